"""No process sits in uninterruptible sleep (D state) holding a GPU device (/dev/nvidia*).

Such a process cannot be killed: the GPU cannot be reset and the next job finds it taken; only a reboot
ends it (gpud PR #1299 escalates persistent ones to reboot). The probe looks twice, ``confirm_s`` apart,
and keeps only a process still in D state with the same start time: a moment in D state during an I/O
is normal. Default WARN (action reboot, no drain) until a site sets ``status = "fail"``: how long is
"stuck" has no published figure beyond gpud's count of consecutive checks.
"""

from __future__ import annotations

from nodehealth.checks.base import CheckSettings, Context, probe_data, setting
from nodehealth.model import Action, CheckResult, Finding, Status, fold
from nodehealth.observations import Observations
from nodehealth.observations.record import record

# The drain reason's code (``nh:<code>``, a published contract: never changes meaning) and what it says.
REASON = ("dstate", "a process stuck in D state holds a GPU device")


@record
class Settings(CheckSettings):
    confirm_s: float = setting(
        1.0,
        "seconds between the two looks; only a process in D state in both counts (paid only when one is found)",
        unit="s",
        min=0,
        max=30,
    )
    status: str = setting(
        "warn",
        "what a stuck holder is: warn (reported, no drain) or fail (drain, action reboot)",
        choices=("warn", "fail"),
    )


def evaluate(obs: Observations, settings: Settings, ctx: Context) -> CheckResult:
    found = probe_data(obs.dstate, ctx, "cannot scan processes", "processes were not probed")
    if isinstance(found, CheckResult):
        return found
    bad = Status.FAIL if settings.status == "fail" else Status.WARN
    findings = [
        Finding(
            bad,
            f"pid {p.pid} ({p.comm}) in D state holding {', '.join(p.devices)}: cannot be killed; reboot to free it",
            Action.REBOOT,
        )
        for p in found.processes
    ]
    if not found.complete:
        findings.append(Finding(Status.UNKNOWN, found.note or "the process scan did not finish"))
    details = {"scanned": found.scanned, "pids": [p.pid for p in found.processes]}
    return fold(ctx.name, findings, f"{found.scanned} process(es): none in D state holding a GPU", details)
