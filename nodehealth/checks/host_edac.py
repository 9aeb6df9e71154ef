"""Host memory: the EDAC memory controllers report no uncorrected (and few corrected) memory errors.

Counts are the kernel's since boot (``/sys/devices/system/edac/mc/mc*``). Default WARN only: an
uncorrected error the node survived (the page was taken offline) is worth a person's look, and a site
decides whether it drains (``ue_status = "fail"``, action inspect). Corrected errors are not judged by
default: mcelog's published DIMM threshold is 10 in 24 h (mcelog.org/config.html), a rate, while these
counters cover the whole uptime; ``ce_warn`` sets a count. No EDAC driver is SKIPPED, never OK.
"""

from __future__ import annotations

from nodehealth.checks.base import CheckSettings, Context, probe_data, result, setting
from nodehealth.model import Action, CheckResult, Finding, Status, fold
from nodehealth.observations import Observations
from nodehealth.observations.record import record

# The drain reason's code (``nh:<code>``, a published contract: never changes meaning) and what it says.
REASON = ("edac", "host memory errors reported by an EDAC memory controller")


@record
class Settings(CheckSettings):
    ue_warn: int = setting(
        1,
        "report (as ue_status says) a controller with at least this many uncorrected errors since boot; "
        "0 = not checked",
        min=0,
        max=100000,
    )
    ce_warn: int = setting(
        0,
        "WARN for a controller with at least this many corrected errors since boot; 0 = not checked",
        min=0,
        max=100000,
    )
    ue_status: str = setting(
        "warn",
        "what an uncorrected-error finding is: warn (reported, no drain) or fail (drain, action inspect)",
        choices=("warn", "fail"),
    )


def evaluate(obs: Observations, settings: Settings, ctx: Context) -> CheckResult:
    edac = probe_data(obs.edac, ctx, "cannot read EDAC counters", "EDAC counters were not probed")
    if isinstance(edac, CheckResult):
        return edac
    if not edac.loaded or not edac.controllers:
        return result(ctx, Status.SKIPPED, "does not apply: no EDAC memory controller (driver not loaded?)")
    findings: list[Finding] = []
    bad = Status.FAIL if settings.ue_status == "fail" else Status.WARN
    for mc in edac.controllers:
        if mc.error is not None:
            findings.append(Finding(Status.UNKNOWN, f"{mc.name}: {mc.error}"))
        where = "".join(f"; {label}: {ce} CE, {ue} UE" for label, ce, ue in mc.dimms)
        if settings.ue_warn and mc.ue is not None and mc.ue >= settings.ue_warn:
            findings.append(
                Finding(bad, f"{mc.name}: {mc.ue} uncorrected memory error(s) since boot{where}", Action.INSPECT)
            )
        if settings.ce_warn and mc.ce is not None and mc.ce >= settings.ce_warn:
            findings.append(
                Finding(Status.WARN, f"{mc.name}: {mc.ce} corrected memory error(s) since boot{where}", Action.INSPECT)
            )
    details = {"controllers": {mc.name: {"ce": mc.ce, "ue": mc.ue} for mc in edac.controllers}}
    ce = sum(mc.ce or 0 for mc in edac.controllers)
    return fold(
        ctx.name,
        findings,
        f"{len(edac.controllers)} memory controller(s): no uncorrected error, {ce} corrected",
        details,
    )
