"""The driver's own verdict on each GPU (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)."""

from __future__ import annotations

from typing import Optional

from nodehealth.checks.base import CheckSettings, Context, field_error, judge_gpus
from nodehealth.model import Action, CheckResult, Finding, Status
from nodehealth.observations import GpuObservation, Observations
from nodehealth.observations.record import record

# The drain reason's code (``nh:<code>``, a published contract: never changes meaning) and what it says.
REASON = ("recovery", "the driver's own recovery verdict (reset, reboot, drain)")

# NVML_GPU_RECOVERY_ACTION_* (nvml.h) -> (what the driver asks for, our action)
RECOVERY_ACTIONS: dict[int, tuple[str, Action]] = {
    0: ("none", Action.NONE),
    1: ("GPU reset", Action.RESET_GPU),
    2: ("node reboot", Action.REBOOT),
    # "Drain peer-to-peer traffic, then query the action again" (nvml.h): no reset is asked
    # for; the node takes no new job until the driver stops asking (docs/checks.md).
    3: ("draining peer-to-peer traffic (then query again)", Action.RESTART_APP),
    4: ("drain and reset", Action.RESET_GPU),
    5: ("recover the IMEX domain", Action.INSPECT),
    6: ("PCI bus reset", Action.RESET_GPU),
    7: ("system reboot", Action.REBOOT),
}


@record
class Settings(CheckSettings):
    pass


def evaluate(obs: Observations, settings: Settings, ctx: Context) -> CheckResult:
    def judge(gpu: GpuObservation) -> Optional[list[Finding]]:
        err = field_error(gpu, "recovery_action")
        if err is not None:
            return [err]
        if gpu.recovery_action is None:
            return None
        if gpu.recovery_action == 0:
            return []
        what, action = RECOVERY_ACTIONS.get(
            gpu.recovery_action, (f"unknown action {gpu.recovery_action}", Action.INSPECT)
        )
        return [Finding(Status.FAIL, f"GPU {gpu.index}: driver requests {what}", action, gpu.index)]

    return judge_gpus(obs, ctx, judge, "{n} GPU(s): driver requests no recovery action")
