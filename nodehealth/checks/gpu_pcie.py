"""The GPU's PCIe link runs at the width (and, under load, the generation) it should."""

from __future__ import annotations

from typing import Optional

from nodehealth.checks.base import CheckSettings, Context, field_error, judge_gpus, setting
from nodehealth.model import Action, CheckResult, Finding, Status
from nodehealth.observations import GpuObservation, Observations
from nodehealth.observations.record import record

# The drain reason's code (``nh:<code>``, a published contract: never changes meaning) and what it says.
REASON = ("pcie", "PCIe link below its width or generation")


@record
class Settings(CheckSettings):
    width: str = setting(
        "fail",
        "status when the link runs narrower than its maximum width (x8 instead of x16 halves host-device bandwidth)",
        choices=("ignore", "warn", "fail"),
    )
    generation: str = setting(
        "warn",
        "status when the link runs below its maximum generation while the GPU is busy; an "
        "idle GPU lowers its link speed to save power, so an idle GPU is never judged on this",
        choices=("ignore", "warn", "fail"),
    )
    busy_utilization_pct: int = setting(
        10, "a GPU at or above this utilization counts as busy for the generation rule", unit="%", min=0, max=100
    )


def _status(word: str) -> Status:
    return Status.FAIL if word == "fail" else Status.WARN


def evaluate(obs: Observations, settings: Settings, ctx: Context) -> CheckResult:
    def judge(gpu: GpuObservation) -> Optional[list[Finding]]:
        err = field_error(gpu, "pcie", "utilization")
        if err is not None:
            return [err]
        if gpu.pcie_width is None or gpu.pcie_max_width is None:
            return None
        out: list[Finding] = []
        if settings.width != "ignore" and gpu.pcie_width < gpu.pcie_max_width:
            out.append(
                Finding(
                    _status(settings.width),
                    f"GPU {gpu.index}: PCIe link x{gpu.pcie_width}, capable of x{gpu.pcie_max_width}",
                    Action.INSPECT,
                    gpu.index,
                )
            )
        busy = (gpu.utilization_gpu_pct or 0) >= settings.busy_utilization_pct
        if (
            settings.generation != "ignore"
            and busy
            and gpu.pcie_gen is not None
            and gpu.pcie_max_gen is not None
            and gpu.pcie_gen < gpu.pcie_max_gen
        ):
            out.append(
                Finding(
                    _status(settings.generation),
                    f"GPU {gpu.index}: PCIe Gen{gpu.pcie_gen} under load, capable of Gen{gpu.pcie_max_gen}",
                    Action.INSPECT,
                    gpu.index,
                )
            )
        return out

    return judge_gpus(obs, ctx, judge, "{n} GPU(s) at full PCIe link width")
