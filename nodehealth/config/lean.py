"""The keys the prolog's fast path needs, read straight from the TOML file, and their one default.

``KEYS`` declares, once, the default, range and choices of every key the fast path reads;
``nodehealth.config.schema`` declares the same keys from it, so the full loader and this reader
cannot disagree. ``DEFAULT_PATH``, ``ENV_VAR``, ``config_path`` and ``node_name`` live here for
the same reason: both readers use them.

Standard library only at import time (``os``, ``sys``): the fast path pays for every module.
``tomllib`` (``tomli`` below Python 3.11) is imported when a file is read, ``socket`` only when
the node name falls back to the host name, and ``hostlist`` only when an ``[[override]]`` touches
one of these keys. ``read_settings`` never raises on a bad file: any doubt (unreadable, invalid
TOML, a value of the wrong type or out of range) is returned as a reason, and the caller takes
the cold path, where the full loader reports the problem.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # no typing import at run time
    from typing import Any, Mapping, Optional

DEFAULT_PATH = "/etc/nodehealth/nodehealth.toml"
ENV_VAR = "NODEHEALTH_CONFIG"

# (dotted key, Settings attribute, kind, default, min, max, choices); kind is one of
# "str", "bool", "int" and "number" (an integer or a float, read as a float).
KEYS = (
    ("node_name", "node_name", "str", "", None, None, None),
    ("paths.state_dir", "state_dir", "str", "/run/nodehealth", None, None, None),
    ("paths.procfs_root", "procfs_root", "str", "/proc", None, None, None),
    ("phases.prolog.budget_s", "prolog_budget_s", "number", 20.0, 1, 3600, None),
    ("slurm.timeout_s", "slurm_timeout_s", "number", 3.0, 0.1, 60, None),
    ("daemon.state_max_age_s", "max_age_s", "number", 90.0, 1, 86400, None),
    ("daemon.xid_follow", "xid_follow", "bool", True, None, None, None),
    ("ledger.enabled", "ledger_enabled", "bool", True, None, None, None),
    ("ledger.max_bytes", "ledger_max_bytes", "int", 1 << 20, 4096, 1 << 30, None),
    ("policy.unknown", "unknown", "str", "pass", None, None, ("pass", "fail")),
)
BY_KEY = {k[0]: k for k in KEYS}


def default(key: str) -> Any:
    """The default of one dotted key of ``KEYS`` (``"paths.state_dir"``)."""
    return BY_KEY[key][3]


class Settings:
    """The values of ``KEYS`` for this node; a new instance holds the defaults."""

    __slots__ = tuple(k[1] for k in KEYS)

    node_name: str
    state_dir: str
    procfs_root: str
    prolog_budget_s: float
    slurm_timeout_s: float
    max_age_s: float
    xid_follow: bool
    ledger_enabled: bool
    ledger_max_bytes: int
    unknown: str

    def __init__(self) -> None:
        for _, attr, _, value, _, _, _ in KEYS:
            setattr(self, attr, value)


def _ok(kind: str, value: Any) -> bool:
    if kind == "str":
        return isinstance(value, str)
    if kind == "bool":
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    return isinstance(value, int) if kind == "int" else isinstance(value, (int, float))


def _lookup(raw: Mapping[str, Any], key: str) -> tuple[bool, Any]:
    """``(True, value)`` when the table tree ``raw`` holds the dotted ``key``, else ``(False, None)``."""
    where: Any = raw
    for part in key.split("."):
        if not isinstance(where, dict) or part not in where:
            return False, None
        where = where[part]
    return True, where


def _apply(s: Settings, raw: Mapping[str, Any]) -> Optional[str]:
    """Copy the keys of ``KEYS`` from one TOML table tree; the first bad one is returned."""
    for key, attr, kind, _, lo, hi, choices in KEYS:
        found, value = _lookup(raw, key)
        if not found:
            continue
        if not _ok(kind, value):
            return key
        if (choices is not None and value not in choices) or (lo is not None and value < lo) or (
                hi is not None and value > hi):
            return key
        setattr(s, attr, float(value) if kind == "number" else value)
    return None


def _touches(rule: Mapping[str, Any]) -> bool:
    return any(_lookup(rule, k[0])[0] for k in KEYS)


def node_name(configured: str = "", environ: Optional[Mapping[str, str]] = None) -> str:
    """This node's name: SLURMD_NODENAME, else the configured name, else the short host name."""
    env = os.environ if environ is None else environ
    if env.get("SLURMD_NODENAME"):
        return env["SLURMD_NODENAME"]
    if configured:
        return configured
    import socket

    return socket.gethostname().split(".")[0]


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
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        if required:
            return None, f"config {path}: no such file"
        data = b""
    except OSError as exc:
        return None, f"config {path}: cannot read: {exc.strerror or exc}"
    if sys.version_info >= (3, 11):
        import tomllib  # novermin - tomli below 3.11
    else:  # pragma: no cover - Python 3.9/3.10
        import tomli as tomllib
    try:
        raw = tomllib.loads(data.decode("utf-8")) if data.strip() else {}
    except (ValueError, UnicodeDecodeError) as exc:  # TOMLDecodeError is a ValueError
        return None, f"config {path}: invalid TOML ({exc})"
    s = Settings()
    bad = _apply(s, raw)
    if bad:
        return None, f"config {path}: {bad} has an unexpected value"
    rules = raw.get("override", [])
    if not isinstance(rules, list):
        return None, f"config {path}: override is not an array of tables"
    relevant = [r for r in rules if isinstance(r, dict) and _touches(r)]
    if relevant:
        import hostlist

        me = node_name(s.node_name, environ)
        for rule in relevant:
            try:
                names = hostlist.expand_hostlist(str(rule.get("hosts", "")))
            except Exception as exc:  # noqa: BLE001 - hostlist.BadHostlist and friends
                return None, f"config {path}: override hosts: {exc}"
            if me in names:
                bad = _apply(s, rule)
                if bad:
                    return None, f"config {path}: override {bad} has an unexpected value"
    return s, ""
