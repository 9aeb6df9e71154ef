"""The node has the physical memory it should, and enough of it is available for a job."""

from __future__ import annotations

from nodehealth.checks.base import CheckSettings, Context, result, setting
from nodehealth.model import Action, CheckResult, Finding, Status, fold
from nodehealth.observations import MemoryObservation, Observations, ProbeError
from nodehealth.observations.record import record

# The drain reason's code (``nh:<code>``, a published contract: never changes meaning) and what it says.
REASON = ("memory", "less physical or available memory than the node should have")

GIB = 1 << 30


@record
class Settings(CheckSettings):
    min_total_gib: float = setting(
        0.0,
        "FAIL (action inspect: a DIMM is missing or disabled) when the memory the kernel sees "
        "is below this; set it a few percent under the installed DIMM total, which firmware and "
        "kernel reserve part of; 0 = not checked",
        unit="GiB",
        min=0,
        max=1 << 20,
    )
    min_available_gib: float = setting(
        0.0,
        "FAIL when less than this is available for new allocations (MemAvailable: free plus "
        "reclaimable cache); 0 = not checked",
        unit="GiB",
        min=0,
        max=1 << 20,
    )
    min_available_pct: float = setting(
        0.0, "FAIL when less than this share of total memory is available; 0 = not checked", unit="%", min=0, max=100
    )


def evaluate(obs: Observations, settings: Settings, ctx: Context) -> CheckResult:
    mem = obs.memory
    if isinstance(mem, ProbeError):
        return result(ctx, Status.UNKNOWN, f"cannot read memory: {mem.message}")
    if not isinstance(mem, MemoryObservation):
        return result(ctx, Status.UNKNOWN, "memory was not probed")
    if not (settings.min_total_gib or settings.min_available_gib or settings.min_available_pct):
        return result(
            ctx, Status.SKIPPED, "no memory threshold configured (min_total_gib, min_available_gib, min_available_pct)"
        )
    total = mem.total_bytes / GIB
    available = mem.available_bytes / GIB
    pct = 100.0 * mem.available_bytes / mem.total_bytes if mem.total_bytes > 0 else 0.0
    findings = []
    if settings.min_total_gib and total < settings.min_total_gib:
        findings.append(
            Finding(
                Status.FAIL,
                f"{total:.1f} GiB physical memory, {settings.min_total_gib:g} GiB expected (missing or disabled DIMM?)",
                Action.INSPECT,
            )
        )
    if settings.min_available_gib and available < settings.min_available_gib:
        findings.append(
            Finding(Status.FAIL, f"{available:.1f} GiB available, below {settings.min_available_gib:g} GiB")
        )
    if settings.min_available_pct and pct < settings.min_available_pct:
        findings.append(Finding(Status.FAIL, f"{pct:.1f}% of memory available, below {settings.min_available_pct:g}%"))
    details = {
        "total_gib": round(total, 2),
        "available_gib": round(available, 2),
        "available_pct": round(pct, 1),
        "swap_total_gib": round(mem.swap_total_bytes / GIB, 2),
        "swap_used_gib": round(mem.swap_used_bytes / GIB, 2),
    }
    return fold(ctx.name, findings, f"{total:.1f} GiB physical, {available:.1f} GiB ({pct:.0f}%) available", details)
