"""A raw TOML table tree into a typed ``Config``: defaults, then validation of every key (unknown
key, type, range, choice, unknown check, each check's own ``validate``), and the other way back
(``to_toml_dict``). ``ConfigError`` is the one error of loading a config (``loader`` re-exports it).
Pure: no file is read here (``nodehealth.config.loader`` reads and resolves the file).

Every error is collected, not only the first: ``build`` validates every key it is given and raises one
``ConfigError`` holding them all (``problems``, each with its dotted ``key``), so a file with three
mistakes takes one run; the loader adds each one's line (``nodehealth.config.locate``). An unknown key
or check names the nearest known one.
"""

from __future__ import annotations

import dataclasses
import math
import re
import typing
from typing import Any, Mapping, Optional, Sequence, Union

from nodehealth.checks.base import CheckSettings
from nodehealth.config import lean
from nodehealth.config.schema import Config, default_checks
from nodehealth.registry import BY_NAME

# ConfigError.kind: a short label of what went wrong (the ``error`` label of nodehealth_config_valid).
KINDS = ("missing", "unreadable", "untrusted", "syntax", "value", "setup")


class ConfigError(Exception):
    """A configuration problem, worded for the one-line error an administrator sees."""

    def __init__(
        self, message: str, kind: str = "value", key: Optional[str] = None, problems: Sequence[ConfigError] = ()
    ) -> None:
        super().__init__(message)
        self.kind = kind if kind in KINDS else "value"
        self.key = key  # the dotted key it is about (``checks.gpu_ecc.max_sbe``), when it is about one
        self.problems: tuple[ConfigError, ...] = tuple(problems) or (self,)  # every error found at once
        self.state_dir: Optional[str] = None  # the state dir the bad file names, when it could be read
        self.persistent_dir: Optional[str] = None  # its persistent dir (where its last good one is kept), the same

    def oneline(self) -> str:
        """The message on one line (a log line, syslog): several errors joined with ``; ``."""
        return str(self).replace(":\n  ", ": ", 1).replace("\n  ", "; ")


# Keys the loader handles itself rather than through a dataclass field.
_TOP_EXTRA = {"override"}

# Keys that hold a path and must be absolute: (table, key, may be empty). The fast path's keys of
# kind "path" are among them (lean.KEYS), so both readers refuse the same values.
ABSOLUTE = tuple((k[0].split(".")[0], k[0].split(".")[1], False) for k in lean.KEYS if k[2] == "path") + (
    ("paths", "sysfs_root", False),
    ("slurm", "scontrol", False),
    ("slurm", "conf", True),
    ("daemon", "textfile_dir", True),
)

_HOST = r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,252})?$"  # compiled by `re` on first use


def near(name: str, known: list[str]) -> str:
    """``locate.near``: imported for a mistyped name only (``locate``'s regexes are for a config with errors)."""
    from nodehealth.config.locate import near as nearest

    return nearest(name, known)


def merge(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """Deep-merge tables; arrays and scalars in ``extra`` replace those in ``base``."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def combined(errors: Sequence[ConfigError], file: str) -> ConfigError:
    """One ConfigError for every error found: the error itself when there is one, else a first line
    counting them and one line each."""
    if len(errors) == 1:
        return errors[0]
    lines = "\n".join(f"  {e}" for e in errors)
    return ConfigError(f"{file}: {len(errors)} errors:\n{lines}", errors[0].kind, problems=errors)


def build(raw: Mapping[str, Any], file: str, prefix: str = "", errors: Optional[list[ConfigError]] = None) -> Config:
    """Defaults-then-validate: turn one raw table tree into a Config or raise ConfigError (every error in
    it). With ``errors``, each one is appended there instead and the Config built from the valid keys
    is returned."""
    errs: list[ConfigError] = [] if errors is None else errors
    first = len(errs)
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key in _TOP_EXTRA:
            continue
        if key == "checks":
            values["checks"] = _build_checks(value, file, prefix, errs)
            continue
        values[key] = value
    cfg: Config = _build_dataclass(Config, {k: v for k, v in values.items() if k != "checks"}, file, prefix, errs)
    checks = values.get("checks") or default_checks()
    cfg = dataclasses.replace(cfg, checks=checks)
    if lean.persistent_follows([raw]):  # a config from before the split: one directory, as it was
        cfg = dataclasses.replace(cfg, paths=dataclasses.replace(cfg.paths, persistent_dir=cfg.paths.state_dir))
    _check_paths(cfg, file, prefix, errs)
    try:
        _check_listen(cfg.daemon.listen, file, f"{prefix}daemon.listen")
    except ConfigError as exc:
        errs.append(exc)
    if errors is None and len(errs) > first:
        raise combined(errs, file)
    return cfg


def _check_paths(cfg: Config, file: str, prefix: str, errs: list[ConfigError]) -> None:
    for table, key, may_be_empty in ABSOLUTE:
        value = getattr(getattr(cfg, table), key)
        if value == "" and may_be_empty:
            continue
        if not value.startswith("/"):
            what = "empty" if value == "" else f"{value!r} is relative"
            where = f"{prefix}{table}.{key}"
            errs.append(ConfigError(f"{file}: {where}: {what}; expected an absolute path", key=where))


def _check_listen(value: str, file: str, key: str) -> None:
    """``HOST:PORT``, ``[IPv6]:PORT``, ``:PORT`` (every interface) or empty (no endpoint)."""
    if value == "":
        return
    host, sep, port = value.rpartition(":")
    ok = bool(sep) and port.isdigit() and len(port) <= 5 and int(port) <= 65535
    if ok and host.startswith("[") and host.endswith("]"):
        import ipaddress

        try:
            ok = ipaddress.ip_address(host[1:-1].split("%")[0]).version == 6
        except ValueError:
            ok = False
    elif ok and host:
        ok = bool(re.match(_HOST, host)) and ":" not in host
    if not ok:
        raise ConfigError(
            f"{file}: {key}: {value!r}: expected HOST:PORT (0.0.0.0:10915, [::]:10915, "
            '127.0.0.1:10915), or "" for no endpoint',
            key=key,
        )


def _build_checks(raw: Any, file: str, prefix: str, errs: list[ConfigError]) -> dict[str, CheckSettings]:
    out = default_checks()
    if not isinstance(raw, dict):
        errs.append(
            ConfigError(f"{file}: {prefix}checks: expected a table of [checks.<name>] tables", key=f"{prefix}checks")
        )
        return out
    for name, table in raw.items():
        spec = BY_NAME.get(name)
        where = f"{prefix}checks.{name}"
        if spec is None:
            known = ", ".join(BY_NAME)
            errs.append(
                ConfigError(f"{file}: {where}: unknown check{near(name, list(BY_NAME))} (known: {known})", key=where)
            )
            continue
        if not isinstance(table, dict):
            errs.append(ConfigError(f"{file}: {where}: expected a table", key=where))
            continue
        before = len(errs)
        settings = _build_dataclass(spec.settings_class, table, file, f"{where}.", errs)
        if len(errs) > before:
            continue
        try:
            settings.validate()
        except ValueError as exc:
            errs.append(ConfigError(f"{file}: {where}: {exc}", key=where))
            continue
        out[name] = settings
    return out


# Keys a table takes besides its dataclass's fields: the top level's, and an [[override]]'s.
_TOP_KEYS, _OVERRIDE_KEYS = ("checks", "override"), ("hosts", "checks")


def _build_dataclass(cls: type, raw: Mapping[str, Any], file: str, prefix: str, errs: list[ConfigError]) -> Any:
    """``cls`` from the valid keys of ``raw``; an error in one key is appended to ``errs`` and the next
    key is still read. A ``raw`` that is no table raises."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{file}: {prefix.rstrip('.')}: expected a table", key=prefix.rstrip(".") or None)
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init and f.name not in ("source", "checks")}
    extra: tuple[str, ...] = ()
    if cls is Config:
        extra = _OVERRIDE_KEYS if prefix.startswith("override[") else _TOP_KEYS
    kwargs: dict[str, Any] = {}
    for key, value in raw.items():
        where = f"{prefix}{key}"
        if key not in fields:
            known = [*fields, *extra]
            errs.append(
                ConfigError(
                    f"{file}: {where}: unknown key{near(key, known)} (known here: {', '.join(known) or '(none)'})",
                    key=where,
                )
            )
            continue
        f = fields[key]
        try:
            kwargs[key] = _coerce(hints[key], f, value, file, where, errs)
        except ConfigError as exc:
            exc.key = exc.key or where
            errs.append(exc)
    return cls(**kwargs)


def _field_default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


_SCALARS = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}


def _coerce(hint: Any, f: dataclasses.Field[Any], value: Any, file: str, key: str, errs: list[ConfigError]) -> Any:
    meta: Mapping[str, Any] = f.metadata or {}
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        # A nested table starts from the parent's default for it (phases.prolog has its own budget).
        before = len(errs)
        built = _build_dataclass(hint, value, file, key + ".", errs)
        default = _field_default(f)
        if default is None:
            return built
        if len(errs) > before:
            return default  # its errors are said; the rest of the file is still read
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
                    raise ConfigError(f'{file}: {key}: expected an integer or "auto", got {value!r}', key=key)
                return value
            return _scalar(int, meta, value, file, key)
        return _coerce(options[0], f, value, file, key, errs)
    if origin is tuple:
        item = args[0]
        if not isinstance(value, list):
            raise ConfigError(f"{file}: {key}: expected an array, got {_kind(value)}", key=key)
        if isinstance(item, type) and dataclasses.is_dataclass(item):
            return tuple(_build_dataclass(item, v, file, f"{key}[{i}].", errs) for i, v in enumerate(value))
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
        raise ConfigError(f"{file}: {key}: expected {_SCALARS.get(kind, kind)}, got {_kind(value)} {value!r}", key=key)
    if kind is float:
        value = float(value)
        if not math.isfinite(value):
            raise ConfigError(f"{file}: {key}: {value!r} is not a finite number", key=key)
    lo, hi, choices = meta.get("min"), meta.get("max"), meta.get("choices")
    if choices and value not in choices:
        raise ConfigError(f"{file}: {key}: {value!r} is not one of {', '.join(map(str, choices))}", key=key)
    if lo is not None and value < lo:
        raise ConfigError(f"{file}: {key}: {value!r} is below the minimum {lo:g}", key=key)
    if hi is not None and value > hi:
        raise ConfigError(f"{file}: {key}: {value!r} is above the maximum {hi:g}", key=key)
    return value


def _kind(value: Any) -> str:
    return {
        dict: "a table",
        list: "an array",
        str: "a string",
        bool: "a boolean",
        int: "an integer",
        float: "a number",
    }.get(type(value), type(value).__name__)


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
