"""The one kernel-log reader: ``/dev/kmsg`` (backlog, then follow), and journald.

``KmsgReader`` reads ``/dev/kmsg`` records without ever blocking for longer than its poll
interval, so a stop event or a deadline ends it promptly; a stop it can poll (``platform.wake``)
is waited on beside the log instead, so an idle follower sleeps until a record or the stop comes.
It remembers the sequence number of the last record it handed out (``last_seq``) and skips
records at or below the position it was started from: together with the boot id that is the
store's position across restarts. A plain file or a FIFO of records works the same way (tests,
replay, ``nodehealth xid scan --kmsg``); at end of file a follower waits for more. Records are
recognised by the pattern table's one record regex (``nodehealth.xid.patterns.KMSG_RECORD``);
the lines go to the pure parser.

A saved position past the last record of the log (sequence numbers only grow within a boot, so
it belongs to no record of this boot: a damaged or foreign state file) would hide every record;
when the backlog ends below it, the reader starts again from the log's first record and says so
(``rewound``).
"""

from __future__ import annotations

import errno
import os
import select
import stat
import threading
import time
from collections.abc import Iterator
from typing import Optional

from nodehealth.platform.wake import WakeEvent
from nodehealth.xid.history import FilePosition as FilePosition
from nodehealth.xid.parse import MAX_LINE_BYTES, split_lines
from nodehealth.xid.pattern_kit import Regex
from nodehealth.xid.patterns import KMSG_PATH, KMSG_RECORD

_READ_SIZE = 64 * 1024  # /dev/kmsg fails a read shorter than the record with EINVAL
POLL_S = 0.25
# The longest wait on /dev/kmsg with a pollable stop (platform.wake.WakeEvent): a record or set() ends
# it at once, so this only bounds a wait nobody will end (a lost wake-up would cost at most this).
WAKE_IDLE_S = 60.0

# The record regex on the bytes the reader sees (the same pattern text as the parser's), compiled on
# first use.
_RECORD_RE: Regex[bytes] = Regex(KMSG_RECORD.regex.pattern.encode())
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


def _kind(mode: int) -> str:
    for test, words in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISLNK, "a symbolic link"),
    ):
        if test(mode):
            return words
    return "not a regular file"


def open_log(path: str) -> int:
    """``path`` opened for reading, never blocking; ``KernelLogUnavailable`` names why it cannot be.

    The kernel's record device (a character device: ``/dev/kmsg``), or a recorded log: a regular
    file, opened by ``platform.ground.open_regular`` (``O_NOFOLLOW|O_NONBLOCK``, judged on the
    descriptor, one name only). A symbolic link, a FIFO, a socket, a directory or a block device
    is refused without being read: a recorded log may lie in a directory others can write.
    """
    from nodehealth.platform import ground

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise KernelLogUnavailable(
                f"cannot read {path}: it is a symbolic link (refused: the kernel log is "
                "/dev/kmsg or a regular file, named by its own path)"
            ) from None
        raise KernelLogUnavailable(_reason(path, exc)) from None
    try:
        mode = os.fstat(fd).st_mode
    except OSError as exc:
        os.close(fd)
        raise KernelLogUnavailable(_reason(path, exc)) from None
    if stat.S_ISCHR(mode):
        return fd
    os.close(fd)
    if not stat.S_ISREG(mode):
        raise KernelLogUnavailable(
            f"cannot read {path}: it is {_kind(mode)}, not the kernel log device or a "
            "regular file (refused without reading it)"
        )
    try:
        return ground.open_regular(path)  # judged again on its own descriptor: what was checked is what is read
    except ground.Foreign as exc:
        raise KernelLogUnavailable(f"cannot read {path}: {exc}") from None
    except OSError as exc:
        raise KernelLogUnavailable(_reason(path, exc)) from None


_TAIL_BYTES = 32


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
    continuation lines). ``kernel_only`` (the default): keep only records of the kernel
    facility; the kernel gives every record written to ``/dev/kmsg`` from user space another
    facility (``devkmsg_write`` turns facility 0 into LOG_USER), so a forwarder, journald's
    ``ForwardToKMsg=`` or a test line is never taken for the driver's. ``last_seq`` is the
    highest sequence number read so far (skipped records included), the position to save.
    ``rewound`` says why the log was read again from its first record (the position was past
    its end), else None.
    """

    def __init__(
        self,
        path: str = KMSG_PATH,
        after_seq: Optional[int] = None,
        kernel_only: bool = True,
        poll_s: float = POLL_S,
        position: Optional[FilePosition] = None,
    ) -> None:
        self.path = path
        # A recorded log (a regular file) is read from ``position`` when it is the same file and
        # has not been rewritten before it, else from its beginning; ``resumed`` says which.
        self.start_position = position
        self.resumed = False
        self._file: Optional[tuple[int, int]] = None  # (st_dev, st_ino) of a regular file being read
        self._offset = 0  # the first byte not yet handed out as part of a whole line
        self._fd: Optional[int] = None
        self._tail = ""
        self.after_seq = after_seq
        self.kernel_only = kernel_only
        self.poll_s = poll_s
        self.last_seq: Optional[int] = after_seq
        self.complete = False  # the backlog was read to its end
        self.lost = 0  # records the kernel overwrote before we read them (EPIPE)
        self.rewound: Optional[str] = None
        self._max_seq: Optional[int] = None  # the highest sequence number in the log itself

    def lines(
        self, follow: bool = False, stop: Optional[threading.Event] = None, deadline: Optional[float] = None
    ) -> Iterator[bytes]:
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
                self.rewound = (
                    f"the saved position (kmsg record {self.after_seq}) is past the end of "
                    f"{self.path} (last record {self._max_seq}): read it again from its first record"
                )
                self.after_seq = None
                self.last_seq = None
                self.complete = False
                self.start_position, self.resumed = None, False

    def position(self) -> Optional[FilePosition]:
        """Where a recorded log has been read to (after the last whole line handed out), None for
        the record device. Valid while reading and after."""
        if self._file is None:
            return None
        if self._fd is not None:
            self._tail = _tail_before(self._fd, self._offset)
        return FilePosition(self._file[0], self._file[1], self._offset, self._tail)

    def _start(self, fd: int, st: os.stat_result) -> None:
        """Seek a recorded log to the saved position when it still describes this file."""
        self._file = (st.st_dev, st.st_ino)
        self._offset = 0
        saved = self.start_position
        if (
            saved is not None
            and (saved.dev, saved.ino) == self._file
            and 0 < saved.offset <= st.st_size
            and _tail_before(fd, saved.offset) == saved.tail
        ):
            os.lseek(fd, saved.offset, os.SEEK_SET)
            self._offset = saved.offset
            self.resumed = True

    def _file_lines(
        self, fd: int, follow: bool, stop: Optional[threading.Event], deadline: Optional[float]
    ) -> Iterator[bytes]:
        """Whole lines of a recorded log, each counted in the offset before it is handed out; a
        last line without its newline yet is left for the next read (a writer may be half way)."""
        pending = b""
        dropping = False  # inside a line longer than MAX_LINE_BYTES: its first part was handed out
        consumed = 0  # bytes of ``pending`` (or of the dropped line) before the current line
        for chunk in self._chunks(fd, False, follow, stop, deadline):
            start = 0
            while True:
                cut = chunk.find(b"\n", start)
                if cut < 0:
                    rest = chunk[start:]
                    consumed += len(rest)
                    if not dropping:
                        pending += rest
                        if len(pending) > MAX_LINE_BYTES:
                            line, pending, dropping = pending[: MAX_LINE_BYTES + 1], b"", True
                            yield line  # the scanner counts it as too long; the offset waits for its end
                    break
                piece = chunk[start:cut]
                self._offset += consumed + len(piece) + 1
                consumed = 0
                start = cut + 1
                if dropping:
                    dropping = False
                    continue
                line = pending + piece
                pending = b""
                yield line[: MAX_LINE_BYTES + 1] if len(line) > MAX_LINE_BYTES else line

    def _lines(self, follow: bool, stop: Optional[threading.Event], deadline: Optional[float]) -> Iterator[bytes]:
        fd = open_log(self.path)
        try:
            st = os.fstat(fd)
            records = stat.S_ISCHR(st.st_mode)
            if records:
                source = split_lines(self._chunks(fd, records, follow, stop, deadline))
            else:
                self._start(fd, st)
                self._fd = fd
                source = self._file_lines(fd, follow, stop, deadline)
            skipping = False
            record = _RECORD_RE.compiled().match
            for line in source:
                m = record(line)
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
            if self._fd is not None:
                self._tail = _tail_before(fd, self._offset)
                self._fd = None
            os.close(fd)

    def _at_end(self) -> None:
        """The backlog has been read: start again when it ended below the saved position."""
        first = not self.complete
        self.complete = True
        if first and self.after_seq is not None and self._max_seq is not None and self._max_seq < self.after_seq:
            raise _Rewind()

    def _chunks(
        self, fd: int, records: bool, follow: bool, stop: Optional[threading.Event], deadline: Optional[float]
    ) -> Iterator[bytes]:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        # A stop that can be polled (platform.wake) is waited on beside the log: no wake-up each poll_s.
        idle_s = self.poll_s
        if isinstance(stop, WakeEvent) and stop.fileno() >= 0:
            poller.register(stop.fileno(), select.POLLIN)
            idle_s = WAKE_IDLE_S
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
                poller.poll(self._wait_ms(deadline, idle_s))
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

    def _wait_ms(self, deadline: Optional[float], wait: Optional[float] = None) -> int:
        wait = self.poll_s if wait is None else wait
        if deadline is not None:
            wait = max(0.0, min(wait, deadline - time.monotonic()))
        return int(wait * 1000)


def _tail_before(fd: int, offset: int) -> str:
    """The bytes just before ``offset`` (hex), read without moving the file position."""
    if offset <= 0:
        return ""
    start = max(0, offset - _TAIL_BYTES)
    try:
        return os.pread(fd, offset - start, start).hex()
    except OSError:
        return ""


def journal_available() -> bool:
    """Whether the systemd journal bindings (``python3-systemd``) can be imported."""
    try:
        import systemd.journal  # noqa: F401
    except ImportError:
        return False
    return True


def kernel_facility(value: object) -> bool:
    """Whether a journal entry's ``SYSLOG_FACILITY`` (absent, an int or its text) is the kernel's.

    journald reads every ``/dev/kmsg`` record as ``_TRANSPORT=kernel``, also those written from
    user space (which the kernel gives another facility); it records a facility only when it is
    not the kernel's (``dev_kmsg_record``: ``if (priority & LOG_FACMASK)``).
    """
    if value is None:
        return True
    text = value.decode("ascii", "replace") if isinstance(value, bytes) else str(value)
    return text.strip() == str(KERNEL_FACILITY)


def journal_lines(
    follow: bool = False, stop: Optional[threading.Event] = None, poll_s: float = POLL_S, kernel_only: bool = True
) -> Iterator[bytes]:
    """Kernel messages of this boot from journald, as ``[uptime] message`` lines.

    ``kernel_only`` (the default): only records of the kernel facility, as ``KmsgReader``.
    Raises ``KernelLogUnavailable`` when the systemd bindings are not installed.
    """
    try:
        from systemd import journal
    except ImportError:
        raise KernelLogUnavailable(
            "journald: the systemd Python bindings (python3-systemd) are not installed"
        ) from None
    reader = journal.Reader()
    try:
        reader.this_boot()
        reader.add_match(_TRANSPORT="kernel")
        while True:
            for entry in reader:
                if kernel_only and not kernel_facility(entry.get("SYSLOG_FACILITY")):
                    continue
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
