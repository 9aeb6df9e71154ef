"""NVML answers at all, and in time: the check that carries a hung or missing NVML."""

from __future__ import annotations

from nodehealth.checks.base import CheckSettings, Context, gpus_expected, no_gpu_expected, result
from nodehealth.model import Action, CheckResult, Status
from nodehealth.observations import NvmlSnapshot, Observations, ProbeError
from nodehealth.observations.record import record

# The drain reason's code (``nh:<code>``, a published contract: never changes meaning) and what it says.
REASON = ("nvml", "NVML missing, failing or not answering in time")


@record
class Settings(CheckSettings):
    pass


# What an unreachable GPU (no handle) needs, by the error nvmlDeviceGetHandleByIndex gave.
_UNREACHABLE_ACTION = {"insufficient_power": Action.INSPECT, "no_permission": Action.INSPECT}


def evaluate(obs: Observations, settings: Settings, ctx: Context) -> CheckResult:
    snap = obs.nvml
    if isinstance(snap, ProbeError):
        if snap.kind == "timeout":
            return result(ctx, Status.FAIL, f"NVML did not answer: {snap.message}", Action.REBOOT, error=snap.message)
        if snap.kind == "unavailable" and not gpus_expected(obs, ctx):
            return result(ctx, Status.SKIPPED, no_gpu_expected(obs, ctx, snap.message))
        if snap.kind == "unavailable":
            # The driver's library is not installed or its kernel module is not loaded: a
            # reboot does not install a driver, so a person has to look.
            return result(
                ctx,
                Status.FAIL,
                f"NVML not available but GPUs are expected: {snap.message}",
                Action.INSPECT,
                error=snap.message,
            )
        if snap.kind == "old_library":
            # The nvidia-ml-py imported is below the floor: what it reads cannot be trusted (a
            # missing wrapper reads as "not supported"), and nothing about the GPUs is known.
            return result(ctx, Status.UNKNOWN, f"NVML not read: {snap.message}", error=snap.message)
        if snap.kind == "permission":
            # Device nodes or cgroup settings refuse us: a reboot changes neither.
            return result(ctx, Status.FAIL, f"NVML refused access: {snap.message}", Action.INSPECT, error=snap.message)
        return result(ctx, Status.FAIL, f"NVML failed: {snap.message}", Action.REBOOT, error=snap.message)
    if not isinstance(snap, NvmlSnapshot):
        return result(ctx, Status.UNKNOWN, "NVML was not probed")
    if not snap.complete and snap.stop != "budget":  # hung (an unexplained stop counts as one)
        where = f"GPU {snap.stalled_gpu}" if snap.stalled_gpu is not None else "NVML"
        call = f" {snap.stalled_call}" if snap.stalled_call else " a call"
        limit = f"{snap.call_timeout_s:g} s" if snap.call_timeout_s is not None else f"{snap.timeout_s:g} s"
        return result(
            ctx,
            Status.FAIL,
            f"{where}:{call} did not return within {limit} (hung)",
            Action.REBOOT,
            gpu=snap.stalled_gpu,
            stalled_call=snap.stalled_call,
            gpus_read=len(snap.gpus),
        )
    unreachable = [g for g in snap.gpus if g.unreachable and not g.lost]
    lost = [g for g in snap.gpus if g.lost]
    if lost:
        names = ", ".join(f"GPU {g.index} ({g.pci_bus_id})" if g.pci_bus_id else f"GPU {g.index}" for g in lost)
        return result(
            ctx,
            Status.FAIL,
            f"{names}: GPU is lost (fallen off the bus)",
            Action.REBOOT,
            gpu=lost[0].index,
            lost=[g.index for g in lost],
        )
    if unreachable:
        kinds = [g.errors[0].kind if g.errors else "error" for g in unreachable]
        action = max((_UNREACHABLE_ACTION.get(k, Action.REBOOT) for k in kinds), key=lambda a: a.rank)
        why = "; ".join(f"GPU {g.index}: {g.errors[0].message if g.errors else 'no handle'}" for g in unreachable)
        return result(
            ctx,
            Status.FAIL,
            f"unable to determine the device handle: {why}",
            action,
            gpu=unreachable[0].index,
            unreachable=[g.index for g in unreachable],
            kinds=kinds,
        )
    if not snap.complete and snap.device_count is None:
        # The budget ended inside nvmlInit (or before it), which had not passed its own deadline:
        # slow, not hung. Without persistence mode the driver is slow to bring GPUs up; a reboot
        # would not start the daemon that keeps them up (gpu_persistence says so once read).
        call = snap.stalled_call or "the reader's start"
        running = f" (running {snap.in_flight_s:g} s)" if snap.in_flight_s is not None and snap.stalled_call else ""
        return result(
            ctx,
            Status.UNKNOWN,
            f"NVML still starting: {call}{running} had not returned when the "
            f"budget of {snap.timeout_s:g} s ended; slow, not hung (hung is no progress for "
            f"{snap.call_timeout_s:g} s); no GPU read",
            stalled_call=snap.stalled_call,
            gpus_read=0,
            elapsed_s=round(snap.elapsed_s, 3),
        )
    if not snap.complete:
        # The budget ended while NVML was still answering: slow, not hung. What was read is
        # judged by the other checks; what was not is named, and nothing is concluded from it.
        total = snap.device_count if snap.device_count is not None else len(snap.gpus)
        unread = [i for i in range(total) if i not in {g.index for g in snap.gpus}]
        call = (
            f"; {snap.stalled_call} had been running {snap.in_flight_s:g} s"
            if (snap.stalled_call and snap.in_flight_s is not None)
            else ""
        )
        what = f"GPU(s) {', '.join(str(i) for i in unread)} not read" if unread else "not every value read"
        return result(
            ctx,
            Status.UNKNOWN,
            f"NVML answering slowly: {len(snap.gpus)} of {total} GPU(s) read "
            f"in {snap.elapsed_s:.1f} s (budget {snap.timeout_s:g} s); {what}{call}",
            gpus_read=len(snap.gpus),
            gpus_not_read=unread,
            stalled_call=snap.stalled_call,
            elapsed_s=round(snap.elapsed_s, 3),
        )
    return result(
        ctx,
        Status.OK,
        f"driver {snap.driver_version}, {snap.device_count} GPU(s), answered in {snap.elapsed_s:.2f} s",
        driver_version=snap.driver_version,
        elapsed_s=round(snap.elapsed_s, 4),
    )
