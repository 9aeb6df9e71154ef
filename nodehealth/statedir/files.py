"""Small files in the state dir: a trusted directory, atomic writes, a lock, appends, strict reads.

Standard library only, and only ``os`` and ``json`` at import time (``fcntl`` when a lock is
taken), so the prolog's fast path writes through the same code as the daemon.

**The directory.** ``ensure_state_dir`` creates the state dir ``0700`` (set explicitly, not left
to the umask) and, like ``check_dir``, says why it may not be used: a symlink, not a directory,
owned by another user (root is always trusted), group- or world-writable, or below a directory
that is (a world-writable directory with the sticky bit, such as ``/tmp``, may hold it). The
statedir writers refuse such a directory (``UnsafeDir``, an ``OSError``), and ``verdict.read``
refuses to trust a verdict found in one.

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

**JSON.** ``parse_json`` is strict where ``json.loads`` is not: NaN and Infinity (and
``1e400``, which is infinity), integers of more than 20 digits, and nesting deeper than
``MAX_DEPTH`` are refused with a ``ValueError`` that says why, as is a document the C parser
runs out of stack on (``RecursionError``). ``read_json_checked`` returns the value or the
reason, which the caller logs; the state is then treated as absent and rewritten by the next
write. ``dumps`` never writes a non-finite number (it becomes null).

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
MAX_DEPTH = 64  # JSON nested deeper than this is not a state file of ours
MAX_INT_DIGITS = 20  # an integer of more digits (beyond 64 bits) is refused when parsing
DIR_MODE = 0o755  # a directory created for another reader (a textfile directory)
FILE_MODE = 0o644  # a file written for another reader (node_exporter's textfile collector)
STATE_DIR_MODE = 0o700  # the state dir and its jobs/ directory: root only
STATE_FILE_MODE = 0o600  # every file in the state dir: root only
_OPEN = os.O_NOFOLLOW | os.O_CLOEXEC
_IFMT, _IFDIR, _IFREG, _IFLNK = 0o170000, 0o040000, 0o100000, 0o120000
_STICKY = 0o1000
_ELOOP = 40  # Linux: O_NOFOLLOW on a symlink


class ShortWrite(OSError):
    """``write(2)`` stored fewer bytes than asked (disk full, quota): the record is not whole."""


class UnsafeDir(OSError):
    """The state dir may not be trusted (its owner, its mode, a symlink); the message says why."""


# --- the directory -----------------------------------------------------------------------------

def _untrusted(what: str, path: str, st: os.stat_result, uid: int, sticky_ok: bool) -> Optional[str]:
    if st.st_uid not in (uid, 0):
        return f"{what} {path} is owned by uid {st.st_uid}, not by root or uid {uid}"
    if st.st_mode & 0o022 and not (sticky_ok and st.st_mode & _STICKY):
        return f"{what} {path} is writable by group or others (mode {st.st_mode & 0o7777:04o})"
    return None


def check_dir(path: str) -> Optional[str]:
    """None when ``path`` is a directory this process may keep its state in, else why not.

    Trusted: a real directory (not a symlink) owned by this process's user or by root and not
    writable by group or others, below directories that are the same (a world-writable one
    with the sticky bit, such as ``/tmp``, may hold it). Nothing is created or changed.
    """
    if not path:
        return "the state dir is not set"
    full = os.path.abspath(path)
    try:
        st = os.lstat(full)
    except OSError as exc:
        return f"state dir {full}: {exc.strerror or exc}"
    kind = st.st_mode & _IFMT
    if kind == _IFLNK:
        return f"state dir {full} is a symbolic link (not followed; name the real directory)"
    if kind != _IFDIR:
        return f"state dir {full} is not a directory"
    uid = os.geteuid()
    why = _untrusted("state dir", full, st, uid, sticky_ok=False)
    if why:
        return why
    parent = os.path.realpath(os.path.dirname(full))
    while True:
        try:
            st = os.stat(parent)
        except OSError as exc:
            return f"directory {parent} above the state dir: {exc.strerror or exc}"
        why = _untrusted("directory", parent, st, uid, sticky_ok=True)
        if why:
            return f"{why}, above the state dir {full}"
        up = os.path.dirname(parent)
        if up == parent:
            return None
        parent = up


def ensure_state_dir(path: str) -> Optional[str]:
    """Create the state dir when missing (mode 0700, set explicitly), then ``check_dir``.

    None when the directory may be used, else why not: the caller reports it and keeps no
    state there. The statedir writers call it themselves (``require_state_dir``).
    """
    if not path:
        return "the state dir is not set"
    full = os.path.abspath(path)
    try:
        try:
            os.mkdir(full, STATE_DIR_MODE)
        except FileNotFoundError:
            os.makedirs(os.path.dirname(full), DIR_MODE, exist_ok=True)
            os.mkdir(full, STATE_DIR_MODE)
    except FileExistsError:
        pass
    except OSError as exc:
        return f"cannot create the state dir {full}: {exc.strerror or exc}"
    else:
        why = _set_dir_mode(full)
        if why:
            return why
    return check_dir(full)


def _set_dir_mode(path: str) -> Optional[str]:
    """Mode 0700 on a directory just made, through a descriptor (never through a symlink)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | _OPEN)
    except OSError as exc:
        return f"cannot open the new directory {path}: {exc.strerror or exc}"
    try:
        os.fchmod(fd, STATE_DIR_MODE)
    except OSError as exc:
        return f"cannot set the mode of {path}: {exc.strerror or exc}"
    finally:
        os.close(fd)
    return None


def require_state_dir(path: str) -> str:
    """``ensure_state_dir`` for writers: the directory, or ``UnsafeDir`` saying why not."""
    why = ensure_state_dir(path)
    if why:
        raise UnsafeDir(why)
    return path


def require_subdir(path: str) -> str:
    """A directory inside the (checked) state dir, created 0700: ``UnsafeDir`` unless it is a real
    directory of this user or root that group and others cannot write."""
    try:
        os.mkdir(path, STATE_DIR_MODE)
    except FileExistsError:
        pass
    else:
        why = _set_dir_mode(path)
        if why:
            raise UnsafeDir(why)
    st = os.lstat(path)
    if st.st_mode & _IFMT != _IFDIR:
        raise UnsafeDir(f"{path} is not a directory (a symbolic link is not followed)")
    why = _untrusted("directory", path, st, os.geteuid(), sticky_ok=False)
    if why:
        raise UnsafeDir(why)
    return path


def ensure_dir(directory: str) -> None:
    """A directory for files written for other readers (``DIR_MODE``); not the state dir's rules."""
    os.makedirs(directory or ".", mode=DIR_MODE, exist_ok=True)


# --- writing -------------------------------------------------------------------------------------

def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:
            raise ShortWrite(f"write stored {len(data) - len(view)} of {len(data)} bytes")
        view = view[n:]


def write_atomic(path: str, text: str, mode: int = STATE_FILE_MODE) -> None:
    """Write ``text`` to a new temp file in the same directory, fsync, rename over ``path``.

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
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _OPEN, STATE_FILE_MODE)
            break
        except FileExistsError:
            if attempt == 99:
                raise
    try:
        try:
            os.fchmod(fd, mode)
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


def _finite(obj: Any, depth: int = 0) -> Any:
    """``obj`` with every NaN or infinite float replaced by None."""
    if depth > MAX_DEPTH:
        raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
    if isinstance(obj, float):
        return obj if obj - obj == 0.0 else None
    if isinstance(obj, dict):
        return {k: _finite(v, depth + 1) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v, depth + 1) for v in obj]
    return obj


def dumps(obj: Any, compact: bool = False) -> str:
    """JSON text of ``obj`` with only finite numbers (a NaN or infinity becomes null)."""
    kw: dict[str, Any] = {"separators": (",", ":")} if compact else {"indent": 1, "sort_keys": True}
    try:
        return json.dumps(obj, allow_nan=False, **kw)
    except ValueError:
        return json.dumps(_finite(obj), allow_nan=False, **kw)


def write_json(path: str, obj: Any, compact: bool = False, mode: int = STATE_FILE_MODE) -> None:
    write_atomic(path, dumps(obj, compact) + "\n", mode)


def write_state(state_dir: str, path: str, text: str) -> None:
    """Write a state file ``path`` in ``state_dir`` (0600) after ``require_state_dir``: the
    directory is created 0700 before anything goes into it, and a directory that is not
    trusted (a link, another user's, writable by others) gets nothing (``UnsafeDir``)."""
    require_state_dir(state_dir)
    write_atomic(path, text, STATE_FILE_MODE)


def write_state_json(state_dir: str, path: str, obj: Any, compact: bool = False) -> None:
    """``write_state`` of ``obj`` as strict JSON (``dumps``)."""
    write_state(state_dir, path, dumps(obj, compact) + "\n")


def append_line(path: str, line: str, mode: int = STATE_FILE_MODE) -> int:
    """Append one record (one ``write(2)`` in append mode); returns the file's size after it.

    The file is opened ``O_NOFOLLOW`` and must be a regular file; a new one gets ``mode``.
    When the file does not end with a newline (a record torn by an earlier short write), this
    record starts on a line of its own, so the torn one is not glued to it. Raises
    ``ShortWrite`` when the kernel stored only part of the record.
    """
    data = line.encode("utf-8")
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | _OPEN, mode)
    try:
        st = os.fstat(fd)
        if st.st_mode & _IFMT != _IFREG:
            raise OSError(f"{path} is not a regular file")
        if st.st_size == 0:
            if st.st_mode & 0o7777 != mode:
                os.fchmod(fd, mode)
        elif os.pread(fd, 1, st.st_size - 1) != b"\n":
            data = b"\n" + data
        n = os.write(fd, data)
        if n != len(data):
            raise ShortWrite(f"{path}: appended {n} of {len(data)} bytes (the record is torn)")
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


# --- reading -------------------------------------------------------------------------------------

def _why(path: str, exc: OSError) -> str:
    if exc.errno == _ELOOP:
        return f"{path} is a symbolic link (not followed)"
    return f"{path}: {exc.strerror or exc}"


def read_checked(path: str, limit: int = MAX_READ) -> tuple[Optional[bytes], Optional[str]]:
    """``(data, None)``: up to ``limit`` bytes of a regular file, read without following a
    symlink; ``(None, None)``: no such file; ``(None, why)``: a symlink, not a regular file,
    unreadable."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | _OPEN)
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, _why(path, exc)
    try:
        if os.fstat(fd).st_mode & _IFMT != _IFREG:
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
        return None, _why(path, exc)
    finally:
        os.close(fd)


def read_bytes(path: str, limit: int = MAX_READ) -> Optional[bytes]:
    """Up to ``limit`` bytes of a regular file (never through a symlink); None when it cannot be read."""
    return read_checked(path, limit)[0]


def read_text(path: str, limit: int = 8 << 20) -> str:
    data = read_bytes(path, limit)
    return "" if data is None else data.decode("utf-8", "replace")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a finite number")


def _finite_float(text: str) -> float:
    value = float(text)
    if value - value != 0.0:  # inf - inf and nan - nan are nan
        raise ValueError(f"{text[:24]} is not a finite number")
    return value


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"integer {text[:24]}... out of range")
    return int(text)


_decoder: list[json.JSONDecoder] = []
_SAME_BRACKETS = bytes.maketrans(b"{}", b"[]")
_NOT_SYNTAX = bytes(range(256)).translate(None, b'[]{}"')


def too_deep(data: bytes, limit: int) -> bool:
    """Whether the JSON document ``data`` (already parsed, so well formed) nests deeper than ``limit``.

    At C speed, without walking the parsed value: escaped backslashes and quotes are dropped
    (every quote left delimits a string), then all but brackets and quotes; adjacent quotes go
    (an empty string, or two strings with nothing between them), then what the strings left
    hold. The brackets left, made one kind, lose their innermost pairs each round: a document
    still not empty after ``limit`` rounds is deeper than that.
    """
    if b"\\" in data:
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    seq = data.translate(_SAME_BRACKETS, _NOT_SYNTAX)
    seq = seq.replace(b'""', b"")
    if b'"' in seq:
        seq = b"".join(seq.split(b'"')[::2])
    for _ in range(limit):
        if not seq:
            return False
        seq = seq.replace(b"[]", b"")
    return bool(seq)


def parse_json(data: Any, max_depth: int = MAX_DEPTH) -> Any:
    """The JSON value in ``data`` (bytes or str), strictly: ``ValueError`` saying why for text
    that is not JSON, NaN or infinite numbers, integers of more than ``MAX_INT_DIGITS`` digits,
    or nesting deeper than ``max_depth``."""
    if not _decoder:
        _decoder.append(json.JSONDecoder(parse_float=_finite_float, parse_int=_bounded_int,
                                         parse_constant=_no_constant))
    text = data.decode("utf-8") if isinstance(data, (bytes, bytearray)) else data
    try:
        obj = _decoder[0].decode(text)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    if len(text) > 2 * max_depth:  # shorter text cannot nest deeper
        raw = data if isinstance(data, (bytes, bytearray)) else text.encode("utf-8")
        if too_deep(bytes(raw), max_depth):
            raise ValueError(f"nested deeper than {max_depth} levels")
    return obj


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


# --- a file from the layout before the split --------------------------------------------------------

def read_own(path: str, limit: int = MAX_READ) -> tuple[Optional[bytes], Optional[str]]:
    """``read_checked`` for a file that must be this process's own, judged on the descriptor: a
    regular file (never through a symlink, a FIFO never waited on) owned by root or this user,
    with one name (a hard link is someone's file under our name), that group and others cannot
    write. ``(None, None)``: no such file; ``(None, why)``: refused."""
    data, why, _ = _read_own(path, limit)
    return data, why


def _read_own(path: str, limit: int) -> tuple[Optional[bytes], Optional[str], Optional[tuple[int, int]]]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | _OPEN)
    except FileNotFoundError:
        return None, None, None
    except OSError as exc:
        return None, _why(path, exc), None
    try:
        st = os.fstat(fd)
        if st.st_mode & _IFMT != _IFREG:
            return None, f"{path} is not a regular file", None
        why = _untrusted("file", path, st, os.geteuid(), sticky_ok=False)
        if why:
            return None, why, None
        if st.st_nlink != 1:
            return None, f"{path} has {st.st_nlink} names (a hard link is not ours)", None
        data = os.read(fd, limit + 1)
    except OSError as exc:
        return None, _why(path, exc), None
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
    with locked(old, timeout_s=lock_timeout_s), locked(new, timeout_s=lock_timeout_s):
        if os.path.lexists(new):
            return False, None
        value, why, read = _read_earlier(old, MAX_READ)
        if why:
            return False, why
        if value is None:
            return False, None
        write_atomic(new, dumps(value) + "\n", STATE_FILE_MODE)
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
            return read_json(path, limit)
    return read_earlier(earlier, limit)[0]


def upgrade(earlier: Optional[str], path: str, lock_timeout_s: float, log: Any = None) -> bool:
    """``move_earlier`` for a writer, saying what happened once through ``log(msg, notable=True)``:
    the move, or why the earlier file was refused (the write that follows makes ``path``, so the
    refusal is not said again). True when moved. A failed move raises ``OSError`` like the write."""
    moved, why = move_earlier(earlier, path, lock_timeout_s)
    if log is not None and moved:
        log(f"moved {earlier} to {path} (state that must outlive a reboot now lives in the persistent dir)",
            notable=True)
    elif log is not None and why:
        log(f"not taking {earlier} from before the upgrade, starting afresh in {path}: {why}", notable=True)
    return moved


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
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | _OPEN, STATE_FILE_MODE)
            st = os.fstat(self.fd)
            if st.st_mode & _IFMT != _IFREG:
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
