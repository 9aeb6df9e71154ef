"""Page retirement (GPUs before Ampere): a pending retirement needs a GPU reset."""

from __future__ import annotations

from typing import Optional

from nodehealth.checks.base import CheckSettings, Context, field_error, judge_gpus, setting
from nodehealth.model import Action, CheckResult, Finding, Status
from nodehealth.observations import GpuObservation, Observations
from nodehealth.observations.record import record

# The drain reason's code (``nh:<code>``, a published contract: never changes meaning) and what it says.
REASON = ("retired", "page retirement pending or over its limit (before Ampere)")


@record
class Settings(CheckSettings):
    max_retired: int = setting(
        60,
        "FAIL (inspection) at or above this many retired pages (NVIDIA's RMA guidance is 60 DBE or 64 total)",
        unit="pages",
        min=1,
    )


def evaluate(obs: Observations, settings: Settings, ctx: Context) -> CheckResult:
    def judge(gpu: GpuObservation) -> Optional[list[Finding]]:
        err = field_error(gpu, "retired_pages")
        if err is not None:
            return [err]
        if gpu.retired_pages_pending is None:
            return None
        out: list[Finding] = []
        if gpu.retired_pages_pending:
            out.append(
                Finding(
                    Status.FAIL, f"GPU {gpu.index}: page retirement pending (reset needed)", Action.RESET_GPU, gpu.index
                )
            )
        total = (gpu.retired_pages_sbe or 0) + (gpu.retired_pages_dbe or 0)
        if total >= settings.max_retired:
            out.append(
                Finding(
                    Status.FAIL,
                    f"GPU {gpu.index}: {total} retired pages (>= {settings.max_retired})",
                    Action.INSPECT,
                    gpu.index,
                )
            )
        return out

    return judge_gpus(obs, ctx, judge, "{n} GPU(s): no page retirement pending")
