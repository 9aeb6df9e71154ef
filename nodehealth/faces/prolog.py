"""``nodehealth-prolog`` (slurm.conf ``Prolog=``): is this node fit for the job about to start?

Exit 0: start the job (healthy, warnings, SKIPPED, UNKNOWN under ``policy.unknown = pass``,
or a fault the drain-storm breaker holds back). Exit 1: a node fault; the node has been
drained with ``nh:<code>[ GPU<i>] <check>: <summary>`` (or, when slurmctld did not answer in time,
Slurm drains it with "Prolog error") and a batch job is requeued. A passing prolog makes no
Slurm call.

Fast path first (``nodehealth.faces.fast``): when the daemon's verdict is fresh (younger than
``[daemon] state_max_age_s``, this boot, XID follower alive) the prolog decides from it
without NVML and without importing the runner, the probes or the config loader. Otherwise
(no daemon, stale, corrupt, another boot ...) the cold path runs the prolog checks itself
and logs why the fast path was not taken. Its deadline counts from the process start.

This module imports nothing from nodehealth at module level: what the fast path pays for is
decided in ``main``.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # no typing import at run time
    from typing import Sequence


def cli() -> int:
    """The installed ``nodehealth-prolog``: Slurm passes no argument, a person may."""
    return main(sys.argv[1:])


def main(argv: Sequence[str] = ()) -> int:
    if argv:  # a person: --help, --version, --dry-run
        from nodehealth.faces.args import handle

        code = handle("prolog", argv)
        if code is not None:
            return code
    from nodehealth.faces import fast

    answer = fast.prolog(os.environ)
    if isinstance(answer, int):
        return answer
    from nodehealth.faces.common import fast_fault, guarded, job_face

    if isinstance(answer, fast.Fault):
        fault = answer
        return guarded("prolog", lambda: fast_fault(fault.report, os.environ, fault.verdict))
    miss = answer
    return guarded("prolog", lambda: job_face("prolog", "prolog", "start", fast_miss=miss))


if __name__ == "__main__":
    raise SystemExit(cli())
