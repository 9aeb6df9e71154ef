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

from nodehealth.metrics.exposition import Metric
from nodehealth.metrics.family import COUNTER, GAUGE, GPU, INFO, Family, row
from nodehealth.metrics.gpu_table import GPU_FAMILIES, NVLINK_COUNTERS, THROTTLE_REASONS

# The ``error`` label of nodehealth_config_valid: "none", or nodehealth.config.loader.KINDS.
CONFIG_ERRORS = ("none", "missing", "unreadable", "untrusted", "syntax", "value", "setup")

_D, _C, _X, _S, _N = "daemon", "checks", "xid", "slurm", "nccl"
NCCL_MODES = ("nvlink", "ib_loopback")
NCCL_TRANSPORTS = ("ib", "socket", "p2p", "unknown")

FAMILIES: tuple[Family, ...] = (
    # ---------------------------------------------------------------- daemon and rounds
    row(
        _D,
        "nodehealth_build_info",
        INFO,
        ("version", "node", "face"),
        "nodehealth version and node (value 1)",
        note="`face` is `daemon`",
    ),
    row(_D, "nodehealth_start_time_seconds", GAUGE, (), "Unix time the daemon started", "seconds"),
    row(_D, "nodehealth_rounds_total", COUNTER, (), "Rounds of checks completed"),
    row(_D, "nodehealth_round_errors_total", COUNTER, (), "Rounds that ended in an internal error"),
    row(_D, "nodehealth_round_last_timestamp_seconds", GAUGE, (), "Unix time the last round ended", "seconds"),
    row(_D, "nodehealth_round_duration_seconds", GAUGE, (), "Wall time of the last round", "seconds"),
    row(
        _D,
        "nodehealth_round_running_seconds",
        GAUGE,
        (),
        "How long the round in progress has run (0 between rounds); a hung probe shows here before its deadline",
        "seconds",
        note="computed at scrape time",
    ),
    row(
        _D,
        "nodehealth_probe_timed_out",
        GAUGE,
        ("probe",),
        "1 when the probe missed its deadline in the last round (NVML: stopped answering part way)",
        per="probe",
    ),
    row(
        _D,
        "nodehealth_probe_timeouts_total",
        COUNTER,
        ("probe",),
        "Rounds in which the probe missed its deadline",
        note="by default only probes that missed a deadline since the start",
        quiet=0.0,
        per="probe",
    ),
    row(
        _D,
        "nodehealth_config_reloads_total",
        COUNTER,
        ("result",),
        "Configuration reloads (SIGHUP) by result",
        values={"result": ("ok", "error")},
        note="`error`: the new file was rejected and the old config kept",
    ),
    row(
        _D,
        "nodehealth_config_last_reload_success",
        GAUGE,
        (),
        "1 when the last reload was accepted",
        note="absent before the first reload",
    ),
    row(
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
        per="one",
    ),
    row(
        _D,
        "nodehealth_config_in_use_info",
        INFO,
        ("using",),
        "The configuration the daemon runs with (value 1)",
        values={"using": ("file", "last_validated")},
        note="`last_validated`: the file did not validate, the daemon runs the last version of it that did "
        "(from the state dir at start, the running one after a rejected reload)",
    ),
    row(
        _D,
        "nodehealth_state_last_write_timestamp_seconds",
        GAUGE,
        (),
        "Unix time the state file was last written",
        "seconds",
        note="the verdict the prolog's fast path reads (docs/operations.md)",
    ),
    row(_D, "nodehealth_state_write_errors_total", COUNTER, (), "Failed writes of the daemon state file"),
    # ---------------------------------------------------------------- checks and the node verdict
    row(
        _C,
        "nodehealth_check_status",
        GAUGE,
        ("check",),
        "Result of each check in the last round: 0 OK, 1 SKIPPED, 2 WARN, 3 UNKNOWN, 4 FAIL",
        per="check",
    ),
    row(
        _C,
        "nodehealth_check_duration_seconds",
        GAUGE,
        ("check",),
        "Time each check took to gather and judge in the last round",
        "seconds",
        note="published with `[daemon] metrics_detail = true`",
        detail=True,
        per="check",
    ),
    row(
        _C, "nodehealth_node_status", GAUGE, (), "The node's verdict in the last round: 0 OK, 2 WARN, 3 UNKNOWN, 4 FAIL"
    ),
    row(_C, "nodehealth_node_failing_checks", GAUGE, (), "Checks that FAILed in the last round"),
    row(
        _C,
        "nodehealth_ib_port_flaps",
        GAUGE,
        ("port",),
        "Times the InfiniBand port went down and came back within host_infiniband's flap_window_s",
        note="`port`: `mlx5_0/1`; from the check's details; only ports that flapped (0 is left out)",
        quiet=0.0,
    ),
    row(
        _C,
        "nodehealth_ib_port_error_increase",
        GAUGE,
        ("port", "counter"),
        "Increase of the port's error counter (ports/<n>/counters/) within host_infiniband's error_window_s",
        note="`counter`: one of the check's error_counters; only counters that rose (0 is left out)",
        quiet=0.0,
    ),
    row(
        _C,
        "nodehealth_host_service_down",
        GAUGE,
        ("name",),
        "1 while a unit or kernel module this node needs (host_services) is not running or not loaded",
        note="`name`: `nvidia-fabricmanager.service`, `nvidia_peermem`, ...; only those down (0 is left out)",
        quiet=0.0,
    ),
    row(
        _C,
        "nodehealth_pcie_aer_errors_total",
        COUNTER,
        ("device", "kind", "class"),
        "PCIe AER errors the kernel counted since boot (aer_dev_*), by device and class (host_pcie_aer)",
        values={"class": ("correctable", "nonfatal", "fatal")},
        note="`device`: the PCI address; `kind`: gpu, nvswitch, nic or `upstream of <address>`; from the check's "
        "details; only counts above 0 (a reboot starts them again)",
        quiet=0.0,
    ),
    row(
        _C,
        "nodehealth_edac_errors_total",
        COUNTER,
        ("controller", "type"),
        "Memory errors an EDAC memory controller counted since boot (host_edac), corrected or uncorrected",
        values={"type": ("corrected", "uncorrected")},
        note="`controller`: `mc0`, ...; from the check's details; only counts above 0",
        quiet=0.0,
    ),
    row(
        _C,
        "nodehealth_dstate_gpu_holders",
        GAUGE,
        (),
        "Processes in D state holding /dev/nvidia* in both of host_dstate's looks",
        note="from the check's details; 0 is left out",
        quiet=0.0,
    ),
    *GPU_FAMILIES,
    # ---------------------------------------------------------------- XID
    row(
        _X,
        "nodehealth_xid_errors_total",
        COUNTER,
        ("gpu", "xid", "action"),
        "XID events read from the kernel log since the daemon started, by GPU, XID and our action for it",
        note="this boot's backlog first; `gpu` is the NVML index, else the PCI address; `action` is the "
        "catalog's (`none`, `restart_app`, `reset_gpu`, `reboot`, `inspect`)",
        per="event",
    ),
    row(
        _X,
        "nodehealth_nvswitch_sxid_errors_total",
        COUNTER,
        ("switch", "class"),
        "NVSwitch SXid events this boot, by NVSwitch and class (fatal, non_fatal), as gpu_sxid judged them",
        note="`switch` is the NVSwitch's PCI address; read from the XID store every round (a daemon restart keeps "
        "the count, a reboot starts it again); only NVSwitches that logged an SXid",
        per="event",
    ),
    row(
        _X,
        "nodehealth_xid_follower_up",
        GAUGE,
        ("state",),
        "1 while the kernel-log XID follower runs (state label: alive, dead, absent, off)",
        values={"state": ("alive", "dead", "absent", "off")},
        per="one",
    ),
    # ---------------------------------------------------------------- NCCL self-test
    row(
        _N,
        "nodehealth_nccl_busbw_gbps",
        GAUGE,
        ("mode",),
        "Bus bandwidth of the largest size in the last NCCL self-test (GB/s as nccl-tests prints it)",
        values={"mode": NCCL_MODES},
        note="out-of-place; absent when the run gave no result row",
        per="mode",
    ),
    row(
        _N,
        "nodehealth_nccl_floor_gbps",
        GAUGE,
        ("mode",),
        "The floor the self-test's bus bandwidth is judged "
        "against (GB/s): FAIL under fail_fraction of it, WARN under warn_fraction",
        values={"mode": NCCL_MODES},
        note="from nodehealth/data/nccl_floors.toml or the node's own <mode>_floor_gbps; absent: no floor",
        per="mode",
    ),
    row(
        _N,
        "nodehealth_nccl_selftest_status",
        GAUGE,
        ("mode",),
        "Result of the last NCCL self-test per mode: 0 OK, 1 SKIPPED, 2 WARN, 3 UNKNOWN, 4 FAIL",
        values={"mode": NCCL_MODES},
        per="mode",
    ),
    row(
        _N,
        "nodehealth_nccl_transport_info",
        INFO,
        ("mode", "transport"),
        "What carried the last NCCL self-test's traffic, from its NCCL_DEBUG=INFO lines (value 1)",
        values={"mode": NCCL_MODES, "transport": NCCL_TRANSPORTS},
        note="`ib`: NET/IB (RoCE, SHARP, IBext plugins); `socket`: NET/Socket; `p2p`: only paths inside the "
        "node (P2P, SHM, NVLS)",
        per="mode",
    ),
    row(
        _N,
        "nodehealth_nccl_last_run_timestamp_seconds",
        GAUGE,
        ("mode",),
        "Unix time the last NCCL self-test of this mode ended",
        "seconds",
        values={"mode": NCCL_MODES},
        note="the daemon runs it every [checks.nccl_selftest] interval_s while the node is idle",
        per="mode",
    ),
    row(
        _N,
        "nodehealth_nccl_run_duration_seconds",
        GAUGE,
        ("mode",),
        "Wall time of the last NCCL self-test run of this mode",
        "seconds",
        values={"mode": NCCL_MODES},
        per="mode",
    ),
    # ---------------------------------------------------------------- Slurm
    row(_S, "nodehealth_slurm_node_drained", GAUGE, (), "1 when Slurm has this node drained (any reason)"),
    row(
        _S,
        "nodehealth_slurm_node_drained_by_nodehealth",
        GAUGE,
        (),
        "1 when the drain reason is ours (exactly the nh:<code> ... reason nodehealth recorded)",
    ),
    row(
        _S,
        "nodehealth_slurm_breaker_open",
        GAUGE,
        (),
        "1 while the drain-storm breaker holds back a drain this node needs",
    ),
    row(
        _S,
        "nodehealth_slurm_flapping",
        GAUGE,
        (),
        "1 while a drain of ours is held for a person: its check "
        "drained [resume] flap_drains times within flap_window_s (reason nh:flap ...; never resumed by nodehealth)",
    ),
    row(
        _S,
        "nodehealth_slurm_orphan_drain",
        GAUGE,
        (),
        "1 while Slurm shows this node drained with a nodehealth "
        "reason and no record of ours (a lost state dir): never resumed by nodehealth, resume it by hand",
    ),
    row(
        _S,
        "nodehealth_slurm_observe_mode",
        GAUGE,
        (),
        '1 while [slurm] mode = "observe": decisions are made, '
        "logged and counted (nodehealth_slurm_would_total), no scontrol update is sent, the faces exit 0",
    ),
    row(
        _S,
        "nodehealth_slurm_would_total",
        COUNTER,
        ("action",),
        "Slurm actions observe mode would have taken (faces and daemon, since the would-be record was created)",
        values={"action": ("drain", "resume", "reboot")},
        note="kept in the persistent dir with the would-be drain; compare with what administrators drained "
        "(docs/operations.md, Rolling out)",
        per="event",
    ),
    row(
        _S,
        "nodehealth_slurm_reboots_requested",
        GAUGE,
        (),
        'Reboots nodehealth asked Slurm for ([slurm] reboot = "asap") within [slurm] reboot_window_s, all checks',
    ),
    row(
        _S,
        "nodehealth_slurm_reboot_escalated",
        GAUGE,
        (),
        "1 while a drain of ours is held for a person after "
        "[slurm] reboot_max reboots within reboot_window_s did not clear its fault (reason nh:inspect ...)",
    ),
    row(
        _S,
        "nodehealth_slurm_actions_total",
        COUNTER,
        ("action",),
        "Slurm decisions the daemon acted on (drained, resumed, held, unreachable, ...)",
        note="`action` is the Slurm hook's outcome: `drained`, `resumed`, `held`, `other`, `disabled`, "
        "`unreachable`, `resume_failed`",
        per="event",
    ),
)

BY_NAME: Mapping[str, Family] = {f.name: f for f in FAMILIES}


class Series(Metric):
    """One family of the table being filled for one rendering: samples by label values.

    Without ``detail`` a sample the default page leaves out (``Family.published``) is dropped here,
    so the code that fills a family never repeats the table's rules.
    """

    def __init__(self, family: Family, detail: bool = False) -> None:
        super().__init__(family.base, family.help, family.type, family.unit)
        self.family, self.detail = family, detail

    def add(self, labels: Sequence[str], value: float) -> None:
        names = self.family.labels
        if len(labels) != len(names):
            raise ValueError(f"{self.family.name}: {len(labels)} label values for labels {names}")
        value = float(value)
        # Most samples of a healthy node are quiet (NVLink errors 0, links up): dropped before
        # their labels are built (767 of 1,021 adds of an 8-GPU page).
        if not self.detail and self.family.left_out(value):
            return
        named = dict(zip(names, labels))
        if self.family.published(named, value, self.detail):
            self.add_sample(self.family.name, named, value)


def new(name: str, detail: bool = False) -> Series:
    """An empty family of the table (KeyError: not in the table)."""
    return Series(BY_NAME[name], detail)


def one(name: str, value: float) -> Series:
    """A family of the table with its one unlabelled sample."""
    series = new(name)
    series.add((), value)
    return series


__all__ = [
    "CONFIG_ERRORS",
    "COUNTER",
    "FAMILIES",
    "GAUGE",
    "GPU",
    "INFO",
    "NVLINK_COUNTERS",
    "THROTTLE_REASONS",
    "BY_NAME",
    "Family",
    "Series",
    "new",
    "one",
]
