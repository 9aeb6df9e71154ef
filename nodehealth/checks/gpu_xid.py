"""No drain-class XID since boot; application XIDs below their rate; the kernel log readable."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Optional

from nodehealth.checks.base import Context, result
from nodehealth.model import Action, CheckResult, Finding, Status, fold, worst_action
from nodehealth.observations import NvmlSnapshot, Observations, ProbeError, XidObservation, XidRecord
from nodehealth.xid.attribution import attribute, gpu_at, gpu_map
from nodehealth.xid.catalog import application_xid_bursts
from nodehealth.xid.events import Severity
from nodehealth.xid.settings import XidSettings
from nodehealth.xid.text import printable

DETAIL_EVENTS = 50  # the most recent events listed in the result's details

# The [checks.gpu_xid] keys: declared once, in nodehealth.xid.settings (the probe and the
# daemon's follower read the same table).
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
        findings.append((Finding(status, f"{where}: {_describe(group)}", action, group[-1].event.gpu),
                         lead_xid(group)))
    return findings


def _record_json(record: XidRecord) -> dict[str, Any]:
    data = record.event.to_json()  # its text printable and bounded
    data["boot_id"] = printable(record.boot_id)
    data["at"] = record.at
    data["current_boot"] = record.current_boot
    return data


def evaluate(obs: Observations, settings: Settings, ctx: Context) -> CheckResult:
    x = obs.xid
    if x is None:
        return result(ctx, Status.UNKNOWN, "the kernel log was not read")
    if isinstance(x, ProbeError):
        if x.kind == "unavailable":
            return result(ctx, Status.SKIPPED, f"does not apply: {x.message}")
        return result(ctx, Status.UNKNOWN, f"cannot watch XIDs: {x.message}", error_kind=x.kind)
    return judge(x, obs.nvml, settings, ctx)


def judge(x: XidObservation, nvml: Optional[object], settings: Settings, ctx: Context) -> CheckResult:
    """The verdict on one XID observation (GPU index and UUID from ``nvml`` when it is a snapshot)."""
    gpus = gpu_map(nvml.gpus) if isinstance(nvml, NvmlSnapshot) else {}
    records = [XidRecord(attribute(r.event, gpus, x.ledger, r.at), r.boot_id, r.at, r.current_boot)
               for r in x.records]
    now = x.gathered_at
    this_boot = [r for r in records if r.current_boot]
    drain = [r for r in records if r.event.severity == Severity.DRAIN and _within(r, now, settings.window_s)]
    warning = [r for r in this_boot
               if r.event.severity == Severity.WARNING and _within(r, now, settings.warning_window_s)]
    app_xids = {r.event.xid for r in this_boot if r.event.severity == Severity.APPLICATION}
    bursts = application_xid_bursts(
        [r.event for r in this_boot], max_events=settings.application_max_events,
        window_s=settings.application_window_s, application_xids=app_xids) if app_xids else []

    named = _findings(drain, Status.FAIL) + _findings(warning, Status.WARN)
    findings = [f for f, _ in named]
    for b in bursts:
        found = gpu_at(b.pci, gpus)
        index = found[0] if found is not None else None
        pci = printable(b.pci) if b.pci else None
        where = f"GPU {index} ({pci})" if index is not None else f"GPU {pci or '(unnamed)'}"
        xids = ", ".join(str(n) for n in b.xids)
        findings.append(Finding(
            Status.WARN, f"{where}: {b.count} application XIDs ({xids}) within {b.window_s:g} s "
            f"(more than {b.max_events}): look at the jobs and the GPU", Action.INSPECT, index))
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
