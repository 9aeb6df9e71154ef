"""Prometheus metrics: what the daemon publishes and the short-lived faces can write as a textfile.

Everything comes from one ``CollectorRegistry`` built here (no global default collectors;
the daemon adds ``ProcessCollector``, which reads ``/proc/self``, by choice). Names follow
``nodehealth_<area>_<thing>_<unit>``; docs/metrics.md lists every one.

The daemon never renders on a scrape what it could render after a round: ``NodeMetrics``
keeps the last round's Report and observations, renders them once (``payload()`` re-renders
only after an update), and adds a small live tail (process figures, time in the current
round). So a scrape never waits on NVML, on a round, or on much Python either.
"""

from __future__ import annotations

import gzip
import os
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Optional

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from nodehealth import __version__
from nodehealth.model import Report, Status
from nodehealth.observations import GpuObservation, NvmlSnapshot, Observations, ProbeError

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
GPU_LABELS = ("gpu", "uuid", "pci_bus_id", "model")

# nvmlClocksEventReason* bits (nvml.h), in bit order.
THROTTLE_REASONS = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)
NVLINK_COUNTERS = ("replay", "recovery", "crc_flit", "crc_data")


@dataclass(frozen=True)
class SlurmView:
    """What the daemon's Slurm hook last saw and did (None fields: not known)."""

    drained: Optional[bool] = None
    drained_by_nodehealth: Optional[bool] = None
    breaker_open: Optional[bool] = None
    reason: Optional[str] = None
    last_action: str = ""  # drained, resumed, held, ... (see nodehealth.daemon.hooks)


def gpu_labels(gpu: GpuObservation) -> list[str]:
    return [str(gpu.index), gpu.uuid or "", gpu.pci_bus_id or "", gpu.name or ""]


def _gauge(name: str, doc: str, labels: Iterable[str] = (), unit: str = "") -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(labels), unit=unit)


def _counter(name: str, doc: str, labels: Iterable[str] = ()) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, labels=list(labels))


def _b(value: Any) -> float:
    return 1.0 if value else 0.0


def probe_timeouts(obs: Optional[Observations]) -> dict[str, bool]:
    """Per probe of a round: did it miss its deadline (or, for NVML, stop answering part way)?"""
    out: dict[str, bool] = {}
    if obs is None:
        return out
    for name in obs.__dataclass_fields__:
        value = getattr(obs, name)
        if value is None:
            continue
        timed = isinstance(value, ProbeError) and value.kind == "timeout"
        if isinstance(value, NvmlSnapshot) and not value.complete:
            timed = True
        out[name] = timed
    return out


def report_families(report: Report) -> Iterator[Metric]:
    status = _gauge("nodehealth_check_status", "Result of each check in the last round: 0 OK, 1 SKIPPED, "
                    "2 WARN, 3 UNKNOWN, 4 FAIL", ["check"])
    duration = _gauge("nodehealth_check_duration_seconds", "Time each check took to gather and judge in the "
                      "last round", ["check"])
    nccl = _gauge("nodehealth_nccl_bus_bandwidth_gigabytes_per_second", "NCCL bus bandwidth a check measured "
                  "(details busbw_gbps)", ["check"])
    floor = _gauge("nodehealth_nccl_bus_bandwidth_floor_gigabytes_per_second", "The floor that check's "
                   "bandwidth is judged against (details floor_gbps)", ["check"])
    for r in report.results:
        status.add_metric([r.name], float(int(r.status)))
        duration.add_metric([r.name], r.duration_s)
        bw, fl = r.details.get("busbw_gbps"), r.details.get("floor_gbps")
        if isinstance(bw, (int, float)) and not isinstance(bw, bool):
            nccl.add_metric([r.name], float(bw))
            if isinstance(fl, (int, float)) and not isinstance(fl, bool):
                floor.add_metric([r.name], float(fl))
    node = _gauge("nodehealth_node_status", "The node's verdict in the last round: 0 OK, 2 WARN, 3 UNKNOWN, 4 FAIL")
    node.add_metric([], float(int(report.status)))
    failing = _gauge("nodehealth_node_failing_checks", "Checks that FAILed in the last round")
    failing.add_metric([], float(sum(1 for r in report.results if r.status == Status.FAIL)))
    yield from (status, duration, node, failing, nccl, floor)


def gpu_families(snap: NvmlSnapshot) -> Iterator[Metric]:
    L = GPU_LABELS
    info = _gauge("nodehealth_gpu_info", "One series per GPU NVML reported (value 1)", (*L, "driver_version"))
    lost = _gauge("nodehealth_gpu_lost", "1 when NVML says the GPU is lost (fallen off the bus)", L)
    temp = _gauge("nodehealth_gpu_temperature_celsius", "GPU core temperature", L)
    slowdown = _gauge("nodehealth_gpu_temperature_slowdown_celsius", "Temperature at which the GPU slows "
                      "itself down (NVML slowdown threshold)", L)
    power = _gauge("nodehealth_gpu_power_watts", "GPU power draw", L)
    plimit = _gauge("nodehealth_gpu_power_limit_watts", "Enforced GPU power limit", L)
    util = _gauge("nodehealth_gpu_utilization_ratio", "Share of the last sample period a kernel ran on the GPU "
                  "(0-1)", L)
    mutil = _gauge("nodehealth_gpu_memory_utilization_ratio", "Share of the last sample period device memory "
                   "was read or written (0-1)", L)
    mused = _gauge("nodehealth_gpu_memory_used_bytes", "Device memory in use", L)
    mtotal = _gauge("nodehealth_gpu_memory_total_bytes", "Device memory installed", L)
    ecc_mode = _gauge("nodehealth_gpu_ecc_enabled", "1 when ECC is on (current mode)", L)
    ecc = _counter("nodehealth_gpu_ecc_errors", "ECC errors NVML counted, by type (corrected, uncorrected) and "
                   "scope (volatile: since the driver loaded; aggregate: lifetime)", (*L, "type", "scope"))
    remapped = _gauge("nodehealth_gpu_remapped_rows", "Rows remapped, by cause (correctable, uncorrectable)",
                      (*L, "cause"))
    remap_pending = _gauge("nodehealth_gpu_row_remap_pending", "1 when a row remap waits for the next GPU reset", L)
    remap_failed = _gauge("nodehealth_gpu_row_remap_failed", "1 when a row remap failed (inspect the GPU)", L)
    retired = _gauge("nodehealth_gpu_retired_pages", "Pages retired, by cause (sbe, dbe)", (*L, "cause"))
    retired_pending = _gauge("nodehealth_gpu_retired_pages_pending", "1 when a page retirement waits for a reset", L)
    pcie_w = _gauge("nodehealth_gpu_pcie_link_width", "Current PCIe link width (lanes)", L)
    pcie_wmax = _gauge("nodehealth_gpu_pcie_link_width_max", "Maximum PCIe link width (lanes)", L)
    pcie_g = _gauge("nodehealth_gpu_pcie_link_generation", "Current PCIe link generation", L)
    pcie_gmax = _gauge("nodehealth_gpu_pcie_link_generation_max", "Maximum PCIe link generation", L)
    nvl_up = _gauge("nodehealth_gpu_nvlink_up", "1 when the NVLink is active", (*L, "link"))
    nvl_err = _counter("nodehealth_gpu_nvlink_errors", "NVLink data-link error counters, by type (replay, "
                       "recovery, crc_flit, crc_data)", (*L, "link", "type"))
    throttle = _gauge("nodehealth_gpu_throttle_reason_active", "1 while this clock throttle (clocks event) "
                      "reason is active", (*L, "reason"))
    persist = _gauge("nodehealth_gpu_persistence_mode_enabled", "1 when persistence mode is on", L)
    recovery = _gauge("nodehealth_gpu_recovery_action", "The driver's recovery action for the GPU "
                      "(NVML_GPU_RECOVERY_ACTION_*: 0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, "
                      "4 drain and reset)", L)
    fabric = _gauge("nodehealth_gpu_fabric_state", "NVSwitch fabric registration state (NVML_GPU_FABRIC_STATE_*: "
                    "3 completed)", L)
    procs = _gauge("nodehealth_gpu_processes", "Compute processes on the GPU", L)
    count = _gauge("nodehealth_nvml_devices", "GPUs NVML reported in the last round")
    count.add_metric([], float(snap.device_count if snap.device_count is not None else len(snap.gpus)))
    for g in snap.gpus:
        lab = gpu_labels(g)
        info.add_metric([*lab, snap.driver_version or ""], 1.0)
        lost.add_metric(lab, _b(g.lost))
        if g.temperature_c is not None:
            temp.add_metric(lab, float(g.temperature_c))
        if g.slowdown_c is not None:
            slowdown.add_metric(lab, float(g.slowdown_c))
        if g.power_w is not None:
            power.add_metric(lab, float(g.power_w))
        if g.power_limit_w is not None:
            plimit.add_metric(lab, float(g.power_limit_w))
        if g.utilization_gpu_pct is not None:
            util.add_metric(lab, g.utilization_gpu_pct / 100.0)
        if g.utilization_memory_pct is not None:
            mutil.add_metric(lab, g.utilization_memory_pct / 100.0)
        if g.memory_used_bytes is not None:
            mused.add_metric(lab, float(g.memory_used_bytes))
        if g.memory_total_bytes is not None:
            mtotal.add_metric(lab, float(g.memory_total_bytes))
        if g.ecc_enabled is not None:
            ecc_mode.add_metric(lab, _b(g.ecc_enabled))
        for value, typ, scope in ((g.ecc.volatile_corrected, "corrected", "volatile"),
                                  (g.ecc.volatile_uncorrected, "uncorrected", "volatile"),
                                  (g.ecc.aggregate_corrected, "corrected", "aggregate"),
                                  (g.ecc.aggregate_uncorrected, "uncorrected", "aggregate")):
            if value is not None:
                ecc.add_metric([*lab, typ, scope], float(value))
        if g.remapped_rows is not None:
            remapped.add_metric([*lab, "correctable"], float(g.remapped_rows.correctable))
            remapped.add_metric([*lab, "uncorrectable"], float(g.remapped_rows.uncorrectable))
            remap_pending.add_metric(lab, _b(g.remapped_rows.pending))
            remap_failed.add_metric(lab, _b(g.remapped_rows.failure))
        if g.retired_pages_sbe is not None:
            retired.add_metric([*lab, "sbe"], float(g.retired_pages_sbe))
        if g.retired_pages_dbe is not None:
            retired.add_metric([*lab, "dbe"], float(g.retired_pages_dbe))
        if g.retired_pages_pending is not None:
            retired_pending.add_metric(lab, _b(g.retired_pages_pending))
        for fam, value in ((pcie_w, g.pcie_width), (pcie_wmax, g.pcie_max_width), (pcie_g, g.pcie_gen),
                           (pcie_gmax, g.pcie_max_gen), (recovery, g.recovery_action), (fabric, g.fabric_state)):
            if value is not None:
                fam.add_metric(lab, float(value))
        for link in g.nvlinks or ():
            nvl_up.add_metric([*lab, str(link.link)], _b(link.active))
            for typ in NVLINK_COUNTERS:
                value = getattr(link, typ)
                if value is not None:
                    nvl_err.add_metric([*lab, str(link.link), typ], float(value))
        if g.throttle_reasons is not None:
            for bit, reason in THROTTLE_REASONS:
                throttle.add_metric([*lab, reason], _b(g.throttle_reasons & bit))
        if g.persistence_mode is not None:
            persist.add_metric(lab, _b(g.persistence_mode))
        if g.processes is not None:
            procs.add_metric(lab, float(len(g.processes)))
    yield from (count, info, lost, temp, slowdown, power, plimit, util, mutil, mused, mtotal, ecc_mode, ecc,
                remapped, remap_pending, remap_failed, retired, retired_pending, pcie_w, pcie_wmax, pcie_g,
                pcie_gmax, nvl_up, nvl_err, throttle, persist, recovery, fabric, procs)


class NodeMetrics:
    """The daemon's metrics, updated from its threads, rendered for scrapes and textfiles.

    Thread-safe: the round thread calls ``update_round``, the XID follower ``count_xid``, the
    HTTP threads ``payload``; a lock guards the state and the cached rendering.
    """

    def __init__(self, node: str, face: str = "daemon", process: bool = True,
                 clock: Any = time.time) -> None:
        self.node, self.face, self.clock = node, face, clock
        self._lock = threading.Lock()
        self.report: Optional[Report] = None
        self.observations: Optional[Observations] = None
        self.rounds = 0
        self.round_errors = 0
        self.last_round_at: Optional[float] = None
        self.last_round_duration: Optional[float] = None
        self.round_started: Optional[float] = None  # set while a round runs
        self.timed_out: dict[str, bool] = {}
        self.timeouts: dict[str, int] = {}
        self.xids: dict[tuple[str, str, str], int] = {}
        self.xid_follower = "off"
        self.slurm: Optional[SlurmView] = None
        self.slurm_actions: dict[str, int] = {}
        self.jobs: dict[int, str] = {}
        self.reloads: dict[str, int] = {"ok": 0, "error": 0}
        self.last_reload_ok: Optional[bool] = None
        self.state_write_errors = 0
        self.state_written_at: Optional[float] = None
        self.started_at = clock()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collect(self.families))
        self.live = CollectorRegistry(auto_describe=False)
        if process:
            ProcessCollector(registry=self.live)
        self.live.register(_Collect(self.live_families))
        self._payload: Optional[bytes] = None
        self._payload_gz: Optional[tuple[bytes, bytes]] = None

    # ------------------------------------------------------------------ updates

    def _changed(self) -> None:
        self._payload = None

    def round_started_now(self) -> None:
        with self._lock:
            self.round_started = self.clock()

    def update_round(self, report: Report, observations: Optional[Observations]) -> None:
        """A round ended: publish its Report and observations, count probe timeouts."""
        with self._lock:
            self.report, self.observations = report, observations
            self.rounds += 1
            self.last_round_at = report.started_at + report.duration_s
            self.last_round_duration = report.duration_s
            self.round_started = None
            self.timed_out = probe_timeouts(observations)
            for probe, timed in self.timed_out.items():
                self.timeouts.setdefault(probe, 0)
                if timed:
                    self.timeouts[probe] += 1
            self._changed()

    def update_report(self, report: Report) -> None:
        """A verdict changed between rounds (a drain-class XID): publish it, no round counted."""
        with self._lock:
            self.report = report
            self._changed()

    def round_failed(self) -> None:
        with self._lock:
            self.round_errors += 1
            self.round_started = None
            self._changed()

    def count_xid(self, gpu: str, xid: int, action: str) -> None:
        with self._lock:
            key = (gpu, str(xid), action)
            self.xids[key] = self.xids.get(key, 0) + 1
            self._changed()

    def set_xid_follower(self, state: str) -> None:
        with self._lock:
            if state != self.xid_follower:
                self.xid_follower = state
                self._changed()

    def set_slurm(self, view: Optional[SlurmView]) -> None:
        with self._lock:
            self.slurm = view
            if view is not None and view.last_action:
                self.slurm_actions[view.last_action] = self.slurm_actions.get(view.last_action, 0) + 1
            self._changed()

    def set_jobs(self, jobs: Mapping[int, str]) -> None:
        with self._lock:
            if dict(jobs) != self.jobs:
                self.jobs = dict(jobs)
                self._changed()

    def reloaded(self, ok: bool) -> None:
        with self._lock:
            self.reloads["ok" if ok else "error"] += 1
            self.last_reload_ok = ok
            self._changed()

    def state_written(self, ok: bool) -> None:
        with self._lock:
            if ok:
                self.state_written_at = self.clock()
            else:
                self.state_write_errors += 1
            self._changed()

    # ------------------------------------------------------------------ rendering

    def payload(self) -> bytes:
        """The exposition text: the cached round part plus the live tail."""
        with self._lock:
            if self._payload is None:
                self._payload = generate_latest(self.registry)
            body = self._payload
        return body + generate_latest(self.live)

    def payload_gzip(self) -> bytes:
        """The same text gzip-encoded (what Prometheus asks for): the round part is compressed
        once per change, the small live tail per scrape; two gzip members concatenated are one
        valid gzip stream (RFC 1952)."""
        with self._lock:
            if self._payload is None:
                self._payload = generate_latest(self.registry)
            if self._payload_gz is None or self._payload_gz[0] is not self._payload:
                self._payload_gz = (self._payload, gzip.compress(self._payload, compresslevel=6, mtime=0))
            body = self._payload_gz[1]
        return body + gzip.compress(generate_latest(self.live), compresslevel=1, mtime=0)

    def families(self) -> Iterator[Metric]:
        """Called by generate_latest with the lock held (from payload)."""
        build = _gauge("nodehealth_build_info", "nodehealth version and node (value 1)", ["version", "node", "face"])
        build.add_metric([__version__, self.node, self.face], 1.0)
        yield build
        rounds = _counter("nodehealth_rounds", "Rounds of checks completed")
        rounds.add_metric([], float(self.rounds))
        errors = _counter("nodehealth_round_errors", "Rounds that ended in an internal error")
        errors.add_metric([], float(self.round_errors))
        yield from (rounds, errors)
        if self.last_round_at is not None:
            last = _gauge("nodehealth_round_last_timestamp_seconds", "Unix time the last round ended")
            last.add_metric([], self.last_round_at)
            dur = _gauge("nodehealth_round_duration_seconds", "Wall time of the last round")
            dur.add_metric([], self.last_round_duration or 0.0)
            yield from (last, dur)
        timed = _gauge("nodehealth_probe_timed_out", "1 when the probe missed its deadline in the last round "
                       "(NVML: stopped answering part way)", ["probe"])
        total = _counter("nodehealth_probe_timeouts", "Rounds in which the probe missed its deadline", ["probe"])
        for probe in sorted(set(self.timed_out) | set(self.timeouts)):
            timed.add_metric([probe], _b(self.timed_out.get(probe)))
            total.add_metric([probe], float(self.timeouts.get(probe, 0)))
        yield from (timed, total)
        if self.report is not None:
            yield from report_families(self.report)
        obs = self.observations
        if obs is not None and isinstance(obs.nvml, NvmlSnapshot):
            snap = obs.nvml
            sim = _gauge("nodehealth_nvml_simulated", "1 when the GPUs are simulated (a scenario file)")
            sim.add_metric([], _b(snap.simulated))
            ela = _gauge("nodehealth_nvml_probe_duration_seconds", "Time the NVML probe took in the last round")
            ela.add_metric([], snap.elapsed_s)
            yield from (sim, ela)
            yield from gpu_families(snap)
            yield self._job_family(snap)
        else:
            yield self._job_family(None)
        xid = _counter("nodehealth_xid_errors", "XID events read from the kernel log since the daemon started, "
                       "by GPU, XID and our action for it", ["gpu", "xid", "action"])
        for (gpu, num, action), n in sorted(self.xids.items()):
            xid.add_metric([gpu, num, action], float(n))
        follower = _gauge("nodehealth_xid_follower_up", "1 while the kernel-log XID follower runs (state label: "
                          "alive, dead, absent, off)", ["state"])
        follower.add_metric([self.xid_follower], _b(self.xid_follower == "alive"))
        yield from (xid, follower)
        if self.slurm is not None:
            s = self.slurm
            for name, value, doc in (
                    ("nodehealth_slurm_node_drained", s.drained, "1 when Slurm has this node drained (any reason)"),
                    ("nodehealth_slurm_node_drained_by_nodehealth", s.drained_by_nodehealth,
                     "1 when the drain reason is ours (nodehealth: ...)"),
                    ("nodehealth_slurm_breaker_open", s.breaker_open,
                     "1 while the drain-storm breaker holds back a drain this node needs")):
                if value is not None:
                    fam = _gauge(name, doc)
                    fam.add_metric([], _b(value))
                    yield fam
        acts = _counter("nodehealth_slurm_actions", "Slurm decisions the daemon acted on (drained, resumed, held, "
                        "unreachable, ...)", ["action"])
        for action, n in sorted(self.slurm_actions.items()):
            acts.add_metric([action], float(n))
        yield acts
        rel = _counter("nodehealth_config_reloads", "Configuration reloads (SIGHUP) by result", ["result"])
        for result, n in sorted(self.reloads.items()):
            rel.add_metric([result], float(n))
        yield rel
        if self.last_reload_ok is not None:
            ok = _gauge("nodehealth_config_last_reload_success", "1 when the last reload was accepted")
            ok.add_metric([], _b(self.last_reload_ok))
            yield ok
        werr = _counter("nodehealth_state_write_errors", "Failed writes of the daemon state file")
        werr.add_metric([], float(self.state_write_errors))
        yield werr
        if self.state_written_at is not None:
            wat = _gauge("nodehealth_state_last_write_timestamp_seconds", "Unix time the state file was last written")
            wat.add_metric([], self.state_written_at)
            yield wat
        start = _gauge("nodehealth_start_time_seconds", "Unix time the daemon started")
        start.add_metric([], self.started_at)
        yield start

    def _job_family(self, snap: Optional[NvmlSnapshot]) -> Metric:
        fam = _gauge("nodehealth_gpu_job_info", "The Slurm job holding the GPU, from the job ledger (value 1)",
                     (*GPU_LABELS, "job_id"))
        by_index = {g.index: g for g in snap.gpus} if snap is not None else {}
        for index, job in sorted(self.jobs.items()):
            g = by_index.get(index)
            lab = gpu_labels(g) if g is not None else [str(index), "", "", ""]
            fam.add_metric([*lab, job], 1.0)
        return fam

    def live_families(self) -> Iterator[Metric]:
        with self._lock:
            started = self.round_started
        fam = _gauge("nodehealth_round_running_seconds", "How long the round in progress has run (0 between "
                     "rounds); a hung probe shows here before its deadline")
        fam.add_metric([], max(0.0, self.clock() - started) if started is not None else 0.0)
        yield fam


class _Collect:
    """Adapts a generator function to the registry's collector interface."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def collect(self) -> Iterator[Metric]:
        return iter(list(self.fn()))


# ----------------------------------------------------------------------------- textfile


def textfile_path(directory: str, face: str) -> str:
    return os.path.join(directory, f"nodehealth-{face}.prom")


def write_textfile(directory: str, face: str, payload: bytes) -> str:
    """Write node_exporter textfile-collector output atomically (temp, fsync, rename).

    The directory must exist (a missing one is a configuration error, not created here).
    """
    from nodehealth.statedir import files as statefile

    if not os.path.isdir(directory):
        raise FileNotFoundError(f"textfile directory {directory} does not exist")
    path = textfile_path(directory, face)
    statefile.write_atomic(path, payload.decode("utf-8"))
    return path


def face_textfile(directory: str, face: str, node: str, report: Report,
                  observations: Optional[Observations] = None) -> str:
    """For a short-lived face (prolog, epilog, health check): its run's metrics as a textfile."""
    m = NodeMetrics(node, face=face, process=False)
    m.update_round(report, observations)
    with m._lock:
        body = generate_latest(m.registry)
    return write_textfile(directory, face, body)
