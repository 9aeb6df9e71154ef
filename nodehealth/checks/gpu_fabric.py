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


@dataclass(frozen=True)
class Settings(CheckSettings):
    pass


def evaluate(obs: Observations, settings: Settings, ctx: Context) -> CheckResult:
    def judge(gpu: GpuObservation) -> Optional[list[Finding]]:
        err = field_error(gpu, "fabric")
        if err is not None:
            return [err]
        if gpu.fabric_state is None or gpu.fabric_state == NOT_SUPPORTED:
            return None
        if gpu.fabric_state != COMPLETED:
            state = _STATE_NAMES.get(gpu.fabric_state, f"state {gpu.fabric_state}")
            # CUDA refuses to start on such a GPU (error 802, "system not yet initialized").
            return [Finding(Status.FAIL, f"GPU {gpu.index}: fabric registration {state} "
                            "(is nvidia-fabricmanager running?)", Action.REBOOT, gpu.index)]
        if gpu.fabric_status:
            return [Finding(Status.FAIL, f"GPU {gpu.index}: fabric registration failed: {gpu.fabric_status}",
                            Action.REBOOT, gpu.index)]
        return []

    return judge_gpus(obs, ctx, judge, "{n} GPU(s) registered with the NVSwitch fabric")
