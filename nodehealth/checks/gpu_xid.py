"""No drain-class XID since boot; application XIDs below their rate; the kernel log readable.

The check owns the ``[checks.gpu_xid]`` table (``XidSettings``, read through ``xid_settings(cfg)``):
the judging windows (here), where the kernel log is and how the event store is bounded (the ``xid``
probe and the daemon's follower, ``nodehealth.probes.xid_store``), the severity overrides (all of
them). Each key is declared once; the config loader, the sample config and ``nodehealth config
defaults`` read it from here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Optional, Protocol

from nodehealth.checks.base import CheckSettings, Context, kernel_log_data, setting
from nodehealth.model import Action, CheckResult, Finding, Status, fold, worst_action
from nodehealth.observations import NvmlSnapshot, Observations, XidObservation, XidRecord
from nodehealth.observations.record import record
from nodehealth.xid.attribution import attribute, gpu_at, gpu_map
from nodehealth.xid.catalog import application_xid_bursts, catalog_for
from nodehealth.xid.events import Severity
from nodehealth.xid.history import DEFAULT_MAX_EVENTS
from nodehealth.xid.patterns import KMSG_PATH
from nodehealth.xid.sxid import KIND_SXID
from nodehealth.xid.text import printable

# The drain reason's code (``nh:<code>``, a published contract: never changes meaning) and what it says.
REASON = ("xid", "xidN: a drain-class XID number N; xid alone: the kernel log not read (policy.unknown = fail)")

DETAIL_EVENTS = 50  # the most recent events listed in the result's details

CHECK = "gpu_xid"  # the check, and its config table [checks.gpu_xid]


class HasChecks(Protocol):
    """What ``xid_settings`` needs of a configuration (``nodehealth.config.schema.Config``).

    A protocol, not the class: the config schema imports the registry, which imports the check
    that imports this module.
    """

    @property
    def checks(self) -> Mapping[str, CheckSettings]: ...


@record
class XidSettings(CheckSettings):
    window_s: float = setting(
        0.0,
        "FAIL on drain-class XIDs this recent; 0 = every one since boot (until a reboot clears "
        "it, or `nodehealth xid clear`)",
        unit="s",
        min=0,
    )
    warning_window_s: float = setting(
        86400.0, "WARN on warning-class XIDs this recent; 0 = every one since boot", unit="s", min=0
    )
    severity_overrides: tuple[str, ...] = setting(
        (),
        'the site\'s severity per XID, "XID=severity" with severity application, warning or '
        'drain, e.g. ["63=drain", "94=application"]; replaces the catalog\'s (docs/xid.md)',
    )
    application_max_events: int = setting(
        20,
        "WARN when one GPU logs more application XIDs (13, 31, 43, 45) than this within application_window_s",
        unit="events",
        min=0,
        max=100000,
    )
    application_window_s: float = setting(3600.0, "window of the application-XID rate", unit="s", min=1)
    kmsg_path: str = setting(KMSG_PATH, "kernel log device the XID watch reads")
    kernel_facility_only: bool = setting(
        True,
        "count only kernel-facility records of the live kernel log (/dev/kmsg, the journal): "
        "the kernel gives every record written from user space (a forwarder, journald's "
        "ForwardToKMsg=, a test) another facility; false also counts those",
    )
    store_max_events: int = setting(
        DEFAULT_MAX_EVENTS,
        "most XID events the event store keeps (oldest non-drain events go first)",
        unit="events",
        min=10,
        max=100000,
    )

    def validate(self) -> None:
        catalog_for(tuple(self.severity_overrides))  # ValueError names the bad entry


def xid_settings(cfg: HasChecks) -> XidSettings:
    """The ``[checks.gpu_xid]`` settings of ``cfg`` (the defaults when the table is absent)."""
    found = cfg.checks.get(CHECK)
    if found is None:
        return XidSettings()
    if not isinstance(found, XidSettings):
        raise TypeError(f"[checks.{CHECK}] holds {type(found).__name__}, not XidSettings")
    return found


Settings = XidSettings


def _within(record: XidRecord, now: float, window_s: float) -> bool:
    return window_s <= 0 or record.at is None or now - record.at <= window_s


def _where(record: XidRecord) -> str:
    ev = record.event
    pci = printable(ev.pci) if ev.pci else "unknown PCI address"
    return f"GPU {ev.gpu} ({pci})" if ev.gpu is not None else f"GPU {pci}"


def _describe(records: Sequence[XidRecord]) -> str:
    by_xid: dict[int, list[XidRecord]] = {}
    for r in records:
        by_xid.setdefault(r.event.xid, []).append(r)
    parts = []
    for xid, group in by_xid.items():
        ev = group[-1].event
        text = f"XID {xid}"
        if ev.mnemonic and ev.mnemonic != "UNKNOWN":
            text += f" {printable(ev.mnemonic)}"
        if len(group) > 1:
            text += f" x{len(group)}"
        jobs = sorted({printable(r.event.job_id) for r in group if r.event.job_id is not None})
        if jobs:
            text += f" (job {', '.join(jobs)})"
        if not any(r.current_boot for r in group):
            text += " (earlier boot; `nodehealth xid clear` once repaired)"
        parts.append(text)
    return ", ".join(parts)


def _grouped(records: Sequence[XidRecord]) -> dict[str, list[XidRecord]]:
    out: dict[str, list[XidRecord]] = {}
    for r in records:
        out.setdefault(_where(r), []).append(r)
    return out


def lead_xid(records: Sequence[XidRecord]) -> int:
    """The XID a finding of ``records`` is named by: the one with the most invasive action, the latest."""
    rank = [((r.event.action or Action.INSPECT).rank, i) for i, r in enumerate(records)]
    return records[max(rank)[1]].event.xid


def _findings(records: Sequence[XidRecord], status: Status) -> list[tuple[Finding, Optional[int]]]:
    """One finding per GPU, with the XID that names it (the drain reason's ``nh:xid<N>``)."""
    findings: list[tuple[Finding, Optional[int]]] = []
    for where, group in _grouped(records).items():
        action = worst_action([r.event.action or Action.INSPECT for r in group])
        findings.append((Finding(status, f"{where}: {_describe(group)}", action, group[-1].event.gpu), lead_xid(group)))
    return findings


def _record_json(record: XidRecord) -> dict[str, Any]:
    data = record.event.to_json()  # its text printable and bounded
    data["boot_id"] = printable(record.boot_id)
    data["at"] = record.at
    data["current_boot"] = record.current_boot
    return data


def evaluate(obs: Observations, settings: Settings, ctx: Context) -> CheckResult:
    x = kernel_log_data(obs.xid, ctx, "XIDs")
    if isinstance(x, CheckResult):
        return x
    return judge(x, obs.nvml, settings, ctx)


def judge(x: XidObservation, nvml: Optional[object], settings: Settings, ctx: Context) -> CheckResult:
    """The verdict on one XID observation (GPU index and UUID from ``nvml`` when it is a snapshot)."""
    gpus = gpu_map(nvml.gpus) if isinstance(nvml, NvmlSnapshot) else {}
    records = [
        XidRecord(attribute(r.event, gpus, x.ledger, r.at), r.boot_id, r.at, r.current_boot)
        for r in x.records
        if r.event.kind != KIND_SXID  # an NVSwitch's, judged by gpu_sxid
    ]
    now = x.gathered_at
    this_boot = [r for r in records if r.current_boot]
    drain = [r for r in records if r.event.severity == Severity.DRAIN and _within(r, now, settings.window_s)]
    warning = [
        r for r in this_boot if r.event.severity == Severity.WARNING and _within(r, now, settings.warning_window_s)
    ]
    app_xids = {r.event.xid for r in this_boot if r.event.severity == Severity.APPLICATION}
    bursts = (
        application_xid_bursts(
            [r.event for r in this_boot],
            max_events=settings.application_max_events,
            window_s=settings.application_window_s,
            application_xids=app_xids,
        )
        if app_xids
        else []
    )

    named = _findings(drain, Status.FAIL) + _findings(warning, Status.WARN)
    findings = [f for f, _ in named]
    for b in bursts:
        found = gpu_at(b.pci, gpus)
        index = found[0] if found is not None else None
        pci = printable(b.pci) if b.pci else None
        where = f"GPU {index} ({pci})" if index is not None else f"GPU {pci or '(unnamed)'}"
        xids = ", ".join(str(n) for n in b.xids)
        findings.append(
            Finding(
                Status.WARN,
                f"{where}: {b.count} application XIDs ({xids}) within {b.window_s:g} s "
                f"(more than {b.max_events}): look at the jobs and the GPU",
                Action.INSPECT,
                index,
            )
        )
    if not x.complete:
        why = x.notes[0] if x.notes else "the kernel log was not read to its end before the deadline"
        findings.append(Finding(Status.UNKNOWN, f"kernel log not fully read: {why}"))

    details: dict[str, Any] = {
        "boot_id": x.boot_id,
        "events_this_boot": len(this_boot),
        "events_earlier_boots": len(records) - len(this_boot),
        "drain_events": len(drain),
        "kmsg_seq": x.kmsg_seq,
        "last_clear": x.last_clear,
        "events": [_record_json(r) for r in records[-DETAIL_EVENTS:]],
    }
    if x.notes:
        details["notes"] = list(x.notes)
    if x.skipped_lines:
        details["skipped_lines"] = x.skipped_lines
    if not this_boot:
        ok = "no XID since boot" if x.last_clear is None else "no XID since boot or the last `nodehealth xid clear`"
    else:
        ok = f"{len(this_boot)} XID event(s) since boot, none needing action"
    res = fold(ctx.name, findings, ok, details)
    # The XID of the worst finding (fold's first of the worst status), for the reason's code.
    lead = next((x for f, x in named if f.status == res.status), None) if res.status > Status.OK else None
    if lead is not None:
        res = replace(res, details=dict(res.details, xid=lead))
    return res
