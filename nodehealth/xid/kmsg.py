"""The one kernel-log reader: ``/dev/kmsg`` (backlog, then follow), and journald.

``KmsgReader`` reads ``/dev/kmsg`` records without ever blocking for longer than its poll
interval, so a stop event or a deadline ends it promptly. It remembers the sequence number of
the last record it handed out (``last_seq``) and skips records at or below the position it was
started from: together with the boot id that is the store's position across restarts. A plain
file or a FIFO of records works the same way (tests, replay, ``nodehealth xid scan --kmsg``);
at end of file a follower waits for more. Records are recognised by the pattern table's one
record regex (``nodehealth.xid.patterns.KMSG_RECORD``); the lines go to the pure parser.

A saved position past the last record of the log (sequence numbers only grow within a boot, so
it belongs to no record of this boot: a damaged or foreign state file) would hide every record;
when the backlog ends below it, the reader starts again from the log's first record and says so
(``rewound``).
"""

from __future__ import annotations

import errno
import os
import re
import select
import stat
import threading
import time
from collections.abc import Iterator
from typing import Optional

from nodehealth.xid.parse import split_lines
from nodehealth.xid.patterns import KMSG_PATH, KMSG_RECORD

_READ_SIZE = 64 * 1024  # /dev/kmsg fails a read shorter than the record with EINVAL
POLL_S = 0.25

# The record regex on the bytes the reader sees (the same pattern text as the parser's).
_RECORD_RE = re.compile(KMSG_RECORD.regex.pattern.encode())
KERNEL_FACILITY = 0


class KernelLogUnavailable(Exception):
    """The kernel log could not be read; the message names the path and the reason."""


class _Rewind(Exception):
    """The backlog ended below the saved position: read the log again from its beginning."""


def _reason(path: str, exc: OSError) -> str:
    reason = exc.strerror or str(exc)
    if exc.errno in (errno.EACCES, errno.EPERM):
        reason += " (reading the kernel log needs root or CAP_SYSLOG)"
    return f"cannot read {path}: {reason}"


def open_log(path: str) -> int:
    """``path`` opened non-blocking for reading; ``KernelLogUnavailable`` names why it cannot be."""
    try:
        return os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise KernelLogUnavailable(_reason(path, exc)) from None


def boot_time(procfs_root: str = "/proc") -> Optional[float]:
    """Unix time of this boot (``btime`` in ``<procfs_root>/stat``), None when unknown.

    A record's microseconds since boot plus this is when it was logged.
    """
    try:
        with open(os.path.join(procfs_root, "stat"), encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


class KmsgReader:
    """Lines of ``/dev/kmsg`` (or a file/FIFO of its records) after a saved position.

    ``after_seq``: records with a sequence number at or below it are skipped (with their
    continuation lines). ``kernel_only``: keep only records of the kernel facility (lines
    written to ``/dev/kmsg`` from user space carry the user facility). ``last_seq`` is the
    highest sequence number read so far (skipped records included), the position to save.
    ``rewound`` says why the log was read again from its first record (the position was past
    its end), else None.
    """

    def __init__(self, path: str = KMSG_PATH, after_seq: Optional[int] = None, kernel_only: bool = False,
                 poll_s: float = POLL_S) -> None:
        self.path = path
        self.after_seq = after_seq
        self.kernel_only = kernel_only
        self.poll_s = poll_s
        self.last_seq: Optional[int] = after_seq
        self.complete = False  # the backlog was read to its end
        self.lost = 0  # records the kernel overwrote before we read them (EPIPE)
        self.rewound: Optional[str] = None
        self._max_seq: Optional[int] = None  # the highest sequence number in the log itself

    def lines(self, follow: bool = False, stop: Optional[threading.Event] = None,
              deadline: Optional[float] = None) -> Iterator[bytes]:
        """Lines after the saved position.

        Without ``follow``: the backlog, ending at its end (``complete`` then True) or at
        ``deadline`` (``time.monotonic()`` value). With ``follow``: then new records as they
        come, until ``stop`` is set or the deadline passes. Raises ``KernelLogUnavailable``
        when the log cannot be opened or read.
        """
        while True:
            try:
                yield from self._lines(follow, stop, deadline)
                return
            except _Rewind:
                self.rewound = (f"the saved position (kmsg record {self.after_seq}) is past the end of "
                                f"{self.path} (last record {self._max_seq}): read it again from its first record")
                self.after_seq = None
                self.last_seq = None
                self.complete = False

    def _lines(self, follow: bool, stop: Optional[threading.Event], deadline: Optional[float]) -> Iterator[bytes]:
        fd = open_log(self.path)
        try:
            records = stat.S_ISCHR(os.fstat(fd).st_mode)
            skipping = False
            for line in split_lines(self._chunks(fd, records, follow, stop, deadline)):
                m = _RECORD_RE.match(line)
                if m is None:
                    # a record's continuation (" KEY=value") goes with its record
                    if not (skipping and line.startswith(b" ")):
                        yield line
                    continue
                seq = int(m.group("seq"))
                if self._max_seq is None or seq > self._max_seq:
                    self._max_seq = seq
                skipping = self.after_seq is not None and seq <= self.after_seq
                if self.last_seq is None or seq > self.last_seq:
                    self.last_seq = seq
                if not skipping and self.kernel_only and int(m.group("pri")) >> 3 != KERNEL_FACILITY:
                    skipping = True
                if not skipping:
                    yield line
        finally:
            os.close(fd)

    def _at_end(self) -> None:
        """The backlog has been read: start again when it ended below the saved position."""
        first = not self.complete
        self.complete = True
        if first and self.after_seq is not None and self._max_seq is not None and self._max_seq < self.after_seq:
            raise _Rewind()

    def _chunks(self, fd: int, records: bool, follow: bool, stop: Optional[threading.Event],
                deadline: Optional[float]) -> Iterator[bytes]:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        while True:
            if stop is not None and stop.is_set():
                return
            if deadline is not None and time.monotonic() >= deadline:
                return
            try:
                chunk = os.read(fd, _READ_SIZE)
            except BlockingIOError:
                self._at_end()
                if not follow:
                    return
                poller.poll(self._wait_ms(deadline))
                continue
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # overwritten before we read it; go on
                    self.lost += 1
                    continue
                raise KernelLogUnavailable(_reason(self.path, exc)) from None
            if not chunk:  # end of a plain file, or a FIFO with no writer
                self._at_end()
                if not follow:
                    return
                if stop is not None:
                    stop.wait(self._wait_ms(deadline) / 1000)
                else:
                    time.sleep(self._wait_ms(deadline) / 1000)
                continue
            if records and not chunk.endswith(b"\n"):
                chunk += b"\n"
            yield chunk

    def _wait_ms(self, deadline: Optional[float]) -> int:
        wait = self.poll_s
        if deadline is not None:
            wait = max(0.0, min(wait, deadline - time.monotonic()))
        return int(wait * 1000)


def journal_available() -> bool:
    """Whether the systemd journal bindings (``python3-systemd``) can be imported."""
    try:
        import systemd.journal  # noqa: F401
    except ImportError:
        return False
    return True


def journal_lines(follow: bool = False, stop: Optional[threading.Event] = None,
                  poll_s: float = POLL_S) -> Iterator[bytes]:
    """Kernel messages of this boot from journald, as ``[uptime] message`` lines.

    Raises ``KernelLogUnavailable`` when the systemd bindings are not installed.
    """
    try:
        from systemd import journal
    except ImportError:
        raise KernelLogUnavailable("journald: the systemd Python bindings (python3-systemd) are not installed") \
            from None
    reader = journal.Reader()
    try:
        reader.this_boot()
        reader.add_match(_TRANSPORT="kernel")
        while True:
            for entry in reader:
                message = entry.get("MESSAGE", "")
                if isinstance(message, bytes):
                    message = message.decode("utf-8", errors="replace")
                mono = entry.get("__MONOTONIC_TIMESTAMP")
                uptime = getattr(mono, "timestamp", None)
                seconds = uptime.total_seconds() if uptime is not None else None
                prefix = f"[{seconds:12.6f}] " if seconds is not None else ""
                yield f"{prefix}{message}".encode("utf-8", errors="replace")
            if not follow or (stop is not None and stop.is_set()):
                return
            reader.wait(poll_s)
    finally:
        reader.close()
