"""Configuration loading: TOML into the frozen dataclasses of ``nodehealth.config.schema``.

Loading is defaults-then-validate: an unknown key, a wrong type, an out-of-range value, an
unknown check name or a check deadline larger than a phase budget is a ``ConfigError`` naming
the file and the key. Per-host overrides (``[[override]]`` with ``hosts = "gpu[001-064]"``) are
validated for every host at load time, so a typo in a rule for other nodes is still caught.
Which file is read (``config_path``) and the node's name (``node_name``) come from
``nodehealth.config.lean``, which the prolog's fast path shares.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import typing
from pathlib import Path
from typing import Any, Mapping, Optional, Union

import hostlist

from nodehealth.checks.base import CheckSettings
from nodehealth.config.lean import config_path, node_name
from nodehealth.config.schema import Config, default_checks
from nodehealth.registry import BY_NAME, CHECKS, PHASES

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on RHEL 9's Python 3.9
    import tomli as tomllib


class ConfigError(Exception):
    """A configuration problem, worded for the one-line error an administrator sees."""


# Keys the loader handles itself rather than through a dataclass field.
_TOP_EXTRA = {"override"}


def load(path: Optional[str] = None, host: Optional[str] = None,
         environ: Optional[Mapping[str, str]] = None) -> Config:
    """Read, validate and resolve the configuration for ``host`` (default: this node)."""
    file, required = config_path(path, environ)
    try:
        text = Path(file).read_text(encoding="utf-8")
    except FileNotFoundError:
        if required:
            raise ConfigError(f"{file}: no such file") from None
        raw: dict[str, Any] = {}
        file = "<defaults>"
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{file}: cannot read: {exc}") from None
    else:
        raw = parse_toml(text, file)
    return resolve(raw, file, host, environ)


def parse_toml(text: str, file: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{file}: invalid TOML: {exc}") from None


def resolve(raw: Mapping[str, Any], file: str, host: Optional[str] = None,
            environ: Optional[Mapping[str, str]] = None) -> Config:
    """Validate ``raw`` (and every override in it), then build the config for ``host``."""
    base = {k: v for k, v in raw.items() if k != "override"}
    overrides = raw.get("override", [])
    if not isinstance(overrides, list):
        raise ConfigError(f"{file}: override: expected an array of tables ([[override]])")
    build(base, file)  # the base alone must be valid
    rules: list[tuple[list[str], dict[str, Any]]] = []
    for i, rule in enumerate(overrides):
        where = f"override[{i}]"
        if not isinstance(rule, dict):
            raise ConfigError(f"{file}: {where}: expected a table")
        expr = rule.get("hosts")
        if not isinstance(expr, str) or not expr.strip():
            raise ConfigError(f"{file}: {where}.hosts: expected a Slurm hostlist expression such as \"gpu[001-064]\"")
        try:
            names = hostlist.expand_hostlist(expr)
        except hostlist.BadHostlist as exc:
            raise ConfigError(f"{file}: {where}.hosts: bad hostlist {expr!r}: {exc}") from None
        body = {k: v for k, v in rule.items() if k != "hosts"}
        if "override" in body:
            raise ConfigError(f"{file}: {where}: overrides cannot nest")
        build(merge(base, body), file, prefix=f"{where}.")
        rules.append((names, body))
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


def merge(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """Deep-merge tables; arrays and scalars in ``extra`` replace those in ``base``."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def build(raw: Mapping[str, Any], file: str, prefix: str = "") -> Config:
    """Defaults-then-validate: turn one raw table tree into a Config or raise ConfigError."""
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key in _TOP_EXTRA:
            continue
        if key == "checks":
            values["checks"] = _build_checks(value, file, prefix)
            continue
        values[key] = value
    cfg = _build_dataclass(Config, {k: v for k, v in values.items() if k != "checks"}, file, prefix)
    checks = values.get("checks") or default_checks()
    cfg = dataclasses.replace(cfg, checks=checks)
    _check_budgets(cfg, file)
    return cfg


def _build_checks(raw: Any, file: str, prefix: str) -> dict[str, CheckSettings]:
    if not isinstance(raw, dict):
        raise ConfigError(f"{file}: {prefix}checks: expected a table of [checks.<name>] tables")
    out = default_checks()
    for name, table in raw.items():
        spec = BY_NAME.get(name)
        if spec is None:
            known = ", ".join(BY_NAME)
            raise ConfigError(f"{file}: {prefix}checks.{name}: unknown check (known: {known})")
        if not isinstance(table, dict):
            raise ConfigError(f"{file}: {prefix}checks.{name}: expected a table")
        settings = _build_dataclass(spec.settings_class, table, file, f"{prefix}checks.{name}.")
        try:
            settings.validate()
        except ValueError as exc:
            raise ConfigError(f"{file}: {prefix}checks.{name}: {exc}") from None
        out[name] = settings
    return out


def _check_budgets(cfg: Config, file: str) -> None:
    enabled = cfg.enabled()
    for spec in CHECKS:
        if not enabled[spec.name]:
            continue
        timeout = cfg.checks[spec.name].timeout_s
        for phase in sorted(spec.phases):
            budget = getattr(cfg.phases, phase).budget_s
            if timeout > budget:
                raise ConfigError(
                    f"{file}: checks.{spec.name}.timeout_s: {timeout:g} s is larger than the "
                    f"{phase} budget (phases.{phase}.budget_s = {budget:g} s)")


def _build_dataclass(cls: type, raw: Mapping[str, Any], file: str, prefix: str) -> Any:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{file}: {prefix.rstrip('.')}: expected a table")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init and f.name not in ("source", "checks")}
    kwargs: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in fields:
            known = ", ".join(fields) or "(none)"
            raise ConfigError(f"{file}: {prefix}{key}: unknown key (known here: {known})")
        f = fields[key]
        kwargs[key] = _coerce(hints[key], f, value, file, f"{prefix}{key}")
    return cls(**kwargs)


def _field_default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


_SCALARS = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}


def _coerce(hint: Any, f: dataclasses.Field[Any], value: Any, file: str, key: str) -> Any:
    meta: Mapping[str, Any] = f.metadata or {}
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        # A nested table starts from the parent's default for it (phases.prolog has its own budget).
        built = _build_dataclass(hint, value, file, key + ".")
        default = _field_default(f)
        if default is None:
            return built
        given = {name: getattr(built, name) for name in value}
        return dataclasses.replace(default, **given)
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is Union:
        options = [a for a in args if a is not type(None)]
        if type(None) in args and value is None:
            return None
        # A number-or-keyword field such as expected_count: accept the keyword form, else the number.
        if set(options) == {int, str}:
            if isinstance(value, str):
                if value != "auto":
                    raise ConfigError(f"{file}: {key}: expected an integer or \"auto\", got {value!r}")
                return value
            return _scalar(int, meta, value, file, key)
        return _coerce(options[0], f, value, file, key)
    if origin is tuple:
        item = args[0]
        if not isinstance(value, list):
            raise ConfigError(f"{file}: {key}: expected an array, got {_kind(value)}")
        if isinstance(item, type) and dataclasses.is_dataclass(item):
            return tuple(_build_dataclass(item, v, file, f"{key}[{i}].") for i, v in enumerate(value))
        out = []
        for i, v in enumerate(value):
            out.append(_scalar(item, meta, v, file, f"{key}[{i}]"))
        return tuple(out)
    return _scalar(hint, meta, value, file, key)


def _scalar(kind: Any, meta: Mapping[str, Any], value: Any, file: str, key: str) -> Any:
    ok = (
        (kind is bool and isinstance(value, bool))
        or (kind is int and isinstance(value, int) and not isinstance(value, bool))
        or (kind is float and isinstance(value, (int, float)) and not isinstance(value, bool))
        or (kind is str and isinstance(value, str))
    )
    if not ok:
        raise ConfigError(f"{file}: {key}: expected {_SCALARS.get(kind, kind)}, got {_kind(value)} {value!r}")
    if kind is float:
        value = float(value)
    lo, hi, choices = meta.get("min"), meta.get("max"), meta.get("choices")
    if choices and value not in choices:
        raise ConfigError(f"{file}: {key}: {value!r} is not one of {', '.join(map(str, choices))}")
    if lo is not None and value < lo:
        raise ConfigError(f"{file}: {key}: {value!r} is below the minimum {lo:g}")
    if hi is not None and value > hi:
        raise ConfigError(f"{file}: {key}: {value!r} is above the maximum {hi:g}")
    return value


def _kind(value: Any) -> str:
    return {dict: "a table", list: "an array", str: "a string", bool: "a boolean",
            int: "an integer", float: "a number"}.get(type(value), type(value).__name__)


def to_toml_dict(cfg: Config) -> dict[str, Any]:
    """The effective config as plain tables (for ``nodehealth config check``)."""
    def plain(obj: Any) -> Any:
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            return {f.name: plain(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.name != "source"}
        if isinstance(obj, Mapping):
            return {k: plain(v) for k, v in obj.items()}
        if isinstance(obj, tuple):
            return [plain(v) for v in obj]
        return obj

    out: dict[str, Any] = plain(cfg)
    return out


def phase_budget(cfg: Config, phase: str) -> float:
    if phase not in PHASES:
        raise ConfigError(f"unknown phase {phase!r}")
    budget: float = getattr(cfg.phases, phase).budget_s
    return budget
