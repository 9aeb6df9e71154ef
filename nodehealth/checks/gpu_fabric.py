"""NVSwitch systems: the GPU finished registering with the fabric (Fabric Manager)."""

from __future__ import annotations

from typing import Optional

from nodehealth.checks.base import CheckSettings, Context, field_error, judge_gpus
from nodehealth.model import Action, CheckResult, Finding, Status
from nodehealth.observations import GpuObservation, Observations
from nodehealth.observations.record import record

# The drain reason's code (``nh:<code>``, a published contract: never changes meaning) and what it says.
REASON = ("fabric", "the GPU not registered with the NVSwitch fabric")

# NVML_GPU_FABRIC_STATE_* (nvml.h)
NOT_SUPPORTED, NOT_STARTED, IN_PROGRESS, COMPLETED = 0, 1, 2, 3
_STATE_NAMES = {NOT_STARTED: "not started", IN_PROGRESS: "in progress", COMPLETED: "completed"}
# NVML_GPU_FABRIC_HEALTH_SUMMARY_* and the healthMask fields (nvmlGpuFabricInfo_v2/v3, nvml.h):
# each tri-state field 2 bits wide at its shift, NOT_SUPPORTED 0 / TRUE 1 / FALSE 2; TRUE is the bad one.
SUMMARY_UNHEALTHY, SUMMARY_LIMITED = 2, 3
_TRUE = 1
# (shift, what TRUE says, the action when it FAILs): a route that is unhealthy or bandwidth lost
# needs the fabric brought up again (reboot); a recovery in progress ends by itself (none: no job
# lands meanwhile, and the drain lifts when it reads FALSE again).
_HEALTH_BITS = (
    (0, "degraded bandwidth", Action.REBOOT),
    (2, "route recovery in progress", Action.NONE),
    (4, "route unhealthy", Action.REBOOT),
    (6, "access timeout recovery in progress", Action.NONE),
)
# NVML_GPU_FABRIC_HEALTH_MASK_*_INCORRECT_CONFIGURATION: 4 bits at shift 8, first in the nvml.h of
# CUDA 13.0 (driver 580); 0 not supported, 1 none (correct), the rest name what is wrong (13.3 adds 6-8).
_CONFIG_SHIFT, _CONFIG_WIDTH = 8, 0xF
_CONFIG_NAMES = {
    2: "incorrect system GUID",
    3: "incorrect chassis serial number",
    4: "no partition",
    5: "insufficient NVLinks",
    6: "incompatible GPU firmware",
    7: "invalid location",
    8: "GPU state invalid",
}


@record
class Settings(CheckSettings):
    pass


def evaluate(obs: Observations, settings: Settings, ctx: Context) -> CheckResult:
    def judge(gpu: GpuObservation) -> Optional[list[Finding]]:
        err = field_error(gpu, "fabric")
        if err is not None:
            return [err]
        health = _health(gpu)
        if gpu.fabric_state is None or gpu.fabric_state == NOT_SUPPORTED:
            # GB200 can report an unhealthy fabric as "not supported" (gpud PR #1108): the
            # health summary, where the driver gives one, still tells.
            if gpu.fabric_health_summary == SUMMARY_UNHEALTHY:
                return [
                    Finding(
                        Status.FAIL,
                        f"GPU {gpu.index}: fabric unhealthy ({health or 'health summary'}) "
                        "although the state reads not supported",
                        Action.REBOOT,
                        gpu.index,
                    )
                ]
            return None
        if gpu.fabric_state == IN_PROGRESS:
            # CUDA refuses to start on such a GPU (error 802, "system not yet initialized"), so no
            # job may land; but a registration under way (minutes after a boot) ends by itself:
            # no reboot is asked for, and a drain for it is lifted once it completes.
            return [
                Finding(
                    Status.FAIL,
                    f"GPU {gpu.index}: fabric registration in progress (wait for it; "
                    "CUDA cannot start until it completes)",
                    Action.NONE,
                    gpu.index,
                )
            ]
        if gpu.fabric_state != COMPLETED:
            state = _STATE_NAMES.get(gpu.fabric_state, f"state {gpu.fabric_state}")
            return [
                Finding(
                    Status.FAIL,
                    f"GPU {gpu.index}: fabric registration {state} (is nvidia-fabricmanager running?)",
                    Action.REBOOT,
                    gpu.index,
                )
            ]
        if gpu.fabric_status:
            return [
                Finding(
                    Status.FAIL,
                    f"GPU {gpu.index}: fabric registration failed: {gpu.fabric_status}",
                    Action.REBOOT,
                    gpu.index,
                )
            ]
        config = _incorrect_configuration(gpu)
        if config:
            # Fabric Manager placed this GPU wrongly (GUID, serial, partition, links): a setting or
            # cabling a person fixes, read from the 13.0 header's field (gpud does not read it yet).
            return [
                Finding(
                    Status.FAIL, f"GPU {gpu.index}: fabric incorrect configuration: {config}", Action.INSPECT, gpu.index
                )
            ]
        if gpu.fabric_health_summary == SUMMARY_UNHEALTHY:
            return [
                Finding(
                    Status.FAIL,
                    f"GPU {gpu.index}: fabric unhealthy ({health or 'health summary'})",
                    Action.REBOOT,
                    gpu.index,
                )
            ]
        if gpu.fabric_health_summary in (None, 0) and gpu.fabric_health_mask is not None:
            # No summary (the v2 structure: drivers 550 and 570, or a v3 that says "not supported"):
            # the mask is all there is, and any field reading TRUE is unhealthy, as gpud judges
            # (leptonai/gpud pkg/nvidia-query/nvml/device/fabric_state.go, getHealthMaskIssues).
            bad = [
                (what, action)
                for shift, what, action in _HEALTH_BITS
                if (gpu.fabric_health_mask >> shift) & 0x3 == _TRUE
            ]
            if bad:
                action = max((a for _, a in bad), key=lambda a: a.rank)
                return [
                    Finding(
                        Status.FAIL,
                        f"GPU {gpu.index}: fabric {', '.join(w for w, _ in bad)} (health mask)",
                        action,
                        gpu.index,
                    )
                ]
            return []
        if health or gpu.fabric_health_summary == SUMMARY_LIMITED:
            # The v3 summary is NVIDIA's own reading of the mask: it said not unhealthy.
            return [
                Finding(
                    Status.WARN, f"GPU {gpu.index}: fabric {health or 'at limited capacity'}", Action.INSPECT, gpu.index
                )
            ]
        return []

    return judge_gpus(obs, ctx, judge, "{n} GPU(s) registered with the NVSwitch fabric")


def _health(gpu: GpuObservation) -> str:
    mask = gpu.fabric_health_mask
    if not mask:
        return ""
    return ", ".join(what for shift, what, _ in _HEALTH_BITS if (mask >> shift) & 0x3 == _TRUE)


def _incorrect_configuration(gpu: GpuObservation) -> str:
    """What the mask's incorrect-configuration field names, "" when correct or not reported."""
    if not gpu.fabric_health_mask:
        return ""
    value = (gpu.fabric_health_mask >> _CONFIG_SHIFT) & _CONFIG_WIDTH
    if value <= 1:
        return ""
    return _CONFIG_NAMES.get(value, f"code {value}")
