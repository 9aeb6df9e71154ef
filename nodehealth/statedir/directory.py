"""The state dir itself: created ``0700``, and trusted or refused with the reason why.

Standard library only (``os``), so the prolog's fast path pays nothing for it.

``ensure_state_dir`` creates the state dir ``0700`` (set explicitly, not left to the umask) and,
like ``check_dir``, says why it may not be used: a symlink, not a directory, owned by another user
(root is always trusted), group- or world-writable, or below a directory that is (a world-writable
directory with the sticky bit, such as ``/tmp``, may hold it). The statedir writers refuse such a
directory (``UnsafeDir``, an ``OSError``), and ``verdict.read`` refuses to trust a verdict found in
one. ``untrusted`` is the owner-and-mode rule the files of the state dir are judged by too (the
upgrade's ``read_own``). The modes and open flags every statedir module uses live here.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:  # no typing import at run time: the fast path pays for every module
    from typing import Optional

DIR_MODE = 0o755  # a directory created for another reader (a textfile directory)
FILE_MODE = 0o644  # a file written for another reader (node_exporter's textfile collector)
STATE_DIR_MODE = 0o700  # the state dir and its jobs/ directory: root only
STATE_FILE_MODE = 0o600  # every file in the state dir: root only
OPEN_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC  # every open in the state dir: never through a symlink
IFMT, IFDIR, IFREG, IFLNK = 0o170000, 0o040000, 0o100000, 0o120000
_STICKY = 0o1000


class UnsafeDir(OSError):
    """The state dir may not be trusted (its owner, its mode, a symlink); the message says why."""


def untrusted(what: str, path: str, st: os.stat_result, uid: int, sticky_ok: bool) -> Optional[str]:
    """Why ``st`` (of ``path``, a ``what``) is not trusted: owned by neither root nor ``uid``, or
    writable by group or others (unless ``sticky_ok`` and the sticky bit is set); None when trusted."""
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
    kind = st.st_mode & IFMT
    if kind == IFLNK:
        return f"state dir {full} is a symbolic link (not followed; name the real directory)"
    if kind != IFDIR:
        return f"state dir {full} is not a directory"
    uid = os.geteuid()
    why = untrusted("state dir", full, st, uid, sticky_ok=False)
    if why:
        return why
    parent = os.path.realpath(os.path.dirname(full))
    while True:
        try:
            st = os.stat(parent)
        except OSError as exc:
            return f"directory {parent} above the state dir: {exc.strerror or exc}"
        why = untrusted("directory", parent, st, uid, sticky_ok=True)
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
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | OPEN_FLAGS)
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
    if st.st_mode & IFMT != IFDIR:
        raise UnsafeDir(f"{path} is not a directory (a symbolic link is not followed)")
    why = untrusted("directory", path, st, os.geteuid(), sticky_ok=False)
    if why:
        raise UnsafeDir(why)
    return path


def ensure_dir(directory: str) -> None:
    """A directory for files written for other readers (``DIR_MODE``); not the state dir's rules."""
    os.makedirs(directory or ".", mode=DIR_MODE, exist_ok=True)
