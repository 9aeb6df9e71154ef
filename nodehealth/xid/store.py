"""The per-boot XID event store and the kernel-log follower that fills it.

One small JSON file, ``<state_dir>/xid-events.json``, holds both the follower's position and
the events (written whole, atomically: temp file, fsync, ``os.replace``; writers serialise on
``xid-events.lock`` with ``flock``)::

    {"format": 1,
     "boot_id": "196c218f-...",      the boot the position belongs to
     "kmsg_seq": 18234,              last /dev/kmsg record read in that boot (null: none yet)
     "last_clear": 1718000000.0,     when `nodehealth xid clear` last ran (null: never)
     "dropped": 0,                   events dropped to keep the file bounded
     "events": [{"boot_id": ..., "at": ..., "recorded_at": ..., "xid": 79, "pci": "0000:3b:00",
                 "kind": "xid", "pid": null, "process": null, "job_id": null, "message": ...,
                 "time": ..., "uptime_s": ..., "seq": ..., "severity": "drain", "action": "reboot"},
                ...]}

Position: records with a sequence number at or below ``kmsg_seq`` are never reported again
in the same boot; a different boot id starts from the beginning of the new boot's log.
Keeping position and events in one file makes "event recorded" and "position advanced" one
atomic step, and lets several readers (the daemon's follower, a prolog) share it without
reporting an event twice: under the lock, only records after the stored position are added.

A file that is not a store, or the parts of one that are not valid (a field of the wrong type,
a number that is not finite or is out of range, an entry that is not an event), is treated as
absent: the notes say what was ignored (the ``gpu_xid`` check's details, the daemon's log), and
the next write replaces the file in good form. A position that is not a kmsg sequence number, or
one past the end of this boot's log, means reading this boot's log from its beginning.

Reboot: when the boot id changes, events of earlier boots are dropped, except drain-class
events whose action a reboot does not fix (anything but ``reboot`` and ``reset_gpu``, i.e.
``inspect``): those stay until an administrator runs ``nodehealth xid clear``. Severity and
action are judged again with the configured catalog whenever the store is read, so a changed
override applies to stored events too (the values in the file are for human readers).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import math
import os
import re
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional

from nodehealth.model import Action
from nodehealth.observations import ProbeError, XidObservation, XidRecord
from nodehealth.statedir import files, layout
from nodehealth.statedir import ledger as job_ledger
from nodehealth.xid.catalog import Catalog, catalog_for, enrich
from nodehealth.xid.events import KIND_FALLEN_OFF_BUS, KIND_XID, Severity, XidEvent
from nodehealth.xid.kmsg import FilePosition, KernelLogUnavailable, KmsgReader, boot_time, open_log
from nodehealth.xid.parse import ScanStats, scan, wall_clock_time
from nodehealth.xid.patterns import KMSG_PATH
from nodehealth.xid.process_job import live_job
from nodehealth.xid.settings import XidSettings, xid_settings
from nodehealth.xid.text import MAX_FIELD_CHARS, MAX_MESSAGE_CHARS, MAX_PROCESS_CHARS, printable, printable_or_none

if TYPE_CHECKING:
    from nodehealth.config.schema import Config

FORMAT = 1
DEFAULT_MAX_EVENTS = XidSettings().store_max_events
REBOOT_CLEARS = frozenset({Action.REBOOT, Action.RESET_GPU})
# The file is a few hundred KiB at its bound; one far larger is not ours.
MAX_STORE_BYTES = 16 << 20
MAX_SEQ = (1 << 64) - 1  # kmsg sequence numbers are unsigned 64-bit
MAX_XID = 99999  # the parser reads at most five digits
MAX_PID = (1 << 31) - 1

_EVENT_KEYS = ("xid", "pci", "kind", "pid", "process", "job_id", "message", "time", "uptime_s", "seq")
_KINDS = (KIND_XID, KIND_FALLEN_OFF_BUS)
_PCI_RE = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}")
_SEVERITIES = frozenset(s.value for s in Severity)
_ACTIONS = frozenset(a.value for a in Action)


class StoreError(Exception):
    """The event store cannot be locked, read or written; the message names the path."""


# --------------------------------------------------------------------------- the file


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
        return {"format": FORMAT, "boot_id": self.boot_id, "kmsg_seq": self.kmsg_seq,
                "last_clear": self.last_clear, "dropped": self.dropped, "events": self.events,
                "file": self.file_position.to_json() if self.file_position is not None else None}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> tuple[StoreState, list[str]]:
        """The state a store's JSON describes, and what in it was not valid and left out."""
        ignored: list[str] = []
        boot = _boot(data.get("boot_id"))
        if boot is None and data.get("boot_id") is not None:
            ignored.append("boot_id")
        seq = data.get("kmsg_seq")
        if seq is not None and _integer(seq, 0, MAX_SEQ) is None:
            ignored.append(f"kmsg_seq {printable(repr(seq), 40)} is not a kmsg sequence number: reading this "
                           "boot's kernel log from its beginning")
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
        return cls(boot_id=boot, kmsg_seq=seq, last_clear=clear, dropped=dropped or 0, events=events,
                   file_position=position), ignored


def store_path(state_dir: str) -> str:
    return layout.path(state_dir, layout.XID_EVENTS)


def boot_id(procfs_root: str = layout.PROCFS_ROOT) -> str:
    """This boot's id (``statedir.layout.read_boot_id``): the store's events and position belong to it.

    Raises ``KernelLogUnavailable`` naming the path when it cannot be read: without it no
    position can be trusted.
    """
    value = layout.read_boot_id(procfs_root)
    if value is None:
        raise KernelLogUnavailable(f"cannot read the boot id from {layout.boot_id_path(procfs_root)}")
    return value


def load_state(state_dir: str) -> tuple[StoreState, tuple[str, ...]]:
    """The stored state (empty when there is none) and notes about anything unusable in it.

    A file that is not a valid store (truncated, hand-edited, not JSON, nested past the parser)
    gives an empty state; the parts of a store that are not valid are left out
    (``StoreState.from_json``). Either way a note says so, and the next write replaces the
    file in good form; it never stops the watch. Raises ``StoreError`` when the file exists
    but cannot be read.
    """
    path = store_path(state_dir)
    unsafe = files.check_dir(state_dir) if os.path.lexists(state_dir) else None
    if unsafe:
        raise StoreError(f"event store not trusted: {unsafe}")
    raw, why = files.read_checked(path, MAX_STORE_BYTES + 1)  # O_NOFOLLOW, regular files only
    if raw is None:
        if why is None:
            return StoreState(), ()
        raise StoreError(f"cannot read {path}: {why}")
    if len(raw) > MAX_STORE_BYTES:
        return StoreState(), (f"{path} is larger than {MAX_STORE_BYTES} bytes; starting a new event store",)
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
        return StoreState(), (f"{path} was not valid JSON; starting a new event store",)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return StoreState(), (f"{path} is not an event store of format {FORMAT}; starting a new one",)
    state, ignored = StoreState.from_json(data)
    if not ignored:
        return state, ()
    return state, (f"{path}: ignored what was not valid ({'; '.join(ignored)}); the file is rewritten "
                   "at the next write",)


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


_TAIL_RE = re.compile(r"(?:[0-9a-f]{2}){0,64}")


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


def save_state(state_dir: str, state: StoreState) -> None:
    """Write the state atomically (``statedir.files.write_atomic``: temp file, fsync, rename)."""
    path = store_path(state_dir)
    try:
        files.write_atomic(path, json.dumps(state.to_json(), separators=(",", ":")), mode=files.STATE_FILE_MODE)
    except OSError as exc:
        raise StoreError(f"cannot write {path}: {exc.strerror or exc}") from None


@contextlib.contextmanager
def locked(state_dir: str, deadline: Optional[float] = None) -> Iterator[None]:
    """Hold the store's lock; ``deadline`` (monotonic) bounds the wait (StoreError after it)."""
    try:
        files.require_state_dir(state_dir)  # 0700 when new; refused when another user's or writable by others
        fd = os.open(layout.path(state_dir, layout.XID_LOCK),
                     os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, files.STATE_FILE_MODE)
    except OSError as exc:
        raise StoreError(f"cannot open the event store lock in {state_dir}: {exc.strerror or exc}") from None
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    raise StoreError(f"cannot lock the event store in {state_dir}: {exc.strerror}") from None
                if deadline is not None and time.monotonic() >= deadline:
                    raise StoreError(f"the event store in {state_dir} stayed locked past the deadline") from None
                time.sleep(0.01)
        yield
    finally:
        os.close(fd)  # closing releases the lock


# --------------------------------------------------------------------------- pure state changes


def stored_event(d: dict[str, Any]) -> XidEvent:
    """The (unjudged) event a stored dict describes."""
    kw = {k: d.get(k) for k in _EVENT_KEYS}
    return XidEvent(
        xid=int(d["xid"]), pci=kw["pci"] if isinstance(kw["pci"], str) else None,
        kind=kw["kind"] if isinstance(kw["kind"], str) else "xid",
        pid=kw["pid"] if isinstance(kw["pid"], int) else None,
        process=kw["process"] if isinstance(kw["process"], str) else None,
        message=kw["message"] if isinstance(kw["message"], str) else "",
        time=kw["time"] if isinstance(kw["time"], str) else None,
        uptime_s=float(kw["uptime_s"]) if isinstance(kw["uptime_s"], (int, float)) else None,
        seq=kw["seq"] if isinstance(kw["seq"], int) else None,
        job_id=str(kw["job_id"]) if kw["job_id"] is not None else None,
    )


def _at(d: dict[str, Any]) -> Optional[float]:
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


def add_events(state: StoreState, events: Iterable[tuple[XidEvent, Optional[float], float]],
               catalog: Catalog, max_events: int = DEFAULT_MAX_EVENTS) -> int:
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
        if event.seq is not None and (event.seq in seen or (state.kmsg_seq is not None
                                                            and event.seq <= state.kmsg_seq)):
            continue
        ev = enrich(event, catalog)
        seen.add(ev.seq)
        state.events.append({
            "boot_id": state.boot_id,
            "at": at,
            "recorded_at": recorded_at,
            "xid": ev.xid, "pci": ev.pci, "kind": ev.kind, "pid": ev.pid,
            "process": printable(ev.process, MAX_PROCESS_CHARS) if ev.process is not None else None,
            "job_id": printable(ev.job_id) if ev.job_id is not None else None,
            "message": printable(ev.message, MAX_MESSAGE_CHARS),
            "time": printable(ev.time) if ev.time is not None else None,
            "uptime_s": ev.uptime_s, "seq": ev.seq,
            "severity": ev.severity.value if ev.severity else None,
            "action": ev.action.value if ev.action else None,
        })
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


# --------------------------------------------------------------------------- reading the log into the store


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


def _check_readable(path: str) -> None:
    os.close(open_log(path))


@dataclass(frozen=True)
class SyncResult:
    state: StoreState
    boot_id: str
    added: int
    complete: bool
    skipped_lines: int
    notes: tuple[str, ...]


class XidStore:
    """The event store of one node, and the ways to fill it from the kernel log.

    ``now`` is the Unix clock (injectable for tests). ``kernel_only`` (the default) keeps only
    kernel-facility kmsg records: records written to /dev/kmsg from user space carry another.
    """

    def __init__(self, state_dir: str, procfs_root: str = "/proc", kmsg_path: str = KMSG_PATH,
                 overrides: tuple[str, ...] = (), max_events: int = DEFAULT_MAX_EVENTS,
                 kernel_only: bool = True, now: Callable[[], float] = time.time,
                 persist: bool = True) -> None:
        self.persist = persist  # False (``nodehealth check`` by hand): sync reads, keeps its position in memory
        self.state_dir = state_dir
        self.procfs_root = procfs_root
        self.kmsg_path = kmsg_path
        self.catalog = catalog_for(tuple(overrides))
        self.max_events = max_events
        self.kernel_only = kernel_only
        self.now = now

    @classmethod
    def configured(cls, cfg: Config, now: Callable[[], float] = time.time) -> XidStore:
        """The store as ``cfg`` sets it up: ``[paths]`` and the ``[checks.gpu_xid]`` settings.

        Raises ValueError or OSError when the XID catalog (with the site's overrides) cannot be loaded.
        """
        s = xid_settings(cfg)
        return cls(cfg.paths.state_dir, cfg.paths.procfs_root, s.kmsg_path, s.severity_overrides,
                   s.store_max_events, s.kernel_facility_only, now)

    # -- one-shot -------------------------------------------------------------------------

    def sync(self, deadline: Optional[float] = None) -> SyncResult:
        """Read the kernel log from the stored position to its end (or ``deadline``) into the
        store. Raises ``KernelLogUnavailable`` (no boot id, unreadable log) or ``StoreError``.
        """
        current = boot_id(self.procfs_root)
        _check_readable(self.kmsg_path)
        with locked(self.state_dir, deadline) if self.persist else contextlib.nullcontext():
            state, notes = load_state(self.state_dir)
            # A store with parts that were not valid is written again in good form (and so
            # warned about once).
            before = json.dumps(state.to_json()) if not notes else ""
            cleared = roll_boot(state, current, self.catalog)
            if cleared:
                notes += (f"the reboot cleared {cleared} drain-class event(s) of an earlier boot",)
            reader = KmsgReader(self.kmsg_path, after_seq=state.kmsg_seq, kernel_only=self.kernel_only,
                                position=state.file_position)
            stats = ScanStats()
            try:
                found = list(scan(reader.lines(deadline=deadline), stats))
            except KernelLogUnavailable as exc:
                if self.persist and before != json.dumps(state.to_json()):
                    save_state(self.state_dir, state)
                raise KernelLogUnavailable(str(exc)) from None
            if reader.rewound is not None:
                notes += (reader.rewound,)
                state.kmsg_seq = None
            added = add_events(state, self._stamped(found), self.catalog, self.max_events)
            if reader.last_seq is not None:
                state.kmsg_seq = max(reader.last_seq, state.kmsg_seq or -1)
            position = reader.position()
            if position is not None:  # a recorded log: read up to here, under the lock, by whoever read it
                state.file_position = position
            if reader.lost:
                notes += (f"{reader.lost} kernel-log record(s) were overwritten before they could be read",)
            if self.persist and before != json.dumps(state.to_json()):
                save_state(self.state_dir, state)
        return SyncResult(state, current, added, reader.complete, stats.skipped, notes)

    def _stamped(self, events: Iterable[XidEvent]) -> Iterator[tuple[XidEvent, Optional[float], float]]:
        """Each event with ``at``, its own time (``event_time``), and the time it was read.

        A line that carries no time of its own (a bare message, the ``kernel:`` tag alone, an
        elided ``[…]``) is placed when it was first read: a recorded log is read once per line,
        so no later reader moves it into a later job. The blamed process names the job only when
        the event's time is known (the process must have started before it; pids are reused).
        """
        btime = boot_time(self.procfs_root)
        for event in events:
            now = self.now()
            own = event_time(event, btime, now)
            at = own if own is not None else now
            if event.pid is not None and event.job_id is None and own is not None:
                uptime = event.uptime_s if event.seq is not None or btime is None else own - btime
                job = live_job(event.pid, self.procfs_root, uptime)
                if job is not None:
                    event = dataclasses.replace(event, job_id=job)
            yield event, at, now

    def clear(self, deadline: Optional[float] = None) -> tuple[int, int]:
        """Read what the kernel log has (when readable), then forget every stored event.

        Reading first moves the position past the events being cleared, so they do not come
        back on the next read. Returns (events, drain-class events) cleared.
        """
        with contextlib.suppress(KernelLogUnavailable):
            self.sync(deadline)
        with locked(self.state_dir, deadline):
            state, _ = load_state(self.state_dir)
            counts = clear_events(state, self.catalog, self.now())
            save_state(self.state_dir, state)
        return counts

    def observation(self, result: Optional[SyncResult] = None, note: Optional[str] = None,
                    gathered_at: Optional[float] = None) -> XidObservation:
        """What the store holds now, judged, as the ``xid`` probe's observation.

        Without a ``result`` (the kernel log could not be read) the stored state is used as
        it is, ``complete`` is False and ``note`` says why.
        """
        notes: tuple[str, ...] = ()
        if result is not None:
            state, current, complete, skipped = result.state, result.boot_id, result.complete, result.skipped_lines
            notes = result.notes
        else:
            current = boot_id(self.procfs_root)
            state, notes = load_state(self.state_dir)
            if state.boot_id != current:
                roll_boot(state, current, self.catalog)
            complete, skipped = False, 0
        if note:
            notes = (note, *notes)
        records = tuple(
            XidRecord(event=judged(d, self.catalog), boot_id=d["boot_id"], at=_at(d),
                      current_boot=d["boot_id"] == current)
            for d in state.events)
        ledger = job_ledger.entries(job_ledger.read(self.state_dir)) \
            if any(r.event.job_id is None for r in records) else ()
        return XidObservation(
            boot_id=current, records=records, gathered_at=gathered_at if gathered_at is not None else self.now(),
            source=self.kmsg_path, complete=complete, kmsg_seq=state.kmsg_seq, skipped_lines=skipped,
            last_clear=state.last_clear, ledger=ledger, notes=notes)

    # -- follow ---------------------------------------------------------------------------

    def follow(self, stop: threading.Event, on_event: Optional[Callable[[XidRecord], None]] = None,
               save_interval_s: float = 5.0, poll_s: float = 0.25,
               on_note: Optional[Callable[[str], None]] = None) -> None:
        """Follow the kernel log into the store until ``stop`` is set.

        Starts from the stored position (reading the backlog of this boot first), records
        each event as it is read, and saves the position at least every ``save_interval_s``
        while lines arrive. ``on_event`` gets each newly stored event, judged; ``on_note``
        each note about the store (parts of the file that were not valid, a position past the
        end of the log), once. Raises ``KernelLogUnavailable`` or ``StoreError`` when it
        cannot start.
        """
        current = boot_id(self.procfs_root)
        with locked(self.state_dir):
            state, notes = load_state(self.state_dir)
            roll_boot(state, current, self.catalog)
            save_state(self.state_dir, state)
        for note in notes:
            if on_note is not None:
                on_note(note)
        reader = KmsgReader(self.kmsg_path, after_seq=state.kmsg_seq, kernel_only=self.kernel_only, poll_s=poll_s,
                            position=state.file_position)
        saved_seq = state.kmsg_seq
        saved_position = start_position = state.file_position
        last_save = time.monotonic()
        rewind_noted = False
        file_checked = False  # whether the reader's start was compared with the stored position

        def record(events: list[XidEvent]) -> list[XidRecord]:
            nonlocal rewind_noted, saved_seq, saved_position, last_save, file_checked
            rewind = reader.rewound is not None and not rewind_noted
            if rewind:
                rewind_noted = True
                if on_note is not None and reader.rewound is not None:
                    on_note(reader.rewound)
            position = reader.position()
            # A recorded log read from its beginning although a position of it was stored (it
            # was rewritten in place): that position no longer counts (unless another reader has
            # replaced it since).
            stale = start_position if position is not None and not file_checked and not reader.resumed \
                and position.same_file(start_position) else None
            file_checked = file_checked or position is not None
            out = self._record(events, reader.last_seq, restart=rewind, position=position, stale=stale)
            saved_seq, saved_position, last_save = reader.last_seq, position, time.monotonic()
            return out

        def moved() -> bool:
            return reader.last_seq != saved_seq or reader.position() != saved_position

        def lines() -> Iterator[bytes]:
            for line in reader.lines(follow=True, stop=stop):
                yield line
                if moved() and time.monotonic() - last_save >= save_interval_s:
                    record([])

        try:
            for event in scan(lines()):
                for stored in record([event]):
                    if on_event is not None:
                        on_event(stored)
        finally:
            if moved():
                with contextlib.suppress(StoreError):
                    record([])

    def _record(self, events: list[XidEvent], last_seq: Optional[int], restart: bool = False,
                position: Optional[FilePosition] = None, stale: Optional[FilePosition] = None) -> list[XidRecord]:
        """Add ``events`` and the position under the lock; ``restart``: the position saved is
        not valid (the log was read again from its beginning) and is replaced by ``last_seq``.

        ``position``: where a recorded log has been read to, just after the line of the last of
        ``events``. When the store's position of the same file is already there or beyond, another
        reader (a face's sync) has recorded those lines: the events are not added again.
        ``stale``: a stored position of the file that is not valid (the file was rewritten since):
        dropped when it is still the one stored.
        """
        with locked(self.state_dir):
            state, _ = load_state(self.state_dir)
            current = boot_id(self.procfs_root)
            roll_boot(state, current, self.catalog)
            if restart:
                state.kmsg_seq = None
            stored = state.file_position
            if stale is not None and stored == stale:
                stored = state.file_position = None
            if position is not None and stored is not None and position.same_file(stored) \
                    and stored.offset >= position.offset:
                events = []  # read and recorded by another reader already
            added = add_events(state, self._stamped(events), self.catalog, self.max_events)
            new = state.events[-added:] if added else []
            if last_seq is not None:
                state.kmsg_seq = max(last_seq, state.kmsg_seq or -1)
            if position is not None and (stored is None or
                                         (position.same_file(stored) and position.offset > stored.offset)):
                state.file_position = position
            save_state(self.state_dir, state)
        return [XidRecord(event=judged(d, self.catalog), boot_id=d["boot_id"], at=_at(d)) for d in new]


# --------------------------------------------------------------------------- the "xid" probe


def gather(state_dir: str, procfs_root: str, kmsg_path: str, overrides: tuple[str, ...], max_events: int,
           kernel_only: bool, timeout_s: float, persist: bool = True) -> Any:
    """The ``xid`` probe: read the kernel log since the stored position, update the store,
    and return this boot's events (``XidObservation``) or a ``ProbeError``. ``persist=False``
    (``nodehealth check`` by hand): the store is read, not written (no lock, no position saved)."""
    deadline = time.monotonic() + max(0.0, timeout_s - 0.05)
    try:
        store = XidStore(state_dir, procfs_root, kmsg_path, overrides, max_events, kernel_only, persist=persist)
    except (OSError, ValueError) as exc:
        return ProbeError("xid", "invalid", f"XID catalog: {exc}")
    try:
        return store.observation(store.sync(deadline))
    except KernelLogUnavailable as exc:
        reason = str(exc)
        kind = "permission" if "root" in reason or "Permission" in reason else "error"
    except StoreError as exc:
        return ProbeError("xid", "error", f"XID event store: {exc}")
    # The log cannot be read: what the store already holds (from the daemon) still counts.
    try:
        return store.observation(note=reason)
    except (StoreError, KernelLogUnavailable):
        return ProbeError("xid", kind, reason)
