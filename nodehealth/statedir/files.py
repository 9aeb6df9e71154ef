"""Small files in the state dir: atomic writes with fsync, a lock, appends that detect short writes.

Standard library only, and only ``os`` and ``json`` at import time (``fcntl`` when a lock is
taken), so the prolog's fast path writes through the same code as the daemon.

Writers take an advisory lock (``<file>.lock``, non-blocking attempts until a deadline) so a
prolog and a health check running at the same moment do not lose each other's update. A
lock that cannot be had in time is given up on: the faces must never wait for it.
"""

from __future__ import annotations

import json
import os

TYPE_CHECKING = False
if TYPE_CHECKING:  # no typing import at run time: the fast path pays for every module
    from typing import Any, Optional

MAX_READ = 1 << 20  # the state files are a few KiB; a larger one is read only this far
DIR_MODE = 0o755
FILE_MODE = 0o644


class ShortWrite(OSError):
    """``write(2)`` stored fewer bytes than asked (disk full, quota): the record is not whole."""


def ensure_dir(directory: str) -> None:
    os.makedirs(directory or ".", mode=DIR_MODE, exist_ok=True)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:
            raise ShortWrite(f"write stored {len(data) - len(view)} of {len(data)} bytes")
        view = view[n:]


def write_atomic(path: str, text: str) -> None:
    """Write ``text`` to a new temp file in the same directory, fsync, rename over ``path``.

    The temp name carries the pid and random bytes and is created with ``O_EXCL``, so a file
    planted under a predictable name is never written through.
    """
    directory = os.path.dirname(path) or "."
    ensure_dir(directory)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.{os.urandom(4).hex()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0),
                 FILE_MODE)
    try:
        try:
            _write_all(fd, text.encode("utf-8"))
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


def write_json(path: str, obj: Any, compact: bool = False) -> None:
    text = json.dumps(obj, separators=(",", ":")) if compact else json.dumps(obj, indent=1, sort_keys=True)
    write_atomic(path, text + "\n")


def append_line(path: str, line: str) -> int:
    """Append one record (one ``write(2)`` in append mode); returns the file's size after it.

    Raises ``ShortWrite`` when the kernel stored only part of the record.
    """
    data = line.encode("utf-8")
    ensure_dir(os.path.dirname(path))
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
    try:
        n = os.write(fd, data)
        if n != len(data):
            raise ShortWrite(f"{path}: appended {n} of {len(data)} bytes")
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def read_bytes(path: str, limit: int = MAX_READ) -> Optional[bytes]:
    try:
        with open(path, "rb") as f:
            return f.read(limit)
    except OSError:
        return None


def read_text(path: str, limit: int = 8 << 20) -> str:
    data = read_bytes(path, limit)
    return "" if data is None else data.decode("utf-8", "replace")


def read_json(path: str, limit: int = MAX_READ) -> Any:
    """The JSON in ``path``; None when missing, unreadable or not JSON."""
    data = read_bytes(path, limit)
    if data is None:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return None


def read_object(path: str, limit: int = MAX_READ) -> Optional[dict[str, Any]]:
    """The JSON object in ``path``; None when missing, unreadable or not a JSON object."""
    raw = read_json(path, limit)
    return raw if isinstance(raw, dict) else None


class locked:
    """``with locked(path, timeout_s) as got:`` holds ``path + '.lock'``; ``got`` is False when the
    lock could not be had in time (the caller decides whether to go on without it)."""

    def __init__(self, path: str, timeout_s: float = 1.0) -> None:
        self.path, self.timeout_s, self.fd = path + ".lock", timeout_s, -1

    def __enter__(self) -> bool:
        import fcntl
        import time

        try:
            ensure_dir(os.path.dirname(self.path))
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
        except OSError:
            return False
        end = time.monotonic() + self.timeout_s
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except OSError:
                if time.monotonic() >= end:
                    return False
                time.sleep(0.01)

    def __exit__(self, *exc: Any) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # releases the lock
            self.fd = -1


def prune_oldest(directory: str, suffix: str, keep: int, over: int) -> None:
    """Past ``over`` files ending in ``suffix`` in ``directory``, delete all but the newest ``keep``."""
    try:
        names = [n for n in os.listdir(directory) if n.endswith(suffix)]
    except OSError:
        return
    if len(names) <= over:
        return
    aged = []
    for n in names:
        try:
            aged.append((os.stat(os.path.join(directory, n)).st_mtime, n))
        except OSError:
            continue
    for _, n in sorted(aged)[:-keep]:
        try:
            os.unlink(os.path.join(directory, n))
        except OSError:
            pass

