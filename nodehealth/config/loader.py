"""Configuration: TOML into frozen dataclasses, defaults in one place, then validation.

Every key is a dataclass field declared with ``setting()`` (doc, unit, bounds). Loading is
defaults-then-validate: an unknown key, a wrong type, an out-of-range value, an unknown
check name or a check deadline larger than a phase budget is a ``ConfigError`` naming the
file and the key. Per-host overrides (``[[override]]`` with ``hosts = "gpu[001-064]"``) are
validated for every host at load time, so a typo in a rule for other nodes is still caught.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Union

import hostlist

from nodehealth.checks.base import CheckSettings, setting
from nodehealth.registry import BY_NAME, CHECKS, PHASES

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on RHEL 9's Python 3.9
    import tomli as tomllib

DEFAULT_PATH = "/etc/nodehealth/nodehealth.toml"
ENV_VAR = "NODEHEALTH_CONFIG"
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


class ConfigError(Exception):
    """A configuration problem, worded for the one-line error an administrator sees."""


@dataclass(frozen=True)
class PhaseSettings:
    budget_s: float = setting(30.0, "total time for one run of this phase's checks", unit="s",
                              min=1, max=3600)


def _phase(budget: float) -> Any:
    return field(default_factory=lambda: PhaseSettings(budget_s=budget),
                 metadata={"doc": "", "unit": "", "min": None, "max": None, "choices": None})


@dataclass(frozen=True)
class Phases:
    """Budgets per face. Keep prolog's well under Slurm's PrologEpilogTimeout."""

    prolog: PhaseSettings = _phase(20.0)
    epilog: PhaseSettings = _phase(30.0)
    healthcheck: PhaseSettings = _phase(50.0)
    manual: PhaseSettings = _phase(30.0)
    daemon: PhaseSettings = _phase(30.0)


@dataclass(frozen=True)
class Policy:
    unknown: str = setting(
        "pass", "what an UNKNOWN result (nodehealth could not tell) does to the exit code and "
        "drain decision: pass = treat as healthy and log loudly, fail = treat as a fault",
        choices=("pass", "fail"))


@dataclass(frozen=True)
class GpuSettings:
    expected_count: Union[int, str] = setting(
        "auto", "GPUs this node must have: a number, or \"auto\" = this node's Gres=gpu:N in "
        "Slurm, else the NVIDIA GPUs on the PCI bus", min=0, max=64)


@dataclass(frozen=True)
class NvmlSettings:
    simulate: str = setting(
        "", "scenario file of simulated GPUs (docs/simulation.md); a relative path is relative "
        "to this config file; empty = the real NVML")


@dataclass(frozen=True)
class Paths:
    sysfs_root: str = setting("/sys", "root of sysfs (PCI devices, InfiniBand ports)")
    procfs_root: str = setting("/proc", "root of procfs (mounts)")
    state_dir: str = setting("/run/nodehealth", "where nodehealth keeps its state")


@dataclass(frozen=True)
class SlurmSettings:
    scontrol: str = setting("/usr/bin/scontrol", "absolute path of scontrol (Slurm faces run with no PATH)")
    timeout_s: float = setting(3.0, "deadline for one scontrol call", unit="s", min=0.1, max=60)
    conf: str = setting(
        "", "slurm.conf to use (exported as SLURM_CONF to scontrol when the environment has none: "
        "HealthCheckProgram runs with an empty environment); empty = Slurm's default")


@dataclass(frozen=True)
class DrainSettings:
    """[drain]: when the Slurm faces take a node out of service."""

    enabled: bool = setting(True, "drain the node (scontrol update state=drain) on a fault; false = only "
                            "exit codes and logs")
    max_share: float = setting(
        0.25, "drain-storm breaker: when more than this share of the cluster's nodes is already drained "
        "by nodehealth, drain no more (log and report instead)", min=0, max=1)
    breaker_min_drained: int = setting(
        3, "the breaker never trips while fewer nodes than this are drained by nodehealth (small clusters)",
        min=1, max=100000)
    reason_max_len: int = setting(200, "longest drain reason written to Slurm", unit="chars", min=40, max=1000)


@dataclass(frozen=True)
class ResumeSettings:
    """[resume]: when a node nodehealth drained goes back into service (health check face)."""

    enabled: bool = setting(True, "resume nodes drained by nodehealth once they are clean again")
    clean_runs: int = setting(3, "consecutive clean health-check runs needed before resuming", min=1, max=1000)
    reboot_actions: tuple[str, ...] = setting(
        ("reboot",), "fault actions that clear only after a reboot (the boot id must change before resume)",
        choices=("restart_app", "reset_gpu", "reboot", "inspect"))
    boot_id_path: str = setting(BOOT_ID_PATH, "file holding this boot's id")


@dataclass(frozen=True)
class LedgerSettings:
    """[ledger]: the job ledger the prolog and epilog append to (docs/operations.md)."""

    enabled: bool = setting(True, "append job start/end records to <state_dir>/jobs.jsonl")
    max_bytes: int = setting(1 << 20, "size at which the ledger is compacted to its newest half",
                             unit="bytes", min=4096, max=1 << 30)


@dataclass(frozen=True)
class DaemonSettings:
    """[daemon]: the long-running watcher (``nodehealth daemon``, docs/daemon.md)."""

    interval_s: float = setting(30.0, "time between two rounds of the daemon phase's checks", unit="s",
                                min=1, max=3600)
    listen: str = setting("0.0.0.0:10915", "HOST:PORT of the Prometheus /metrics endpoint (\"[::]:10915\" for "
                          "IPv6; port 10915 is outside the 9100-9999 exporter range); empty = no endpoint")
    state_max_age_s: float = setting(
        90.0, "the prolog uses the daemon's verdict (<state_dir>/daemon-state.json) only when it is younger "
        "than this; older means the prolog runs its own checks", unit="s", min=1, max=86400)
    textfile_dir: str = setting(
        "", "node_exporter textfile collector directory: the daemon and the short-lived faces also write "
        "their metrics there (nodehealth-<face>.prom, atomically); empty = off")
    slurm_actions: bool = setting(
        True, "drain on a fault and resume when clean from the daemon, through the same policy as the "
        "health check face ([drain], [resume]); false = only publish")
    xid_follow: bool = setting(True, "follow the kernel log for XID events while the daemon runs")


def _checks_default() -> dict[str, CheckSettings]:
    return {spec.name: spec.settings_class() for spec in CHECKS}


@dataclass(frozen=True)
class Config:
    """The effective configuration for one node."""

    node_name: str = setting(
        "", "this node's name; SLURMD_NODENAME wins over it, the short hostname is the fallback")
    phases: Phases = field(default_factory=Phases)
    policy: Policy = field(default_factory=Policy)
    gpu: GpuSettings = field(default_factory=GpuSettings)
    nvml: NvmlSettings = field(default_factory=NvmlSettings)
    paths: Paths = field(default_factory=Paths)
    slurm: SlurmSettings = field(default_factory=SlurmSettings)
    drain: DrainSettings = field(default_factory=DrainSettings)
    resume: ResumeSettings = field(default_factory=ResumeSettings)
    ledger: LedgerSettings = field(default_factory=LedgerSettings)
    daemon: DaemonSettings = field(default_factory=DaemonSettings)
    checks: Mapping[str, CheckSettings] = field(default_factory=_checks_default)
    source: str = field(default="<defaults>", compare=False)

    def check(self, name: str) -> CheckSettings:
        return self.checks[name]

    def enabled(self) -> dict[str, bool]:
        out = {}
        for spec in CHECKS:
            value = self.checks[spec.name].enabled
            out[spec.name] = spec.default_enabled if value is None else value
        return out


# Keys the loader handles itself rather than through a dataclass field.
_TOP_EXTRA = {"override"}


def node_name(configured: str = "", environ: Optional[Mapping[str, str]] = None) -> str:
    env = os.environ if environ is None else environ
    if env.get("SLURMD_NODENAME"):
        return env["SLURMD_NODENAME"]
    if configured:
        return configured
    return socket.gethostname().split(".")[0]


def config_path(explicit: Optional[str] = None, environ: Optional[Mapping[str, str]] = None) -> tuple[str, bool]:
    """The config file to read and whether it was asked for (a missing default is fine)."""
    env = os.environ if environ is None else environ
    if explicit:
        return explicit, True
    if env.get(ENV_VAR):
        return env[ENV_VAR], True
    return DEFAULT_PATH, False


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
    checks = values.get("checks") or _checks_default()
    cfg = dataclasses.replace(cfg, checks=checks)
    _check_budgets(cfg, file)
    return cfg


def _build_checks(raw: Any, file: str, prefix: str) -> dict[str, CheckSettings]:
    if not isinstance(raw, dict):
        raise ConfigError(f"{file}: {prefix}checks: expected a table of [checks.<name>] tables")
    out = _checks_default()
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


# --------------------------------------------------------------------------- the documented sample


_HEADER = """\
# nodehealth configuration: every key, with its default and unit.
# Default location /etc/nodehealth/nodehealth.toml; --config FILE or NODEHEALTH_CONFIG override it.
# Every key is optional: a commented line shows the default. Unknown keys, wrong types and
# out-of-range values are errors that name the key, so a typo cannot pass unnoticed.
# This file is generated by `nodehealth config defaults`; the test suite checks it is current.
"""

_OVERRIDE_DOC = """\
# Per-host overrides, NHC-style: each [[override]] applies to the nodes its Slurm hostlist
# expression names, in file order (later wins). Any table above may appear inside one.
# Every override is validated at load time, also on nodes it does not match.
#
# [[override]]
# hosts = "gpu[001-064]"
# gpu.expected_count = 4
# checks.gpu_nvlink.expected_links = 12
"""


def document() -> str:
    """The sample config: every key commented out at its default, with doc and unit."""
    out = [_HEADER]
    _doc_fields(Config(), "", out)
    for spec in CHECKS:
        out.append(f"\n[checks.{spec.name}]")
        out.append(f"# {spec.summary}")
        out.append(f"# phases: {', '.join(p for p in PHASES if p in spec.phases)}; "
                   f"on by default: {'yes' if spec.default_enabled else 'no'}")
        _doc_fields(spec.settings_class(), f"checks.{spec.name}", out, header=False)
    out.append("")
    out.append(_OVERRIDE_DOC)
    return "\n".join(out)


def _doc_fields(obj: Any, table: str, out: list[str], header: bool = True) -> None:
    nested = []
    scalars = []
    for f in dataclasses.fields(obj):
        if f.name in ("source", "checks"):
            continue
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            nested.append((f, value))
        else:
            scalars.append((f, value))
    if scalars:
        if header and table:
            out.append(f"\n[{table}]")
        for f, value in scalars:
            meta: Mapping[str, Any] = f.metadata or {}
            bits = [meta.get("doc", "")]
            if meta.get("unit"):
                bits.append(f"unit: {meta['unit']}")
            if meta.get("choices"):
                bits.append("one of: " + ", ".join(map(str, meta["choices"])))
            if meta.get("min") is not None or meta.get("max") is not None:
                lo = "" if meta.get("min") is None else f"{meta['min']:g}"
                hi = "" if meta.get("max") is None else f"{meta['max']:g}"
                bits.append(f"range: {lo}..{hi}")
            out.append("# " + "; ".join(b for b in bits if b))
            out.append(f"# {f.name} = {_toml_value(value)}")
    for f, value in nested:
        _doc_fields(value, f"{table}.{f.name}" if table else f.name, out)


def _toml_value(value: Any) -> str:
    if value is None:
        return "(unset)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, tuple):
        if value and dataclasses.is_dataclass(value[0]):
            return "[" + ", ".join(
                "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in dataclasses.asdict(item).items()) + " }"
                for item in value) + "]"
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'
