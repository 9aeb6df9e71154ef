"""The guard that keeps the suite's own processes out of the host's state dirs.

``install(dirs, log_fd)`` adds an audit hook (PEP 578) to this process: every change it makes
under one of ``dirs`` (an open for writing or creating, a directory descriptor on one of them,
mkdir, rename/replace, remove, rmdir, link, symlink, chmod, chown, utime, truncate, rmtree) is
appended as one line to ``log_fd``, an ``O_APPEND`` descriptor, so a child forked from this
process (the NVML probe's) reports through the same file. ``taken(log_fd, offset)`` reads what
was logged since ``offset``.

What another process on the host does there (an administrator's ``nodehealth check``, a daemon)
is not seen: programs the tests start get the defaults of ``[paths]`` moved into the run's own
sandbox instead (``NODEHEALTH_DEFAULT_ROOT``, tests/conftest.py).
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any, Iterable, Optional

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)

# event -> (index of each path argument, index of its dir_fd argument or None)
_EVENTS: dict[str, tuple[tuple[int, Optional[int]], ...]] = {
    "os.mkdir": ((0, 2),),
    "os.rename": ((0, 2), (1, 3)),
    "os.remove": ((0, 1),),
    "os.rmdir": ((0, 1),),
    "os.link": ((0, 2), (1, 3)),
    "os.symlink": ((1, 2),),
    "os.chmod": ((0, 2),),
    "os.chown": ((0, 3),),
    "os.utime": ((0, 3),),
    "os.truncate": ((0, None),),
    "shutil.rmtree": ((0, 1),),
}

_state: dict[str, Any] = {"dirs": (), "fd": -1}
_busy = threading.local()


def _fd_path(fd: int) -> Optional[str]:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None


def _resolve(path: Any, dir_fd: Any) -> Optional[str]:
    if isinstance(path, int):
        return _fd_path(path)
    try:
        path = os.fsdecode(path)
    except TypeError:
        return None
    if not os.path.isabs(path):
        base = _fd_path(dir_fd) if isinstance(dir_fd, int) and dir_fd >= 0 else os.getcwd()
        if base is None:
            return None
        path = os.path.join(base, path)
    return os.path.normpath(path)


def _under(path: Optional[str]) -> bool:
    return path is not None and any(path == d or path.startswith(d + "/") for d in _state["dirs"])


def _record(event: str, path: str) -> None:
    line = f"pid {os.getpid()}: {event} {path}\n".encode("utf-8", "backslashreplace")
    try:
        os.write(_state["fd"], line)
    except OSError:
        pass


def _hook(event: str, args: tuple[Any, ...]) -> None:
    if event != "open" and event not in _EVENTS:
        return
    if getattr(_busy, "on", False) or not _state["dirs"]:
        return
    _busy.on = True
    try:
        if event == "open":
            path, mode, flags = args
            writing = isinstance(flags, int) and flags & _WRITE_FLAGS
            if isinstance(mode, str) and any(c in mode for c in "wax+"):
                writing = True
            if not writing and not (isinstance(flags, int) and flags & _O_DIRECTORY):
                return
            where = _resolve(path, None)
            if writing and _under(where):
                _record("open for writing", str(where))
            elif not writing and where in _state["dirs"]:
                # the state-dir layer creates and renames by name through the directory's descriptor
                _record("open as a directory descriptor", str(where))
            return
        for index, fd_index in _EVENTS[event]:
            if index >= len(args):
                continue
            where = _resolve(args[index], args[fd_index] if fd_index is not None and fd_index < len(args) else None)
            if _under(where):
                _record(event, str(where))
    except Exception:  # an audit hook that raises would break the operation it watches
        pass
    finally:
        _busy.on = False


def install(dirs: Iterable[str], log_fd: int) -> None:
    """Watch ``dirs`` (and what their symlinks resolve to) in this process, logging to ``log_fd``."""
    watched: set[str] = set()
    for d in dirs:
        watched.add(os.path.normpath(os.path.abspath(d)))
        watched.add(os.path.realpath(d))
    first = _state["fd"] < 0
    _state["dirs"], _state["fd"] = tuple(sorted(watched)), log_fd
    if first:  # an audit hook cannot be removed: one per process
        sys.addaudithook(_hook)


def taken(log_fd: int, offset: int) -> tuple[str, int]:
    """What was logged to ``log_fd`` since ``offset``, and the new offset."""
    end = os.fstat(log_fd).st_size
    return os.pread(log_fd, end - offset, offset).decode("utf-8", "replace"), end
