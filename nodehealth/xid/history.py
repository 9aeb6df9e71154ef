"""The XID event store's content and its pure changes (no I/O: ``nodehealth.probes.xid_store``
reads and writes the file, locks it and fills it from the kernel log).

``StoreState`` is the file's content in memory (``to_json``/``from_json``: what in a stored
document is not valid is left out and named); ``roll_boot``, ``add_events``, ``clear_events``
change it; ``event_time`` places an event in time; ``FilePosition`` is how far a recorded log was
read. The file's format and the rules (position, reboot, bounds) are described in
``nodehealth.probes.xid_store``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Optional

from nodehealth.model import Action
from nodehealth.observations.record import record
from nodehealth.xid.catalog import Catalog, enrich
from nodehealth.xid.events import KIND_FALLEN_OFF_BUS, KIND_XID, Severity, XidEvent
from nodehealth.xid.parse import wall_clock_time
from nodehealth.xid.pattern_kit import Regex
from nodehealth.xid.patterns import EVENTS
from nodehealth.xid.text import MAX_FIELD_CHARS, MAX_MESSAGE_CHARS, MAX_PROCESS_CHARS, printable, printable_or_none

FORMAT = 1
DEFAULT_MAX_EVENTS = 1000  # the default of [checks.gpu_xid] store_max_events (checks.gpu_xid.XidSettings)
REBOOT_CLEARS = frozenset({Action.REBOOT, Action.RESET_GPU})
# The file is a few hundred KiB at its bound; one far larger is not ours.
MAX_SEQ = (1 << 64) - 1  # kmsg sequence numbers are unsigned 64-bit
MAX_XID = 99999  # the parser reads at most five digits
MAX_PID = (1 << 31) - 1

_EVENT_KEYS = ("xid", "pci", "kind", "pid", "process", "job_id", "message", "time", "uptime_s", "seq")
# The kinds a stored event may have: those of the event patterns (a new pattern's kind is kept as it is).
_KINDS = frozenset({KIND_XID, KIND_FALLEN_OFF_BUS, *(p.kind for p in EVENTS if p.kind)})
_PCI_RE: Regex[str] = Regex(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}")
_SEVERITIES = frozenset(s.value for s in Severity)
_ACTIONS = frozenset(a.value for a in Action)


class StoreError(Exception):
    """The event store cannot be locked, read or written; the message names the path."""


@record
class FilePosition:
    """How far a recorded log (a regular file) has been read: its identity, the offset of the first
    byte not read (always just after a newline), and the bytes before that offset (``tail``, hex),
    which tell a file rewritten in place from one that only grew."""

    dev: int
    ino: int
    offset: int
    tail: str = ""

    def same_file(self, other: Optional[FilePosition]) -> bool:
        return other is not None and (self.dev, self.ino) == (other.dev, other.ino)

    def to_json(self) -> dict[str, Any]:
        return {"dev": self.dev, "ino": self.ino, "offset": self.offset, "tail": self.tail}


@dataclass
class StoreState:
    """The store file's content, in memory."""

    boot_id: Optional[str] = None
    kmsg_seq: Optional[int] = None
    last_clear: Optional[float] = None
    dropped: int = 0
    events: list[dict[str, Any]] = field(default_factory=list)
    # How far a recorded log (a regular file as kmsg_path) has been read; kept across boots (the
    # file's lines do not come back with a reboot). None: no recorded log read yet.
    file_position: Optional[FilePosition] = None

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "boot_id": self.boot_id,
            "kmsg_seq": self.kmsg_seq,
            "last_clear": self.last_clear,
            "dropped": self.dropped,
            "events": self.events,
            "file": self.file_position.to_json() if self.file_position is not None else None,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> tuple[StoreState, list[str]]:
        """The state a store's JSON describes, and what in it was not valid and left out."""
        ignored: list[str] = []
        boot = _boot(data.get("boot_id"))
        if boot is None and data.get("boot_id") is not None:
            ignored.append("boot_id")
        seq = data.get("kmsg_seq")
        if seq is not None and _integer(seq, 0, MAX_SEQ) is None:
            ignored.append(
                f"kmsg_seq {printable(repr(seq), 40)} is not a kmsg sequence number: reading this "
                "boot's kernel log from its beginning"
            )
            seq = None
        clear = _number(data.get("last_clear"))
        if clear is None and data.get("last_clear") is not None:
            ignored.append("last_clear")
        dropped = _integer(data.get("dropped", 0), 0, MAX_SEQ)
        if dropped is None:
            ignored.append("dropped")
        raw_events = data.get("events", [])
        if not isinstance(raw_events, list):
            ignored.append(f"events is a JSON {type(raw_events).__name__}, not a list")
            raw_events = []
        events: list[dict[str, Any]] = []
        fields = 0
        for item in raw_events:
            event, bad = _stored(item, boot)
            if event is not None:
                events.append(event)
                fields += bad
        if len(events) < len(raw_events):
            ignored.append(f"{len(raw_events) - len(events)} of {len(raw_events)} stored event(s) are not events")
        if fields:
            ignored.append(f"{fields} event field(s)")
        position = _file_position(data.get("file"))
        if position is None and data.get("file") is not None:
            ignored.append("file (the recorded log's position): reading it from its beginning")
        return cls(
            boot_id=boot, kmsg_seq=seq, last_clear=clear, dropped=dropped or 0, events=events, file_position=position
        ), ignored


def _number(value: Any) -> Optional[float]:
    """A finite JSON number as a float, else None (NaN and Infinity included)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer beyond any float
        return None
    return number if math.isfinite(number) else None


def _integer(value: Any, low: int, high: int) -> Optional[int]:
    """A JSON integer within [low, high], else None (a float, a bool, out of range)."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        return None
    return value


_TAIL_RE: Regex[str] = Regex(r"(?:[0-9a-f]{2}){0,64}")


def _file_position(value: Any) -> Optional[FilePosition]:
    """A recorded log's stored position in good form, else None."""
    if not isinstance(value, dict):
        return None
    dev, ino, offset = (_integer(value.get(k), 0, MAX_SEQ) for k in ("dev", "ino", "offset"))
    tail = value.get("tail")
    if dev is None or ino is None or offset is None or not isinstance(tail, str) or not _TAIL_RE.fullmatch(tail):
        return None
    return FilePosition(dev, ino, offset, tail)


def _boot(value: Any) -> Optional[str]:
    """A boot id as stored (short printable text), else None."""
    if isinstance(value, str) and value and len(value) <= MAX_FIELD_CHARS and value.isprintable():
        return value
    return None


def _stored(item: Any, file_boot: Optional[str]) -> tuple[Optional[dict[str, Any]], int]:
    """One stored event in good form (known keys only), or None; and how many of its fields were
    not valid.

    Not an event: not an object, no XID number in range, no boot (its own, else the file's).
    Other fields that are not valid become absent; text is made printable and bounded.
    """
    if not isinstance(item, dict):
        return None, 0
    xid = _integer(item.get("xid"), 0, MAX_XID)
    boot = _boot(item.get("boot_id")) or file_boot
    if xid is None or boot is None:
        return None, 0
    pci, kind, message, job = item.get("pci"), item.get("kind"), item.get("message"), item.get("job_id")
    out: dict[str, Any] = {
        "boot_id": boot,
        "at": _number(item.get("at")),
        "recorded_at": _number(item.get("recorded_at")),
        "xid": xid,
        "pci": pci if isinstance(pci, str) and _PCI_RE.fullmatch(pci) else None,
        "kind": kind if kind in _KINDS else KIND_XID,
        "pid": _integer(item.get("pid"), 1, MAX_PID),
        "process": printable_or_none(item.get("process"), MAX_PROCESS_CHARS),
        "job_id": printable(str(job)) if isinstance(job, (str, int)) and not isinstance(job, bool) else None,
        "message": printable(message, MAX_MESSAGE_CHARS) if isinstance(message, str) else "",
        "time": printable_or_none(item.get("time")),
        "uptime_s": _number(item.get("uptime_s")),
        "seq": _integer(item.get("seq"), 0, MAX_SEQ),
        "severity": item.get("severity") if item.get("severity") in _SEVERITIES else None,
        "action": item.get("action") if item.get("action") in _ACTIONS else None,
    }
    bad = sum(1 for key, value in out.items() if key in item and item[key] != value)
    return out, bad


# --------------------------------------------------------------------------- pure state changes


def stored_event(d: dict[str, Any]) -> XidEvent:
    """The (unjudged) event a stored dict describes."""
    kw = {k: d.get(k) for k in _EVENT_KEYS}
    return XidEvent(
        xid=int(d["xid"]),
        pci=kw["pci"] if isinstance(kw["pci"], str) else None,
        kind=kw["kind"] if isinstance(kw["kind"], str) else "xid",
        pid=kw["pid"] if isinstance(kw["pid"], int) else None,
        process=kw["process"] if isinstance(kw["process"], str) else None,
        message=kw["message"] if isinstance(kw["message"], str) else "",
        time=kw["time"] if isinstance(kw["time"], str) else None,
        uptime_s=float(kw["uptime_s"]) if isinstance(kw["uptime_s"], (int, float)) else None,
        seq=kw["seq"] if isinstance(kw["seq"], int) else None,
        job_id=str(kw["job_id"]) if kw["job_id"] is not None else None,
    )


def stored_at(d: dict[str, Any]) -> Optional[float]:
    """The Unix time a stored event happened at, None when not known."""
    at = d.get("at")
    return float(at) if isinstance(at, (int, float)) and not isinstance(at, bool) else None


def judged(d: dict[str, Any], catalog: Catalog) -> XidEvent:
    return enrich(stored_event(d), catalog)


def roll_boot(state: StoreState, current_boot: str, catalog: Catalog) -> int:
    """Start a new boot in ``state`` if the boot id changed; returns the drain events cleared.

    Kept: drain-class events of earlier boots whose action a reboot does not fix.
    """
    if state.boot_id == current_boot:
        return 0
    kept: list[dict[str, Any]] = []
    cleared = 0
    for d in state.events:
        if d["boot_id"] == current_boot:
            kept.append(d)
            continue
        ev = judged(d, catalog)
        if ev.severity == Severity.DRAIN:
            if ev.action in REBOOT_CLEARS:
                cleared += 1
            else:
                kept.append(d)
    state.events = kept
    state.boot_id = current_boot
    state.kmsg_seq = None
    return cleared


def add_events(
    state: StoreState,
    events: Iterable[tuple[XidEvent, Optional[float], float]],
    catalog: Catalog,
    max_events: int = DEFAULT_MAX_EVENTS,
) -> int:
    """Append ``(event, at, recorded_at)`` to this boot's events; returns how many were new.

    An event with a kmsg sequence number at or below the stored position, or one this boot's
    stored events already hold, is already in the store (another reader got there first, or
    the log was read again from its beginning) and is skipped. Text is stored printable and
    bounded. The store keeps at most ``max_events``: the oldest non-drain events go first,
    then the oldest.
    """
    assert state.boot_id is not None
    added = 0
    seen = {d.get("seq") for d in state.events if d["boot_id"] == state.boot_id and d.get("seq") is not None}
    for event, at, recorded_at in events:
        if event.seq is not None and (
            event.seq in seen or (state.kmsg_seq is not None and event.seq <= state.kmsg_seq)
        ):
            continue
        ev = enrich(event, catalog)
        seen.add(ev.seq)
        state.events.append(
            {
                "boot_id": state.boot_id,
                "at": at,
                "recorded_at": recorded_at,
                "xid": ev.xid,
                "pci": ev.pci,
                "kind": ev.kind,
                "pid": ev.pid,
                "process": printable(ev.process, MAX_PROCESS_CHARS) if ev.process is not None else None,
                "job_id": printable(ev.job_id) if ev.job_id is not None else None,
                "message": printable(ev.message, MAX_MESSAGE_CHARS),
                "time": printable(ev.time) if ev.time is not None else None,
                "uptime_s": ev.uptime_s,
                "seq": ev.seq,
                "severity": ev.severity.value if ev.severity else None,
                "action": ev.action.value if ev.action else None,
            }
        )
        added += 1
    _bound(state, catalog, max_events)
    return added


def _bound(state: StoreState, catalog: Catalog, max_events: int) -> None:
    excess = len(state.events) - max_events
    if excess <= 0:
        return
    drop: set[int] = set()
    for i, d in enumerate(state.events):
        if len(drop) == excess:
            break
        if judged(d, catalog).severity != Severity.DRAIN:
            drop.add(i)
    for i in range(len(state.events)):
        if len(drop) == excess:
            break
        drop.add(i)
    state.events = [d for i, d in enumerate(state.events) if i not in drop]
    state.dropped += excess


def clear_events(state: StoreState, catalog: Catalog, now: float) -> tuple[int, int]:
    """Forget every stored event (all boots); returns (events, drain-class events) cleared."""
    total = len(state.events)
    drain = sum(1 for d in state.events if judged(d, catalog).severity == Severity.DRAIN)
    state.events = []
    state.last_clear = now
    return total, drain


def event_time(event: XidEvent, btime: Optional[float], now: float) -> Optional[float]:
    """Unix time of an event by its own line, None when the line does not say.

    A kmsg record: boot time plus its microseconds since boot. Another line: its wall clock
    (``parse.wall_clock_time``: a recorded log may be of another boot, which seconds since this
    boot would misplace), else its ``[ 94.57]`` seconds since this boot.
    """
    uptime = event.uptime_s
    if event.seq is not None and uptime is not None:
        return btime + uptime if btime is not None else None
    wall = wall_clock_time(event.time, now)
    if wall is not None:
        return wall
    return btime + uptime if btime is not None and uptime is not None else None
