"""Every metric family nodehealth publishes, declared once.

A row says what a family is: its exposed name, type (``gauge``, ``counter`` or ``info``), label
names (with their values where the set is fixed), the HELP text, the unit its name ends in, and
which section of docs/metrics.md lists it. The code that fills a family asks the table for it
(``new(name)``) and adds samples; it never spells a help text or a label list itself.
docs/metrics.md's tables are generated from these rows (tests/test_metrics.py checks them).

An ``info`` family has the value 1 and carries its data in labels; the Prometheus text format
exposes it as a gauge whose name ends in ``_info``. A counter's name ends in ``_total``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Optional

from prometheus_client.core import Metric

GAUGE, COUNTER, INFO = "gauge", "counter", "info"

# The labels of every per-GPU family (NVML index, UUID, PCI address, NVML name).
GPU = ("gpu", "uuid", "pci_bus_id", "model")

# nvmlClocksEventReason* names (nvml.h), in bit order; the bits are the renderer's.
THROTTLE_REASONS = (
    "gpu_idle",
    "applications_clocks_setting",
    "sw_power_cap",
    "hw_slowdown",
    "sync_boost",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "display_clock_setting",
)
NVLINK_COUNTERS = ("replay", "recovery", "crc_flit", "crc_data")
# The ``error`` label of nodehealth_config_valid: "none", or nodehealth.config.loader.KINDS.
CONFIG_ERRORS = ("none", "missing", "unreadable", "untrusted", "syntax", "value", "setup")


@dataclass(frozen=True, eq=False)
class Family:
    """One row of the table."""

    section: str  # the docs/metrics.md table that lists it
    name: str  # as exposed: counters end in _total, info families in _info
    type: str  # GAUGE, COUNTER or INFO
    labels: tuple[str, ...]
    help: str  # the HELP line
    unit: str = ""  # base unit the name ends in (seconds, bytes, ...); "" for counts and states
    values: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # label -> every value it takes
    note: str = ""  # what docs/metrics.md says beyond the HELP line

    @property
    def base(self) -> str:
        """The name without the suffix the text format adds back (``_total``, ``_info``)."""
        suffix = {COUNTER: "_total", INFO: "_info"}.get(self.type, "")
        return self.name[: -len(suffix)] if suffix else self.name


def _f(
    section: str,
    name: str,
    typ: str,
    labels: tuple[str, ...],
    help: str,
    unit: str = "",
    values: Optional[Mapping[str, tuple[str, ...]]] = None,
    note: str = "",
) -> Family:
    return Family(section, name, typ, labels, help, unit, dict(values or {}), note)


_D, _C, _G, _X, _S, _N = "daemon", "checks", "gpu", "xid", "slurm", "nccl"
NCCL_MODES = ("nvlink", "ib_loopback")
NCCL_TRANSPORTS = ("ib", "socket", "p2p", "unknown")

FAMILIES: tuple[Family, ...] = (
    # ---------------------------------------------------------------- daemon and rounds
    _f(
        _D,
        "nodehealth_build_info",
        INFO,
        ("version", "node", "face"),
        "nodehealth version and node (value 1)",
        note="`face` is `daemon`",
    ),
    _f(_D, "nodehealth_start_time_seconds", GAUGE, (), "Unix time the daemon started", "seconds"),
    _f(_D, "nodehealth_rounds_total", COUNTER, (), "Rounds of checks completed"),
    _f(_D, "nodehealth_round_errors_total", COUNTER, (), "Rounds that ended in an internal error"),
    _f(_D, "nodehealth_round_last_timestamp_seconds", GAUGE, (), "Unix time the last round ended", "seconds"),
    _f(_D, "nodehealth_round_duration_seconds", GAUGE, (), "Wall time of the last round", "seconds"),
    _f(
        _D,
        "nodehealth_round_running_seconds",
        GAUGE,
        (),
        "How long the round in progress has run (0 between rounds); a hung probe shows here before its deadline",
        "seconds",
        note="computed at scrape time",
    ),
    _f(
        _D,
        "nodehealth_probe_timed_out",
        GAUGE,
        ("probe",),
        "1 when the probe missed its deadline in the last round (NVML: stopped answering part way)",
    ),
    _f(_D, "nodehealth_probe_timeouts_total", COUNTER, ("probe",), "Rounds in which the probe missed its deadline"),
    _f(
        _D,
        "nodehealth_config_reloads_total",
        COUNTER,
        ("result",),
        "Configuration reloads (SIGHUP) by result",
        values={"result": ("ok", "error")},
        note="`error`: the new file was rejected and the old config kept",
    ),
    _f(
        _D,
        "nodehealth_config_last_reload_success",
        GAUGE,
        (),
        "1 when the last reload was accepted",
        note="absent before the first reload",
    ),
    _f(
        _D,
        "nodehealth_config_valid",
        GAUGE,
        ("file", "error"),
        "1 when the config file validates as it is now; 0 "
        "when it does not (the daemon then runs the configuration nodehealth_config_in_use_info names)",
        values={"error": CONFIG_ERRORS},
        note="checked at start, on SIGHUP and at the first scrape after the file changed; `unreadable` "
        "includes not a regular file, `untrusted`: running as root, the file or a program it names is "
        "not root's own or others can write it, `setup`: its scenario file; the faces fall back the "
        "same way and log the error (stderr, syslog)",
    ),
    _f(
        _D,
        "nodehealth_config_in_use_info",
        INFO,
        ("using",),
        "The configuration the daemon runs with (value 1)",
        values={"using": ("file", "last_validated")},
        note="`last_validated`: the file did not validate, the daemon runs the last version of it that did "
        "(from the state dir at start, the running one after a rejected reload)",
    ),
    _f(
        _D,
        "nodehealth_state_last_write_timestamp_seconds",
        GAUGE,
        (),
        "Unix time the state file was last written",
        "seconds",
        note="the verdict the prolog's fast path reads (docs/operations.md)",
    ),
    _f(_D, "nodehealth_state_write_errors_total", COUNTER, (), "Failed writes of the daemon state file"),
    # ---------------------------------------------------------------- checks and the node verdict
    _f(
        _C,
        "nodehealth_check_status",
        GAUGE,
        ("check",),
        "Result of each check in the last round: 0 OK, 1 SKIPPED, 2 WARN, 3 UNKNOWN, 4 FAIL",
    ),
    _f(
        _C,
        "nodehealth_check_duration_seconds",
        GAUGE,
        ("check",),
        "Time each check took to gather and judge in the last round",
        "seconds",
    ),
    _f(
        _C, "nodehealth_node_status", GAUGE, (), "The node's verdict in the last round: 0 OK, 2 WARN, 3 UNKNOWN, 4 FAIL"
    ),
    _f(_C, "nodehealth_node_failing_checks", GAUGE, (), "Checks that FAILed in the last round"),
    # ---------------------------------------------------------------- GPUs (NVML)
    _f(_G, "nodehealth_nvml_devices", GAUGE, (), "GPUs NVML reported in the last round"),
    _f(
        _G, "nodehealth_nvml_probe_duration_seconds", GAUGE, (), "Time the NVML probe took in the last round", "seconds"
    ),
    _f(_G, "nodehealth_gpu_info", INFO, (*GPU, "driver_version"), "One series per GPU NVML reported (value 1)"),
    _f(_G, "nodehealth_gpu_lost", GAUGE, GPU, "1 when NVML says the GPU is lost (fallen off the bus)"),
    _f(_G, "nodehealth_gpu_temperature_celsius", GAUGE, GPU, "GPU core temperature", "celsius"),
    _f(
        _G,
        "nodehealth_gpu_temperature_slowdown_celsius",
        GAUGE,
        GPU,
        "Temperature at which the GPU slows itself down (NVML slowdown threshold)",
        "celsius",
    ),
    _f(_G, "nodehealth_gpu_power_watts", GAUGE, GPU, "GPU power draw", "watts"),
    _f(_G, "nodehealth_gpu_power_limit_watts", GAUGE, GPU, "Enforced GPU power limit", "watts"),
    _f(
        _G,
        "nodehealth_gpu_utilization_ratio",
        GAUGE,
        GPU,
        "Share of the last sample period a kernel ran on the GPU (0-1)",
        "ratio",
        note="NVML's percent / 100",
    ),
    _f(
        _G,
        "nodehealth_gpu_memory_utilization_ratio",
        GAUGE,
        GPU,
        "Share of the last sample period device memory was read or written (0-1)",
        "ratio",
    ),
    _f(_G, "nodehealth_gpu_memory_used_bytes", GAUGE, GPU, "Device memory in use", "bytes"),
    _f(_G, "nodehealth_gpu_memory_total_bytes", GAUGE, GPU, "Device memory installed", "bytes"),
    _f(_G, "nodehealth_gpu_ecc_enabled", GAUGE, GPU, "1 when ECC is on (current mode)"),
    _f(
        _G,
        "nodehealth_gpu_ecc_errors_total",
        COUNTER,
        (*GPU, "type", "scope"),
        "ECC errors NVML counted, by type "
        "(corrected, uncorrected) and scope (volatile: since the driver loaded; aggregate: lifetime)",
        values={"type": ("corrected", "uncorrected"), "scope": ("volatile", "aggregate")},
    ),
    _f(
        _G,
        "nodehealth_gpu_remapped_rows",
        GAUGE,
        (*GPU, "cause"),
        "Rows remapped, by cause (correctable, uncorrectable)",
        values={"cause": ("correctable", "uncorrectable")},
        note="Ampere and later",
    ),
    _f(_G, "nodehealth_gpu_row_remap_pending", GAUGE, GPU, "1 when a row remap waits for the next GPU reset"),
    _f(_G, "nodehealth_gpu_row_remap_failed", GAUGE, GPU, "1 when a row remap failed (inspect the GPU)"),
    _f(
        _G,
        "nodehealth_gpu_retired_pages",
        GAUGE,
        (*GPU, "cause"),
        "Pages retired, by cause (sbe, dbe)",
        values={"cause": ("sbe", "dbe")},
        note="pre-Ampere",
    ),
    _f(_G, "nodehealth_gpu_retired_pages_pending", GAUGE, GPU, "1 when a page retirement waits for a reset"),
    _f(_G, "nodehealth_gpu_pcie_link_width", GAUGE, GPU, "Current PCIe link width (lanes)"),
    _f(_G, "nodehealth_gpu_pcie_link_width_max", GAUGE, GPU, "Maximum PCIe link width (lanes)"),
    _f(_G, "nodehealth_gpu_pcie_link_generation", GAUGE, GPU, "Current PCIe link generation"),
    _f(_G, "nodehealth_gpu_pcie_link_generation_max", GAUGE, GPU, "Maximum PCIe link generation"),
    _f(_G, "nodehealth_gpu_nvlink_up", GAUGE, (*GPU, "link"), "1 when the NVLink is active"),
    _f(
        _G,
        "nodehealth_gpu_nvlink_errors_total",
        COUNTER,
        (*GPU, "link", "type"),
        "NVLink data-link error counters, by type (replay, recovery, crc_flit, crc_data)",
        values={"type": NVLINK_COUNTERS},
    ),
    _f(
        _G,
        "nodehealth_gpu_throttle_reason_active",
        GAUGE,
        (*GPU, "reason"),
        "1 while this clock throttle (clocks event) reason is active",
        values={"reason": THROTTLE_REASONS},
    ),
    _f(_G, "nodehealth_gpu_persistence_mode_enabled", GAUGE, GPU, "1 when persistence mode is on"),
    _f(
        _G,
        "nodehealth_gpu_recovery_action",
        GAUGE,
        GPU,
        "The driver's recovery action for the GPU "
        "(NVML_GPU_RECOVERY_ACTION_*: 0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and reset)",
    ),
    _f(
        _G,
        "nodehealth_gpu_fabric_state",
        GAUGE,
        GPU,
        "NVSwitch fabric registration state (NVML_GPU_FABRIC_STATE_*: 3 completed)",
    ),
    _f(_G, "nodehealth_gpu_processes", GAUGE, GPU, "Compute processes on the GPU"),
    _f(
        _G,
        "nodehealth_gpu_job_info",
        INFO,
        (*GPU, "job_id"),
        "The Slurm job holding the GPU, from the job ledger (value 1)",
        note="join on `gpu` to read utilization per job",
    ),
    # ---------------------------------------------------------------- XID
    _f(
        _X,
        "nodehealth_xid_errors_total",
        COUNTER,
        ("gpu", "xid", "action"),
        "XID events read from the kernel log since the daemon started, by GPU, XID and our action for it",
        note="this boot's backlog first; `gpu` is the NVML index, else the PCI address; `action` is the "
        "catalog's (`none`, `restart_app`, `reset_gpu`, `reboot`, `inspect`)",
    ),
    _f(
        _X,
        "nodehealth_xid_follower_up",
        GAUGE,
        ("state",),
        "1 while the kernel-log XID follower runs (state label: alive, dead, absent, off)",
        values={"state": ("alive", "dead", "absent", "off")},
    ),
    # ---------------------------------------------------------------- NCCL self-test
    _f(
        _N,
        "nodehealth_nccl_busbw_gbps",
        GAUGE,
        ("mode",),
        "Bus bandwidth of the largest size in the last NCCL self-test (GB/s as nccl-tests prints it)",
        values={"mode": NCCL_MODES},
        note="out-of-place; absent when the run gave no result row",
    ),
    _f(
        _N,
        "nodehealth_nccl_floor_gbps",
        GAUGE,
        ("mode",),
        "The floor the self-test's bus bandwidth is judged "
        "against (GB/s): FAIL under fail_fraction of it, WARN under warn_fraction",
        values={"mode": NCCL_MODES},
        note="from nodehealth/data/nccl_floors.toml or the node's own <mode>_floor_gbps; absent: no floor",
    ),
    _f(
        _N,
        "nodehealth_nccl_selftest_status",
        GAUGE,
        ("mode",),
        "Result of the last NCCL self-test per mode: 0 OK, 1 SKIPPED, 2 WARN, 3 UNKNOWN, 4 FAIL",
        values={"mode": NCCL_MODES},
    ),
    _f(
        _N,
        "nodehealth_nccl_transport_info",
        INFO,
        ("mode", "transport"),
        "What carried the last NCCL self-test's traffic, from its NCCL_DEBUG=INFO lines (value 1)",
        values={"mode": NCCL_MODES, "transport": NCCL_TRANSPORTS},
        note="`ib`: NET/IB (RoCE, SHARP, IBext plugins); `socket`: NET/Socket; `p2p`: only paths inside the "
        "node (P2P, SHM, NVLS)",
    ),
    _f(
        _N,
        "nodehealth_nccl_last_run_timestamp_seconds",
        GAUGE,
        ("mode",),
        "Unix time the last NCCL self-test of this mode ended",
        "seconds",
        values={"mode": NCCL_MODES},
        note="the daemon runs it every [checks.nccl_selftest] interval_s while the node is idle",
    ),
    _f(
        _N,
        "nodehealth_nccl_run_duration_seconds",
        GAUGE,
        ("mode",),
        "Wall time of the last NCCL self-test run of this mode",
        "seconds",
        values={"mode": NCCL_MODES},
    ),
    # ---------------------------------------------------------------- Slurm
    _f(_S, "nodehealth_slurm_node_drained", GAUGE, (), "1 when Slurm has this node drained (any reason)"),
    _f(
        _S,
        "nodehealth_slurm_node_drained_by_nodehealth",
        GAUGE,
        (),
        "1 when the drain reason is ours (exactly the nh:<code> ... reason nodehealth recorded)",
    ),
    _f(
        _S,
        "nodehealth_slurm_breaker_open",
        GAUGE,
        (),
        "1 while the drain-storm breaker holds back a drain this node needs",
    ),
    _f(
        _S,
        "nodehealth_slurm_flapping",
        GAUGE,
        (),
        "1 while a drain of ours is held for a person: its check "
        "drained [resume] flap_drains times within flap_window_s (reason nh:flap ...; never resumed by nodehealth)",
    ),
    _f(
        _S,
        "nodehealth_slurm_orphan_drain",
        GAUGE,
        (),
        "1 while Slurm shows this node drained with a nodehealth "
        "reason and no record of ours (a lost state dir): never resumed by nodehealth, resume it by hand",
    ),
    _f(
        _S,
        "nodehealth_slurm_observe_mode",
        GAUGE,
        (),
        '1 while [slurm] mode = "observe": decisions are made, '
        "logged and counted (nodehealth_slurm_would_total), no scontrol update is sent, the faces exit 0",
    ),
    _f(
        _S,
        "nodehealth_slurm_would_total",
        COUNTER,
        ("action",),
        "Slurm actions observe mode would have taken (faces and daemon, since the would-be record was created)",
        values={"action": ("drain", "resume", "reboot")},
        note="kept in the persistent dir with the would-be drain; compare with what administrators drained "
        "(docs/operations.md, Rolling out)",
    ),
    _f(
        _S,
        "nodehealth_slurm_reboots_requested",
        GAUGE,
        (),
        'Reboots nodehealth asked Slurm for ([slurm] reboot = "asap") within [slurm] reboot_window_s, all checks',
    ),
    _f(
        _S,
        "nodehealth_slurm_reboot_escalated",
        GAUGE,
        (),
        "1 while a drain of ours is held for a person after "
        "[slurm] reboot_max reboots within reboot_window_s did not clear its fault (reason nh:inspect ...)",
    ),
    _f(
        _S,
        "nodehealth_slurm_actions_total",
        COUNTER,
        ("action",),
        "Slurm decisions the daemon acted on (drained, resumed, held, unreachable, ...)",
        note="`action` is the Slurm hook's outcome: `drained`, `resumed`, `held`, `other`, `disabled`, "
        "`unreachable`, `resume_failed`",
    ),
)

BY_NAME: Mapping[str, Family] = {f.name: f for f in FAMILIES}


class Series(Metric):
    """One family of the table being filled for one rendering: samples by label values."""

    def __init__(self, family: Family) -> None:
        super().__init__(family.base, family.help, family.type, family.unit)
        self.family = family

    def add(self, labels: Sequence[str], value: float) -> None:
        names = self.family.labels
        if len(labels) != len(names):
            raise ValueError(f"{self.family.name}: {len(labels)} label values for labels {names}")
        self.add_sample(self.family.name, dict(zip(names, labels)), float(value))


def new(name: str) -> Series:
    """An empty family of the table (KeyError: not in the table)."""
    return Series(BY_NAME[name])


def one(name: str, value: float) -> Series:
    """A family of the table with its one unlabelled sample."""
    series = new(name)
    series.add((), value)
    return series
