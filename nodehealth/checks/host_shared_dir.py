"""Shared directories answer: a write, fsync, read and delete round trip under a deadline."""

from __future__ import annotations

from nodehealth.checks.base import CheckSettings, Context, result, setting
from nodehealth.model import CheckResult, Finding, Status, fold
from nodehealth.observations import Observations, ProbeError
from nodehealth.observations.record import record

# The drain reason's code (``nh:<code>``, a published contract: never changes meaning) and what it says.
REASON = ("shareddir", "a shared directory not answering its round trip in time")


@record
class Settings(CheckSettings):
    paths: tuple[str, ...] = setting(
        (),
        "directories on shared file systems (NFS, Lustre, GPFS) to write a small file into, "
        "fsync, read back and delete; empty = check skipped",
    )
    timeout_s: float = setting(
        5.0,
        "deadline for all round trips together: a directory that does not answer in time (a hung mount) is a FAIL",
        unit="s",
        min=0.1,
        max=600,
    )


def evaluate(obs: Observations, settings: Settings, ctx: Context) -> CheckResult:
    if not settings.paths:
        return result(ctx, Status.SKIPPED, "no shared directory configured")
    trips = obs.shared_dirs
    if isinstance(trips, ProbeError):
        if trips.kind == "timeout":
            return result(ctx, Status.FAIL, f"shared directories did not answer: {trips.message}")
        return result(ctx, Status.UNKNOWN, f"cannot test shared directories: {trips.message}")
    if trips is None:
        return result(ctx, Status.UNKNOWN, "shared directories were not probed")
    findings = []
    details: dict[str, object] = {}
    for trip in trips:
        details[trip.path] = {
            "ok": trip.ok,
            "elapsed_s": round(trip.elapsed_s, 4),
            "timed_out": trip.timed_out,
            "error": trip.error,
        }
        if trip.timed_out:
            findings.append(
                Finding(Status.FAIL, f"{trip.path}: did not answer within {trip.elapsed_s:.1f} s (hung mount?)")
            )
        elif not trip.ok:
            findings.append(Finding(Status.FAIL, f"{trip.path}: round trip failed: {trip.error}"))
    slowest = max((t.elapsed_s for t in trips), default=0.0)
    return fold(
        ctx.name,
        findings,
        f"{len(trips)} shared dir(s): write, fsync, read, delete in {slowest * 1000:.0f} ms or less",
        {"dirs": details},
    )
