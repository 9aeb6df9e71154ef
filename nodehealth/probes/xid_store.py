"""The per-boot XID event store's file, and the kernel-log reading that fills it (its content and
its pure changes: ``nodehealth.xid.history``; the file's reading, writing and lock:
``nodehealth.probes.xid_store_file``).

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
import json
import os
import threading
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, Callable, Optional

from nodehealth.checks.gpu_xid import xid_settings
from nodehealth.observations import ProbeError, XidObservation, XidRecord
from nodehealth.observations.record import record
from nodehealth.probes.kernel_log import FilePosition, KernelLogUnavailable, KmsgReader, boot_time, open_log
from nodehealth.probes.process_job import live_job
from nodehealth.probes.xid_store_file import MAX_STORE_BYTES as MAX_STORE_BYTES
from nodehealth.probes.xid_store_file import boot_id as boot_id
from nodehealth.probes.xid_store_file import load_state as load_state
from nodehealth.probes.xid_store_file import locked as locked
from nodehealth.probes.xid_store_file import save_state as save_state
from nodehealth.probes.xid_store_file import store_path as store_path
from nodehealth.statedir import ledger as job_ledger
from nodehealth.xid.catalog import catalog_for
from nodehealth.xid.events import XidEvent
from nodehealth.xid.history import DEFAULT_MAX_EVENTS as DEFAULT_MAX_EVENTS
from nodehealth.xid.history import FORMAT as FORMAT
from nodehealth.xid.history import MAX_SEQ as MAX_SEQ
from nodehealth.xid.history import StoreError as StoreError
from nodehealth.xid.history import StoreState as StoreState
from nodehealth.xid.history import add_events as add_events
from nodehealth.xid.history import clear_events as clear_events
from nodehealth.xid.history import event_time as event_time
from nodehealth.xid.history import judged as judged
from nodehealth.xid.history import roll_boot as roll_boot
from nodehealth.xid.history import stored_at
from nodehealth.xid.parse import ScanStats, scan
from nodehealth.xid.patterns import KMSG_PATH

if TYPE_CHECKING:
    from nodehealth.config.schema import Config

__all__ = [
    "DEFAULT_MAX_EVENTS",
    "FORMAT",
    "MAX_SEQ",
    "StoreError",
    "StoreState",
    "add_events",
    "catalog_for",
    "clear_events",
    "event_time",
    "judged",
    "roll_boot",
]


def _check_readable(path: str) -> None:
    os.close(open_log(path))


@record
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

    def __init__(
        self,
        state_dir: str,
        procfs_root: str = "/proc",
        kmsg_path: str = KMSG_PATH,
        overrides: tuple[str, ...] = (),
        max_events: int = DEFAULT_MAX_EVENTS,
        kernel_only: bool = True,
        now: Callable[[], float] = time.time,
        persist: bool = True,
    ) -> None:
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
        return cls(
            cfg.paths.state_dir,
            cfg.paths.procfs_root,
            s.kmsg_path,
            s.severity_overrides,
            s.store_max_events,
            s.kernel_facility_only,
            now,
        )

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
            reader = KmsgReader(
                self.kmsg_path, after_seq=state.kmsg_seq, kernel_only=self.kernel_only, position=state.file_position
            )
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

    def observation(
        self, result: Optional[SyncResult] = None, note: Optional[str] = None, gathered_at: Optional[float] = None
    ) -> XidObservation:
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
            XidRecord(
                event=judged(d, self.catalog),
                boot_id=d["boot_id"],
                at=stored_at(d),
                current_boot=d["boot_id"] == current,
            )
            for d in state.events
        )
        ledger = (
            job_ledger.entries(job_ledger.read(self.state_dir)) if any(r.event.job_id is None for r in records) else ()
        )
        return XidObservation(
            boot_id=current,
            records=records,
            gathered_at=gathered_at if gathered_at is not None else self.now(),
            source=self.kmsg_path,
            complete=complete,
            kmsg_seq=state.kmsg_seq,
            skipped_lines=skipped,
            last_clear=state.last_clear,
            ledger=ledger,
            notes=notes,
        )

    # -- follow ---------------------------------------------------------------------------

    def follow(
        self,
        stop: threading.Event,
        on_event: Optional[Callable[[XidRecord], None]] = None,
        save_interval_s: float = 5.0,
        poll_s: float = 0.25,
        on_note: Optional[Callable[[str], None]] = None,
    ) -> None:
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
        reader = KmsgReader(
            self.kmsg_path,
            after_seq=state.kmsg_seq,
            kernel_only=self.kernel_only,
            poll_s=poll_s,
            position=state.file_position,
        )
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
            stale = (
                start_position
                if position is not None
                and not file_checked
                and not reader.resumed
                and position.same_file(start_position)
                else None
            )
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

    def _record(
        self,
        events: list[XidEvent],
        last_seq: Optional[int],
        restart: bool = False,
        position: Optional[FilePosition] = None,
        stale: Optional[FilePosition] = None,
    ) -> list[XidRecord]:
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
            if (
                position is not None
                and stored is not None
                and position.same_file(stored)
                and stored.offset >= position.offset
            ):
                events = []  # read and recorded by another reader already
            added = add_events(state, self._stamped(events), self.catalog, self.max_events)
            new = state.events[-added:] if added else []
            if last_seq is not None:
                state.kmsg_seq = max(last_seq, state.kmsg_seq or -1)
            if position is not None and (
                stored is None or (position.same_file(stored) and position.offset > stored.offset)
            ):
                state.file_position = position
            save_state(self.state_dir, state)
        return [XidRecord(event=judged(d, self.catalog), boot_id=d["boot_id"], at=stored_at(d)) for d in new]


# --------------------------------------------------------------------------- the "xid" probe


def gather(
    state_dir: str,
    procfs_root: str,
    kmsg_path: str,
    overrides: tuple[str, ...],
    max_events: int,
    kernel_only: bool,
    timeout_s: float,
    persist: bool = True,
) -> Any:
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
