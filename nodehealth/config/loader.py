"""Configuration loading: TOML into the frozen dataclasses of ``nodehealth.config.schema``.

Loading is defaults-then-validate: an unknown key, a wrong type, an out-of-range or non-finite
value, a relative path where an absolute one is needed, a malformed listen address, an unknown
check name is a ``ConfigError`` naming the file and the key. A check's ``timeout_s`` larger than
a phase's budget is not an error: the budget caps it when that phase runs. Per-host
overrides (``[[override]]`` with ``hosts = "gpu[001-064]"``) are validated for every host at
load time, so a typo in a rule for other nodes is still caught.
Which file is read (``config_path``) and the node's name (``node_name``) come from
``nodehealth.config.lean``, which the prolog's fast path shares.

Only a regular file is read (a FIFO or a device is refused unopened), and, running as root, only
one that root owns and nobody else can write, in directories nobody else can write; the
programs it names (``[slurm] scontrol``) likewise (``nodehealth.config.trust``).

``load`` raises; ``load_safe`` is what the faces and the daemon use: when the file does not
validate it returns the last configuration that validated on this node
(``nodehealth.config.lastgood``), else the built-in defaults, with the error, so a bad edit
never turns the checks off.

The typed build from a table tree (defaults, then every key validated) is ``nodehealth.config.build``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import sys
import time
from typing import Any, Callable, Mapping, Optional

from nodehealth.config import lastgood, lean, trust
from nodehealth.config.build import ABSOLUTE as ABSOLUTE
from nodehealth.config.build import KINDS as KINDS
from nodehealth.config.build import ConfigError as ConfigError
from nodehealth.config.build import build as build
from nodehealth.config.build import combined
from nodehealth.config.build import merge as merge
from nodehealth.config.build import to_toml_dict as to_toml_dict
from nodehealth.config.lean import config_path as config_path
from nodehealth.config.lean import node_name as node_name
from nodehealth.config.schema import Config as Config
from nodehealth.observations.record import record
from nodehealth.registry import PHASES

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on RHEL 9's Python 3.9
    import tomli as tomllib

MAX_DEPTH = 16  # tables and arrays inside each other; the schema needs 5


# Keys that name a program nodehealth runs (as root): trusted like the config file itself.
PROGRAMS = (("slurm", "scontrol"),)


@record
class Source:
    """One config file as read: its path, text and ``lean.identity`` (None: the default file is absent)."""

    file: str
    text: str
    identity: Optional[list[int]]

    @property
    def label(self) -> str:
        """What errors and ``Config.source`` call it."""
        return self.file if self.identity is not None else "<defaults>"


def read_source(path: Optional[str] = None, environ: Optional[Mapping[str, str]] = None) -> Source:
    """The config file's text: a regular file, root's own when running as root; raises ConfigError."""
    file, required = config_path(path, environ)
    file = os.path.abspath(file)
    try:
        data, st = lean.read_regular(file)
    except FileNotFoundError:
        if required:
            raise ConfigError(f"{file}: no such file", "missing") from None
        return Source(file, "", None)
    except OSError as exc:
        raise ConfigError(f"{file}: cannot read: {exc.strerror or exc}", "unreadable") from None
    why = lean.untrusted(st) or trust.problem(file)
    if why:
        raise ConfigError(
            f"{file}: not trusted: {why} (running as root, nodehealth uses only files root owns "
            "and nobody else can write)",
            "untrusted",
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{file}: not UTF-8: {exc}", "syntax") from None
    return Source(file, text, lean.identity(st))


def load(path: Optional[str] = None, host: Optional[str] = None, environ: Optional[Mapping[str, str]] = None) -> Config:
    """Read, validate and resolve the configuration for ``host`` (default: this node)."""
    src = read_source(path, environ)
    try:
        cfg = resolve(parse_toml(src.text, src.label), src.label, host, environ)
        check_programs(cfg, src.label)
    except ConfigError as exc:
        raise located(exc, src.text, src.label) from None
    return cfg


# The regexes of this module are strings, compiled by `re` on first use (and kept in its cache): a
# config that loads needs none of them.
_TOML_LINE = r"\(at line (\d+), column \d+\)"


def located(exc: ConfigError, text: str, file: str) -> ConfigError:
    """``exc`` with each of its errors at its line: ``FILE:LINE: key: ...`` (``nodehealth.config.locate``),
    or as it was where no line is found; one error per line when there are several."""
    if file == "<defaults>" or not text:
        return exc
    from nodehealth.config import locate  # its regexes, for a config with errors only

    lines = locate.index(text)
    out: list[tuple[float, int, ConfigError]] = []
    for e in exc.problems:
        message, head = str(e), f"{file}: "
        line = locate.line_of(lines, e.key) if e.key else None
        m = re.search(_TOML_LINE, message) if e.kind == "syntax" else None
        line = int(m.group(1)) if line is None and m else line
        if line is not None and message.startswith(head):
            message = f"{file}:{line}: {message[len(head) :]}"
        new = ConfigError(message, e.kind, e.key)
        new.state_dir, new.persistent_dir = e.state_dir, e.persistent_dir
        out.append((line if line is not None else math.inf, len(out), new))
    return combined([new for _, _, new in sorted(out, key=lambda t: (t[0], t[1]))], file)


def parse_toml(text: str, file: str) -> dict[str, Any]:
    try:
        raw: dict[str, Any] = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{file}: invalid TOML: {exc}", "syntax") from None
    except RecursionError:
        raise ConfigError(f"{file}: invalid TOML: nested too deeply (at most {MAX_DEPTH} levels)", "syntax") from None
    check_tree(raw, file)
    return raw


def check_tree(raw: Mapping[str, Any], file: str) -> None:
    """Nesting at most ``MAX_DEPTH`` deep, and every float finite (NaN passes every range check); every
    such error at once."""
    todo: list[tuple[str, Any, int]] = [(k, v, 1) for k, v in reversed(list(raw.items()))]
    errs: list[ConfigError] = []
    while todo:
        key, value, depth = todo.pop()
        if isinstance(value, float) and not math.isfinite(value):
            errs.append(ConfigError(f"{file}: {key}: {value!r} is not a finite number", key=key))
        if isinstance(value, (dict, list)):
            if depth > MAX_DEPTH:
                raise ConfigError(f"{file}: {key}: nested too deeply (at most {MAX_DEPTH} levels)", "syntax", key)
            items = value.items() if isinstance(value, dict) else ((f"[{i}]", v) for i, v in enumerate(value))
            for k, v in reversed(list(items)):
                todo.append((f"{key}{k}" if k.startswith("[") else f"{key}.{k}", v, depth + 1))
    if errs:
        raise combined(errs, file)


def resolve(
    raw: Mapping[str, Any], file: str, host: Optional[str] = None, environ: Optional[Mapping[str, str]] = None
) -> Config:
    """Validate ``raw`` (and every override in it), then build the config for ``host``; every error of the
    base and of each override at once."""
    base = {k: v for k, v in raw.items() if k != "override"}
    overrides = raw.get("override", [])
    errs: list[ConfigError] = []
    if not isinstance(overrides, list):
        errs.append(ConfigError(f"{file}: override: expected an array of tables ([[override]])", key="override"))
        overrides = []
    build(base, file, errors=errs)  # the base alone must be valid
    base_ok = not errs
    rules: list[tuple[list[str], dict[str, Any]]] = []
    for i, rule in enumerate(overrides):
        where = f"override[{i}]"
        if not isinstance(rule, dict):
            errs.append(ConfigError(f"{file}: {where}: expected a table", key=where))
            continue
        expr = rule.get("hosts")
        names: list[str] = []
        if not isinstance(expr, str) or not expr.strip():
            errs.append(
                ConfigError(
                    f'{file}: {where}.hosts: expected a Slurm hostlist expression such as "gpu[001-064]"',
                    key=f"{where}.hosts",
                )
            )
        else:
            import hostlist  # for [[override]] rules only

            try:
                names = hostlist.expand_hostlist(expr)
            except hostlist.BadHostlist as exc:
                errs.append(ConfigError(f"{file}: {where}.hosts: bad hostlist {expr!r}: {exc}", key=f"{where}.hosts"))
        body = {k: v for k, v in rule.items() if k != "hosts"}
        if "override" in body:
            errs.append(ConfigError(f"{file}: {where}: overrides cannot nest", key=f"{where}.override"))
            continue
        mine: list[ConfigError] = []
        build(merge(base, body), file, prefix=f"{where}.", errors=mine)
        # With a base that does not validate, its errors come again under this prefix: said once, above.
        errs += [e for e in mine if base_ok or _in_body(body, (e.key or "")[len(where) + 1 :])]
        rules.append((names, body))
    if errs:
        raise combined(errs, file)
    cfg_node = base.get("node_name", "") if isinstance(base.get("node_name", ""), str) else ""
    name = host or node_name(cfg_node, environ)
    merged: dict[str, Any] = dict(base)
    for names, body in rules:
        if name in names:
            merged = merge(merged, body)
    cfg = build(merged, file)
    if cfg.nvml.simulate and not os.path.isabs(cfg.nvml.simulate) and file != "<defaults>":
        path = os.path.join(os.path.dirname(os.path.abspath(file)), cfg.nvml.simulate)
        cfg = dataclasses.replace(cfg, nvml=dataclasses.replace(cfg.nvml, simulate=path))
    return dataclasses.replace(cfg, source=file)


def _in_body(body: Mapping[str, Any], key: str) -> bool:
    """Whether the dotted ``key`` (``gpu.expected_count``, ``checks.x.allowed[1]``) names a value given in
    ``body``."""
    node: Any = body
    for part in key.split("."):
        name = part.split("[", 1)[0]
        if not isinstance(node, Mapping) or name not in node:
            return False
        node = node[name]
    return bool(key)


def check_programs(cfg: Config, file: str) -> None:
    """Every program the config names: root's own, in directories only root can write (as root)."""
    for table, key in PROGRAMS:
        value = getattr(getattr(cfg, table), key)
        why = trust.problem(value)
        if why:
            raise ConfigError(
                f"{file}: {table}.{key}: {value} not trusted: {why} (running as root, nodehealth "
                "runs only programs root owns and nobody else can write)",
                "untrusted",
                f"{table}.{key}",
            )


@record
class Loaded:
    """What ``load_safe`` found: the config to run with, and why it is not the file's own."""

    cfg: Config
    file: str  # the config file asked for
    error: Optional[ConfigError] = None  # None: the file validated and ``cfg`` is its config
    using: str = "file"  # "file", "last_validated" (error set) or "defaults" (error set)
    note: str = ""  # how the fallback was chosen, or why the validated file could not be recorded

    @property
    def valid(self) -> bool:
        return self.error is None


def load_valid(
    path: Optional[str] = None,
    environ: Optional[Mapping[str, str]] = None,
    check: Optional[Callable[[Config], None]] = None,
    remember: bool = True,
    now: Optional[float] = None,
) -> tuple[Config, str]:
    """The file's own config for this node, and a note ("" or why it could not be recorded).

    Raises ConfigError, with ``state_dir`` set to the state dir the file names when it got that
    far (where its last good config is kept). ``check`` may raise ConfigError for what the loader
    cannot see (a scenario file). A config that validates is recorded as this node's last good
    one (``remember``).
    """
    hint: Optional[str] = None
    kept: Optional[str] = None
    try:
        src = read_source(path, environ)
        # also when the file does not parse: where its last good one is kept
        hint, kept = _path_in(src.text, "state_dir"), _path_in(src.text, "persistent_dir")
        try:
            raw = parse_toml(src.text, src.label)
            hint, kept = _path_of(raw, "state_dir"), _path_of(raw, "persistent_dir")
            cfg = resolve(raw, src.label, None, environ)
            check_programs(cfg, src.label)
        except ConfigError as exc:
            raise located(exc, src.text, src.label) from None
        if check is not None:
            check(cfg)
    except ConfigError as exc:
        exc.state_dir, exc.persistent_dir = hint, kept
        raise
    note = ""
    if remember:
        try:
            lastgood.record(cfg.paths, src.file, src.text, src.identity, time.time() if now is None else now)
        except OSError as exc:
            note = f"cannot record the validated configuration in {cfg.paths.persistent_dir}: {exc.strerror or exc}"
    return cfg, note


def load_safe(
    path: Optional[str] = None,
    environ: Optional[Mapping[str, str]] = None,
    check: Optional[Callable[[Config], None]] = None,
    remember: bool = True,
    now: Optional[float] = None,
    defaults: bool = True,
) -> Loaded:
    """The config to run with; a bad file does not raise.

    The file's own config when it validates (``load_valid``). Otherwise the last config that
    validated on this node from this same path, read back from the state dir and validated
    again, else (``defaults``) the built-in defaults (in the state dir the file names, when it
    names an absolute one), with the file's error. The file's ConfigError propagates only when
    there is nothing to fall back on.
    """
    file = os.path.abspath(config_path(path, environ)[0])
    try:
        cfg, note = load_valid(path, environ, check, remember, now)
    except ConfigError as exc:
        return _fallback(file, exc, (exc.state_dir, exc.persistent_dir), environ, check, defaults)
    return Loaded(cfg, file, note=note)


_TABLE_LINE = r"^\s*\[\s*(\[?)\s*([A-Za-z0-9_.\s]*?)\s*\]"
_DIR_LINES = {key: rf'^\s*(paths\s*\.\s*)?{key}\s*=\s*"([^"\\]+)"\s*(#.*)?$' for key in ("state_dir", "persistent_dir")}


def _path_in(text: str, key: str) -> Optional[str]:
    """``[paths] <key>`` read line by line from a file that may not parse as a whole (a trusted one)."""
    table: Optional[str] = ""
    for line in text.splitlines():
        m = re.match(_TABLE_LINE, line)
        if m:
            table = None if m.group(1) else m.group(2).replace(" ", "")
            continue
        m = re.match(_DIR_LINES[key], line)
        if m and ((table == "" and m.group(1)) or (table == "paths" and not m.group(1))):
            return m.group(2) if m.group(2).startswith("/") else None
    return None


def _path_of(raw: Mapping[str, Any], key: str) -> Optional[str]:
    paths = raw.get("paths")
    value = paths.get(key) if isinstance(paths, dict) else None
    return value if isinstance(value, str) and os.path.isabs(value) else None


def _fallback(
    file: str,
    error: ConfigError,
    hints: tuple[Optional[str], Optional[str]],
    environ: Optional[Mapping[str, str]],
    check: Optional[Callable[[Config], None]],
    defaults: bool,
) -> Loaded:
    hint, kept = hints
    # Where the file keeps its last good one (its persistent dir; its state dir when it names only
    # that: lean.persistent_follows), then the default, then the run dirs from before the split.
    dirs = [d for d in (kept or hint, lean.default("paths.persistent_dir"), hint, lean.default("paths.state_dir")) if d]
    whys, unseen = [], []
    for sd in dict.fromkeys(dirs):
        why = trust.problem(lastgood.path_in(sd))
        rec, why = (None, why) if why else lastgood.recall(sd, file)
        if rec is None:
            # Record files that are simply absent make one clause ("neither A nor B"), not the same words twice.
            if why == lastgood.none_yet(lastgood.path_in(sd)):
                unseen.append(lastgood.path_in(sd))
            else:
                whys.append(why)
            continue
        try:
            label = file if rec["identity"] is not None else "<defaults>"
            cfg = resolve(parse_toml(rec["text"], label), label, None, environ)
            check_programs(cfg, label)
            if check is not None:
                check(cfg)
        except ConfigError as exc:
            whys.append(f"the last configuration that validated here no longer does: {exc}")
            continue
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(rec["validated_at"]))
        source = f"{file} as it validated at {when} (sha256 {rec['sha256'][:12]}, kept in {lastgood.path_in(sd)})"
        return Loaded(dataclasses.replace(cfg, source=source), file, error, "last_validated", source)
    if not defaults:
        raise error
    # The built-in defaults, but in the state dir the file names: drain records and the ledger stay where they are.
    named = {k: v for k, v in (("state_dir", hint), ("persistent_dir", kept)) if v}
    cfg = resolve({"paths": named} if named else {}, "<defaults>", None, environ)
    try:
        check_programs(cfg, "<defaults>")
        if check is not None:
            check(cfg)
    except ConfigError:
        raise error from None
    whys[:0] = [lastgood.none_yet(*unseen)] if unseen else []
    return Loaded(cfg, file, error, "defaults", "; ".join(whys))


def phase_budget(cfg: Config, phase: str) -> float:
    if phase not in PHASES:
        raise ConfigError(f"unknown phase {phase!r}")
    budget: float = getattr(cfg.phases, phase).budget_s
    return budget
