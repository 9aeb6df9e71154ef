"""The daemon's schedule of the NCCL self-test: every ``interval_s`` (plus jitter), only on an idle node.

Idle is known locally, never by asking slurmctld: no job of this boot that the job ledger's one
rule (``statedir.ledger.holding``) says holds the node now (the prolog wrote its start, the
epilog has not written an end before now), and no compute process
on any GPU in the round's NVML snapshot (a snapshot that is cut off, or that could not list the
processes of a GPU, proves nothing: not idle). The ledger is read again after the run: a job
that started while the test ran shares the GPUs with it, so that result is dropped (a slow run
caused by a job must not drain the node) and the test runs again at the next round.

The result joins every round's report until the next run (its metrics, the daemon's verdict and
the Slurm policy see it), as the check's result would in a phase run.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from nodehealth.model import CheckResult, Report
from nodehealth.observations import NvmlSnapshot, Observations

CHECK = "nccl_selftest"


def busy_reason(snapshot: Any, running: Sequence[Any]) -> str:
    """Why the node is not idle ("" when it is): a running job of the ledger, a GPU process, no proof."""
    if running:
        jobs = ", ".join(str(getattr(j, "job_id", j)) for j in running[:3])
        return f"job {jobs} running (job ledger)"
    if not isinstance(snapshot, NvmlSnapshot):
        return "no NVML snapshot to show the GPUs idle"
    if not snapshot.complete:
        return "the NVML snapshot was cut off"
    for gpu in snapshot.gpus:
        if gpu.processes is None:
            return f"GPU {gpu.index}: its processes could not be read"
        if gpu.processes:
            return f"GPU {gpu.index}: {len(gpu.processes)} compute process(es)"
    return ""


def holding_jobs(state_dir: str, boot_id: Optional[str], at: Optional[float] = None) -> tuple[Any, ...]:
    """The ledger's jobs of this boot that hold the node at Unix time ``at`` (now by default): the
    ledger's one rule (``statedir.ledger.holding``, any GPU) with no teardown slack, the rule the
    daemon's job labels use (``daemon.hooks.ledger_jobs``)."""
    from nodehealth.statedir import ledger

    jobs = ledger.entries(ledger.of_boot(ledger.read(state_dir), boot_id))
    return ledger.holding(jobs, None, time.time() if at is None else at, slack_s=0.0)


@dataclass
class Schedule:
    """When the next self-test is due (monotonic seconds); the first one is one jitter after start."""

    interval_s: float
    jitter_s: float
    clock: Callable[[], float] = time.monotonic
    rng: random.Random = field(default_factory=random.Random)
    next_due: Optional[float] = None

    def __post_init__(self) -> None:
        self.next_due = self.clock() + self.rng.uniform(0, self.jitter_s)

    def due(self) -> bool:
        return self.interval_s > 0 and self.next_due is not None and self.clock() >= self.next_due

    def ran(self) -> None:
        self.next_due = self.clock() + self.interval_s + self.rng.uniform(0, self.jitter_s)


def merge(report: Report, result: Optional[CheckResult]) -> Report:
    """``report`` with the self-test's latest result in place of (or after) its own."""
    if result is None:
        return report
    import dataclasses

    results = tuple(r for r in report.results if r.name != CHECK) + (result,)
    return dataclasses.replace(report, results=results)


@dataclass(frozen=True)
class Decision:
    ran: bool
    why: str = ""  # why it did not run, or why its result was dropped
    result: Optional[CheckResult] = None


def maybe_run(
    schedule: Schedule, obs: Optional[Observations], jobs: Callable[[], Sequence[Any]], run: Callable[[], CheckResult]
) -> Decision:
    """Run the self-test when it is due and the node idle; drop a result a job started into."""
    if not schedule.due():
        return Decision(False, "not due")
    why = busy_reason(obs.nvml if obs is not None else None, jobs())
    if why:
        return Decision(False, why)
    res = run()
    late = list(jobs())  # none ran before: any now started while the test ran
    if late:
        names = ", ".join(str(getattr(j, "job_id", j)) for j in late[:3])
        return Decision(True, f"result dropped: job {names} started while the self-test ran (it stays due)")
    schedule.ran()
    return Decision(True, "", res)
