"""Root trusts only root's files: the config file, the programs it names, the last good config.

nodehealth runs as root. A file it reads its configuration from, or a program it runs, that
someone else can change is someone else's code running as root. ``problem`` says why a path is
not to be trusted: every existing component of the path as written and of the path it resolves
to must be owned by root and not writable by group or others. A world-writable directory with
the sticky bit (``/tmp``) is accepted: there only an entry's owner may rename or remove it, and
that owner is checked too. A component that does not exist yet is no problem in itself (the
directory above it, checked, says who could create it). Not running as root, nothing is checked.
"""

from __future__ import annotations

import os
import stat
from typing import Optional


def _components(path: str) -> list[str]:
    """``/a/b/c`` -> ``["/a/b/c", "/a/b", "/a", "/"]``."""
    out = [path]
    while True:
        parent = os.path.dirname(path)
        if parent == path:
            return out
        out.append(parent)
        path = parent


def _why(st: os.stat_result, where: str) -> str:
    if st.st_uid != 0:
        return f"{where} is owned by uid {st.st_uid}, not root"
    if stat.S_ISLNK(st.st_mode):
        return ""
    if st.st_mode & 0o022 and not (stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX):
        who = "group and others" if st.st_mode & 0o022 == 0o022 else "group" if st.st_mode & 0o020 else "others"
        return f"{where} is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o})"
    return ""


def problem(path: str, euid: Optional[int] = None) -> str:
    """Why root must not read or run ``path``, or "" (also "" when not running as root)."""
    if (os.geteuid() if euid is None else euid) != 0:
        return ""
    if not os.path.isabs(path):
        return f"{path} is not an absolute path"
    path = os.path.normpath(path)
    seen: set[str] = set()
    for chain in (_components(path), _components(os.path.realpath(path))):
        for where in chain:
            if where in seen:
                continue
            seen.add(where)
            try:
                st = os.lstat(where)
            except FileNotFoundError:
                continue
            except OSError as exc:
                return f"{where} cannot be checked: {exc.strerror or exc}"
            why = _why(st, where)
            if why:
                return why
    return ""
