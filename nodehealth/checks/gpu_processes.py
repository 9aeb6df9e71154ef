"""No compute process on the GPUs when the phase says they must be idle, and none that no job owns.

In the idle phases (prolog, epilog) any compute process on a GPU is a fault; the summary names
the job (``left by job 1234`` in the epilog, ``before job 1234`` in the prolog). In the other
phases (health check, daemon, by hand) processes of running jobs are only reported, and a
process that belongs to no job running on the node — not in a Slurm job's cgroup, on a GPU no
running job of the ledger holds — is a fault (a stray left by an ended job): so a drain for it
lasts while it lives, and ends when it is gone. Without the ledger the running jobs are not
known and processes are only reported (``details["judged"] = False``).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from nodehealth.checks.base import CheckSettings, Context, field_error, judge_gpus, setting
from nodehealth.model import Action, CheckResult, Finding, Status
from nodehealth.observations import GpuObservation, GpuProcess, JobObservation, NodeJobs, NvmlSnapshot, Observations
from nodehealth.observations.record import record

# The drain reason's code (``nh:<code>``, a published contract: never changes meaning) and what it says.
REASON = ("procs", "a compute process no job owns (a stray), or one where the GPUs must be idle")


@record
class Settings(CheckSettings):
    idle_phases: tuple[str, ...] = setting(
        ("prolog", "epilog"),
        "phases in which a compute process on a GPU is a fault; in other "
        "phases processes are only reported, unless they belong to no running job (strays)",
        choices=("prolog", "epilog", "healthcheck", "manual", "daemon"),
    )
    strays: bool = setting(
        True,
        "outside the idle phases, judge a compute process that belongs to no job running on "
        "the node (job ledger, the process's Slurm cgroup) a fault; false = only report processes",
    )


def _describe(gpu: GpuObservation, procs: list[GpuProcess] | tuple[GpuProcess, ...]) -> str:
    pids = ", ".join(str(p.pid) for p in procs)
    mib = sum(p.used_memory_bytes or 0 for p in procs) // (1 << 20)
    return f"GPU {gpu.index}: {len(procs)} compute process(es) (pid {pids}, {mib} MiB)"


def evaluate(obs: Observations, settings: Settings, ctx: Context) -> CheckResult:
    must_be_idle = ctx.phase in settings.idle_phases
    job = obs.job.job_id if isinstance(obs.job, JobObservation) else None
    jobs = obs.node_jobs if isinstance(obs.node_jobs, NodeJobs) and settings.strays else None

    def judge(gpu: GpuObservation) -> Optional[list[Finding]]:
        err = field_error(gpu, "processes")
        if err is not None:
            return [err]
        if gpu.processes is None:
            return None
        if not gpu.processes:
            return []
        if must_be_idle:
            when = (
                (f"left by job {job}" if ctx.phase == "epilog" else f"before job {job}")
                if job
                else f"before/after a job ({ctx.phase})"
            )
            return [Finding(Status.FAIL, f"{_describe(gpu, gpu.processes)} {when}", Action.RESTART_APP, gpu.index)]
        if jobs is None or jobs.holds(gpu.index) is not None:
            return []
        strays = [p for p in gpu.processes if p.pid not in jobs.pid_jobs]
        if not strays:
            return []
        return [
            Finding(Status.FAIL, f"{_describe(gpu, strays)} of no running job (stray)", Action.RESTART_APP, gpu.index)
        ]

    res = judge_gpus(obs, ctx, judge, "{n} GPU(s) idle" if must_be_idle else "{n} GPU(s) checked")
    if must_be_idle or not isinstance(obs.nvml, NvmlSnapshot):
        return res
    judged = jobs is not None
    if res.status > Status.WARN:
        return dataclasses.replace(res, details={**res.details, "judged": True})
    # Outside the idle phases processes of running jobs are expected: report them.
    busy = {str(g.index): [p.pid for p in g.processes] for g in obs.nvml.gpus if g.processes}
    if not busy:
        return dataclasses.replace(
            res, summary=res.summary.replace("checked", "idle"), details={**res.details, "judged": judged}
        )
    owner = {i: jobs.holds(int(i)) for i in busy} if jobs is not None else {}
    named = ", ".join(f"{i} (job {owner[i]})" if owner.get(i) else i for i in busy)
    summary = f"{res.summary}; compute processes on GPU {named} ({ctx.phase}: " + (
        "of running jobs)" if judged else "not judged: running jobs unknown)"
    )
    return dataclasses.replace(res, summary=summary, details={**res.details, "processes": busy, "judged": judged})
