"""``job_forensics`` (epilog): what happened to the node during the job that just ended (pure).

The ``job`` probe brings the job (id, GPUs, its start from the ledger, the ECC baseline the
prolog recorded); the ``nvml`` probe the counters at job end; the ``xid`` probe this boot's
XID events. FAIL: an uncorrectable ECC increment or a drain-class XID during the job; WARN:
corrected-only increments or a warning-class XID; SKIPPED outside a job or with nothing to
compare. The summary names the job, so the drain reason does.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping, Optional, Sequence

from nodehealth.checks.base import CheckSettings, Context
from nodehealth.model import Action, CheckResult, Finding, Status, fold
from nodehealth.observations import COUNTER_KEYS, JobObservation, Observations, ProbeError, gpu_counters
from nodehealth.observations.record import record

# The drain reason's code (``nh:<code>``, a published contract: never changes meaning) and what it says.
REASON = ("jobecc", "an uncorrectable ECC increment during the job that just ended; xidN: XID N during it")

NAME = "job_forensics"  # the result's name, and so the drain reason's ``nh:<code> GPU<i> job_forensics: ...``
FORENSICS = NAME


@record
class Settings(CheckSettings):
    """No keys of its own: what counts is the XID catalog's severity and the ECC counter kind."""


def evaluate(obs: Observations, settings: Settings, ctx: Context) -> CheckResult:
    job = obs.job
    if not isinstance(job, JobObservation):
        why = job.message if isinstance(job, ProbeError) else "no job"
        return CheckResult(ctx.name, Status.SKIPPED, f"not judged: {why}")
    return job_forensics(job.job_id, job.gpus, job.baseline, obs.nvml, obs.xid, job.start, job.now, job.boot_id)


_COUNTER_WORDS = {
    "volatile_uncorrected": "uncorrectable ECC error(s)",
    "remapped_uncorrectable": "row(s) remapped for uncorrectable errors",
    "volatile_corrected": "corrected ECC error(s)",
    "remapped_correctable": "row(s) remapped for correctable errors",
}


def _int(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _match(before: Mapping[str, Any], after: Mapping[str, Any], index: str) -> Optional[tuple[str, Mapping[str, Any]]]:
    """The after-reading of the GPU ``index`` had before: by UUID when both know it, else by index."""
    b = before.get(index)
    if not isinstance(b, Mapping):
        return None
    uuid = b.get("uuid")
    if uuid:
        for k, a in after.items():
            if isinstance(a, Mapping) and a.get("uuid") == uuid:
                return k, a
    a = after.get(index)
    if isinstance(a, Mapping) and not (uuid and a.get("uuid") and a.get("uuid") != uuid):
        return index, a
    return None


def ecc_increments(
    before: Mapping[str, Any], after: Mapping[str, Any], gpus: Optional[Sequence[int]]
) -> tuple[list[tuple[int, str, int, int]], list[str]]:
    """Counter increments on the job's GPUs: ``[(gpu, key, before, after)]`` and notes.

    A counter that went down (GPU reset or driver reload during the job) is not compared.
    """
    wanted = (
        sorted(before, key=lambda k: int(k) if k.isdigit() else 1 << 30) if gpus is None else [str(g) for g in gpus]
    )
    incs: list[tuple[int, str, int, int]] = []
    notes: list[str] = []
    for idx in wanted:
        if not idx.isdigit():
            continue
        if idx not in before:
            notes.append(f"GPU {idx}: no counters at job start")
            continue
        found = _match(before, after, idx)
        if found is None:
            notes.append(f"GPU {idx}: no counters at job end")
            continue
        at, a = found
        b = before[idx]
        for key, _ in COUNTER_KEYS:
            x, y = _int(b.get(key)), _int(a.get(key))
            if x is None or y is None:
                continue
            if y < x:
                notes.append(f"GPU {at}: {key} went from {x} to {y} (GPU reset or driver reload?); not compared")
            elif y > x:
                incs.append((int(at), key, x, y))
    return incs, notes


def _xid_in_job(rec: Any, job_id: str, gpus: Optional[Sequence[int]], start: Optional[float], end: float) -> bool:
    ev = rec.event
    if not rec.current_boot:
        return False
    if ev.job_id is not None:
        return str(ev.job_id) == job_id
    if start is None or rec.at is None or not (start <= rec.at <= end):
        return False
    return gpus is None or (ev.gpu is not None and ev.gpu in gpus)


def job_forensics(
    job_id: str,
    gpus: Optional[Sequence[int]],
    baseline: Optional[Mapping[str, Any]],
    nvml: Any,
    xid: Any,
    start: Optional[float],
    now: float,
    boot_id: Optional[str],
) -> CheckResult:
    """What happened to the node during job ``job_id``, judged at its end (pure).

    * ``baseline``: the counters recorded at job start (``counters_record``), or None.
    * ``nvml``: the epilog's ``NvmlSnapshot`` (else a ``ProbeError`` or None): counters at job end.
    * ``xid``: the epilog's ``XidObservation`` (else a ``ProbeError`` or None). An XID counts
      for the job when the event store attributed it to the job, or, unattributed, when it
      happened on one of the job's GPUs between ``start`` (the job's ledger start) and ``now``.

    FAIL: an uncorrectable ECC increment (volatile uncorrectable errors, rows remapped for
    uncorrectable errors) or a drain-class XID during the job. WARN: corrected-only
    increments or a warning-class XID. Application XIDs (the job's own faults) are listed in
    the details only. SKIPPED when there was nothing to compare. The summary names the job.
    """
    findings: list[Finding] = []
    xid_of: dict[int, int] = {}  # a finding's index -> the XID that names it (the drain reason's nh:xid<N>)
    notes: list[str] = []
    details: dict[str, Any] = {
        "job_id": job_id,
        "job_gpus": list(gpus) if gpus is not None else None,
        "job_start": start,
    }
    compared = False
    # ECC and row-remap counters.
    after_gpus = getattr(nvml, "gpus", None)
    if baseline is None:
        notes.append("no ECC baseline from job start")
    elif after_gpus is None:
        notes.append(f"no NVML reading at job end ({getattr(nvml, 'message', 'not read')})")
    elif baseline.get("boot_id") != boot_id:
        notes.append("the node rebooted during the job: ECC counters were reset, not compared")
    else:
        before = baseline.get("gpus")
        before = before if isinstance(before, Mapping) else {}
        incs, more = ecc_increments(before, gpu_counters(after_gpus), gpus)
        notes += more
        compared = True
        details["baseline"] = {"time": baseline.get("time"), "source": baseline.get("source")}
        details["ecc_increments"] = [{"gpu": g, "counter": k, "before": x, "after": y} for g, k, x, y in incs]
        per_gpu: dict[int, list[tuple[str, int, int]]] = {}
        for g, k, x, y in incs:
            per_gpu.setdefault(g, []).append((k, x, y))
        for g, items in sorted(per_gpu.items()):
            bad = [i for i in items if dict(COUNTER_KEYS)[i[0]]]
            text = ", ".join(f"+{y - x} {_COUNTER_WORDS[k]}" for k, x, y in (bad or items))
            if bad:
                findings.append(Finding(Status.FAIL, f"GPU {g}: {text} during the job", Action.RESET_GPU, g))
            else:
                findings.append(Finding(Status.WARN, f"GPU {g}: {text} during the job", Action.NONE, g))
    # XIDs.
    records = getattr(xid, "records", None)
    if records is None:
        notes.append(f"XIDs not watched ({getattr(xid, 'message', 'kernel log not read')})")
    else:
        from nodehealth.xid.attribution import attribute, gpu_map
        from nodehealth.xid.events import Severity

        compared = True
        where = gpu_map(after_gpus) if after_gpus is not None else {}
        ledger = getattr(xid, "ledger", ())
        mine = []
        for r in records:
            ev = attribute(r.event, where, ledger, r.at)
            r = replace(r, event=ev)
            if _xid_in_job(r, job_id, gpus, start, now):
                mine.append(r)
        details["xids"] = [
            {
                "xid": r.event.xid,
                "gpu": r.event.gpu,
                "pci": r.event.pci,
                "at": r.at,
                "severity": r.event.severity.value if r.event.severity else None,
                "action": r.event.action.value if r.event.action else None,
                "job_id": r.event.job_id,
            }
            for r in mine[-50:]
        ]
        for sev, status in ((Severity.DRAIN, Status.FAIL), (Severity.WARNING, Status.WARN)):
            group = [r for r in mine if r.event.severity == sev]
            by_gpu: dict[Optional[int], list[Any]] = {}
            for r in group:
                by_gpu.setdefault(r.event.gpu, []).append(r)
            for xg, rs in by_gpu.items():
                xids = ", ".join(str(n) for n in sorted({r.event.xid for r in rs}))
                label = f"GPU {xg}" if xg is not None else f"GPU {rs[-1].event.pci or '(unknown)'}"
                action = (
                    max((r.event.action or Action.REBOOT for r in rs), key=lambda a: a.rank)
                    if status == Status.FAIL
                    else Action.INSPECT
                )
                findings.append(Finding(status, f"{label}: XID {xids} during the job", action, xg))
                lead = max(enumerate(rs), key=lambda ir: ((ir[1].event.action or Action.REBOOT).rank, ir[0]))[1]
                xid_of[len(findings) - 1] = lead.event.xid
    if notes:
        details["notes"] = notes
    if not findings and not compared:
        return CheckResult(
            FORENSICS, Status.SKIPPED, f"job {job_id}: nothing to compare ({'; '.join(notes)})", details=details
        )
    res = fold(FORENSICS, findings, f"job {job_id}: no XID or ECC increment during the job", details)
    if res.status > Status.OK:
        res = replace(res, summary=f"job {job_id}: {res.summary}")
        worst = next(i for i, f in enumerate(findings) if f.status == res.status)  # fold's first of the worst
        if worst in xid_of:
            res = replace(res, details=dict(res.details, xid=xid_of[worst]))
    return res
