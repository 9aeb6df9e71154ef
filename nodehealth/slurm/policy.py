"""What the Slurm faces decide, as pure functions: no I/O, no clock, no subprocess.

* Node states: ``scontrol show node -o`` lines (22.05 and later, and the old ``DOWN*``
  layout) and ``sinfo`` state words become a ``NodeInfo`` with a base state and flags.
* Ownership: a drain reason is ours when it starts with ``nodehealth:``; only such drains
  are ever resumed, and another reason is never overwritten.
* Reason text: ``nodehealth: <check>: <summary>``, sanitised for ``scontrol`` and capped.
* Hysteresis: resume after N consecutive clean runs; a reboot-class fault also needs a new
  boot id.
* Drain-storm breaker: past a share of nodes already drained by nodehealth, stop draining.
* The state file's content (``State``): clean-run counter, what we drained and why, boot id.

The faces (``nodehealth.faces``) do the I/O through ``nodehealth.probes``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping, Optional, Sequence

from nodehealth.model import Action, CheckResult, Report, Status

# Re-exported: they live in a lean module because the prolog's fast path needs them too.
from nodehealth.slurm.jobenv import job_gpus as job_gpus
from nodehealth.slurm.jobenv import sanitize as sanitize

PREFIX = "nodehealth:"
REASON_MAX = 200
STATE_VERSION = 1

# ----------------------------------------------------------------------------- node states

# Suffix characters sinfo and old scontrol append to a state word (man sinfo, NODE STATE CODES).
_SUFFIX_FLAGS = {
    "*": "NOT_RESPONDING",
    "~": "POWERED_DOWN",
    "#": "POWERING_UP",
    "!": "POWER_DOWN",
    "%": "POWERING_DOWN",
    "$": "MAINTENANCE",
    "@": "REBOOT_REQUESTED",
    "^": "REBOOT_ISSUED",
    "-": "PLANNED",
}
# sinfo's compound words (long and short forms) -> (base state, flags).
_SINFO_WORDS = {
    "drained": ("IDLE", ("DRAIN",)),
    "drain": ("IDLE", ("DRAIN",)),
    "draining": ("MIXED", ("DRAIN",)),
    "drng": ("MIXED", ("DRAIN",)),
    "alloc": ("ALLOCATED", ()),
    "allocated": ("ALLOCATED", ()),
    "mix": ("MIXED", ()),
    "comp": ("COMPLETING", ()),
    "maint": ("IDLE", ("MAINTENANCE",)),
    "resv": ("IDLE", ("RESERVED",)),
    "reserved": ("IDLE", ("RESERVED",)),
    "boot": ("IDLE", ("REBOOT_ISSUED",)),
    "npc": ("IDLE", ("NOT_RESPONDING",)),
    "down": ("DOWN", ()),
    "fail": ("DOWN", ("FAIL",)),
    "failg": ("ALLOCATED", ("FAIL",)),
    "failing": ("ALLOCATED", ("FAIL",)),
    "unk": ("UNKNOWN", ()),
    "pow_dn": ("IDLE", ("POWERED_DOWN",)),
    "pow_up": ("IDLE", ("POWERING_UP",)),
    "inval": ("UNKNOWN", ("INVALID_REG",)),
    "plnd": ("IDLE", ("PLANNED",)),
}
_BASE_STATES = {"IDLE", "ALLOCATED", "MIXED", "DOWN", "ERROR", "FUTURE", "UNKNOWN", "COMPLETING",
                "FAIL", "DRAIN", "DRAINED", "DRAINING", "RESERVED", "MAINT", "PLANNED", "INVAL"}
# Flags that mean a person or Slurm itself is working on the node: never resume it.
HANDS_OFF_FLAGS = frozenset({"REBOOT_REQUESTED", "REBOOT_ISSUED", "MAINTENANCE", "POWERED_DOWN",
                             "POWERING_DOWN", "POWER_DOWN", "POWERING_UP", "INVALID_REG"})
_REASON_SUFFIX = re.compile(r"^(?P<text>.*?)\s*\[(?P<user>[^\[\]@]*)@(?P<time>[^\[\]]*)\]\s*$", re.S)
_GRES_GPU = re.compile(r"(?:^|,)gpu(?::[A-Za-z0-9_.-]+)?:(\d+)")


@dataclass(frozen=True)
class NodeState:
    """A Slurm node state split into its base state and its flags (upper case)."""

    text: str
    base: str
    flags: frozenset[str] = frozenset()

    @property
    def drained(self) -> bool:
        """The DRAIN flag is set (IDLE+DRAIN, MIXED+DRAIN, DOWN+DRAIN, drained, draining)."""
        return "DRAIN" in self.flags

    @property
    def responding(self) -> bool:
        return "NOT_RESPONDING" not in self.flags

    @property
    def hands_off(self) -> bool:
        """Reboot pending or issued, maintenance, power saving, invalid registration."""
        return bool(self.flags & HANDS_OFF_FLAGS)


def parse_state(text: str) -> NodeState:
    """``IDLE+DRAIN``, ``MIXED+DRAIN+NOT_RESPONDING``, ``DOWN*``, ``drained``, ``idle~``, ``DRAINED``."""
    raw = (text or "").strip()
    word = raw
    flags: set[str] = set()
    while word and word[-1] in _SUFFIX_FLAGS:
        flags.add(_SUFFIX_FLAGS[word[-1]])
        word = word[:-1]
    parts = [p for p in word.split("+") if p]
    if not parts:
        return NodeState(raw, "UNKNOWN", frozenset(flags))
    head = parts[0]
    lowered = head.lower()
    if head.islower() and lowered in _SINFO_WORDS:
        base, extra = _SINFO_WORDS[lowered]
        flags.update(extra)
    else:
        base = head.upper()
    flags.update(p.upper() for p in parts[1:])
    # Old and sinfo spellings of a drained node: DRAINED/DRAINING/DRAIN as the base word.
    if base in ("DRAIN", "DRAINED"):
        base, flags = "IDLE", flags | {"DRAIN"}
    elif base == "DRAINING":
        base, flags = "MIXED", flags | {"DRAIN"}
    elif base == "MAINT":
        base, flags = "IDLE", flags | {"MAINTENANCE"}
    elif base == "INVAL":
        base, flags = "UNKNOWN", flags | {"INVALID_REG"}
    elif base not in _BASE_STATES and base.lower() in _SINFO_WORDS:
        b, extra = _SINFO_WORDS[base.lower()]
        base, flags = b, flags | set(extra)
    return NodeState(raw, base, frozenset(flags))


@dataclass(frozen=True)
class Reason:
    """A Slurm node reason: free text and the ``[user@time]`` suffix Slurm adds."""

    full: str
    text: str
    user: Optional[str] = None
    time: Optional[str] = None

    @property
    def ours(self) -> bool:
        return is_ours(self.text)


def parse_reason(full: Optional[str]) -> Optional[Reason]:
    if full is None:
        return None
    full = full.strip()
    if not full or full in ("(null)", "none", "None"):
        return None
    m = _REASON_SUFFIX.match(full)
    if m:
        return Reason(full, m.group("text").strip(), m.group("user") or None, m.group("time") or None)
    return Reason(full, full)


@dataclass(frozen=True)
class NodeInfo:
    """One node as ``scontrol show node -o`` (or sinfo) describes it."""

    name: str
    state: NodeState
    reason: Optional[Reason] = None
    gres_gpus: Optional[int] = None
    fields: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    @property
    def drained(self) -> bool:
        return self.state.drained

    @property
    def drained_by_us(self) -> bool:
        return self.state.drained and self.reason is not None and self.reason.ours

    @property
    def drained_by_others(self) -> bool:
        return self.state.drained and not self.drained_by_us


def gres_gpu_count(gres: Optional[str]) -> Optional[int]:
    """``gpu:8``, ``gpu:h100:8(S:0-1)``, ``gpu:quadro:1(S:0),vmem:2G`` -> GPU count; None if no GPU gres."""
    if not gres or gres in ("(null)", "N/A"):
        return None
    found = [int(m.group(1)) for m in _GRES_GPU.finditer(gres)]
    return sum(found) if found else None


def node_fields(line: str) -> dict[str, str]:
    """``Key=Value`` pairs of a node record; ``Reason`` runs to the end of the record."""
    out: dict[str, str] = {}
    at = line.find("Reason=")
    while at > 0 and not line[at - 1].isspace():
        at = line.find("Reason=", at + 1)
    head, reason = (line, None) if at < 0 else (line[:at], line[at + len("Reason="):])
    for token in head.split():
        key, sep, value = token.partition("=")
        if sep and key not in out:
            out[key] = value
    if reason is not None:
        out["Reason"] = reason.strip()
    return out


def parse_nodes(text: str) -> list[NodeInfo]:
    """All node records of ``scontrol show node`` output, one-line (``-o``) or multi-line.

    A record starts at ``NodeName=``; with the multi-line layout its continuation lines are
    joined (a ``Reason=`` line runs to its own end of line).
    """
    records: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith("NodeName="):
            records.append(line)
        elif records:
            if line.startswith("Reason="):
                # Multi-line layout: keep Reason last so it can run to the end.
                records[-1] = records[-1] + "\n" + line
            else:
                records[-1] = records[-1] + " " + line
    nodes = []
    for rec in records:
        head, _, reason_line = rec.partition("\nReason=")
        fields = node_fields(head)
        if reason_line:
            first, _, rest = reason_line.partition("\n")
            fields["Reason"] = first.strip()
            if rest:  # fields after the Reason line (rare): keep those we do not have yet
                for k, v in node_fields(rest.replace("\n", " ")).items():
                    fields.setdefault(k, v)
        name = fields.get("NodeName", "")
        if not name:
            continue
        nodes.append(NodeInfo(name=name, state=parse_state(fields.get("State", "")),
                              reason=parse_reason(fields.get("Reason")),
                              gres_gpus=gres_gpu_count(fields.get("Gres")), fields=fields))
    return nodes


# ----------------------------------------------------------------------------- reasons


def is_ours(reason: Optional[str]) -> bool:
    """A reason is ours only when it starts with ``nodehealth:`` (leading blanks allowed)."""
    return bool(reason) and reason.lstrip().startswith(PREFIX)  # type: ignore[union-attr]

def format_reason(result: CheckResult, limit: int = REASON_MAX, more: int = 0) -> str:
    """``nodehealth: <check>: <summary>`` (plus ``(+N more)``), sanitised and capped."""
    extra = f" (+{more} more)" if more > 0 else ""
    body = sanitize(f"{result.name}: {result.summary}", limit)
    text = sanitize(f"{PREFIX} {body}", limit - len(extra)) + extra
    return text[:limit]


def worst_failure(report: Report, unknown_policy: str = "pass") -> Optional[CheckResult]:
    """The result that makes this run a node fault, or None.

    FAIL results first (the most invasive action among them); with ``policy.unknown = fail``
    an UNKNOWN result counts too.
    """
    bad = [r for r in report.results if r.status == Status.FAIL]
    if not bad and unknown_policy == "fail":
        bad = [r for r in report.results if r.status == Status.UNKNOWN]
    if not bad:
        return None
    return max(bad, key=lambda r: (r.status, r.action.rank))


def fault_count(report: Report, unknown_policy: str = "pass") -> int:
    worst = worst_failure(report, unknown_policy)
    if worst is None:
        return 0
    return sum(1 for r in report.results if r.status == worst.status)


# ----------------------------------------------------------------------------- job scoping


def scope_processes(report: Report, gpus: Optional[Sequence[int]]) -> Report:
    """Judge ``gpu_processes`` on the job's GPUs only (shared nodes run other jobs' processes).

    With the job's GPUs unknown the check's own node-wide verdict stands.
    """
    if gpus is None:
        return report
    keep = {str(g) for g in gpus}
    out = []
    for r in report.results:
        per_gpu = r.details.get("gpus") if r.name == "gpu_processes" else None
        if r.status > Status.WARN and isinstance(per_gpu, Mapping) and per_gpu:
            mine = {k: v for k, v in per_gpu.items() if k in keep}
            others = sorted(k for k in per_gpu if k not in keep)
            details = dict(r.details, gpus=mine, job_gpus=list(gpus))
            if others:
                details["other_jobs_gpus"] = others
            if not mine:
                r = replace(r, status=Status.OK, gpu=None, action=Action.NONE, details=details,
                            summary=f"job GPU(s) {','.join(sorted(keep, key=int))} idle "
                                    f"(processes only on GPU(s) {','.join(others)} of other jobs)")
            else:
                first = sorted(mine, key=int)[0]
                text = "; ".join(str(mine[k]) for k in sorted(mine, key=int))
                r = replace(r, gpu=int(first), details=details, summary=text)
        out.append(r)
    return replace(report, results=tuple(out))


# ----------------------------------------------------------------------------- breaker


@dataclass(frozen=True)
class Breaker:
    """The drain-storm breaker's view of the cluster."""

    total: int
    ours: int
    share: float
    limit: float
    tripped: bool

    def describe(self) -> str:
        state = "HOLDING (no new drain)" if self.tripped else "closed"
        return (f"drain-storm breaker {state}: {self.ours} of {self.total} node(s) "
                f"({self.share:.0%}) drained by nodehealth, limit {self.limit:.0%}")


def breaker(nodes: Iterable[NodeInfo], max_share: float, min_drained: int = 1,
            exclude: Optional[str] = None) -> Breaker:
    """Trip when the share of nodes already drained by nodehealth is over ``max_share``.

    ``exclude`` (this node) is left out of the count of ours, so re-draining a node that is
    already ours never counts against itself. ``min_drained``: below this many nodes drained
    by us the breaker never trips (small clusters).
    """
    nodes = list(nodes)
    total = len(nodes)
    ours = sum(1 for n in nodes if n.drained_by_us and n.name != exclude)
    share = ours / total if total else 0.0
    tripped = total > 0 and ours >= min_drained and share > max_share
    return Breaker(total, ours, share, max_share, tripped)


# ----------------------------------------------------------------------------- state


@dataclass(frozen=True)
class DrainRecord:
    """What nodehealth drained this node for."""

    reason: str
    check: str
    action: str
    boot_id: Optional[str]
    time: float
    phase: str
    job_id: Optional[str] = None
    confirmed: bool = True  # scontrol accepted the drain

    def to_json(self) -> dict[str, Any]:
        return {"reason": self.reason, "check": self.check, "action": self.action, "boot_id": self.boot_id,
                "time": self.time, "phase": self.phase, "job_id": self.job_id, "confirmed": self.confirmed}

    @classmethod
    def from_json(cls, raw: Any) -> Optional[DrainRecord]:
        if not isinstance(raw, Mapping):
            return None
        try:
            return cls(reason=str(raw["reason"]), check=str(raw.get("check", "")),
                       action=str(raw.get("action", "none")), boot_id=_opt_str(raw.get("boot_id")),
                       time=float(raw.get("time", 0.0)), phase=str(raw.get("phase", "")),
                       job_id=_opt_str(raw.get("job_id")), confirmed=bool(raw.get("confirmed", True)))
        except (KeyError, TypeError, ValueError):
            return None


@dataclass(frozen=True)
class State:
    """The Slurm faces' memory between runs (``<state_dir>/slurm-state.json``)."""

    clean_runs: int = 0
    last_status: Optional[str] = None
    last_run: float = 0.0
    boot_id: Optional[str] = None
    drain: Optional[DrainRecord] = None
    breaker_held: Optional[dict[str, Any]] = None
    slurm_node: Optional[dict[str, Any]] = None  # cached Gres/state/reason of this node

    def to_json(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "clean_runs": self.clean_runs, "last_status": self.last_status,
                "last_run": self.last_run, "boot_id": self.boot_id,
                "drain": self.drain.to_json() if self.drain else None,
                "breaker_held": self.breaker_held, "slurm_node": self.slurm_node}

    @classmethod
    def from_json(cls, raw: Any) -> State:
        """A state from its JSON; anything unreadable becomes the empty state."""
        if not isinstance(raw, Mapping) or raw.get("version") != STATE_VERSION:
            return cls()
        try:
            clean = int(raw.get("clean_runs", 0))
        except (TypeError, ValueError):
            clean = 0
        try:
            last_run = float(raw.get("last_run", 0.0))
        except (TypeError, ValueError):
            last_run = 0.0
        held = raw.get("breaker_held")
        node = raw.get("slurm_node")
        return cls(clean_runs=max(0, clean), last_status=_opt_str(raw.get("last_status")), last_run=last_run,
                   boot_id=_opt_str(raw.get("boot_id")), drain=DrainRecord.from_json(raw.get("drain")),
                   breaker_held=dict(held) if isinstance(held, Mapping) else None,
                   slurm_node=dict(node) if isinstance(node, Mapping) else None)


def _opt_str(value: Any) -> Optional[str]:
    return None if value is None else str(value)


def is_clean(report: Report, unknown_policy: str = "pass") -> Optional[bool]:
    """True: a clean run (nothing worse than WARN). False: a fault. None: UNKNOWN, no evidence."""
    if worst_failure(report, unknown_policy) is not None:
        return False
    if report.status == Status.UNKNOWN:
        return None
    return True


def after_run(state: State, report: Report, unknown_policy: str, now: float, boot_id: Optional[str]) -> State:
    """Advance the clean-run counter: +1 on a clean run, 0 on a fault, unchanged on UNKNOWN."""
    clean = is_clean(report, unknown_policy)
    if clean is True:
        count = state.clean_runs + 1
    elif clean is False:
        count = 0
    else:
        count = state.clean_runs
    return replace(state, clean_runs=count, last_status=report.status.name, last_run=now, boot_id=boot_id)


# ----------------------------------------------------------------------------- decisions


@dataclass(frozen=True)
class Decision:
    """What a face should do with Slurm: ``none``, ``drain`` or ``resume``, and why."""

    action: str
    why: str
    reason: Optional[str] = None  # the drain reason to set
    result: Optional[CheckResult] = None


def decide_drain(node: Optional[NodeInfo], fault: CheckResult, reason: str) -> Decision:
    """Whether to set our drain reason on a node with a fault.

    Never overwrite a reason that is not ours (an admin's drain, Slurm's own "Kill task
    failed", another tool's). Re-setting our own identical reason is skipped.
    """
    if node is not None and node.reason is not None and not node.reason.ours and (
            node.drained or node.state.base == "DOWN"):
        return Decision("none", f"node already out of service for another reason ({node.reason.full!r}); "
                        "left untouched", result=fault)
    if node is not None and node.drained_by_us and node.reason is not None and node.reason.text == reason:
        return Decision("none", "already drained by nodehealth for this fault", result=fault)
    return Decision("drain", f"{fault.name} {fault.status.name}", reason=reason, result=fault)


def reboot_class(action: str, reboot_actions: Sequence[str]) -> bool:
    return action in reboot_actions


def decide_resume(node: Optional[NodeInfo], state: State, clean_runs_needed: int, boot_id: Optional[str],
                  reboot_actions: Sequence[str]) -> Decision:
    """Whether a clean node that nodehealth drained may go back into service.

    Only a drain whose reason is ours; not while a reboot or maintenance is pending; after
    ``clean_runs_needed`` consecutive clean runs; and for a reboot-class fault only once the
    boot id differs from the one recorded at the drain. A drain record lost with the state
    file (``/run`` is cleared by a reboot) counts as "rebooted since".
    """
    if node is None:
        return Decision("none", "node state unknown")
    if not node.drained:
        return Decision("none", "node not drained")
    if not node.drained_by_us:
        return Decision("none", "drained for a reason that is not ours; never resumed by nodehealth")
    if node.state.hands_off:
        return Decision("none", f"node state {node.state.text}: reboot/maintenance pending, left alone")
    if state.clean_runs < clean_runs_needed:
        return Decision("none", f"clean run {state.clean_runs} of {clean_runs_needed} needed to resume")
    rec = state.drain
    if rec is not None and reboot_class(rec.action, reboot_actions):
        if rec.boot_id is None or boot_id is None:
            return Decision("none", f"{rec.check} needs a reboot (action {rec.action}); boot id unknown")
        if rec.boot_id == boot_id:
            return Decision("none", f"{rec.check} needs a reboot (action {rec.action}); not rebooted since the drain")
    return Decision("resume", f"{state.clean_runs} consecutive clean run(s)")


# ----------------------------------------------------------------------------- job forensics (epilog)

FORENSICS = "job_forensics"  # the epilog's result name (and drain reason: ``nodehealth: job_forensics: ...``)
COUNTERS_VERSION = 1
# Per-GPU counters recorded at job start and compared at job end: (key, uncorrectable?).
COUNTER_KEYS = (("volatile_uncorrected", True), ("remapped_uncorrectable", True),
                ("volatile_corrected", False), ("remapped_correctable", False))
_COUNTER_WORDS = {"volatile_uncorrected": "uncorrectable ECC error(s)",
                  "remapped_uncorrectable": "row(s) remapped for uncorrectable errors",
                  "volatile_corrected": "corrected ECC error(s)",
                  "remapped_correctable": "row(s) remapped for correctable errors"}


def gpu_counters(gpus: Iterable[Any]) -> dict[str, dict[str, Any]]:
    """ECC and row-remap counters per GPU index (as text) from NVML ``GpuObservation``s.

    None where NVML did not report the counter. The prolog records this at job start (the
    job baseline), the epilog at job end; ``job_forensics`` compares the two.
    """
    out: dict[str, dict[str, Any]] = {}
    for g in gpus:
        ecc, rows = g.ecc, g.remapped_rows
        out[str(g.index)] = {
            "uuid": g.uuid,
            "volatile_uncorrected": ecc.volatile_uncorrected,
            "volatile_corrected": ecc.volatile_corrected,
            "remapped_uncorrectable": rows.uncorrectable if rows is not None else None,
            "remapped_correctable": rows.correctable if rows is not None else None,
        }
    return out


def counters_record(counters: Mapping[str, Any], now: float, boot_id: Optional[str], source: str,
                    gpus: Optional[Sequence[int]] = None, job_id: Optional[str] = None) -> dict[str, Any]:
    """The JSON written to the state dir: all GPUs, or only ``gpus`` (a job's baseline)."""
    keep = None if gpus is None else {str(g) for g in gpus}
    return {"v": COUNTERS_VERSION, "job_id": job_id, "time": round(now, 3), "boot_id": boot_id, "source": source,
            "gpus": {k: dict(v) for k, v in counters.items() if keep is None or k in keep}}


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


def ecc_increments(before: Mapping[str, Any], after: Mapping[str, Any],
                   gpus: Optional[Sequence[int]]) -> tuple[list[tuple[int, str, int, int]], list[str]]:
    """Counter increments on the job's GPUs: ``[(gpu, key, before, after)]`` and notes.

    A counter that went down (GPU reset or driver reload during the job) is not compared.
    """
    wanted = sorted(before, key=lambda k: int(k) if k.isdigit() else 1 << 30) if gpus is None \
        else [str(g) for g in gpus]
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


def job_forensics(job_id: str, gpus: Optional[Sequence[int]], baseline: Optional[Mapping[str, Any]],
                  nvml: Any, xid: Any, start: Optional[float], now: float, boot_id: Optional[str]) -> CheckResult:
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
    from nodehealth.model import Action, Finding, fold

    findings: list[Finding] = []
    notes: list[str] = []
    details: dict[str, Any] = {"job_id": job_id, "job_gpus": list(gpus) if gpus is not None else None,
                               "job_start": start}
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
        details["xids"] = [{"xid": r.event.xid, "gpu": r.event.gpu, "pci": r.event.pci, "at": r.at,
                            "severity": r.event.severity.value if r.event.severity else None,
                            "action": r.event.action.value if r.event.action else None,
                            "job_id": r.event.job_id} for r in mine[-50:]]
        for sev, status in ((Severity.DRAIN, Status.FAIL), (Severity.WARNING, Status.WARN)):
            group = [r for r in mine if r.event.severity == sev]
            by_gpu: dict[Optional[int], list[Any]] = {}
            for r in group:
                by_gpu.setdefault(r.event.gpu, []).append(r)
            for xg, rs in by_gpu.items():
                xids = ", ".join(str(n) for n in sorted({r.event.xid for r in rs}))
                label = f"GPU {xg}" if xg is not None else f"GPU {rs[-1].event.pci or '(unknown)'}"
                action = max((r.event.action or Action.REBOOT for r in rs), key=lambda a: a.rank) \
                    if status == Status.FAIL else Action.INSPECT
                findings.append(Finding(status, f"{label}: XID {xids} during the job", action, xg))
    if notes:
        details["notes"] = notes
    if not findings and not compared:
        return CheckResult(FORENSICS, Status.SKIPPED, f"job {job_id}: nothing to compare ({'; '.join(notes)})",
                           details=details)
    res = fold(FORENSICS, findings, f"job {job_id}: no XID or ECC increment during the job", details)
    if res.status > Status.OK:
        res = replace(res, summary=f"job {job_id}: {res.summary}")
    return res
