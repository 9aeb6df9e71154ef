"""Small files in the state dir: JSON state written atomically, the job ledger, the boot id.

Writers take an advisory lock (``<file>.lock``, non-blocking attempts until a deadline) so a
prolog and a health check running at the same moment do not lose each other's update. A
lock that cannot be had in time is given up on: the faces must never wait for it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
import time
from typing import Any, Iterator, Optional

from nodehealth.statedir import ledger

BOOT_ID = "/proc/sys/kernel/random/boot_id"


def read_boot_id(path: str = BOOT_ID) -> Optional[str]:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            text = f.read(128).strip()
    except OSError:
        return None
    return text or None


@contextlib.contextmanager
def locked(path: str, timeout_s: float = 1.0) -> Iterator[bool]:
    """Hold ``path + '.lock'`` while the block runs; yields False if it could not be had in time."""
    fd = -1
    got = False
    try:
        os.makedirs(os.path.dirname(path) or ".", mode=0o755, exist_ok=True)
        fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        end = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                got = True
                break
            except OSError:
                if time.monotonic() >= end:
                    break
                time.sleep(0.01)
    except OSError:
        pass
    try:
        yield got
    finally:
        if fd >= 0:
            os.close(fd)  # releases the lock


def read_json(path: str) -> Any:
    """The JSON in ``path``; None when missing, unreadable or not JSON."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def write_atomic(path: str, text: str) -> None:
    """Write ``text`` to a temp file in the same directory, fsync, rename over ``path``."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, mode=0o755, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_json(path: str, obj: Any) -> None:
    write_atomic(path, json.dumps(obj, indent=1, sort_keys=True) + "\n")


def ledger_append(path: str, line: str, max_bytes: int) -> None:
    """Append one record; when the file outgrows ``max_bytes``, keep its newest half (atomic rewrite)."""
    data = line.encode("utf-8")
    os.makedirs(os.path.dirname(path) or ".", mode=0o755, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, data)  # one write(2) of one short line: appended whole
        size = os.fstat(fd).st_size
    finally:
        os.close(fd)
    if size > max_bytes:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.readlines()
        write_atomic(path, "".join(ledger.compact(lines, max_bytes)))


def read_text(path: str, limit: int = 8 << 20) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(limit)
    except OSError:
        return ""
