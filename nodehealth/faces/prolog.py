"""``nodehealth-prolog`` (slurm.conf ``Prolog=``): is this node fit for the job about to start?

Exit 0: start the job (healthy, warnings, SKIPPED, UNKNOWN under ``policy.unknown = pass``,
or a fault the drain-storm breaker holds back). Exit 1: a node fault; the node has been
drained with ``nodehealth: <check>: <summary>`` (or, when slurmctld did not answer in time,
Slurm drains it with "Prolog error") and a batch job is requeued. A passing prolog makes no
Slurm call.
"""

from __future__ import annotations

from nodehealth.faces.common import guarded, job_face


def main() -> int:
    return guarded("prolog", lambda: job_face("prolog", "prolog", "start"))


if __name__ == "__main__":
    raise SystemExit(main())
