"""No compute process on the GPUs when the phase says they must be idle (prolog, epilog)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from nodehealth.checks.base import CheckSettings, Context, field_error, judge_gpus, setting
from nodehealth.model import Action, CheckResult, Finding, Status
from nodehealth.observations import GpuObservation, NvmlSnapshot, Observations


@dataclass(frozen=True)
class Settings(CheckSettings):
    idle_phases: tuple[str, ...] = setting(
        ("prolog", "epilog"), "phases in which a compute process on a GPU is a fault; in other "
        "phases processes are only reported", choices=("prolog", "epilog", "healthcheck", "manual", "daemon"))


def evaluate(obs: Observations, settings: Settings, ctx: Context) -> CheckResult:
    must_be_idle = ctx.phase in settings.idle_phases

    def judge(gpu: GpuObservation) -> Optional[list[Finding]]:
        err = field_error(gpu, "processes")
        if err is not None:
            return [err]
        if gpu.processes is None:
            return None
        if not gpu.processes:
            return []
        pids = ", ".join(str(p.pid) for p in gpu.processes)
        mib = sum(p.used_memory_bytes or 0 for p in gpu.processes) // (1 << 20)
        message = f"GPU {gpu.index}: {len(gpu.processes)} compute process(es) (pid {pids}, {mib} MiB)"
        if must_be_idle:
            return [Finding(Status.FAIL, message + f" before/after a job ({ctx.phase})",
                            Action.RESTART_APP, gpu.index)]
        return []

    res = judge_gpus(obs, ctx, judge, "{n} GPU(s) idle" if must_be_idle else "{n} GPU(s) checked")
    if must_be_idle or not isinstance(obs.nvml, NvmlSnapshot):
        return res
    # Outside the idle phases processes are expected: report them, do not judge them.
    busy = {str(g.index): [p.pid for p in g.processes] for g in obs.nvml.gpus if g.processes}
    if not busy:
        return dataclasses.replace(res, summary=res.summary.replace("checked", "idle"))
    summary = f"{res.summary}; compute processes on GPU {', '.join(busy)} ({ctx.phase}: not judged)"
    return dataclasses.replace(res, summary=summary, details={**res.details, "processes": busy})
