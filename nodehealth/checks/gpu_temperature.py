"""GPU and memory (HBM) temperature against NVML's own thresholds, and slowdowns in force."""

from __future__ import annotations

from typing import Optional

from nodehealth.checks.base import CheckSettings, Context, field_error, judge_gpus, setting
from nodehealth.model import Action, CheckResult, Finding, Status
from nodehealth.observations import GpuObservation, Observations
from nodehealth.observations.record import record

# The drain reason's code (``nh:<code>``, a published contract: never changes meaning) and what it says.
REASON = ("temp", "GPU or memory temperature past NVML's thresholds, slowdowns in force")

# nvmlClocksEventReason* bits (nvml.h); the software reasons (idle, power cap, sync boost,
# application clocks) are normal operation and are not judged.
HW_SLOWDOWN = 0x08
HW_THERMAL_SLOWDOWN = 0x40
HW_POWER_BRAKE = 0x80
SW_THERMAL_SLOWDOWN = 0x20
_HW_REASONS = {
    HW_SLOWDOWN: "HW slowdown",
    HW_THERMAL_SLOWDOWN: "HW thermal slowdown",
    HW_POWER_BRAKE: "HW power brake slowdown",
    # The driver lowers clocks because the GPU or its memory (Hopper's HBM) is too hot: not
    # a hardware alarm, but the job runs slower, as under the hardware reasons.
    SW_THERMAL_SLOWDOWN: "SW thermal slowdown",
}


@record
class Settings(CheckSettings):
    warn_below_slowdown_c: int = setting(
        8, "WARN when a GPU is this close to its NVML slowdown threshold", unit="degC", min=0, max=50
    )
    fail_below_slowdown_c: int = setting(
        0, "FAIL when a GPU is this close to (or past) its slowdown threshold", unit="degC", min=0, max=50
    )
    fallback_slowdown_c: int = setting(
        85, "slowdown threshold to use when NVML does not report one", unit="degC", min=40, max=120
    )
    hw_slowdown: str = setting(
        "warn",
        "status when a hardware or thermal slowdown (HW, HW thermal, power brake, SW thermal) is active",
        choices=("ignore", "warn", "fail"),
    )


def evaluate(obs: Observations, settings: Settings, ctx: Context) -> CheckResult:
    def judge(gpu: GpuObservation) -> Optional[list[Finding]]:
        err = field_error(gpu, "temperature", "throttle")
        if err is not None:
            return [err]
        if gpu.temperature_c is None:
            return None
        findings: list[Finding] = []
        if gpu.memory_temp_c is not None and gpu.mem_max_c:
            hbm, limit = gpu.memory_temp_c, gpu.mem_max_c
            if hbm >= limit - settings.fail_below_slowdown_c:
                findings.append(
                    Finding(
                        Status.FAIL,
                        f"GPU {gpu.index}: memory (HBM) {hbm} C, max operating {limit} C",
                        Action.INSPECT,
                        gpu.index,
                    )
                )
            elif hbm >= limit - settings.warn_below_slowdown_c:
                findings.append(
                    Finding(
                        Status.WARN,
                        f"GPU {gpu.index}: memory (HBM) {hbm} C, within {limit - hbm} C of its max operating {limit} C",
                        Action.INSPECT,
                        gpu.index,
                    )
                )
        slowdown = gpu.slowdown_c if gpu.slowdown_c else settings.fallback_slowdown_c
        temp = gpu.temperature_c
        if temp >= slowdown - settings.fail_below_slowdown_c:
            findings.append(
                Finding(
                    Status.FAIL,
                    f"GPU {gpu.index}: {temp} C, slowdown threshold {slowdown} C",
                    Action.INSPECT,
                    gpu.index,
                )
            )
        elif temp >= slowdown - settings.warn_below_slowdown_c:
            findings.append(
                Finding(
                    Status.WARN,
                    f"GPU {gpu.index}: {temp} C, within {slowdown - temp} C of slowdown ({slowdown} C)",
                    Action.INSPECT,
                    gpu.index,
                )
            )
        active = [label for bit, label in _HW_REASONS.items() if (gpu.throttle_reasons or 0) & bit]
        if active and settings.hw_slowdown != "ignore":
            status = Status.FAIL if settings.hw_slowdown == "fail" else Status.WARN
            findings.append(
                Finding(status, f"GPU {gpu.index}: {', '.join(active)} active at {temp} C", Action.INSPECT, gpu.index)
            )
        return findings

    return judge_gpus(obs, ctx, judge, "{n} GPU(s) below their slowdown thresholds, no hardware slowdown")
