"""The only code that touches hardware and the OS.

``PROBES`` maps a probe name (what a check ``needs``) to the function that gathers it. A
probe returns frozen observations from ``nodehealth.observations`` or a ``ProbeError``; it
honours the deadline it is given. Modules are imported inside the functions, so a face pays
only for the probes it runs. Vendor and OS errors are translated here, at the boundary.
"""

from __future__ import annotations

from dataclasses import field
from typing import TYPE_CHECKING, Any, Callable, Mapping

from nodehealth.observations import ProbeError
from nodehealth.observations.record import record
from nodehealth.probes.source import ProbeSetupError, resolve

__all__ = ["PROBES", "Probe", "ProbeContext", "ProbeSetupError", "validate"]

if TYPE_CHECKING:
    from nodehealth.config.schema import Config


@record
class ProbeContext:
    config: Config
    node: str
    environ: Mapping[str, str] = field(default_factory=dict)  # the job's environment (prolog, epilog)
    phase: str = "manual"
    # A look, not a run (--dry-run, check --as): nothing asks slurmctld, nothing is written.
    look_only: bool = False
    # False for ``nodehealth check`` run by hand: it may ask slurmctld, but writes nothing to the state
    # dir (no Slurm view cached, the XID scan's position kept in memory for the run); look_only implies it.
    writes: bool = True


@record
class Probe:
    """``gather(ctx, timeout_s)`` returns the observation, or, for a probe with ``forks``,
    an object whose ``collect()`` returns it; forking probes are started before any thread."""

    name: str
    gather: Callable[[ProbeContext, float], Any]
    forks: bool = False


def validate(config: Config) -> None:
    """Raise ProbeSetupError for a configuration the probes cannot run with."""
    resolve(config)


def _nvml(ctx: ProbeContext, timeout_s: float) -> Any:
    from nodehealth.probes import nvml

    source = resolve(ctx.config)
    return nvml.start(
        source.loader,
        timeout_s,
        call_timeout_s=ctx.config.nvml.call_timeout_s,
        slow_call_timeout_s=ctx.config.nvml.init_timeout_s,
        keep_module=ctx.phase == "daemon",
    )


def _pci_gpus(ctx: ProbeContext, timeout_s: float) -> Any:
    source = resolve(ctx.config)
    if source.pci_bus_ids is not None:
        from nodehealth.observations import PciGpus

        return PciGpus(source.pci_bus_ids, "scenario")
    from nodehealth.probes import pci

    return pci.nvidia_gpus(ctx.config.paths.sysfs_root)


def _slurm_node(ctx: ProbeContext, timeout_s: float) -> Any:
    if ctx.config.gpu.expected_count != "auto":
        return ProbeError("slurm_node", "unavailable", "not needed: [gpu] expected_count is set")
    from nodehealth.probes import slurm

    return slurm.node_view(
        ctx.config,
        ctx.node,
        ctx.phase,
        min(timeout_s, ctx.config.slurm.timeout_s),
        cached_only=ctx.look_only,
        cache=ctx.writes and not ctx.look_only,
    )


def _job(ctx: ProbeContext, timeout_s: float) -> Any:
    from nodehealth.probes import job

    return job.gather(ctx.environ, ctx.config.paths.state_dir, ctx.config.paths.procfs_root)


def _node_jobs(ctx: ProbeContext, timeout_s: float) -> Any:
    settings = ctx.config.checks.get("gpu_processes")
    if ctx.phase in getattr(settings, "idle_phases", ()):
        return ProbeError("node_jobs", "unavailable", f"not needed in the {ctx.phase}: every process is a fault")
    if not ctx.config.ledger.enabled:
        return ProbeError("node_jobs", "unavailable", "[ledger] enabled = false: the running jobs are not known")
    from nodehealth.probes import jobs

    return jobs.gather(ctx.config.paths.state_dir, ctx.config.paths.procfs_root)


def _memory(ctx: ProbeContext, timeout_s: float) -> Any:
    from nodehealth.probes import host

    return host.memory(ctx.config.paths.procfs_root)


def _mounts(ctx: ProbeContext, timeout_s: float) -> Any:
    from nodehealth.probes import host

    specs = getattr(ctx.config.checks["host_mounts"], "mounts", ())
    return host.start_mounts([s.path for s in specs], timeout_s, ctx.config.paths.procfs_root)


def _shared_dirs(ctx: ProbeContext, timeout_s: float) -> Any:
    from nodehealth.probes import host

    return host.start_shared_dirs(getattr(ctx.config.checks["host_shared_dir"], "paths", ()), timeout_s)


def _not_theirs(ctx: ProbeContext, probe: str, what: str, host_source: bool = True, hint: str = "") -> Any:
    """The one simulate rule: simulated GPUs are not judged by this host's facts about GPUs (``what`` is
    the host's, not theirs: a ProbeError, "unavailable"). None when the GPUs are real, or when the probe
    reads a recorded source instead of the host's (``host_source`` False); ``hint``: how to give it one."""
    if not ctx.config.nvml.simulate or not host_source:
        return None
    return ProbeError(probe, "unavailable", f"simulated GPUs: {what}" + (f" ({hint})" if hint else ""))


def _simulated_sysfs(ctx: ProbeContext, probe: str, what: str) -> Any:
    """``_not_theirs`` for a probe of this host's sysfs; a recorded tree as ``[paths] sysfs_root`` is read."""
    from nodehealth.probes import pci

    return _not_theirs(
        ctx,
        probe,
        what,
        host_source=pci.is_host_sysfs(ctx.config.paths.sysfs_root),
        hint="set [paths] sysfs_root to a recorded sysfs tree to read one",
    )


def _infiniband(ctx: ProbeContext, timeout_s: float) -> Any:
    from nodehealth.probes import infiniband

    gate = _simulated_sysfs(ctx, "infiniband", "the host's InfiniBand ports are not their NICs")
    if gate is not None:
        return gate
    paths = ctx.config.paths
    # In a killable child (a PMA counter read waits on the HCA); the history is this boot's (run dir).
    return infiniband.start(paths.sysfs_root, paths, timeout_s, persist=ctx.writes and not ctx.look_only)


def _xid(ctx: ProbeContext, timeout_s: float) -> Any:
    from nodehealth.checks.gpu_xid import xid_settings
    from nodehealth.probes import xid_store
    from nodehealth.xid.patterns import KMSG_PATH

    settings = xid_settings(ctx.config)
    gate = _not_theirs(
        ctx,
        "xid",
        "the host's kernel log is not theirs",
        host_source=settings.kmsg_path == KMSG_PATH,
        hint="set [checks.gpu_xid] kmsg_path to a recorded log to watch one",
    )
    if gate is not None:
        return gate
    return xid_store.gather(
        ctx.config.paths.state_dir,
        ctx.config.paths.procfs_root,
        settings.kmsg_path,
        settings.severity_overrides,
        settings.store_max_events,
        settings.kernel_facility_only,
        timeout_s,
        persist=ctx.writes and not ctx.look_only,
    )


def _nccl(ctx: ProbeContext, timeout_s: float) -> Any:
    from nodehealth.nccl import runner as nccl_runner

    settings = ctx.config.checks["nccl_selftest"]
    gpus = getattr(settings, "gpus", 0)
    if not gpus:
        found = _pci_gpus(ctx, timeout_s)
        gpus = len(found.bus_ids) if not isinstance(found, ProbeError) else 0
    # In a killable child: the deadline ends it with the runner's process group (nccl.runner.start).
    return nccl_runner.start(nccl_runner.Plan.from_settings(settings), gpus, timeout_s)


def _services(ctx: ProbeContext, timeout_s: float) -> Any:
    from nodehealth.probes import services

    gate = _not_theirs(ctx, "services", "the host's services and modules are not theirs")
    if gate is not None:
        return gate
    settings = ctx.config.checks["host_services"]
    return services.gather(
        ctx.config.paths.sysfs_root,
        settings.gpu_units(),  # type: ignore[attr-defined]
        getattr(settings, "units", ()),
        settings.all_modules(),  # type: ignore[attr-defined]
        timeout_s,
        systemctl=getattr(settings, "systemctl", services.SYSTEMCTL),
        systemd_dir=getattr(settings, "systemd_run_dir", services.SYSTEMD_RUN_DIR),
    )


def _counter_reading(ctx: ProbeContext, timeout_s: float) -> Any:
    """The latest GPU counter reading in the state dir (a bounded read of one small file)."""
    import time

    from nodehealth.observations.counters import CounterReading
    from nodehealth.statedir import counters, layout

    reading, problem = counters.read_latest_checked(ctx.config.paths.state_dir)
    boot = layout.read_boot_id(ctx.config.paths.procfs_root)
    return CounterReading(reading, problem, boot, time.time())


def _pcie_aer(ctx: ProbeContext, timeout_s: float) -> Any:
    from nodehealth.probes import host_errors

    gate = _simulated_sysfs(ctx, "pcie_aer", "the host's PCIe AER counters are not theirs")
    if gate is not None:
        return gate
    settings = ctx.config.checks.get("host_pcie_aer")
    return host_errors.pcie_aer(ctx.config.paths.sysfs_root, timeout_s, getattr(settings, "upstream", True))


def _edac(ctx: ProbeContext, timeout_s: float) -> Any:
    from nodehealth.probes import host_errors

    return host_errors.edac(ctx.config.paths.sysfs_root)


def _dstate(ctx: ProbeContext, timeout_s: float) -> Any:
    from nodehealth.probes import host_errors

    gate = _not_theirs(ctx, "dstate", "no process of this host holds them")
    if gate is not None:
        return gate
    settings = ctx.config.checks.get("host_dstate")
    return host_errors.start_dstate(ctx.config.paths.procfs_root, timeout_s, getattr(settings, "confirm_s", 1.0))


PROBES: dict[str, Probe] = {
    "nvml": Probe("nvml", _nvml, forks=True),
    "pci_gpus": Probe("pci_gpus", _pci_gpus),
    "slurm_node": Probe("slurm_node", _slurm_node),
    "xid": Probe("xid", _xid),
    "job": Probe("job", _job),
    "node_jobs": Probe("node_jobs", _node_jobs),
    "memory": Probe("memory", _memory),
    "mounts": Probe("mounts", _mounts, forks=True),
    "shared_dirs": Probe("shared_dirs", _shared_dirs, forks=True),
    "infiniband": Probe("infiniband", _infiniband, forks=True),
    "nccl": Probe("nccl", _nccl, forks=True),
    "pcie_aer": Probe("pcie_aer", _pcie_aer),
    "edac": Probe("edac", _edac),
    "dstate": Probe("dstate", _dstate, forks=True),
    "counter_reading": Probe("counter_reading", _counter_reading),
    "services": Probe("services", _services),
}
