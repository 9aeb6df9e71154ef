"""Small files in the state dir: atomic writes, a lock, appends, bounded strict reads, one update.

Standard library only, and only ``os`` at import time (``json`` when ``strictjson`` first needs it,
``fcntl`` when a lock is taken), so the prolog's fast path writes through the same code as the
daemon. The state dir's own trust rules are ``statedir.directory``'s, the strict JSON
``statedir.strictjson``'s, and the one-time move from the layout before the split
``statedir.upgrade``'s; the names of the first two that most callers use are re-exported here
(``files.check_dir``, ``files.parse_json``, ...), so a caller imports one module.

**Files.** Every file is opened with ``O_NOFOLLOW`` (reads too, and the lock files): a symlink
planted in the state dir is never written or read through. Reads also refuse anything but a
regular file (a FIFO is opened non-blocking and refused, never waited on). A new file comes
from a unique name (``O_EXCL``, random bytes) in the same directory and is renamed into place.
Modes are set with ``fchmod``, never left to the umask: ``STATE_FILE_MODE`` (0600) for the state
dir's files, which hold user names, job ids, the config text and the verdict that lets a job
start, and which only root (the faces, the daemon) reads; it is ``write_atomic``'s default.
``FILE_MODE`` (0644) only where asked for, for a file written for another reader (the
node_exporter textfile collector runs as its own user). A state file is written through
``write_state`` / ``write_state_json``, which check the state dir (``require_state_dir``:
created 0700 first, refused when not trusted) before anything is written into it; a directory
``write_atomic`` has to create itself is made 0700, never wider.

**Reads.** ``read_json_checked`` returns the strict value (``parse_json``) or the reason, which
the caller logs; the state is then treated as absent and rewritten by the next write. No writer
stores more than ``MAX_READ`` bytes of JSON, what a reader reads (``update_json``).

Writers take an advisory lock (``<file>.lock``, non-blocking attempts until a deadline) so a
prolog and a health check running at the same moment do not lose each other's update. A
lock that cannot be had in time is given up on: the faces must never wait for it.
"""

from __future__ import annotations

import os

from nodehealth.statedir.directory import (
    DIR_MODE,
    FILE_MODE,
    IFMT,
    IFREG,
    OPEN_FLAGS,
    STATE_DIR_MODE,
    STATE_FILE_MODE,
    UnsafeDir,
    check_dir,
    ensure_dir,
    ensure_state_dir,
    require_state_dir,
    require_subdir,
)
from nodehealth.statedir.strictjson import MAX_DEPTH, MAX_INT_DIGITS, dumps, parse_json, too_deep

TYPE_CHECKING = False
if TYPE_CHECKING:  # no typing import at run time: the fast path pays for every module
    from typing import Any, Callable, Optional, TypeVar, Union

    T = TypeVar("T")

__all__ = [  # the re-exported names are the directory's and the strict JSON's (see the docstring)
    "DIR_MODE",
    "FILE_MODE",
    "MAX_DEPTH",
    "MAX_INT_DIGITS",
    "MAX_READ",
    "STATE_DIR_MODE",
    "STATE_FILE_MODE",
    "ShortWrite",
    "UnsafeDir",
    "append_line",
    "check_dir",
    "dumps",
    "ensure_dir",
    "ensure_state_dir",
    "locked",
    "parse_json",
    "prune_oldest",
    "read_bytes",
    "read_checked",
    "read_json",
    "read_json_checked",
    "read_object",
    "read_object_checked",
    "read_text",
    "require_state_dir",
    "require_subdir",
    "too_deep",
    "update_json",
    "why_unreadable",
    "write_atomic",
    "write_json",
    "write_state",
    "write_state_json",
]

MAX_READ = 1 << 20  # the state files are a few KiB; a larger one is read only this far
_ELOOP = 40  # Linux: O_NOFOLLOW on a symlink


class ShortWrite(OSError):
    """``write(2)`` stored fewer bytes than asked (disk full, quota): the record is not whole."""


# --- writing -------------------------------------------------------------------------------------


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:
            raise ShortWrite(f"write stored {len(data) - len(view)} of {len(data)} bytes")
        view = view[n:]


def write_atomic(path: str, text: Union[str, bytes], mode: int = STATE_FILE_MODE, durable: bool = True) -> None:
    """Write ``text`` (UTF-8; bytes as they are) to a new temp file in the same directory, fsync,
    rename over ``path``. ``durable=False``: no fsync, for a file of this boot only that is
    rewritten soon (a crash that loses the page cache is a reboot, after which the file is
    refused as another boot's: the fsync would keep nothing that is ever read).

    The temp file has a unique name (random bytes, created with ``O_EXCL | O_NOFOLLOW``, as
    ``mkstemp`` does), so nothing planted under a name is ever written through; the rename
    replaces a symlink at ``path`` instead of following it. ``mode`` is set with ``fchmod``:
    ``STATE_FILE_MODE`` (the default) for a state-dir file, ``FILE_MODE`` for one another user
    reads. A missing directory is created 0700 (whatever the umask, never wider); a state file
    goes through ``write_state``, which checks the state dir first.
    """
    directory = os.path.dirname(path) or "."
    if not os.path.isdir(directory):
        os.makedirs(directory, STATE_DIR_MODE, exist_ok=True)  # mode & ~umask: at most 0700
    stem = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.")
    for attempt in range(100):
        tmp = stem + os.urandom(6).hex()
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | OPEN_FLAGS, STATE_FILE_MODE)
            break
        except FileExistsError:
            if attempt == 99:
                raise
    try:
        try:
            os.fchmod(fd, mode)
            _write_all(fd, text if isinstance(text, bytes) else text.encode("utf-8"))
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_json(path: str, obj: Any, compact: bool = False, mode: int = STATE_FILE_MODE) -> None:
    write_atomic(path, dumps(obj, compact) + "\n", mode)


def write_state(state_dir: str, path: str, text: Union[str, bytes]) -> None:
    """Write a state file ``path`` in ``state_dir`` (0600) after ``require_state_dir``: the
    directory is created 0700 before anything goes into it, and a directory that is not
    trusted (a link, another user's, writable by others) gets nothing (``UnsafeDir``)."""
    require_state_dir(state_dir)
    write_atomic(path, text, STATE_FILE_MODE)


def write_state_json(state_dir: str, path: str, obj: Any, compact: bool = False) -> None:
    """``write_state`` of ``obj`` as strict JSON (``dumps``)."""
    write_state(state_dir, path, dumps(obj, compact) + "\n")


def append_line(path: str, line: str, mode: int = STATE_FILE_MODE, follow_replace: int = 0) -> int:
    """Append one record (one ``write(2)`` in append mode); returns the file's size after it.

    The file is opened ``O_NOFOLLOW`` and must be a regular file; a new one gets ``mode``.
    When the file does not end with a newline (a record torn by an earlier short write), this
    record starts on a line of its own, so the torn one is not glued to it. Raises
    ``ShortWrite`` when the kernel stored only part of the record.

    ``follow_replace`` (for a writer that does not hold the file's lock): when, after the write, the
    name no longer leads to the file written (a compaction renamed a new file over it), the record
    is appended again to the new file, up to that many times. The compaction copies what reached
    the old file before its rename, so the record may then stand twice, never nowhere.
    """
    data = line.encode("utf-8")
    for _ in range(follow_replace + 1):
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | OPEN_FLAGS, mode)
        try:
            st = os.fstat(fd)
            if st.st_mode & IFMT != IFREG:
                raise OSError(f"{path} is not a regular file")
            out = data
            if st.st_size == 0:
                if st.st_mode & 0o7777 != mode:
                    os.fchmod(fd, mode)
            elif os.pread(fd, 1, st.st_size - 1) != b"\n":
                out = b"\n" + data
            n = os.write(fd, out)
            if n != len(out):
                raise ShortWrite(f"{path}: appended {n} of {len(out)} bytes (the record is torn)")
            size = os.fstat(fd).st_size
        finally:
            os.close(fd)
        if not follow_replace:
            break
        try:
            now = os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            continue  # the ledger was removed after the write: the record goes into a new one
        if (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino):
            break
    return size


# --- reading -------------------------------------------------------------------------------------


def why_unreadable(path: str, exc: OSError) -> str:
    """The reason an open or read of ``path`` failed, in words (a symlink says so)."""
    if exc.errno == _ELOOP:
        return f"{path} is a symbolic link (not followed)"
    return f"{path}: {exc.strerror or exc}"


def read_checked(path: str, limit: int = MAX_READ) -> tuple[Optional[bytes], Optional[str]]:
    """``(data, None)``: up to ``limit`` bytes of a regular file, read without following a
    symlink; ``(None, None)``: no such file; ``(None, why)``: a symlink, not a regular file,
    unreadable."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | OPEN_FLAGS)
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, why_unreadable(path, exc)
    try:
        if os.fstat(fd).st_mode & IFMT != IFREG:
            return None, f"{path} is not a regular file"
        chunks = []
        left = limit
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks), None
    except OSError as exc:
        return None, why_unreadable(path, exc)
    finally:
        os.close(fd)


def read_bytes(path: str, limit: int = MAX_READ) -> Optional[bytes]:
    """Up to ``limit`` bytes of a regular file (never through a symlink); None when it cannot be read."""
    return read_checked(path, limit)[0]


def read_text(path: str, limit: int = 8 << 20) -> str:
    data = read_bytes(path, limit)
    return "" if data is None else data.decode("utf-8", "replace")


def read_json_checked(path: str, limit: int = MAX_READ) -> tuple[Any, Optional[str]]:
    """``(value, None)`` for a file that parses (``parse_json``); ``(None, None)`` for no file;
    ``(None, why)`` for one that is unusable: the caller logs ``why``, treats the state as
    absent, and its next write replaces the file."""
    data, why = read_checked(path, limit + 1)
    if data is None:
        return None, why
    if len(data) > limit:
        return None, f"{path} is larger than {limit} bytes"
    if not data.strip():
        return None, f"{path} is empty"
    try:
        return parse_json(data), None
    except ValueError as exc:  # UnicodeDecodeError is a ValueError too
        return None, f"{path} is not valid JSON ({str(exc)[:200]})"


def read_json(path: str, limit: int = MAX_READ) -> Any:
    """The JSON in ``path``; None when missing, unreadable or not strict JSON (``read_json_checked``)."""
    return read_json_checked(path, limit)[0]


def read_object_checked(path: str, limit: int = MAX_READ) -> tuple[Optional[dict[str, Any]], Optional[str]]:
    """``read_json_checked`` for a JSON object: anything else is a reason."""
    raw, why = read_json_checked(path, limit)
    if raw is None or isinstance(raw, dict):
        return raw, why
    return None, f"{path} holds a JSON {type(raw).__name__}, not an object"


def read_object(path: str, limit: int = MAX_READ) -> Optional[dict[str, Any]]:
    """The JSON object in ``path``; None when missing, unreadable or not a JSON object."""
    return read_object_checked(path, limit)[0]


# --- one update ----------------------------------------------------------------------------------


def update_json(
    path: str,
    change: Callable[[Any], T],
    lock_timeout_s: float,
    encode: Optional[Callable[[T], Any]] = None,
    log: Any = None,
) -> T:
    """Re-read ``path`` under its lock, apply ``change``, write the result atomically (0600).

    ``change`` gets the strict JSON value (``read_json_checked``; None when the file is absent
    or unusable, which ``log(why, notable=True)`` is told) and returns the new value, written
    as ``encode(new)`` (``new`` itself without ``encode``); ``new`` is returned. A lock that
    cannot be had in time is said through ``log`` and the write goes on without it. Never
    stores what the readers refuse: JSON of more than ``MAX_READ`` bytes raises ``OSError``
    and the file keeps its old text. The caller checks the directory first
    (``require_state_dir``); any ``OSError`` of the write is raised.
    """
    with locked(path, timeout_s=lock_timeout_s) as got:
        if not got and log is not None:
            log(f"state lock {path}.lock busy; writing anyway")
        raw, why = read_json_checked(path)
        if why and log is not None:
            log(f"state file unusable, starting afresh and rewriting it: {why}", notable=True)
        new = change(raw)
        text = dumps(new if encode is None else encode(new)) + "\n"
        if len(text) > MAX_READ:  # never store what the reader refuses (readers read MAX_READ)
            raise OSError(f"the new state is {len(text)} bytes, more than {MAX_READ}: not written")
        write_atomic(path, text, STATE_FILE_MODE)
        return new


# --- the lock and pruning ------------------------------------------------------------------------


class locked:
    """``with locked(path, timeout_s) as got:`` holds ``path + '.lock'``; ``got`` is False when the
    lock could not be had in time (the caller decides whether to go on without it). The lock
    file is opened ``O_NOFOLLOW`` (a planted symlink means no lock, never a write through it)."""

    def __init__(self, path: str, timeout_s: float = 1.0) -> None:
        self.path, self.timeout_s, self.fd = path + ".lock", timeout_s, -1

    def __enter__(self) -> bool:
        import fcntl
        import time

        try:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | OPEN_FLAGS, STATE_FILE_MODE)
            st = os.fstat(self.fd)
            if st.st_mode & IFMT != IFREG:
                raise OSError(f"{self.path} is not a regular file")
            if st.st_mode & 0o7777 != STATE_FILE_MODE:
                os.fchmod(self.fd, STATE_FILE_MODE)
        except OSError:
            self._close()
            return False
        end = time.monotonic() + self.timeout_s
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except OSError:
                if time.monotonic() >= end:
                    return False
                time.sleep(0.002)

    def _close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # releases the lock
            self.fd = -1

    def __exit__(self, *exc: Any) -> None:
        self._close()


def prune_oldest(directory: str, suffix: str, keep: int, over: int) -> None:
    """Past ``over`` files ending in ``suffix`` in ``directory``, delete all but the newest ``keep``
    (regular files only; a symlink is removed, never followed)."""
    try:
        names = [n for n in os.listdir(directory) if n.endswith(suffix)]
    except OSError:
        return
    if len(names) <= over:
        return
    aged = []
    for n in names:
        try:
            aged.append((os.lstat(os.path.join(directory, n)).st_mtime, n))
        except OSError:
            continue
    for _, n in sorted(aged)[:-keep]:
        try:
            os.unlink(os.path.join(directory, n))
        except OSError:
            pass
