"""``nodehealth-healthcheck`` (slurm.conf ``HealthCheckProgram=``, or cron): drain and resume.

Slurm only logs a health check's exit code, so this face acts by itself: it reads this
node's state once (``scontrol show node -o NODE``, cached for the prolog), runs the
health-check phase, drains on a fault (ownership and breaker rules) and resumes a node
nodehealth drained after ``[resume] clean_runs`` clean runs (reboot-class faults: only
after the boot id changed). Exit 0 healthy, 1 a fault.
"""

from __future__ import annotations

import sys
from typing import Sequence

from nodehealth.faces.args import handle
from nodehealth.faces.common import guarded, healthcheck_face


def cli() -> int:
    """The installed ``nodehealth-healthcheck``: Slurm passes no argument, a person may."""
    return main(sys.argv[1:])


def main(argv: Sequence[str] = ()) -> int:
    code = handle("healthcheck", argv)  # a person: --help, --version, --dry-run
    if code is not None:
        return code
    return guarded("healthcheck", healthcheck_face)


if __name__ == "__main__":
    raise SystemExit(cli())
