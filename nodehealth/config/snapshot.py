"""The prolog fast path's settings, kept when a config file validates: no TOML read before a job.

Whoever validates a config file fully (the daemon at each (re)load, a face's cold path after a
successful load: ``nodehealth.config.lastgood.record``) calls ``keep``: the keys of
``nodehealth.config.lean.KEYS`` as ``lean.resolve`` reads them from the same text (defaults, bounds,
the ``[[override]]`` rules for this node), with the file's path and identity (``lean.identity``, from
the ``fstat`` of the read that validated), go to ``<default run dir>/prolog-<path>.marshal``
(``statedir.layout.snapshot_path``; the default run dir is ``[paths] state_dir``'s default, since
the fast path knows no other before it has its settings; it is created for a config whose
``state_dir`` it is, and otherwise used when it exists: the systemd unit's ``RuntimeDirectory``).
``marshal`` is built into the interpreter, so reading it imports nothing.

``read`` gives the fast path its ``lean.Settings``, or why not; every doubt is a reason and the
cold path runs: no snapshot (the file has not validated here), a run dir that is not trusted
(``statedir.directory.check_dir``), a snapshot that is a symlink, not a regular file, larger than
``MAX_BYTES``, not owned by root (or, not running as root, by this user) or writable by others,
bytes that are not a strict marshal value (``strictjson.parse_marshal``), another kind or version,
made from another file or from another version of this one (its identity now), a key missing or
out of its bounds, and settings whose ``[[override]]`` rules were matched against another node name
than ``SLURMD_NODENAME``. Standard library and ``nodehealth.statedir`` only.

Format (version 1), a ``marshal`` dict::

    {"v": 1, "kind": "nodehealth-prolog-snapshot", "config_path": "/etc/nodehealth/nodehealth.toml",
     "config_id": [dev, ino, size, mtime_ns, ctime_ns] | None, "override_node": "" | "gpu017",
     "settings": {"node_name": "", "state_dir": "/run/nodehealth", ...}}
"""

from __future__ import annotations

import marshal
import os

from nodehealth.config import lean
from nodehealth.statedir import directory, files, layout
from nodehealth.statedir.strictjson import parse_marshal

TYPE_CHECKING = False
if TYPE_CHECKING:  # no typing import at run time: the fast path pays for every module
    from typing import Any, Mapping, Optional

KIND = "nodehealth-prolog-snapshot"
VERSION = 1
MAX_BYTES = 64 << 10  # a snapshot is a few hundred bytes
FIELDS = frozenset(("v", "kind", "config_path", "config_id", "override_node", "settings"))


def run_dir() -> str:
    """Where snapshots are kept: the default of ``[paths] state_dir`` (``lean.DEFAULT_ROOT_ENV`` moves it)."""
    return str(lean.default("paths.state_dir"))


def path_for(config_path: str) -> Optional[str]:
    return layout.snapshot_path(run_dir(), config_path)


def encode(s: lean.Settings, override_node: str) -> bytes:
    """The snapshot of ``s`` (``lean.resolve``'s settings, their ``config_path`` and ``config_id``)."""
    obj = {
        "v": VERSION,
        "kind": KIND,
        "config_path": s.config_path,
        "config_id": None if s.config_id is None else list(s.config_id),
        "override_node": override_node,
        "settings": {attr: getattr(s, attr) for _, attr, *_ in lean.KEYS},
    }
    return marshal.dumps(obj)


def keep(
    path: str, text: str, ident: Optional[list[int]], paths: Any = None, environ: Optional[Mapping[str, str]] = None
) -> str:
    """Keep the fast path's settings for ``path``, whose ``text`` (read with identity ``ident``) has
    just validated to a config whose ``[paths]`` are ``paths``; "" when kept (or already there),
    else why not (raises no ``OSError``). Settings whose directories are not the full loader's are
    not kept: the two readers disagree, and the cold path is the one to trust."""
    s, why, node = lean.resolve(text.encode("utf-8"), ident, path, os.environ if environ is None else environ)
    if s is None:
        return why
    if paths is not None and not isinstance(paths, str):
        if (s.state_dir, s.persistent_dir) != (paths.state_dir, paths.persistent_dir):
            return f"config {path}: the fast path's directories are not the loader's; no snapshot kept"
    where = path_for(s.config_path)
    if where is None:
        return f"config path {path[:80]}... too long to name its fast-path snapshot"
    home = run_dir()
    if os.path.abspath(s.state_dir) != os.path.abspath(home) and not os.path.isdir(home):
        # Not created for a config that keeps its state elsewhere: the unit's RuntimeDirectory makes it.
        return f"no fast-path snapshot: {home} does not exist (the state is kept in {s.state_dir})"
    data = encode(s, node)
    old, _ = files.read_checked(where, MAX_BYTES + 1)
    if old == data:
        return ""
    try:
        files.write_state(run_dir(), where, data)
    except OSError as exc:
        return f"cannot keep the fast path's settings in {where}: {exc.strerror or exc}"
    return ""


def _read(where: str) -> tuple[Optional[bytes], str]:
    """The snapshot's bytes, or why they are not to be believed (never through a symlink)."""
    try:
        fd = os.open(where, os.O_RDONLY | os.O_NONBLOCK | directory.OPEN_FLAGS)
    except FileNotFoundError:
        return None, "missing"
    except OSError as exc:
        return None, files.why_unreadable(where, exc)
    try:
        st = os.fstat(fd)
        if st.st_mode & directory.IFMT != directory.IFREG:
            return None, f"{where} is not a regular file"
        uid = os.geteuid()
        if st.st_uid not in (0, uid):
            return None, f"{where} is owned by uid {st.st_uid}, not by root or uid {uid}"
        if st.st_mode & 0o022:
            return None, f"{where} is writable by group or others (mode {st.st_mode & 0o7777:04o})"
        data = os.read(fd, MAX_BYTES + 1)
    except OSError as exc:
        return None, files.why_unreadable(where, exc)
    finally:
        os.close(fd)
    if len(data) > MAX_BYTES:
        return None, f"{where} is larger than {MAX_BYTES} bytes"
    return data, ""


def _identity(value: Any) -> bool:
    return value is None or (
        type(value) is list and len(value) == 5 and all(type(v) is int and 0 <= v < 1 << 64 for v in value)
    )


def read(path: str, ident: Optional[list[int]], environ: Mapping[str, str]) -> tuple[Optional[lean.Settings], str]:
    """The fast path's settings for the config file ``path`` as it is now (``ident``: its identity,
    None for an absent default file), or ``(None, why)``."""
    where = path_for(path)
    if where is None:
        return None, f"config path {path[:80]}... too long to name its fast-path snapshot"
    unsafe = files.check_dir(run_dir())
    if unsafe:
        if not os.path.lexists(run_dir()):
            return None, f"config {path} has not been validated on this node yet ({run_dir()} missing)"
        return None, f"fast-path settings not trusted: {unsafe}"
    data, why = _read(where)
    if data is None:
        if why == "missing":
            return None, f"config {path} has not been validated on this node yet (no {where})"
        return None, f"fast-path settings not trusted: {why}"
    try:
        raw = parse_marshal(data)
    except ValueError as exc:
        return None, f"fast-path settings {where} are corrupt or partial: {exc}"
    if type(raw) is not dict or raw.get("kind") != KIND:
        return None, f"fast-path settings {where} are not a nodehealth snapshot"
    if raw.get("v") != VERSION:
        return None, f"fast-path settings {where} have version {raw.get('v')!r}, this reader knows {VERSION}"
    if set(raw) != FIELDS or not _identity(raw["config_id"]) or type(raw["override_node"]) is not str:
        return None, f"fast-path settings {where} are incomplete (missing or malformed fields)"
    if raw["config_path"] != path:
        return None, f"fast-path settings {where} were made from {str(raw['config_path'])[:200]}, not {path}"
    if raw["config_id"] != ident:
        return None, f"config {path} changed since it last validated"
    values = raw["settings"]
    s = lean.Settings()
    for row in lean.KEYS:
        attr = row[1]
        if type(values) is not dict or attr not in values or not lean.valid(row, values[attr]):
            return None, f"fast-path settings {where}: {row[0]} is missing or has an unexpected value"
        setattr(s, attr, float(values[attr]) if row[2] == "number" else values[attr])
    node = raw["override_node"]
    if node and environ.get("SLURMD_NODENAME") != node:
        return None, (
            f"fast-path settings {where} apply [[override]] rules for node {node}, "
            f"not {environ.get('SLURMD_NODENAME') or '(SLURMD_NODENAME unset)'}"
        )
    s.config_path, s.config_id = path, ident
    return s, ""
