"""The keys the prolog's fast path needs, read from the TOML file by their own reader, and their one default.

``KEYS`` declares, once, the default, range and choices of every key the fast path reads;
``nodehealth.config.schema`` declares the same keys from it, so the full loader and this reader
cannot disagree. ``DEFAULT_PATH``, ``ENV_VAR``, ``config_path`` and ``node_name`` live here for
the same reason: both readers use them.

The fast path itself reads no TOML: when a file validates, ``resolve`` reads these keys from the
same text (with the same defaults, bounds and ``[[override]]`` rules) and ``nodehealth.config.snapshot``
keeps the result in ``marshal`` form, which the fast path checks with ``valid`` and the file's
``identity`` before it believes it. ``read_settings`` reads a file the same way.

Standard library only at import time (``os``, ``sys``): the fast path pays for every module.
``tomllib`` (``tomli`` below Python 3.11) is imported when a file is read (the host name, where
the node name falls back to it, is ``os.uname()``'s: no ``socket``), and ``hostlist`` only when an
``[[override]]`` touches one of these keys. ``read_settings`` never raises on a bad file: any doubt (unreadable, not a
regular file, not root's own while running as root, invalid TOML, a value of the wrong type, out
of range or not finite) is returned as a reason.

``read_regular`` is the one way either reader opens a config file: ``stat`` first, and only a
regular file is opened (non-blocking, so a FIFO swapped in between cannot hang the prolog), then
checked again on the open descriptor. ``identity`` names the file that was read (device, inode,
size, modification and change times): the prolog's fast path compares it with the one its
snapshot was made from (and ``nodehealth.config.lastgood`` records it too).
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # no typing import at run time
    from typing import Any, Mapping, Optional

DEFAULT_PATH = "/etc/nodehealth/nodehealth.toml"
ENV_VAR = "NODEHEALTH_CONFIG"

MAX_BYTES = 1 << 20  # a config file larger than this is refused unread

# A directory the defaults of [paths] state_dir and persistent_dir are moved under (an absolute
# path; unset, or anything else, keeps /run/nodehealth and /var/lib/nodehealth). The test suite
# sets it for itself and every process it starts (tests/conftest.py), so no test reaches the
# host's state dirs through a default; a value a config sets is never moved.
DEFAULT_ROOT_ENV = "NODEHEALTH_DEFAULT_ROOT"
_ROOT = os.environ.get(DEFAULT_ROOT_ENV, "")
_ROOT = _ROOT.rstrip("/") if _ROOT.startswith("/") else ""

# (dotted key, Settings attribute, kind, default, min, max, choices); kind is one of
# "str", "path" (a string holding an absolute path), "bool", "int" and "number" (an integer or a
# finite float, read as a float).
KEYS = (
    ("node_name", "node_name", "str", "", None, None, None),
    ("paths.state_dir", "state_dir", "path", _ROOT + "/run/nodehealth", None, None, None),
    ("paths.persistent_dir", "persistent_dir", "path", _ROOT + "/var/lib/nodehealth", None, None, None),
    ("paths.procfs_root", "procfs_root", "path", "/proc", None, None, None),
    ("phases.prolog.budget_s", "prolog_budget_s", "number", 20.0, 1, 3600, None),
    ("slurm.timeout_s", "slurm_timeout_s", "number", 3.0, 0.1, 60, None),
    ("daemon.state_max_age_s", "max_age_s", "number", 90.0, 1, 86400, None),
    ("daemon.xid_follow", "xid_follow", "bool", True, None, None, None),
    ("ledger.enabled", "ledger_enabled", "bool", True, None, None, None),
    ("ledger.max_bytes", "ledger_max_bytes", "int", 1 << 20, 4096, 1 << 30, None),
    ("policy.unknown", "unknown", "str", "pass", None, None, ("pass", "fail")),
)
BY_KEY = {k[0]: k for k in KEYS}


def documented(value: Any) -> Any:
    """A default as the documentation shows it: the production path, without ``DEFAULT_ROOT_ENV``'s root."""
    if _ROOT and isinstance(value, str) and value.startswith(_ROOT + "/"):
        return value[len(_ROOT) :]
    return value


def default(key: str) -> Any:
    """The default of one dotted key of ``KEYS`` (``"paths.state_dir"``)."""
    return BY_KEY[key][3]


class Settings:
    """The values of ``KEYS`` for this node; a new instance holds the defaults."""

    __slots__ = tuple(k[1] for k in KEYS) + ("config_path", "config_id")

    node_name: str
    state_dir: str
    persistent_dir: str
    procfs_root: str
    prolog_budget_s: float
    slurm_timeout_s: float
    max_age_s: float
    xid_follow: bool
    ledger_enabled: bool
    ledger_max_bytes: int
    unknown: str
    config_path: str  # the file these settings were read from
    config_id: Optional[list[int]]  # its ``identity``; None when the default file is absent

    def __init__(self) -> None:
        for _, attr, _, value, _, _, _ in KEYS:
            setattr(self, attr, value)
        self.config_path, self.config_id = DEFAULT_PATH, None


_S_IFMT, _S_IFREG = 0o170000, 0o100000


class NotRegular(OSError):
    """The config path names something other than a regular file (a FIFO, a device, a directory)."""


def _regular(mode: int) -> bool:
    return mode & _S_IFMT == _S_IFREG


def read_regular(path: str, limit: int = MAX_BYTES) -> tuple[bytes, Any]:
    """The bytes of the regular file ``path`` and its ``os.fstat``; raises ``OSError``.

    ``NotRegular`` for anything else (refused before it is opened), also when the file is larger
    than ``limit``; ``FileNotFoundError`` when it does not exist.
    """
    if not _regular(os.stat(path).st_mode):
        raise NotRegular(f"{path}: not a regular file")
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0))
    try:
        st = os.fstat(fd)
        if not _regular(st.st_mode):
            raise NotRegular(f"{path}: not a regular file")
        chunks = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, limit + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > limit:
        raise NotRegular(f"{path}: larger than {limit} bytes")
    return b"".join(chunks), st


def identity(st: Any) -> list[int]:
    """What names one version of a file: device, inode, size, modification and change times (ns)."""
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def untrusted(st: Any, euid: Optional[int] = None) -> str:
    """Why a process running as root must not use the file ``st`` describes, or "" (not root: "")."""
    if (os.geteuid() if euid is None else euid) != 0:
        return ""
    if st.st_uid != 0:
        return f"owned by uid {st.st_uid}, not root"
    if st.st_mode & 0o022:
        return f"writable by group or others (mode {st.st_mode & 0o7777:04o})"
    return ""


def _ok(kind: str, value: Any) -> bool:
    if kind == "str":
        return isinstance(value, str)
    if kind == "path":
        return isinstance(value, str) and value.startswith("/")
    if kind == "bool":
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if kind == "int":
        return isinstance(value, int)
    # value - value is 0 for every finite number, NaN for NaN and the infinities (no math import)
    return isinstance(value, (int, float)) and value - value == 0


def _lookup(raw: Mapping[str, Any], key: str) -> tuple[bool, Any]:
    """``(True, value)`` when the table tree ``raw`` holds the dotted ``key``, else ``(False, None)``."""
    where: Any = raw
    for part in key.split("."):
        if not isinstance(where, dict) or part not in where:
            return False, None
        where = where[part]
    return True, where


def valid(row: Any, value: Any) -> bool:
    """Whether ``value`` is one the key of ``KEYS`` row ``row`` takes: its kind, range and choices."""
    _, _, kind, _, lo, hi, choices = row
    if not _ok(kind, value):
        return False
    return not (
        (choices is not None and value not in choices)
        or (lo is not None and value < lo)
        or (hi is not None and value > hi)
    )


def _apply(s: Settings, raw: Mapping[str, Any]) -> Optional[str]:
    """Copy the keys of ``KEYS`` from one TOML table tree; the first bad one is returned."""
    for row in KEYS:
        key, attr, kind = row[:3]
        found, value = _lookup(raw, key)
        if not found:
            continue
        if not valid(row, value):
            return key
        setattr(s, attr, float(value) if kind == "number" else value)
    return None


def _touches(rule: Mapping[str, Any]) -> bool:
    return any(_lookup(rule, k[0])[0] for k in KEYS)


def sets_dirs(raw: Mapping[str, Any]) -> tuple[bool, bool]:
    """Whether one table tree sets ``[paths] state_dir`` and ``[paths] persistent_dir``."""
    return _lookup(raw, "paths.state_dir")[0], _lookup(raw, "paths.persistent_dir")[0]


def persistent_follows(trees: Any) -> bool:
    """The rule for configs written before the split: when the trees that apply to this node (the
    file, then its matching overrides) set ``state_dir`` but none sets ``persistent_dir``, the
    persistent dir is that ``state_dir`` (one directory, everything where it was)."""
    state = persistent = False
    for tree in trees:
        s, p = sets_dirs(tree)
        state, persistent = state or s, persistent or p
    return state and not persistent


def node_name(configured: str = "", environ: Optional[Mapping[str, str]] = None) -> str:
    """This node's name: SLURMD_NODENAME, else the configured name, else the short host name."""
    env = os.environ if environ is None else environ
    if env.get("SLURMD_NODENAME"):
        return env["SLURMD_NODENAME"]
    if configured:
        return configured
    return os.uname().nodename.split(".")[0]  # gethostname(2) on Linux: without importing socket


def config_path(explicit: Optional[str] = None, environ: Optional[Mapping[str, str]] = None) -> tuple[str, bool]:
    """The config file to read and whether it was asked for (a missing default file is fine)."""
    env = os.environ if environ is None else environ
    if explicit:
        return explicit, True
    if env.get(ENV_VAR):
        return env[ENV_VAR], True
    return DEFAULT_PATH, False


def read_settings(environ: Mapping[str, str]) -> tuple[Optional[Settings], str]:
    """The settings from the config file, or ``(None, why)`` (then the cold path)."""
    path, required = config_path(None, environ)
    st = None
    try:
        data, st = read_regular(path)
    except FileNotFoundError:
        if required:
            return None, f"config {path}: no such file"
        data = b""
    except OSError as exc:
        return None, f"config {path}: cannot read: {exc.strerror or exc}"
    if st is not None:
        distrust = untrusted(st)
        if distrust:
            return None, f"config {path}: not trusted: {distrust}"
    s, why, _ = resolve(data, identity(st) if st is not None else None, path, environ)
    return s, why


def resolve(
    data: bytes, ident: Optional[list[int]], path: str, environ: Mapping[str, str]
) -> tuple[Optional[Settings], str, str]:
    """The settings in the config text ``data`` read from ``path`` (``ident``: the ``identity`` of
    that read, None for an absent default file), or ``(None, why, "")``; the third value is the node name the
    ``[[override]]`` rules that touch these keys were matched against ("" when none does: the
    settings do not depend on the node). ``nodehealth.config.snapshot`` keeps what this gives for
    a file that validated."""
    if sys.version_info >= (3, 11):
        import tomllib  # novermin - tomli below 3.11
    else:  # pragma: no cover - Python 3.9/3.10
        import tomli as tomllib
    try:
        raw = tomllib.loads(data.decode("utf-8")) if data.strip() else {}
    except (ValueError, UnicodeDecodeError) as exc:  # TOMLDecodeError is a ValueError
        return None, f"config {path}: invalid TOML ({exc})", ""
    except RecursionError:
        return None, f"config {path}: nested too deeply", ""
    s = Settings()
    s.config_path = path if path.startswith("/") else os.path.abspath(path)
    s.config_id = ident
    bad = _apply(s, raw)
    if bad:
        return None, f"config {path}: {bad} has an unexpected value", ""
    rules = raw.get("override", [])
    if not isinstance(rules, list):
        return None, f"config {path}: override is not an array of tables", ""
    relevant = [r for r in rules if isinstance(r, dict) and _touches(r)]
    applied = [raw]
    me = ""
    if relevant:
        import hostlist

        me = node_name(s.node_name, environ)
        for rule in relevant:
            try:
                names = hostlist.expand_hostlist(str(rule.get("hosts", "")))
            except Exception as exc:  # noqa: BLE001 - hostlist.BadHostlist and friends
                return None, f"config {path}: override hosts: {exc}", ""
            if me in names:
                bad = _apply(s, rule)
                if bad:
                    return None, f"config {path}: override {bad} has an unexpected value", ""
                applied.append(rule)
    if persistent_follows(applied):
        s.persistent_dir = s.state_dir
    return s, "", me
