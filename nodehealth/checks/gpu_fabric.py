"""NVSwitch systems: the GPU finished registering with the fabric (Fabric Manager)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from nodehealth.checks.base import CheckSettings, Context, field_error, judge_gpus
from nodehealth.model import Action, CheckResult, Finding, Status
from nodehealth.observations import GpuObservation, Observations

# NVML_GPU_FABRIC_STATE_* (nvml.h)
NOT_SUPPORTED, NOT_STARTED, IN_PROGRESS, COMPLETED = 0, 1, 2, 3
_STATE_NAMES = {NOT_STARTED: "not started", IN_PROGRESS: "in progress", COMPLETED: "completed"}
# NVML_GPU_FABRIC_HEALTH_SUMMARY_* and the healthMask fields (nvmlGpuFabricInfo_v2/v3, nvml.h):
# (shift, value meaning "bad", what it says).
SUMMARY_UNHEALTHY, SUMMARY_LIMITED = 2, 3
_HEALTH_BITS = ((0, 1, "degraded bandwidth"), (2, 1, "route recovery in progress"), (4, 1, "route unhealthy"),
                (6, 1, "access timeout recovery in progress"))


@dataclass(frozen=True)
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
                return [Finding(Status.FAIL, f"GPU {gpu.index}: fabric unhealthy ({health or 'health summary'}) "
                                "although the state reads not supported", Action.REBOOT, gpu.index)]
            return None
        if gpu.fabric_state == IN_PROGRESS:
            # CUDA refuses to start on such a GPU (error 802, "system not yet initialized"), so no
            # job may land; but a registration under way (minutes after a boot) ends by itself:
            # no reboot is asked for, and a drain for it is lifted once it completes.
            return [Finding(Status.FAIL, f"GPU {gpu.index}: fabric registration in progress (wait for it; "
                            "CUDA cannot start until it completes)", Action.NONE, gpu.index)]
        if gpu.fabric_state != COMPLETED:
            state = _STATE_NAMES.get(gpu.fabric_state, f"state {gpu.fabric_state}")
            return [Finding(Status.FAIL, f"GPU {gpu.index}: fabric registration {state} "
                            "(is nvidia-fabricmanager running?)", Action.REBOOT, gpu.index)]
        if gpu.fabric_status:
            return [Finding(Status.FAIL, f"GPU {gpu.index}: fabric registration failed: {gpu.fabric_status}",
                            Action.REBOOT, gpu.index)]
        if gpu.fabric_health_summary == SUMMARY_UNHEALTHY:
            return [Finding(Status.FAIL, f"GPU {gpu.index}: fabric unhealthy ({health or 'health summary'})",
                            Action.REBOOT, gpu.index)]
        if health or gpu.fabric_health_summary == SUMMARY_LIMITED:
            return [Finding(Status.WARN, f"GPU {gpu.index}: fabric {health or 'at limited capacity'}",
                            Action.INSPECT, gpu.index)]
        return []

    return judge_gpus(obs, ctx, judge, "{n} GPU(s) registered with the NVSwitch fabric")


def _health(gpu: GpuObservation) -> str:
    mask = gpu.fabric_health_mask
    if not mask:
        return ""
    return ", ".join(what for shift, bad, what in _HEALTH_BITS if (mask >> shift) & 0x3 == bad)
