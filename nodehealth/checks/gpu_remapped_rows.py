"""Row remapping (Ampere and later): pending needs a reset, failure needs inspection."""

from __future__ import annotations

from typing import Optional

from nodehealth.checks.base import CheckSettings, Context, field_error, judge_gpus
from nodehealth.model import Action, CheckResult, Finding, Status
from nodehealth.observations import GpuObservation, Observations
from nodehealth.observations.record import record

# The drain reason's code (``nh:<code>``, a published contract: never changes meaning) and what it says.
REASON = ("rowremap", "row remapping pending (reset) or failed (inspect)")


@record
class Settings(CheckSettings):
    pass


def evaluate(obs: Observations, settings: Settings, ctx: Context) -> CheckResult:
    def judge(gpu: GpuObservation) -> Optional[list[Finding]]:
        err = field_error(gpu, "remapped_rows")
        if err is not None:
            return [err]
        rows = gpu.remapped_rows
        if rows is None:
            return None
        out: list[Finding] = []
        if rows.failure:
            out.append(
                Finding(
                    Status.FAIL,
                    f"GPU {gpu.index}: row remapping failed ({rows.uncorrectable} uncorrectable rows remapped)",
                    Action.INSPECT,
                    gpu.index,
                )
            )
        if rows.pending:
            out.append(
                Finding(
                    Status.FAIL, f"GPU {gpu.index}: row remap pending (GPU reset needed)", Action.RESET_GPU, gpu.index
                )
            )
        return out

    return judge_gpus(obs, ctx, judge, "{n} GPU(s): no row remap pending or failed")
