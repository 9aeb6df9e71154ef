"""PCIe AER: the GPUs, NVSwitches and network controllers (and the ports above them) report no link errors.

Counts are the kernel's since boot (``aer_dev_*``, Linux 4.19+), at the device and at its link partner.
Default WARN only, never a drain: no anchor publishes a sourced threshold for these files (DCGM watches
NVML's PCIe replay counter, not AER), and a fatal or non-fatal uncorrectable error the
kernel recovered from leaves its count until reboot. ``uncorrectable_status = "fail"`` drains (action
inspect) for a site that has decided; correctable errors (the link's replays fixed them) are counted
and shown, judged only past ``correctable_warn``.
"""

from __future__ import annotations

from nodehealth.checks.base import CheckSettings, Context, probe_data, result, setting
from nodehealth.model import Action, CheckResult, Finding, Status, fold
from nodehealth.observations import Observations
from nodehealth.observations.host_errors import AerDevice
from nodehealth.observations.record import record

# The drain reason's code (``nh:<code>``, a published contract: never changes meaning) and what it says.
REASON = ("aer", "PCIe AER errors on a GPU, NVSwitch or network controller link")


@record
class Settings(CheckSettings):
    fatal_warn: int = setting(
        1,
        "report (as uncorrectable_status says) a device with at least this many fatal uncorrectable errors "
        "since boot; 0 = not checked",
        min=0,
        max=100000,
    )
    nonfatal_warn: int = setting(
        1,
        "report (as uncorrectable_status says) a device with at least this many non-fatal uncorrectable "
        "errors since boot; 0 = not checked",
        min=0,
        max=100000,
    )
    correctable_warn: int = setting(
        0,
        "WARN for a device with at least this many correctable errors since boot; 0 = not checked "
        "(healthy links log some; no published threshold)",
        min=0,
        max=100000,
    )
    uncorrectable_status: str = setting(
        "warn",
        "what a fatal or non-fatal finding is: warn (reported, no drain) or fail (drain, action inspect)",
        choices=("warn", "fail"),
    )
    upstream: bool = setting(True, "also read the port above each device (its link partner counts its errors)")


def evaluate(obs: Observations, settings: Settings, ctx: Context) -> CheckResult:
    aer = probe_data(obs.pcie_aer, ctx, "cannot read PCIe AER counters", "PCIe AER counters were not probed")
    if isinstance(aer, CheckResult):
        return aer
    if not aer.devices and aer.complete:
        return result(ctx, Status.SKIPPED, "does not apply: no GPU, NVSwitch or network controller on the PCI bus")
    counted = [d for d in aer.devices if (d.correctable, d.nonfatal, d.fatal) != (None, None, None)]
    findings: list[Finding] = []
    for dev in aer.devices:
        findings.extend(_judge(dev, settings))
    if not aer.complete:
        findings.append(Finding(Status.UNKNOWN, "not every device was read before the deadline"))
    if not counted and not findings:
        return result(
            ctx,
            Status.SKIPPED,
            f"does not apply: no AER counters on {len(aer.devices)} device(s) (kernel before 4.19 or AER off)",
        )
    details = {
        "devices": {
            d.bus_id: {"kind": d.kind, "correctable": d.correctable, "nonfatal": d.nonfatal, "fatal": d.fatal}
            for d in counted
        }
    }
    return fold(ctx.name, findings, f"{len(counted)} device(s) with AER counters: no uncorrectable error", details)


def _judge(dev: AerDevice, settings: Settings) -> list[Finding]:
    name = f"{dev.bus_id} ({dev.kind})"
    out = []
    if dev.error is not None:
        out.append(Finding(Status.UNKNOWN, f"{name}: {dev.error}"))
    bad = Status.FAIL if settings.uncorrectable_status == "fail" else Status.WARN
    which = ", ".join(f"{n} {c}" for n, c in dev.by_error if not n.startswith("correctable"))
    detail = f" ({which})" if which else ""
    if settings.fatal_warn and dev.fatal is not None and dev.fatal >= settings.fatal_warn:
        out.append(Finding(bad, f"{name}: {dev.fatal} fatal PCIe error(s) since boot{detail}", Action.INSPECT))
    if settings.nonfatal_warn and dev.nonfatal is not None and dev.nonfatal >= settings.nonfatal_warn:
        out.append(
            Finding(
                bad, f"{name}: {dev.nonfatal} non-fatal uncorrectable PCIe error(s) since boot{detail}", Action.INSPECT
            )
        )
    if settings.correctable_warn and dev.correctable is not None and dev.correctable >= settings.correctable_warn:
        out.append(
            Finding(Status.WARN, f"{name}: {dev.correctable} correctable PCIe error(s) since boot", Action.INSPECT)
        )
    return out
