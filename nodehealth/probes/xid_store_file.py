"""The XID event store's file (its format: ``nodehealth.probes.xid_store``): its path, its reading,
its atomic writing and its lock, in the state dir (``nodehealth.statedir``). The store's state and its
pure changes are ``nodehealth.xid.history``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import time
from collections.abc import Iterator
from typing import Optional

from nodehealth.probes.kernel_log import KernelLogUnavailable
from nodehealth.statedir import files, layout
from nodehealth.xid.history import FORMAT, StoreError, StoreState

MAX_STORE_BYTES = 16 << 20


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
    return state, (
        f"{path}: ignored what was not valid ({'; '.join(ignored)}); the file is rewritten at the next write",
    )


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
        fd = os.open(
            layout.path(state_dir, layout.XID_LOCK),
            os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
            files.STATE_FILE_MODE,
        )
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
