"""The NVIDIA driver is one the site allows."""

from __future__ import annotations

from nodehealth.checks.base import CheckSettings, Context, nvml_snapshot, result, setting
from nodehealth.model import Action, CheckResult, Status
from nodehealth.observations import Observations
from nodehealth.observations.record import record

# The drain reason's code (``nh:<code>``, a published contract: never changes meaning) and what it says.
REASON = ("driver", "an NVIDIA driver the site does not allow")


@record
class Settings(CheckSettings):
    allowed: tuple[str, ...] = setting(
        (),
        'driver versions allowed on this node, exact ("550.127.05") or a prefix ending in '
        '"." or "*" ("550."); empty = any driver',
    )


def evaluate(obs: Observations, settings: Settings, ctx: Context) -> CheckResult:
    snap = nvml_snapshot(obs, ctx)
    if isinstance(snap, CheckResult):
        return snap
    version = snap.driver_version
    if version is None:
        return result(ctx, Status.UNKNOWN, "NVML did not report the driver version")
    if not settings.allowed:
        return result(ctx, Status.OK, f"driver {version} (no allowed list configured)", driver=version)
    if any(_matches(version, pattern) for pattern in settings.allowed):
        return result(ctx, Status.OK, f"driver {version} is allowed", driver=version)
    return result(
        ctx,
        Status.FAIL,
        f"driver {version} is not in the allowed list ({', '.join(settings.allowed)})",
        Action.INSPECT,
        driver=version,
        allowed=list(settings.allowed),
    )


def _matches(version: str, pattern: str) -> bool:
    if pattern.endswith("*"):
        return version.startswith(pattern[:-1])
    if pattern.endswith("."):
        return version.startswith(pattern)
    return version == pattern
