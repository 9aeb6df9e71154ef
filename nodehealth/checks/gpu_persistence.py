"""Persistence mode on: without it every job start re-initialises each GPU (1-3 s each)."""

from __future__ import annotations

from typing import Optional

from nodehealth.checks.base import CheckSettings, Context, field_error, judge_gpus, setting
from nodehealth.model import CheckResult, Finding, Status
from nodehealth.observations import GpuObservation, Observations
from nodehealth.observations.record import record

# The drain reason's code (``nh:<code>``, a published contract: never changes meaning) and what it says.
REASON = ("persist", "persistence mode off")


@record
class Settings(CheckSettings):
    when_off: str = setting("warn", "status when persistence mode is off", choices=("warn", "fail"))


def evaluate(obs: Observations, settings: Settings, ctx: Context) -> CheckResult:
    def judge(gpu: GpuObservation) -> Optional[list[Finding]]:
        err = field_error(gpu, "persistence_mode")
        if err is not None:
            return [err]
        if gpu.persistence_mode is None:
            return None
        if gpu.persistence_mode:
            return []
        status = Status.FAIL if settings.when_off == "fail" else Status.WARN
        return [Finding(status, f"GPU {gpu.index}: persistence mode off", gpu=gpu.index)]

    return judge_gpus(obs, ctx, judge, "{n} GPU(s) in persistence mode")
