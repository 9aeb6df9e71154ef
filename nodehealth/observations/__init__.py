"""What probes return and checks judge: plain frozen dataclasses, no behaviour, no I/O.

Conventions: a field that is ``None`` means "not supported / not reported by this GPU,
driver or kernel" (checks turn that into SKIPPED, never OK). Errors other than "not
supported" are kept per field in ``errors`` so a check can say UNKNOWN with the reason.
Units are in the field names (``_c`` degrees Celsius, ``_w`` watts, ``_bytes``, ``_pct``).
"""

from __future__ import annotations

from dataclasses import field
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Optional, Protocol, Union

from nodehealth.observations.host_errors import AerObservation, DstateObservation, EdacObservation
from nodehealth.observations.record import record
from nodehealth.observations.slurm import NodeInfo
from nodehealth.observations.xid import XidEvent

if TYPE_CHECKING:
    from nodehealth.observations.counters import CounterReading as CounterReading
    from nodehealth.observations.nccl import NcclObservation as NcclObservation
    from nodehealth.observations.nccl import NcclRun as NcclRun
    from nodehealth.observations.nccl import PerfResult as PerfResult
    from nodehealth.observations.nccl import TransportResult as TransportResult
    from nodehealth.observations.services import ServicesObservation as ServicesObservation

# Defined in nodehealth.observations.nccl and named here on first use (``from nodehealth.observations
# import NcclRun`` works as before): only the NCCL self-test makes them, so no other run pays for them.
_LAZY = {
    name: "nodehealth.observations.nccl" for name in ("NcclObservation", "NcclRun", "PerfResult", "TransportResult")
}


def __getattr__(name: str) -> Any:
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(where), name)
    globals()[name] = value
    return value


@record
class ProbeError:
    """A probe could not produce its observation.

    kind: ``timeout`` (missed its deadline), ``unavailable`` (the thing is not on this node,
    e.g. NVML not loadable, no scontrol), ``permission``, ``invalid`` (data we could not
    parse), ``error`` (anything else).
    """

    probe: str
    kind: str
    message: str


# --------------------------------------------------------------------------- NVML


@record
class FieldError:
    """An NVML call on one GPU failed with something other than "not supported".

    kind is one of the probe-boundary error kinds: ``gpu_lost``, ``reset_required``,
    ``no_permission``, ``timeout``, ``error``.
    """

    field: str
    kind: str
    message: str


@record
class EccCounts:
    """Total ECC error counts (NVML ``nvmlDeviceGetTotalEccErrors``); None = not supported."""

    volatile_corrected: Optional[int] = None
    volatile_uncorrected: Optional[int] = None
    aggregate_corrected: Optional[int] = None
    aggregate_uncorrected: Optional[int] = None


@record
class RemappedRows:
    """Row remapping state (Ampere and later, ``nvmlDeviceGetRemappedRows``)."""

    correctable: int
    uncorrectable: int
    pending: bool  # a remap is recorded and takes effect at the next GPU reset
    failure: bool  # a remap failed: the GPU needs hardware inspection


@record
class NvLink:
    """One NVLink: state and its data-link error counters (None = counter not supported)."""

    link: int
    active: bool
    replay: Optional[int] = None
    recovery: Optional[int] = None
    crc_flit: Optional[int] = None
    crc_data: Optional[int] = None


@record
class GpuProcess:
    pid: int
    used_memory_bytes: Optional[int] = None


@record
class GpuObservation:
    """Everything the NVML probe read from one GPU."""

    index: int
    name: Optional[str] = None
    uuid: Optional[str] = None
    pci_bus_id: Optional[str] = None  # "0000:3b:00.0", lower case
    temperature_c: Optional[int] = None
    slowdown_c: Optional[int] = None  # NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
    shutdown_c: Optional[int] = None  # NVML_TEMPERATURE_THRESHOLD_SHUTDOWN
    gpu_max_c: Optional[int] = None  # NVML_TEMPERATURE_THRESHOLD_GPU_MAX (max operating)
    mem_max_c: Optional[int] = None  # NVML_TEMPERATURE_THRESHOLD_MEM_MAX (HBM max operating)
    memory_temp_c: Optional[int] = None  # NVML_FI_DEV_MEMORY_TEMP (HBM)
    power_w: Optional[float] = None
    power_limit_w: Optional[float] = None  # enforced (nvmlDeviceGetEnforcedPowerLimit)
    power_default_limit_w: Optional[float] = None  # nvmlDeviceGetPowerManagementDefaultLimit
    utilization_gpu_pct: Optional[int] = None
    utilization_memory_pct: Optional[int] = None
    memory_used_bytes: Optional[int] = None
    memory_total_bytes: Optional[int] = None
    ecc_enabled: Optional[bool] = None  # current ECC mode
    ecc_pending_enabled: Optional[bool] = None  # mode after the next reset
    ecc: EccCounts = field(default_factory=EccCounts)
    retired_pages_sbe: Optional[int] = None
    retired_pages_dbe: Optional[int] = None
    retired_pages_pending: Optional[bool] = None
    remapped_rows: Optional[RemappedRows] = None
    pcie_gen: Optional[int] = None
    pcie_max_gen: Optional[int] = None
    pcie_width: Optional[int] = None
    pcie_max_width: Optional[int] = None
    nvlinks: Optional[tuple[NvLink, ...]] = None  # None: GPU has no NVLink / not supported
    fabric_state: Optional[int] = None  # NVML_GPU_FABRIC_STATE_*; None: not an NVSwitch system
    fabric_status: Optional[str] = None  # None when the fabric registration succeeded
    fabric_health_mask: Optional[int] = None  # nvmlGpuFabricInfo_v2+ healthMask; None: v1 call
    fabric_health_summary: Optional[int] = None  # NVML_GPU_FABRIC_HEALTH_SUMMARY_* (v3)
    processes: Optional[tuple[GpuProcess, ...]] = None
    throttle_reasons: Optional[int] = None  # nvmlClocksEventReason* bitmask
    # ns throttled per reason since the driver loaded (probes.nvml_h.THROTTLE_FIELDS): ("thermal", ns), ...;
    # only the reasons the GPU reports. None: none reported.
    throttle_ns: Optional[tuple[tuple[str, int], ...]] = None
    persistence_mode: Optional[bool] = None
    recovery_action: Optional[int] = None  # NVML_GPU_RECOVERY_ACTION_*; None: not reported
    mig_enabled: Optional[bool] = None  # current MIG mode
    lost: bool = False  # NVML answered "GPU is lost" (fallen off the bus)
    unreachable: bool = False  # counted by NVML, but no handle (errors say why)
    errors: tuple[FieldError, ...] = ()

    @property
    def label(self) -> str:
        return f"GPU {self.index}"


@record
class NvmlSnapshot:
    """The NVML probe's view of the node.

    ``complete`` is False when the probe was cut off (``stop`` says why); then ``stalled_gpu``
    and ``stalled_call`` say where NVML stopped answering (``stalled_gpu`` None: before any
    GPU, e.g. in nvmlInit) and ``gpus`` holds the GPUs read before that.
    """

    driver_version: Optional[str]
    cuda_driver_version: Optional[int]
    device_count: Optional[int]
    gpus: tuple[GpuObservation, ...]
    elapsed_s: float
    complete: bool = True
    timeout_s: Optional[float] = None
    stalled_gpu: Optional[int] = None
    stalled_call: Optional[str] = None
    # Why an incomplete read stopped: "hung" (one call passed its own deadline, call_timeout_s)
    # or "budget" (the read's budget, timeout_s, ended while NVML was still answering).
    stop: Optional[str] = None
    call_timeout_s: Optional[float] = None
    in_flight_s: Optional[float] = None  # how long the call cut off had been running


# --------------------------------------------------------------------------- PCI and Slurm


@record
class PciGpus:
    """NVIDIA GPUs present on the PCI bus (sysfs vendor 0x10de, display/3D class)."""

    bus_ids: tuple[str, ...]
    source: str  # "sysfs" or "scenario"


# This node as slurmctld describes it (``scontrol show node -o``): the one shape of a Slurm node.
SlurmNode = NodeInfo


@record
class JobObservation:
    """The Slurm job a prolog or epilog runs for, as this node knows it (no Slurm call)."""

    job_id: str
    gpus: Optional[tuple[int, ...]]  # the job's GPU indexes; None: not known
    start: Optional[float]  # Unix time of its start on this boot (the job ledger); None: not recorded
    baseline: Optional[Mapping[str, Any]]  # its GPUs' ECC counters at job start (statedir.counters)
    boot_id: Optional[str]
    now: float  # Unix time the observation was made (the job's end, for the epilog)


# --------------------------------------------------------------------------- host


@record
class MemoryObservation:
    total_bytes: int
    available_bytes: int
    swap_total_bytes: int = 0
    swap_used_bytes: int = 0


@record
class MountObservation:
    """One configured mount point as found on the node."""

    path: str
    present: bool  # a file system is mounted exactly at path
    fstype: Optional[str] = None
    source: Optional[str] = None
    read_only: Optional[bool] = None
    total_bytes: Optional[int] = None
    free_bytes: Optional[int] = None
    error: Optional[str] = None  # statvfs failed or did not answer in time


@record
class SharedDirObservation:
    """A write/fsync/read/delete round trip in one shared directory."""

    path: str
    ok: bool
    elapsed_s: float
    timed_out: bool = False
    error: Optional[str] = None


@record
class IbPort:
    """One InfiniBand (or RoCE) port from /sys/class/infiniband/<dev>/ports/<n>/."""

    device: str
    port: int
    state: Optional[str]  # "ACTIVE", "DOWN", "INIT", "ARMED" (number prefix stripped)
    phys_state: Optional[str]  # "LinkUp", "Disabled", "Polling", ...
    rate_gbps: Optional[float]  # from "400 Gb/sec (4X NDR)"
    link_layer: Optional[str] = None  # "InfiniBand" or "Ethernet"
    error: Optional[str] = None  # a sysfs value was missing or malformed
    # ports/<n>/counters/<name> as read now (name, value); () when the port has none or they were not read.
    counters: tuple[tuple[str, int], ...] = ()
    # What earlier rounds saw of this port (probes.ib_history), oldest first, this round's last; () = not kept.
    history: tuple[IbSample, ...] = ()


@record
class IbSample:
    """One port as a round saw it, kept when it differs from the one before (probes.ib_history):
    ``t`` Unix seconds, ``up`` state ACTIVE and LinkUp, ``counters`` as in ``IbPort.counters``."""

    t: float
    up: bool
    counters: tuple[tuple[str, int], ...] = ()


# --------------------------------------------------------------------------- XID watch


class JobLedgerEntry(Protocol):
    """One Slurm job as the job ledger places it in time: what a check may read of
    ``nodehealth.statedir.ledger.JobEntry`` (the ledger's own record, standard library only for the
    prolog's fast path). ``start`` and ``end``: Unix seconds (``end`` None while it runs); ``gpus``:
    NVML indices, None when the ledger did not say (the job is then taken to cover every GPU)."""

    @property
    def job_id(self) -> str: ...
    @property
    def start(self) -> float: ...
    @property
    def end(self) -> Optional[float]: ...
    @property
    def user(self) -> Optional[str]: ...
    @property
    def gpus(self) -> Optional[tuple[int, ...]]: ...


@record
class XidRecord:
    """One XID event kept in the per-boot event store.

    ``event`` is judged (severity, action, mnemonic) with the configured catalog; its
    ``job_id`` is set when the blamed process was alive when the event was read. ``at``:
    Unix seconds the event happened (boot time + the record's uptime), else when it was read.
    ``current_boot``: False for an event of an earlier boot that a reboot does not clear.
    """

    event: XidEvent
    boot_id: str
    at: Optional[float]
    current_boot: bool = True


@record
class XidObservation:
    """The XID events this node has had, from the event store after reading the kernel log.

    ``records``: this boot's events, plus earlier boots' drain-class events that a reboot
    does not clear (action other than reboot / reset_gpu), oldest first. ``complete``: False
    when the kernel log could not be read to its end before the deadline (the events read so
    far are kept). ``ledger``: job-ledger entries that may name the job of an event.
    ``gathered_at``: Unix seconds; windows are measured back from it.
    """

    boot_id: str
    records: tuple[XidRecord, ...]
    gathered_at: float
    source: str
    complete: bool = True
    kmsg_seq: Optional[int] = None
    skipped_lines: int = 0
    last_clear: Optional[float] = None
    ledger: tuple[JobLedgerEntry, ...] = ()
    notes: tuple[str, ...] = ()


# --------------------------------------------------------------------------- the bundle


@record
class Observations:
    """Everything the probes gathered for one run. ``None``: that probe was not needed."""

    nvml: Union[NvmlSnapshot, ProbeError, None] = None
    pci_gpus: Union[PciGpus, ProbeError, None] = None
    slurm_node: Union[SlurmNode, ProbeError, None] = None
    memory: Union[MemoryObservation, ProbeError, None] = None
    mounts: Union[tuple[MountObservation, ...], ProbeError, None] = None
    shared_dirs: Union[tuple[SharedDirObservation, ...], ProbeError, None] = None
    infiniband: Union[tuple[IbPort, ...], ProbeError, None] = None
    xid: Union[XidObservation, ProbeError, None] = None
    job: Union[JobObservation, ProbeError, None] = None
    node_jobs: Union[NodeJobs, ProbeError, None] = None
    nccl: Union[NcclObservation, ProbeError, None] = None
    pcie_aer: Union[AerObservation, ProbeError, None] = None
    edac: Union[EdacObservation, ProbeError, None] = None
    dstate: Union[DstateObservation, ProbeError, None] = None
    counter_reading: Union[CounterReading, ProbeError, None] = None
    services: Union[ServicesObservation, ProbeError, None] = None


@record
class NodeJobs:
    """Which Slurm jobs run on this node now, as the node itself knows (no Slurm call).

    ``running``: the job ledger's jobs with a start and no end on this boot (``JobLedgerEntry``);
    ``pid_jobs``: process id -> job id for the processes in a Slurm job's cgroup (``job_<id>``).
    """

    running: tuple[JobLedgerEntry, ...]
    pid_jobs: Mapping[int, str]

    def holds(self, gpu: int) -> Optional[str]:
        """A running job that holds ``gpu`` (or whose GPUs are not known), else None."""
        for job in self.running:
            if job.gpus is None or gpu in job.gpus:
                return str(job.job_id)
        return None


# Per-GPU counters recorded at job start and compared at job end: (key, uncorrectable?).
COUNTER_KEYS = (
    ("volatile_uncorrected", True),
    ("remapped_uncorrectable", True),
    ("volatile_corrected", False),
    ("remapped_correctable", False),
)


def gpu_counters(gpus: Iterable[GpuObservation]) -> dict[str, dict[str, Any]]:
    """ECC and row-remap counters per GPU index (as text) from NVML ``GpuObservation``s.

    None where NVML did not report the counter. The prolog records this at job start (the
    job baseline), the epilog at job end; ``job_forensics`` compares the two.
    """
    out: dict[str, dict[str, Any]] = {}
    for g in gpus:
        ecc, rows = g.ecc, g.remapped_rows
        out[str(g.index)] = {
            "uuid": g.uuid,
            "volatile_uncorrected": ecc.volatile_uncorrected,
            "volatile_corrected": ecc.volatile_corrected,
            "remapped_uncorrectable": rows.uncorrectable if rows is not None else None,
            "remapped_correctable": rows.correctable if rows is not None else None,
            **{f"throttle_{reason}_ns": ns for reason, ns in g.throttle_ns or ()},
        }
    return out
