"""Files on someone else's ground: a shared directory, an ``--out`` directory, a recorded log.

The one rule for every name the agent touches where another user can create names too:

* **Create what you own, exclusively.** A directory is a fresh ``mkdir`` with a random name
  (``make_own_dir``), verified on its descriptor (ours, a directory, not a link, not writable by
  group or others); a file is ``O_CREAT|O_EXCL|O_NOFOLLOW`` (``create_new``) or a fresh temp name
  renamed over our own earlier file (``replace_own``). Nothing existing is ever written through.
* **Open with ``O_NOFOLLOW`` and judge the descriptor, not the path.** ``open_own_dir`` and
  ``open_regular`` check what was opened (``fstat``), so a name swapped between a check and its
  use cannot slip through. Files are opened ``O_NONBLOCK|O_NOCTTY``: a FIFO or a device planted
  under a file's name is refused without waiting for a writer.
* **A hard link is not a file of ours.** A regular file with more than one name (``st_nlink > 1``)
  may be another name for someone else's file (a victim's, root's): it is refused.
* **Delete only names you created, through the directory's descriptor** (``unlink_own``), never by
  listing a directory and removing what is there.

Whatever is refused raises ``Foreign`` (an ``OSError``) whose message says why and names the
owner (uid and, when known, the user name). Everything works through directory descriptors, and
names are single path components (no ``/``, not ``.`` or ``..``).

Standard library only.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Optional

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH
TOKEN_BYTES = 16  # a directory's random suffix: 32 hex digits


class Foreign(OSError):
    """A name on shared ground that is not ours: a link, not the expected type, another owner, a mode others
    can write. The message says why and names the owner (uid and, when known, user name)."""

    def __init__(self, message: str, owner: Optional[int] = None, reason: str = "") -> None:
        super().__init__(errno.EPERM, message)
        self.owner = owner
        self.reason = reason  # "type" (a link, a FIFO…), "owner", "mode", "links", "size", "replaced"

    def __str__(self) -> str:
        return str(self.strerror)


def who(uid: int) -> str:
    """``uid 65534 (nobody)``; the bare uid when it has no name."""
    try:
        import pwd

        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (KeyError, ImportError):
        return f"uid {uid}"


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "of unknown type"


def _check_name(name: str) -> None:
    if not name or "/" in name or name in (".", "..") or "\0" in name:
        raise ValueError(f"{name!r} is not a single file name")


def _lstat(path: str, dir_fd: Optional[int]) -> Optional[os.stat_result]:
    try:
        return os.stat(path, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return None


def _refuse_link(path: str, dir_fd: Optional[int], exc: OSError, want: str) -> Foreign:
    """Why ``open(path, O_NOFOLLOW…)`` failed with ELOOP/ENOTDIR: what the name is and whose it is."""
    st = _lstat(path, dir_fd)
    if st is None:
        return Foreign(f"{path} is not {want} ({exc.strerror})", reason="type")
    return Foreign(f"{path} is {_kind(st.st_mode)}, not {want}, owned by {who(st.st_uid)}", st.st_uid, "type")


def _judge(path: str, st: os.stat_result, owner: Optional[int], want: str) -> None:
    if owner is not None and st.st_uid != owner:
        raise Foreign(f"{path} is owned by {who(st.st_uid)}, not by {who(owner)}", st.st_uid, "owner")
    if owner is not None and st.st_mode & _OTHERS_WRITE:
        raise Foreign(
            f"{path} ({want}, owned by {who(st.st_uid)}) is writable by group or others "
            f"(mode {stat.S_IMODE(st.st_mode):04o})",
            st.st_uid,
            "mode",
        )


# --- directories -------------------------------------------------------------------------------


def open_own_dir(path: str, dir_fd: Optional[int] = None) -> int:
    """Open an existing directory that must be ours: O_DIRECTORY|O_NOFOLLOW, fstat owner == geteuid(), not
    writable by group/others; else Foreign."""
    try:
        fd = os.open(path, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise _refuse_link(path, dir_fd, exc, "a directory") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISDIR(st.st_mode):  # O_DIRECTORY makes this impossible; kept for the contract
            raise Foreign(f"{path} is {_kind(st.st_mode)}, not a directory", st.st_uid, "type")
        _judge(path, st, os.geteuid(), "a directory")
    except BaseException:
        os.close(fd)
        raise
    return fd


def make_own_dir(parent: str, prefix: str, mode: int = 0o700) -> tuple[int, str]:
    """mkdir a fresh directory named prefix + random (os.urandom, in hex) under parent; verify it with lstat/fstat
    (ours, a directory, not a link); return (O_DIRECTORY|O_NOFOLLOW descriptor, name)."""
    if mode & _OTHERS_WRITE:
        raise ValueError(f"mode {mode:04o} lets others write: not a directory of our own")
    pfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for _ in range(8):
            name = prefix + os.urandom(TOKEN_BYTES).hex()
            _check_name(name)
            try:
                os.mkdir(name, mode, dir_fd=pfd)
            except FileExistsError:  # 128 random bits: someone is guessing, or planted it; take another
                continue
            fd = open_own_dir(name, dir_fd=pfd)
            try:
                os.fchmod(fd, mode)  # the umask does not decide
                st, lst = os.fstat(fd), _lstat(name, pfd)
                if lst is None or (lst.st_dev, lst.st_ino) != (st.st_dev, st.st_ino):
                    raise Foreign(
                        f"{os.path.join(parent, name)} was replaced right after it was made", reason="replaced"
                    )
            except BaseException:
                os.close(fd)
                raise
            return fd, name
        raise Foreign(f"could not make a fresh directory {prefix}… in {parent}: every name tried exists")
    finally:
        os.close(pfd)


def ensure_own_dir(path: str, mode: int = 0o755, dir_fd: Optional[int] = None) -> int:
    """A directory of our own at ``path`` (an ``--out DIR``): made fresh when it does not exist (``mkdir``,
    then ``mode`` set on its descriptor), else opened with ``open_own_dir``: a link, another user's
    directory, or one group or others may write is Foreign. Without ``dir_fd``, missing parents are
    made first (``makedirs``); with it, ``path`` is one name in that directory.
    Returns its O_DIRECTORY|O_NOFOLLOW descriptor."""
    if dir_fd is None:
        parent, name = os.path.split(os.path.abspath(os.path.normpath(path)))
        os.makedirs(parent, exist_ok=True)
        pfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    else:
        _check_name(path)
        parent, name, pfd = "", path, dir_fd
    try:
        try:
            os.mkdir(name, mode & 0o755, dir_fd=pfd)
            made = True
        except FileExistsError:
            made = False
        try:
            fd = open_own_dir(name, dir_fd=pfd)
        except Foreign as exc:  # named in full: the message is the user's answer
            raise Foreign(
                f"{os.path.join(parent, name)}: {exc}" if parent else str(exc), exc.owner, exc.reason
            ) from None
        if made:
            os.fchmod(fd, mode & 0o755)
        return fd
    finally:
        if dir_fd is None:
            os.close(pfd)


def remove_own_dir(parent_fd: int, name: str, fd: int) -> bool:
    """rmdir ``name`` in ``parent_fd`` when it is still the directory open as ``fd`` (and empty).

    True when it was removed (or is gone); False when the name now holds something else or the
    directory is not empty: nothing of anyone else is touched.
    """
    _check_name(name)
    st, lst = os.fstat(fd), _lstat(name, parent_fd)
    if lst is None:
        return True
    if (lst.st_dev, lst.st_ino) != (st.st_dev, st.st_ino):
        return False
    try:
        os.rmdir(name, dir_fd=parent_fd)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


# --- files ------------------------------------------------------------------------------------


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:
            raise OSError(errno.EIO, "short write")
        view = view[n:]


def create_new(dir_fd: int, name: str, data: bytes, mode: int = 0o600) -> None:
    """Write a file that must not exist yet: O_WRONLY|O_CREAT|O_EXCL|O_NOFOLLOW|O_CLOEXEC, fchmod, write all, fsync."""
    _check_name(name)
    fd = os.open(name, _CREATE_FLAGS, mode & 0o777, dir_fd=dir_fd)
    try:
        os.fchmod(fd, mode & 0o777)
        _write_all(fd, data)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        unlink_own(dir_fd, name)
        raise
    os.close(fd)


def replace_own(dir_fd: int, name: str, data: bytes, mode: int = 0o600, tmp: Optional[str] = None) -> None:
    """Atomically (a fresh O_EXCL temp name in the same dir, then os.rename with src_dir_fd/dst_dir_fd).

    ``tmp``: the temp name to use (a predictable one, so that whoever cleans up the directory can
    remove it by name); a leftover of that name, ours from an earlier attempt, is removed first.
    Without it, a random one. The rename replaces the name itself, never what a link points at.
    """
    _check_name(name)
    if tmp is None:
        tmp = f".{name}.{os.urandom(8).hex()}.tmp"
    else:
        _check_name(tmp)
        unlink_own(dir_fd, tmp)
    create_new(dir_fd, tmp, data, mode)
    try:
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        unlink_own(dir_fd, tmp)
        raise


def publish_new(dir_fd: int, name: str, data: bytes, mode: int = 0o600) -> os.stat_result:
    """Make ``name`` appear whole, or not at all, where it must not exist yet (shared ground).

    The data goes to a fresh temp name first (``create_new``), which is then ``link()``ed to
    ``name`` (``EEXIST`` whatever ``name`` is: a file, a link, a FIFO, a directory — nothing is
    replaced) and removed. A reader may see two names for a moment (``st_nlink == 2``).
    Returns the file's ``lstat`` (its identity, to remove it later only if it is still ours).
    FileExistsError when the name is taken.
    """
    _check_name(name)
    tmp = f".{name}.{os.urandom(8).hex()}.tmp"
    create_new(dir_fd, tmp, data, mode)
    try:
        os.link(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    finally:
        unlink_own(dir_fd, tmp)


def unlink_if_same(dir_fd: int, name: str, ident: os.stat_result) -> bool:
    """Remove ``name`` only while it is still the file ``ident`` (same device and inode); True if removed."""
    _check_name(name)
    now = _lstat(name, dir_fd)
    if now is None or (now.st_dev, now.st_ino) != (ident.st_dev, ident.st_ino):
        return False
    unlink_own(dir_fd, name)
    return True


def append_own(dir_fd: int, name: str, data: bytes) -> None:
    """Append to a file we wrote: O_WRONLY|O_APPEND|O_NOFOLLOW|O_NONBLOCK, then on the descriptor a regular
    file of ours with one name (else Foreign), write all, fsync."""
    _check_name(name)
    fd = _open_file(
        name,
        os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC,
        dir_fd,
        os.geteuid(),
    )
    try:
        _write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def open_regular(path: str, dir_fd: Optional[int] = None, owner: Optional[int] = None) -> int:
    """O_RDONLY|O_NOFOLLOW|O_NONBLOCK|O_CLOEXEC, then fstat: a regular file (never blocks on a FIFO or a
    device), owned by `owner` when given; else Foreign. The caller reads and closes.

    Also refused: a file with more than one name (a hard link to someone else's file), and, when
    ``owner`` is given, a file group or others may write (it would not be only the owner's word).
    """
    return _open_file(path, _READ_FLAGS, dir_fd, owner)


def _open_file(path: str, flags: int, dir_fd: Optional[int], owner: Optional[int]) -> int:
    """Open with ``flags`` (which carry O_NOFOLLOW and O_NONBLOCK) and judge the descriptor: a regular
    file with one name, of ``owner`` and not writable by others when ``owner`` is given."""
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _refuse_link(path, dir_fd, exc, "a regular file") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Foreign(
                f"{path} is {_kind(st.st_mode)}, not a regular file, owned by {who(st.st_uid)}", st.st_uid, "type"
            )
        if st.st_nlink != 1:
            raise Foreign(
                f"{path} has {st.st_nlink} names (a hard link, owned by {who(st.st_uid)}): "
                "it may be another name for someone else's file",
                st.st_uid,
                "links",
            )
        _judge(path, st, owner, "a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path: str, max_bytes: int, dir_fd: Optional[int] = None, owner: Optional[int] = None) -> bytes:
    """open_regular + read at most max_bytes; a larger file is Foreign("... larger than N bytes")."""
    fd = open_regular(path, dir_fd=dir_fd, owner=owner)
    try:
        chunks: list[bytes] = []
        got = 0
        while got <= max_bytes:
            chunk = os.read(fd, max_bytes + 1 - got)
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        if got > max_bytes:
            raise Foreign(f"{path} is larger than {max_bytes} bytes", reason="size")
        return b"".join(chunks)
    finally:
        os.close(fd)


def unlink_own(dir_fd: int, name: str) -> None:
    """Remove one name we created, through the directory's descriptor; a missing name is fine."""
    _check_name(name)
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
