"""NVML answers at all, and in time: the check that carries a hung or missing NVML."""

from __future__ import annotations

from dataclasses import dataclass

from nodehealth.checks.base import CheckSettings, Context, gpus_expected, result
from nodehealth.model import Action, CheckResult, Status
from nodehealth.observations import NvmlSnapshot, Observations, ProbeError


@dataclass(frozen=True)
class Settings(CheckSettings):
    pass


def evaluate(obs: Observations, settings: Settings, ctx: Context) -> CheckResult:
    snap = obs.nvml
    if isinstance(snap, ProbeError):
        if snap.kind == "timeout":
            return result(ctx, Status.FAIL, f"NVML did not answer: {snap.message}", Action.REBOOT,
                          error=snap.message)
        if snap.kind == "unavailable" and not gpus_expected(obs, ctx):
            return result(ctx, Status.SKIPPED, f"NVML not available and no GPU expected ({snap.message})")
        if snap.kind == "unavailable":
            # The driver's library is not installed or its kernel module is not loaded: a
            # reboot does not install a driver, so a person has to look.
            return result(ctx, Status.FAIL, f"NVML not available but GPUs are expected: {snap.message}",
                          Action.INSPECT, error=snap.message)
        return result(ctx, Status.FAIL, f"NVML failed: {snap.message}", Action.REBOOT, error=snap.message)
    if not isinstance(snap, NvmlSnapshot):
        return result(ctx, Status.UNKNOWN, "NVML was not probed")
    if not snap.complete:
        where = f"GPU {snap.stalled_gpu}" if snap.stalled_gpu is not None else "NVML"
        call = f" ({snap.stalled_call})" if snap.stalled_call else ""
        return result(ctx, Status.FAIL, f"{where} did not answer within {snap.timeout_s:g} s{call}",
                      Action.REBOOT, gpu=snap.stalled_gpu, stalled_call=snap.stalled_call,
                      gpus_read=len(snap.gpus))
    lost = [g for g in snap.gpus if g.lost]
    if lost:
        names = ", ".join(f"GPU {g.index} ({g.pci_bus_id})" for g in lost)
        return result(ctx, Status.FAIL, f"{names}: GPU is lost (fallen off the bus)", Action.REBOOT,
                      gpu=lost[0].index, lost=[g.index for g in lost])
    return result(ctx, Status.OK,
                  f"driver {snap.driver_version}, {snap.device_count} GPU(s), answered in {snap.elapsed_s:.2f} s",
                  driver_version=snap.driver_version, elapsed_s=round(snap.elapsed_s, 4),
                  simulated=snap.simulated)
