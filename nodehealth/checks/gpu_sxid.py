"""No fatal NVSwitch SXid since boot; non-fatal SXids per NVSwitch below their rate.

HGX nodes fail through their NVSwitches: the NVSwitch driver logs
``nvidia-nvswitch<N>: SXid (PCI:<switch>): <sxid>, Fatal|Non-fatal, Link <L> ...``. The lines come
through the kernel-log pipeline of the XID watch (the ``xid`` probe: the same reader, per-boot store
and follower, settings in ``[checks.gpu_xid]``), as events of kind ``sxid`` (``nodehealth.xid.sxid``);
this check judges them and ``gpu_xid`` leaves them.

Why these defaults (on by default, like gpu_xid):
- A fatal SXid (the line says "Fatal", or the SXid is in the "always fatal" table of NVIDIA's Fabric
  Manager User Guide, DU-09883-001) stalls NVLink traffic through that NVSwitch until the NVSwitches and
  GPUs are reset (on bare metal: a reboot); the next multi-GPU job hangs or fails. FAIL, action reboot,
  this boot only: the reboot is the repair and a new boot starts a new store.
- Non-fatal SXids (single-bit ECC corrected by the switch, a replayed flit) are counted and WARN only
  when one NVSwitch logs more than ``nonfatal_max_events`` within ``nonfatal_window_s``. NVIDIA gives no
  rate; GPUd marks some non-fatal SXids for a reboot, we never drain on them unless the site says so
  (``severity_overrides``, e.g. ``"12028=drain"``).
- A node without NVSwitches logs no SXid: OK ("no NVSwitch SXid since boot"), never a drain.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

from nodehealth.checks.base import CheckSettings, Context, kernel_log_data, setting
from nodehealth.model import Action, CheckResult, Finding, Status, fold
from nodehealth.observations import Observations, XidRecord
from nodehealth.observations.record import record
from nodehealth.xid.catalog import sxid_catalog_for
from nodehealth.xid.events import Severity
from nodehealth.xid.sxid import KIND_SXID, SxidCatalog, judge_sxid, link_of
from nodehealth.xid.text import printable

# The drain reason's code (``nh:<code>``, a published contract: never changes meaning) and what it says.
REASON = (
    "sxid",
    "a fatal NVSwitch SXid since boot (the NVSwitch's PCI address and the SXid in the summary); "
    "or the kernel log not read (policy.unknown = fail)",
)

DETAIL_EVENTS = 50  # the most recent SXid events listed in the result's details


@record
class Settings(CheckSettings):
    nonfatal_max_events: int = setting(
        20,
        "WARN when one NVSwitch logs more non-fatal SXids than this within nonfatal_window_s (not a drain)",
        unit="events",
        min=0,
        max=100000,
    )
    nonfatal_window_s: float = setting(3600.0, "window of the non-fatal SXid rate", unit="s", min=1)
    severity_overrides: tuple[str, ...] = setting(
        (),
        'the site\'s severity per SXid, "SXID=severity" with severity warning or drain, e.g. ["12028=drain"]; '
        "replaces the line's Fatal/Non-fatal and the catalog's class (nodehealth/data/sxid_catalog.toml)",
    )

    def validate(self) -> None:
        sxid_catalog_for(tuple(self.severity_overrides))  # ValueError names the bad entry


def _switch(record: XidRecord) -> str:
    pci = record.event.pci
    return f"NVSwitch {printable(pci)}" if pci else "NVSwitch (unnamed)"


def _describe(records: Sequence[XidRecord], catalog: SxidCatalog) -> str:
    by_sxid: dict[int, list[XidRecord]] = {}
    for r in records:
        by_sxid.setdefault(r.event.xid, []).append(r)
    parts = []
    for sxid, group in by_sxid.items():
        name = catalog.name(sxid)
        text = f"SXid {sxid}" + (f" {printable(name)}" if name != "UNKNOWN" else "")
        links = sorted({n for n in (link_of(r.event) for r in group) if n is not None})
        if links:
            text += f" (link {', '.join(str(n) for n in links)})"
        if len(group) > 1:
            text += f" x{len(group)}"
        parts.append(text)
    return ", ".join(parts)


def _t(record: XidRecord) -> Optional[float]:
    return record.at if record.at is not None else record.event.uptime_s


def _most_within(records: Sequence[XidRecord], window_s: float) -> int:
    """The most events of ``records`` inside any one window of ``window_s`` (events without a time: all)."""
    times = sorted(t for t in (_t(r) for r in records) if t is not None)
    untimed = len(records) - len(times)
    best, lo = 0, 0
    for hi, t in enumerate(times):
        while t - times[lo] > window_s:
            lo += 1
        best = max(best, hi - lo + 1)
    return best + untimed


def _counts(fatal: dict[str, list[XidRecord]], nonfatal: dict[str, list[XidRecord]]) -> dict[str, dict[str, int]]:
    """Events this boot per NVSwitch PCI address and class (``fatal``, ``non_fatal``): the metric's values."""
    out: dict[str, dict[str, int]] = {}
    for klass, groups in (("fatal", fatal), ("non_fatal", nonfatal)):
        for group in groups.values():
            pci = printable(group[0].event.pci) if group[0].event.pci else "unknown"
            out.setdefault(pci, {})[klass] = len(group)
    return out


def _record_json(record: XidRecord) -> dict[str, Any]:
    data = record.event.to_json()
    data["sxid"] = data.pop("xid")
    for key in ("gpu", "gpu_uuid", "pid", "process", "job_id"):
        data.pop(key, None)
    data["link"] = link_of(record.event)
    data["at"] = record.at
    return data


def evaluate(obs: Observations, settings: Settings, ctx: Context) -> CheckResult:
    x = kernel_log_data(obs.xid, ctx, "SXids")
    if isinstance(x, CheckResult):
        return x
    catalog = sxid_catalog_for(tuple(settings.severity_overrides))
    records = [r for r in x.records if r.event.kind == KIND_SXID and r.current_boot]
    fatal: dict[str, list[XidRecord]] = {}
    nonfatal: dict[str, list[XidRecord]] = {}
    for r in records:
        severity, _ = judge_sxid(r.event, catalog)
        (fatal if severity == Severity.DRAIN else nonfatal).setdefault(_switch(r), []).append(r)

    findings = [
        Finding(Status.FAIL, f"{where}: fatal {_describe(group, catalog)}: reboot the node", Action.REBOOT)
        for where, group in fatal.items()
    ]
    for where, group in nonfatal.items():
        most = _most_within(group, settings.nonfatal_window_s)
        if most > settings.nonfatal_max_events:
            findings.append(
                Finding(
                    Status.WARN,
                    f"{where}: {most} non-fatal SXids within {settings.nonfatal_window_s:g} s (more than "
                    f"{settings.nonfatal_max_events}): {_describe(group, catalog)}; look at the NVSwitch",
                    Action.INSPECT,
                )
            )
    if not x.complete:
        why = x.notes[0] if x.notes else "the kernel log was not read to its end before the deadline"
        findings.append(Finding(Status.UNKNOWN, f"kernel log not fully read: {why}"))
    details: dict[str, Any] = {
        "boot_id": x.boot_id,
        "sxid_events_this_boot": len(records),
        "fatal_events": sum(len(g) for g in fatal.values()),
        "switches": sorted(set(fatal) | set(nonfatal)),
        "counts": _counts(fatal, nonfatal),
        "events": [_record_json(r) for r in records[-DETAIL_EVENTS:]],
    }
    if not records:
        ok = "no NVSwitch SXid since boot"
    else:
        ok = f"{len(records)} non-fatal NVSwitch SXid(s) since boot, below the rate"
    return fold(ctx.name, findings, ok, details)
