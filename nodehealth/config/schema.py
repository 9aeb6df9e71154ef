"""The configuration's schema: one frozen dataclass per table, every key declared with ``setting()``.

Each key carries its default, doc, unit and bounds here (``nodehealth.config.sample`` documents
them, ``nodehealth.config.loader`` validates against them). The keys the prolog's fast path
reads take their default, bounds and choices from ``nodehealth.config.lean.KEYS`` through
``_lean``, so the lean reader and the full loader cannot disagree on them.
"""

from __future__ import annotations

from collections.abc import ItemsView, Iterator, KeysView, ValuesView
from dataclasses import field, fields
from typing import Any, Mapping, Union

from nodehealth.checks.base import CheckSettings, setting
from nodehealth.config import lean
from nodehealth.observations.record import record
from nodehealth.registry import BY_NAME, CHECKS, PHASES
from nodehealth.statedir import layout


def _lean(key: str, doc: str, unit: str = "") -> Any:
    """``setting()`` for a key of ``lean.KEYS``: its default, range and choices come from there."""
    _, _, _, default, lo, hi, choices = lean.BY_KEY[key]
    return setting(default, doc, unit=unit, min=lo, max=hi, choices=choices)


# Every phase's budget has the range of the prolog's, which the lean reader checks too.
_BUDGET_MIN, _BUDGET_MAX = lean.BY_KEY["phases.prolog.budget_s"][4:6]


@record
class PhaseSettings:
    budget_s: float = setting(
        30.0, "total time for one run of this phase's checks", unit="s", min=_BUDGET_MIN, max=_BUDGET_MAX
    )


def _phase(budget: float) -> Any:
    return field(
        default_factory=lambda: PhaseSettings(budget_s=budget),
        metadata={"doc": "", "unit": "", "min": None, "max": None, "choices": None},
    )


@record
class Phases:
    """The phases, in order, and their budgets (``[phases.<name>]``). A face runs one phase;
    keep the prolog's well under Slurm's PrologEpilogTimeout."""

    prolog: PhaseSettings = _phase(lean.default("phases.prolog.budget_s"))
    epilog: PhaseSettings = _phase(30.0)
    healthcheck: PhaseSettings = _phase(50.0)
    manual: PhaseSettings = _phase(30.0)
    daemon: PhaseSettings = _phase(30.0)


if tuple(f.name for f in fields(Phases)) != PHASES:  # one field per phase the registry names, in its order
    raise AssertionError(f"config.schema.Phases {[f.name for f in fields(Phases)]} != registry.PHASES {PHASES}")


@record
class Policy:
    unknown: str = _lean(
        "policy.unknown",
        "what an UNKNOWN result (nodehealth could not tell) does to the exit code and "
        "drain decision: pass = treat as healthy and log loudly, fail = treat as a fault",
    )


@record
class GpuSettings:
    expected_count: Union[int, str] = setting(
        "auto",
        'GPUs this node must have: a number, or "auto" = this node\'s Gres=gpu:N in '
        "Slurm, else the NVIDIA GPUs on the PCI bus",
        min=0,
        max=64,
    )


@record
class NvmlSettings:
    simulate: str = setting(
        "",
        "scenario file of simulated GPUs (docs/simulation.md); a relative path is relative "
        "to this config file; empty = the real NVML",
    )
    call_timeout_s: float = setting(
        3.0,
        "deadline for one NVML call: a call that takes longer is hung (the GPU is wedged); "
        "the read as a whole has the GPU checks' timeout_s",
        unit="s",
        min=0.1,
        max=120,
    )
    init_timeout_s: float = setting(
        30.0,
        "deadline for nvmlInit and for opening one GPU, which initialises it when "
        "persistence mode is off, counted from the call's last visible progress (docs/nvml.md)",
        unit="s",
        min=0.1,
        max=300,
    )


@record
class Paths:
    sysfs_root: str = setting("/sys", "root of sysfs (PCI devices, InfiniBand ports)")
    procfs_root: str = _lean("paths.procfs_root", "root of procfs (mounts, this boot's id)")
    state_dir: str = _lean(
        "paths.state_dir",
        "where nodehealth keeps what belongs to one boot (the daemon's verdict, the XID "
        "store, GPU counters, the job ledger); a tmpfs is right",
    )
    persistent_dir: str = _lean(
        "paths.persistent_dir",
        "persistent state that must outlive a reboot: drain records, drain history, "
        "reboot counts, the last good config; when a config sets state_dir and not this, it is that "
        "state_dir (one directory, as before)",
    )


@record
class SlurmSettings:
    scontrol: str = setting("/usr/bin/scontrol", "absolute path of scontrol (Slurm faces run with no PATH)")
    timeout_s: float = _lean("slurm.timeout_s", "deadline for one scontrol call", unit="s")
    conf: str = setting(
        "",
        "slurm.conf to use (exported as SLURM_CONF to scontrol when the environment has none: "
        "HealthCheckProgram runs with an empty environment); empty = Slurm's default",
    )
    reconcile_s: float = setting(
        3600.0,
        "how often the health check or the daemon reads this node from slurmctld when nothing "
        "changed (Gres GPU count for expected_count = auto, a person's resume or edited reason); a "
        "healthy node makes no other call",
        unit="s",
        min=60,
        max=86400,
    )
    mode: str = setting(
        "enforce",
        "enforce = drain and resume as decided; observe = decide as usual, log and export "
        '"would drain" / "would resume" (nodehealth_slurm_would_total), make no scontrol update, and '
        "the faces exit 0 (a roll-out: docs/operations.md); a value that is neither is a config error, "
        "never observe",
        choices=("enforce", "observe"),
    )
    reboot: str = setting(
        "off",
        "asap = after draining for a reboot-class fault ([resume] reboot_actions), ask Slurm to reboot "
        "the node (scontrol reboot ASAP nextstate=RESUME; needs RebootProgram in slurm.conf); off = the "
        "drain waits for a person or a boot",
        choices=("off", "asap"),
    )
    reboot_max: int = setting(
        2,
        "reboots asked for one check within reboot_window_s before the next fault of that check is "
        "held for a person instead (reason nh:inspect ..., no reboot, no automatic resume)",
        min=1,
        max=100,
    )
    reboot_window_s: float = setting(
        86400.0, "how long a reboot asked for a check counts towards reboot_max", unit="s", min=60, max=30 * 86400
    )


@record
class DrainSettings:
    """[drain]: when the Slurm faces take a node out of service."""

    enabled: bool = setting(
        True, "drain the node (scontrol update state=drain) on a fault; false = only exit codes and logs"
    )
    max_share: float = setting(
        0.25,
        "drain-storm breaker: when more than this share of the cluster's nodes is already drained "
        "by nodehealth, drain no more (log and report instead)",
        min=0,
        max=1,
    )
    breaker_min_drained: int = setting(
        3,
        "the breaker never trips while fewer nodes than this are drained by nodehealth (small clusters)",
        min=1,
        max=100000,
    )
    reason_max_len: int = setting(200, "longest drain reason written to Slurm", unit="chars", min=40, max=1000)


@record
class ResumeSettings:
    """[resume]: when a node nodehealth drained goes back into service (health check face)."""

    enabled: bool = setting(True, "resume nodes drained by nodehealth once they are clean again")
    clean_runs: int = setting(3, "consecutive clean health-check runs needed before resuming", min=1, max=1000)
    reboot_actions: tuple[str, ...] = setting(
        ("reboot",),
        "fault actions that clear only after a reboot (the boot id must change before resume)",
        choices=("restart_app", "reset_gpu", "reboot", "inspect"),
    )
    # Flap damping (docs/operations.md, "Flapping"). A part that "works after a reset, fails under
    # load" drains, passes its clean runs idle, takes a job and fails again: each cycle costs a job.
    # Three drains for one check in six hours is not chance: one drain is a transient, two may be a
    # repeat of it (a stray twice), a third within a shift is a pattern only a person can break.
    # Six hours holds three cycles even at a 5-minute HealthCheckInterval with the backoff below
    # (3, then 6 clean runs: 45 min of clean runs alone), and a day-long job's repeat falls out of it.
    flap_drains: int = setting(
        3,
        "drains for the same check within flap_window_s that hold the node for a person: the drain that "
        'reaches this count says "flapping: N drains in W" and is never resumed by nodehealth '
        "(a person resumes it by hand); 0 = no damping",
        min=0,
        max=32,
    )
    flap_window_s: float = setting(
        21600.0,
        "the window in which drains are counted for flap_drains, and for the clean-run backoff",
        unit="s",
        min=1,
        max=30 * 86400,
    )
    clean_runs_max: int = setting(
        48,
        "backoff cap: the Nth drain for one check within flap_window_s needs clean_runs x 2^(N-1) clean "
        "runs before it is resumed, at most this many",
        min=1,
        max=100000,
    )


@record
class LedgerSettings:
    """[ledger]: the job ledger the prolog and epilog append to (docs/operations.md)."""

    enabled: bool = _lean("ledger.enabled", f"append job start/end records to <state_dir>/{layout.LEDGER}")
    max_bytes: int = _lean("ledger.max_bytes", "size at which the ledger is compacted to its newest half", unit="bytes")


@record
class DaemonSettings:
    """[daemon]: the long-running watcher (``nodehealth daemon``, docs/daemon.md)."""

    interval_s: float = setting(30.0, "time between two rounds of the daemon phase's checks", unit="s", min=1, max=3600)
    listen: str = setting(
        "127.0.0.1:10915",
        "HOST:PORT of the Prometheus /metrics endpoint: this node only by default; a Prometheus on another "
        "host needs the node's management address here (or 0.0.0.0 behind a firewall; docs/daemon.md, "
        '"Where it listens"); "[::1]:10915" for IPv6; port 10915 is outside the 9100-9999 exporter range; '
        "empty = no endpoint",
    )
    state_max_age_s: float = _lean(
        "daemon.state_max_age_s",
        f"the prolog uses the daemon's verdict (<state_dir>/{layout.DAEMON_STATE}) "
        "only when it is younger than this; older means the prolog runs its own checks",
        unit="s",
    )
    textfile_dir: str = setting(
        "",
        "node_exporter textfile collector directory: the daemon also writes its metrics there after "
        "each round (nodehealth-daemon.prom, atomically); empty = off",
    )
    slurm_actions: bool = setting(
        True,
        "drain on a fault and resume when clean from the daemon, through the same policy as the "
        "health check face ([drain], [resume]); false = only publish",
    )
    xid_follow: bool = _lean("daemon.xid_follow", "follow the kernel log for XID events while the daemon runs")
    metrics_job_ids: bool = setting(
        True,
        "publish the Slurm job holding each GPU (nodehealth_gpu_job_info, from the job ledger) on "
        "/metrics and in the textfile; false = leave job ids out of both",
    )
    metrics_detail: bool = setting(
        False,
        "publish every series on /metrics and in the textfile: per NVLink link, every throttle reason, "
        "limits and maxima, healthy values of fault flags, check durations (docs/metrics.md: about 7x the "
        "default page's series); false = the default page, within 200 series for an 8-GPU node",
    )


class CheckTable(dict):  # type: ignore[type-arg]  # dict[str, CheckSettings]; the stub's views differ
    """Every registered check's settings: the ones set (a config file's ``[checks.<name>]``), and for the
    others their defaults, made when first asked for.

    A check's defaults need its module (its ``Settings`` class), so a config that sets nothing of a check
    imports that module only when something asks for the check's settings: a prolog does not import the
    NCCL self-test's module. It is a ``dict`` (``config.build`` fills it in) whose keys are always every
    registered check, in the registry's order: iterating, ``items()``, ``==`` and ``repr`` make them all.
    """

    def __getitem__(self, name: str) -> CheckSettings:
        if not dict.__contains__(self, name):
            spec = BY_NAME[name]  # KeyError: not a registered check
            dict.__setitem__(self, name, spec.settings_class())
        got: CheckSettings = dict.__getitem__(self, name)
        return got

    def get(self, name: str, default: Any = None) -> Any:
        try:
            return self[name]
        except KeyError:
            return default

    def __contains__(self, name: object) -> bool:
        return name in BY_NAME or dict.__contains__(self, name)

    def __iter__(self) -> Iterator[str]:
        extra = [name for name in dict.__iter__(self) if name not in BY_NAME]
        return iter([spec.name for spec in CHECKS] + extra)

    def __len__(self) -> int:
        return len(list(self.__iter__()))

    def keys(self) -> KeysView[str]:  # type: ignore[override]
        return KeysView(self)

    def values(self) -> ValuesView[CheckSettings]:  # type: ignore[override]
        return ValuesView(self)

    def items(self) -> ItemsView[str, CheckSettings]:  # type: ignore[override]
        return ItemsView(self)

    def made(self) -> dict[str, CheckSettings]:
        """The settings made so far (set by the config, or asked for), without making any other."""
        return {name: dict.__getitem__(self, name) for name in dict.__iter__(self)}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mapping) and dict(self.items()) == dict(other.items())

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __repr__(self) -> str:
        return repr(dict(self.items()))

    def copy(self) -> CheckTable:
        return CheckTable(self.made())

    def __reduce__(self) -> Any:
        return (CheckTable, (self.made(),))


def default_checks() -> dict[str, CheckSettings]:
    """Every registered check's settings at their defaults (each made when first asked for: ``CheckTable``)."""
    return CheckTable()


@record
class Config:
    """The effective configuration for one node."""

    node_name: str = _lean(
        "node_name", "this node's name; SLURMD_NODENAME wins over it, the short hostname is the fallback"
    )
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
    checks: Mapping[str, CheckSettings] = field(default_factory=default_checks)
    source: str = field(default="<defaults>", compare=False)

    def check(self, name: str) -> CheckSettings:
        return self.checks[name]

    def enabled(self) -> dict[str, bool]:
        # A check whose settings were neither set nor asked for is at its defaults, where ``enabled`` is
        # unset (a test holds every check to it): the registry's default, without importing its module.
        made = self.checks.made() if isinstance(self.checks, CheckTable) else self.checks
        out = {}
        for spec in CHECKS:
            settings = made.get(spec.name)
            value = None if settings is None else settings.enabled
            out[spec.name] = spec.default_enabled if value is None else value
        return out
