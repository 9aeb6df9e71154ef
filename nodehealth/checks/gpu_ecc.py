"""ECC is on, no uncorrectable error since the driver loaded, error totals under thresholds."""

from __future__ import annotations

import dataclasses
from typing import Optional

from nodehealth.checks.base import CheckSettings, Context, field_error, judge_gpus, setting
from nodehealth.model import Action, CheckResult, Finding, Status
from nodehealth.observations import GpuObservation, Observations
from nodehealth.observations.record import record

# The drain reason's code (``nh:<code>``, a published contract: never changes meaning) and what it says.
REASON = ("ecc", "ECC off, uncorrectable errors, or error totals over thresholds")


@record
class Settings(CheckSettings):
    require_enabled: str = setting(
        "fail", "status when ECC is disabled (or will be after the next reset)", choices=("ignore", "warn", "fail")
    )
    max_volatile_uncorrected: int = setting(
        0, "FAIL above this many uncorrectable errors since the driver loaded", unit="errors", min=0
    )
    max_aggregate_uncorrected: int = setting(
        10, "WARN (hardware inspection) above this many uncorrectable errors over the GPU's life", unit="errors", min=0
    )
    max_volatile_corrected: int = setting(
        10000, "WARN above this many corrected errors since the driver loaded", unit="errors", min=0
    )


def evaluate(obs: Observations, settings: Settings, ctx: Context) -> CheckResult:
    switched_off: list[int] = []  # GPUs whose ECC a reset cannot turn back on (the hint says how)

    def judge(gpu: GpuObservation) -> Optional[list[Finding]]:
        err = field_error(gpu, "ecc_mode", "ecc_errors")
        if err is not None:
            return [err]
        if gpu.ecc_enabled is None:
            return None
        out: list[Finding] = []
        if settings.require_enabled != "ignore" and not (gpu.ecc_enabled and gpu.ecc_pending_enabled is not False):
            status = Status.FAIL if settings.require_enabled == "fail" else Status.WARN
            state = "disabled" if not gpu.ecc_enabled else "enabled now but disabled after the next reset"
            # A reset or reboot applies the pending mode (nvml.h, nvmlDeviceGetEccMode: "The
            # 'pending' ECC mode refers to the target mode following the next reboot"). Only
            # when that mode is on does a reset help; with it off, someone turned ECC off and
            # turning it back on is a configuration change: inspect (the hint says how).
            action = Action.RESET_GPU if gpu.ecc_pending_enabled else Action.INSPECT
            if action == Action.INSPECT:
                switched_off.append(gpu.index)
                state += " (pending mode off too: a reset keeps it off; enable it with nvidia-smi -e 1)"
            else:
                state += " (enabled at the next reset: pending mode on)"
            out.append(Finding(status, f"GPU {gpu.index}: ECC {state}", action, gpu.index))
        ecc = gpu.ecc
        if ecc.volatile_uncorrected is not None and ecc.volatile_uncorrected > settings.max_volatile_uncorrected:
            out.append(
                Finding(
                    Status.FAIL,
                    f"GPU {gpu.index}: {ecc.volatile_uncorrected} volatile uncorrectable ECC error(s)",
                    Action.RESET_GPU,
                    gpu.index,
                )
            )
        if ecc.aggregate_uncorrected is not None and ecc.aggregate_uncorrected > settings.max_aggregate_uncorrected:
            out.append(
                Finding(
                    Status.WARN,
                    f"GPU {gpu.index}: {ecc.aggregate_uncorrected} uncorrectable ECC "
                    f"errors over its life (> {settings.max_aggregate_uncorrected})",
                    Action.INSPECT,
                    gpu.index,
                )
            )
        if ecc.volatile_corrected is not None and ecc.volatile_corrected > settings.max_volatile_corrected:
            out.append(
                Finding(
                    Status.WARN,
                    f"GPU {gpu.index}: {ecc.volatile_corrected} corrected ECC errors "
                    f"since driver load (> {settings.max_volatile_corrected})",
                    Action.NONE,
                    gpu.index,
                )
            )
        return out

    res = judge_gpus(obs, ctx, judge, "{n} GPU(s): ECC on, no uncorrectable errors")
    if switched_off and res.action == Action.INSPECT:
        res = dataclasses.replace(res, details={**res.details, "ecc_disabled": switched_off})
    return res
