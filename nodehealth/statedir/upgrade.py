"""The one-time move of a persistent file from the layout before the split (one directory, the
run dir) into the persistent dir, and the reads that see such a file until it is moved.

Standard library only. The file is taken only on ``read_own``'s terms (root's or this user's own
regular file with a single name, that others cannot write, strict JSON), under both files' locks;
``upgrade`` is what a writer calls, ``read_json_or_earlier`` what a reader calls (it moves nothing).
"""

from __future__ import annotations

import os

from nodehealth.statedir import files
from nodehealth.statedir.directory import IFMT, IFREG, OPEN_FLAGS, STATE_FILE_MODE, check_dir, untrusted
from nodehealth.statedir.files import MAX_READ
from nodehealth.statedir.strictjson import dumps, parse_json

TYPE_CHECKING = False
if TYPE_CHECKING:  # no typing import at run time: the fast path pays for every module
    from typing import Any, Optional


def read_own(path: str, limit: int = MAX_READ) -> tuple[Optional[bytes], Optional[str]]:
    """``read_checked`` for a file that must be this process's own, judged on the descriptor: a
    regular file (never through a symlink, a FIFO never waited on) owned by root or this user,
    with one name (a hard link is someone's file under our name), that group and others cannot
    write. ``(None, None)``: no such file; ``(None, why)``: refused."""
    data, why, _ = _read_own(path, limit)
    return data, why


def _read_own(path: str, limit: int) -> tuple[Optional[bytes], Optional[str], Optional[tuple[int, int]]]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | OPEN_FLAGS)
    except FileNotFoundError:
        return None, None, None
    except OSError as exc:
        return None, files.why_unreadable(path, exc), None
    try:
        st = os.fstat(fd)
        if st.st_mode & IFMT != IFREG:
            return None, f"{path} is not a regular file", None
        why = untrusted("file", path, st, os.geteuid(), sticky_ok=False)
        if why:
            return None, why, None
        if st.st_nlink != 1:
            return None, f"{path} has {st.st_nlink} names (a hard link is not ours)", None
        data = os.read(fd, limit + 1)
    except OSError as exc:
        return None, files.why_unreadable(path, exc), None
    finally:
        os.close(fd)
    if len(data) > limit:
        return None, f"{path} is larger than {limit} bytes", None
    return data, None, (st.st_dev, st.st_ino)


def read_earlier(path: Optional[str], limit: int = MAX_READ) -> tuple[Any, Optional[str]]:
    """The JSON value of a persistent file where the layout before the split kept it (``path``, in
    the run directory; None: there is none), on ``read_own``'s terms and strict (``parse_json``):
    ``(value, None)``, ``(None, None)`` for no file, ``(None, why)`` for one refused."""
    value, why, _ = _read_earlier(path, limit)
    return value, why


def _read_earlier(path: Optional[str], limit: int) -> tuple[Any, Optional[str], Optional[tuple[int, int]]]:
    if path is None or check_dir(os.path.dirname(path) or "."):
        return None, None, None
    data, why, ident = _read_own(path, limit)
    if data is None:
        return None, why, None
    try:
        return parse_json(data), None, ident
    except ValueError as exc:
        return None, f"{path} is not valid JSON ({str(exc)[:200]})", None


def move_earlier(old: Optional[str], new: str, lock_timeout_s: float) -> tuple[bool, Optional[str]]:
    """Once, on the first write after an upgrade: the persistent file ``old`` (the run directory's,
    from the layout before the split) becomes ``new`` in the persistent dir (already checked by the
    caller), when ``new`` does not exist yet. Under both files' locks (a writer of the old layout
    still running takes ``old``'s); the text is taken only on ``read_earlier``'s terms, written to
    ``new`` atomically (0600) and only then is ``old`` removed, while its name is still the file
    that was read. ``(True, None)``: moved; ``(False, None)``: nothing to move; ``(False, why)``:
    refused, and ``old`` is left where it is (the caller logs it; its next write makes ``new``, so
    the refusal is said once)."""
    if old is None or os.path.lexists(new) or not os.path.lexists(old):
        return False, None
    with files.locked(old, timeout_s=lock_timeout_s), files.locked(new, timeout_s=lock_timeout_s):
        if os.path.lexists(new):
            return False, None
        value, why, read = _read_earlier(old, MAX_READ)
        if why:
            return False, why
        if value is None:
            return False, None
        files.write_atomic(new, dumps(value) + "\n", STATE_FILE_MODE)
        try:
            st = os.lstat(old)
            if (st.st_dev, st.st_ino) == read:  # still the file that was read: remove that name only
                os.unlink(old)
        except OSError:
            pass
        return True, None


def read_json_or_earlier(path: str, earlier: Optional[str], limit: int = MAX_READ) -> Any:
    """``read_json(path)`` when its directory may be trusted (``check_dir``), else None; while
    ``path`` (or its directory) does not exist, the same file where the layout before the split
    kept it (``earlier``, on ``read_earlier``'s terms), so a reader between an upgrade and the
    first write still sees the drain record. Nothing is moved or created: readers write nothing."""
    directory = os.path.dirname(path) or "."
    if os.path.lexists(directory):
        if check_dir(directory):
            return None
        if earlier is None or os.path.lexists(path):
            return files.read_json(path, limit)
    return read_earlier(earlier, limit)[0]


def upgrade(earlier: Optional[str], path: str, lock_timeout_s: float, log: Any = None) -> bool:
    """``move_earlier`` for a writer, saying what happened once through ``log(msg, notable=True)``:
    the move, or why the earlier file was refused (the write that follows makes ``path``, so the
    refusal is not said again). True when moved. A failed move raises ``OSError`` like the write."""
    moved, why = move_earlier(earlier, path, lock_timeout_s)
    if log is not None and moved:
        log(
            f"moved {earlier} to {path} (state that must outlive a reboot now lives in the persistent dir)",
            notable=True,
        )
    elif log is not None and why:
        log(f"not taking {earlier} from before the upgrade, starting afresh in {path}: {why}", notable=True)
    return moved
