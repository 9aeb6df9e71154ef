"""``nodehealth-epilog`` (slurm.conf ``Epilog=``): what did the job leave behind or break?

Runs the epilog-phase checks (compute processes or memory left on the job's GPUs, GPU
faults) scoped to the job's GPUs, records the job's end in the ledger, then the same drain
rules as the prolog. Exit 1 on a node fault (Slurm drains with "Epilog error" if we could
not set our own reason).
"""

from __future__ import annotations

import sys
from typing import Sequence

from nodehealth.faces.args import handle
from nodehealth.faces.common import guarded, job_face


def cli() -> int:
    """The installed ``nodehealth-epilog``: Slurm passes no argument, a person may."""
    return main(sys.argv[1:])


def main(argv: Sequence[str] = ()) -> int:
    code = handle("epilog", argv)  # a person: --help, --version, --dry-run
    if code is not None:
        return code
    return guarded("epilog", lambda: job_face("epilog", "epilog", "end"))


if __name__ == "__main__":
    raise SystemExit(cli())
