"""The reboot loop (``[slurm] reboot = "asap"``, opt-in): a reboot-class drain asks Slurm for the reboot.

After nodehealth drained the node for a fault whose action is reboot-class (``[resume]
reboot_actions``), ``after_drain`` asks Slurm to reboot it: ``scontrol reboot ASAP
nextstate=RESUME reason=<our reason> NODE``. Slurm runs ``RebootProgram`` once the node is idle and,
when slurmd registers after the boot, resumes it and clears the reason itself (Slurm 22.05:
meanwhile the reason reads "<ours> : reboot issued", and a node that does not register within
``ResumeTimeout`` goes DOWN, "reboot timed out"). So:

* the fault is gone after the boot: Slurm resumed the node, nothing more happens; the reboot stays
  counted for ``reboot_window_s``;
* the fault is still there: the next check drains again (the node is not drained any more: a new
  drain), which asks for the next reboot, until ``reboot_max`` reboots of that check within
  ``reboot_window_s``. The drain after that is **escalated**: no reboot, the reason becomes
  ``nh:inspect <check>: <N> reboots in <W>: <the fault's reason>``, and the drain record is held for
  a person (``flapping``: never resumed by nodehealth; a person resumes it by hand).

The count lives in ``reboots.json`` in the persistent dir (it must outlive the reboots it
counts): per check, the times reboots were asked (the newest ``MAX_TIMES``), and the escalation.
Pure decisions (``decide``, ``recent``, ``inspect_reason``) apart from the calls (``after_drain``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, Mapping, Optional, Sequence

from nodehealth.statedir import layout, slurmstate
from nodehealth.statedir.records import read_doc, update_doc

FILE_NAME = layout.REBOOTS
MAX_TIMES = 32  # reboots remembered per check ([slurm] reboot_max is at most 100, but a window rarely holds 32)
MAX_CHECKS = 64
INSPECT = "nh:inspect"


@dataclass(frozen=True)
class Decision:
    action: str  # "reboot", "escalate" or "none"
    why: str
    count: int = 0  # reboots of this check within the window, before this decision


def recent(times: Sequence[float], now: float, window_s: float) -> list[float]:
    """The times within ``window_s`` before ``now`` (a time in the future counts: the clock went back)."""
    return sorted(t for t in times if now - t < window_s)


def decide(
    mode: str,
    action: str,
    reboot_actions: Sequence[str],
    times: Sequence[float],
    now: float,
    reboot_max: int,
    window_s: float,
) -> Decision:
    """What a drain just made for a fault of ``action`` asks for, given the reboots of its check."""
    if mode != "asap":
        return Decision("none", "[slurm] reboot = off")
    if action not in reboot_actions:
        return Decision("none", f"action {action} is not reboot-class")
    n = len(recent(times, now, window_s))
    if n >= reboot_max:
        return Decision("escalate", f"{n} reboot(s) in {_span(window_s)} did not clear it: held for a person", n)
    return Decision("reboot", f"reboot {n + 1} of {reboot_max} allowed in {_span(window_s)}", n)


def _span(seconds: float) -> str:
    if seconds % 3600 == 0:
        return f"{int(seconds // 3600)} h"
    if seconds % 60 == 0:
        return f"{int(seconds // 60)} min"
    return f"{seconds:g} s"


def inspect_reason(reason: str, check: str, count: int, window_s: float, limit: int) -> str:
    """``nh:inspect <check>: N reboots in W: <reason>``, cut to ``limit``: the first 20 characters
    (``sinfo -R``) say it is for a person."""
    head = f"{INSPECT} {check}: {count} reboots in {_span(window_s)}: "
    return (head + reason)[:limit]


def times_of(doc: Mapping[str, Any], check: str) -> list[float]:
    checks = doc.get("checks")
    raw = checks.get(check) if isinstance(checks, Mapping) else None
    if not isinstance(raw, list):
        return []
    return [
        float(t) for t in raw[-MAX_TIMES:] if isinstance(t, (int, float)) and not isinstance(t, bool) and 0 < t < 1e12
    ]


def escalated(doc: Mapping[str, Any]) -> dict[str, Any]:
    """check -> the escalation recorded ({time, reason, count}) for the checks held for a person."""
    raw = doc.get("escalated")
    if not isinstance(raw, Mapping):
        return {}
    return {k: v for k, v in list(raw.items())[:MAX_CHECKS] if isinstance(k, str) and isinstance(v, Mapping)}


def status(cfg: Any, node: str) -> tuple[Optional[int], Optional[bool]]:
    """(reboots asked within the window, our drain held after them) for the metrics; (None, None)
    with ``[slurm] reboot = "off"`` and nothing recorded."""
    doc = load(cfg.paths)
    if cfg.slurm.reboot == "off" and not doc:
        return None, None
    now = time.time()
    checks = doc.get("checks")
    names = [k for k in checks if isinstance(k, str)] if isinstance(checks, Mapping) else []
    asked = sum(len(recent(times_of(doc, k), now, cfg.slurm.reboot_window_s)) for k in names)
    rec = slurmstate.load(cfg.paths).drain
    held = rec is not None and any(e.get("reason") == rec.reason for e in escalated(doc).values())
    return asked, held


def load(paths: Any) -> dict[str, Any]:
    return read_doc(paths, FILE_NAME)


def after_drain(actor: Any, check: str, action: str, reason: str) -> Optional[str]:
    """Right after ``act.on_fault`` drained ``actor.node`` for ``check`` (``reason``): ask for the
    reboot, or escalate. Returns what was done ("reboot", "escalate") or None."""
    cfg = actor.cfg
    s = cfg.slurm
    doc = load(cfg.paths)
    now = time.time()
    d = decide(s.reboot, action, cfg.resume.reboot_actions, times_of(doc, check), now, s.reboot_max, s.reboot_window_s)
    if d.action == "none":
        return None
    if d.action == "escalate":  # also over a flapping hold: the reason then says the reboots did not help
        return _escalate(actor, check, reason, d, now)
    rec = actor.load().drain
    if rec is not None and rec.flapping:  # a reboot with nextstate=RESUME would lift a hold for a person
        actor.log(f"no reboot asked for {actor.node}: its drain is held for a person ({rec.reason})")
        return None
    out = actor.client.reboot(actor.node, reason)
    if not out.ok:
        actor.log(
            f"reboot of {actor.node} not asked ({out.message}); the drain waits for a person or a boot", notable=True
        )
        return None

    def count(doc: dict[str, Any]) -> dict[str, Any]:
        checks = (
            {k: v for k, v in (doc.get("checks") or {}).items() if isinstance(k, str)}
            if isinstance(doc.get("checks"), Mapping)
            else {}
        )
        checks[check] = (recent(times_of(doc, check), now, s.reboot_window_s) + [now])[-MAX_TIMES:]
        doc["checks"] = dict(list(checks.items())[-MAX_CHECKS:])
        esc = escalated(doc)
        esc.pop(check, None)
        doc["escalated"] = esc
        doc["pending"] = {"boot_id": actor.boot_id, "time": now, "check": check}
        return doc

    _write(actor, count)
    actor.log(f"asked Slurm to reboot {actor.node} (ASAP, nextstate=RESUME): {d.why}", notable=True)
    return "reboot"


def after_boot(cfg: Any, boot_id: Optional[str], log: Any) -> bool:
    """Where the faces and the daemon build their client: the first run on a new boot after a reboot we
    asked for forgets the cached Slurm view of this node. It shows the node drained by us (or Slurm's
    "reboot issued"), but Slurm resumes the node itself when it registers (nextstate=RESUME): trusted
    for up to ``[slurm] reconcile_s``, it would pass for our drain while the node takes jobs with the
    fault still there. True when it did."""
    doc = load(cfg.paths)
    pending = doc.get("pending")
    if not isinstance(pending, Mapping) or boot_id is None or pending.get("boot_id") == boot_id:
        return False
    try:
        update_doc(cfg.paths, FILE_NAME, lambda d: dict(d, pending=None))
    except OSError as exc:
        log(f"cannot write the reboot count: {exc}", notable=True)
        return False
    slurmstate.update(
        cfg.paths, lambda s: replace(s, slurm_node=dict(s.slurm_node, time=None)) if s.slurm_node else s, 0.5, log
    )
    log(
        "booted since the reboot nodehealth asked for: reading this node from Slurm again (it resumes the "
        "node itself once slurmd registers)"
    )
    return True


def _escalate(actor: Any, check: str, reason: str, d: Decision, now: float) -> Optional[str]:
    cfg = actor.cfg
    text = inspect_reason(reason, check, d.count, cfg.slurm.reboot_window_s, cfg.drain.reason_max_len)
    out = actor.client.update(actor.node, "drain", text)
    if not out.ok:
        actor.log(f"escalation of {actor.node} not written ({out.message}): {d.why}", notable=True)
        return None

    def hold(s: slurmstate.State) -> slurmstate.State:
        if s.drain is None:
            return s
        return replace(s, drain=replace(s.drain, reason=text, flapping=True))

    actor.save(hold)

    def mark(doc: dict[str, Any]) -> dict[str, Any]:
        esc = escalated(doc)
        esc[check] = {"time": now, "count": d.count, "reason": text}
        doc["escalated"] = dict(list(esc.items())[-MAX_CHECKS:])
        return doc

    _write(actor, mark)
    actor.log(f"drained {actor.node} for a person: {text} ({d.why}; no reboot asked)", notable=True)
    return "escalate"


def _write(actor: Any, change: Any) -> None:
    try:
        actor.update_doc(FILE_NAME, change)  # the state dir, or a preview's memory
    except OSError as exc:
        actor.log(f"cannot write the reboot count: {exc}", notable=True)
