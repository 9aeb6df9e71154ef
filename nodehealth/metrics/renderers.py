"""A round's Report and NVML snapshot as metric families of the table (families.py).

A GPU field NVML did not report (``None``) gives no sample rather than a made-up value.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Optional

from nodehealth.metrics.exposition import Metric
from nodehealth.metrics.families import FAMILIES, GPU, NVLINK_COUNTERS, THROTTLE_REASONS, Series, new, one
from nodehealth.model import Report, Status
from nodehealth.observations import GpuObservation, NvmlSnapshot, Observations, ProbeError

# nvmlClocksEventReason* bits (nvml.h), in the order of families.THROTTLE_REASONS.
THROTTLE_BITS = tuple(zip((1 << n for n in range(len(THROTTLE_REASONS))), THROTTLE_REASONS))


def b(value: Any) -> float:
    return 1.0 if value else 0.0


def gpu_labels(gpu: GpuObservation) -> list[str]:
    return [str(gpu.index), gpu.uuid or "", gpu.pci_bus_id or "", gpu.name or ""]


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


def report_families(report: Report, detail: bool = False) -> Iterator[Metric]:
    status, duration = new("nodehealth_check_status"), new("nodehealth_check_duration_seconds", detail)
    for r in report.results:
        status.add([r.name], int(r.status))
        duration.add([r.name], r.duration_s)
    yield from (status, duration) if detail else (status,)
    yield one("nodehealth_node_status", int(report.status))
    yield one("nodehealth_node_failing_checks", sum(1 for r in report.results if r.status == Status.FAIL))
    yield from nccl_families(report)
    yield from infiniband_families(report)
    yield from services_families(report)
    yield from sxid_families(report)
    yield from host_error_families(report)


def services_families(report: Report) -> Iterator[Metric]:
    """host_services' units and modules not running or not loaded, from its result's details (``judged``)."""
    result = next((r for r in report.results if r.name == "host_services"), None)
    judged = result.details.get("judged") if result is not None else None
    if not isinstance(judged, dict) or not judged:
        return
    down = new("nodehealth_host_service_down")
    for name, seen in sorted(judged.items()):
        if isinstance(seen, dict) and isinstance(seen.get("ok"), bool):
            down.add([name], 0 if seen["ok"] else 1)
    yield down


def infiniband_families(report: Report) -> Iterator[Metric]:
    """host_infiniband's flaps and counter increases per port, from its result's details (``ports``)."""
    result = next((r for r in report.results if r.name == "host_infiniband"), None)
    ports = result.details.get("ports") if result is not None else None
    if not isinstance(ports, dict) or not ports:
        return
    flaps, rose = new("nodehealth_ib_port_flaps"), new("nodehealth_ib_port_error_increase")
    for name, port in sorted(ports.items()):
        if not isinstance(port, dict):
            continue
        if isinstance(port.get("flaps"), int):
            flaps.add([name], port["flaps"])
        for counter, value in sorted((port.get("increase") or {}).items()):
            if isinstance(value, int):
                rose.add([name, counter], value)
    yield from (flaps, rose)


def sxid_families(report: Report) -> Iterator[Metric]:
    """gpu_sxid's SXid events this boot per NVSwitch and class, from its result's details (``counts``)."""
    result = next((r for r in report.results if r.name == "gpu_sxid"), None)
    counts = result.details.get("counts") if result is not None else None
    if not isinstance(counts, dict) or not counts:
        return
    sxid = new("nodehealth_nvswitch_sxid_errors_total")
    for switch, by_class in sorted(counts.items()):
        for klass, n in sorted(by_class.items()) if isinstance(by_class, dict) else ():
            if isinstance(n, int):
                sxid.add([switch, klass], n)
    yield sxid


def host_error_families(report: Report) -> Iterator[Metric]:
    """host_pcie_aer's, host_edac's and host_dstate's counts, from their results' details."""
    details = {r.name: r.details for r in report.results if r.name in ("host_pcie_aer", "host_edac", "host_dstate")}
    devices = details.get("host_pcie_aer", {}).get("devices")
    if isinstance(devices, dict) and devices:
        aer = new("nodehealth_pcie_aer_errors_total")
        for bus_id, seen in sorted(devices.items()):
            for klass in ("correctable", "nonfatal", "fatal"):
                n = seen.get(klass) if isinstance(seen, dict) else None
                if isinstance(n, int):
                    aer.add([bus_id, str(seen.get("kind", "")), klass], n)
        yield aer
    controllers = details.get("host_edac", {}).get("controllers")
    if isinstance(controllers, dict) and controllers:
        edac = new("nodehealth_edac_errors_total")
        for name, seen in sorted(controllers.items()):
            for key, kind in (("ce", "corrected"), ("ue", "uncorrected")):
                n = seen.get(key) if isinstance(seen, dict) else None
                if isinstance(n, int):
                    edac.add([name, kind], n)
        yield edac
    pids = details.get("host_dstate", {}).get("pids")
    if isinstance(pids, list):
        yield one("nodehealth_dstate_gpu_holders", len(pids))


NCCL_CHECK = "nccl_selftest"


def nccl_families(report: Report) -> Iterator[Metric]:
    """The NCCL self-test's families from its result's details (``runs``: one entry per mode)."""
    result = next((r for r in report.results if r.name == NCCL_CHECK), None)
    runs = result.details.get("runs") if result is not None else None
    if not isinstance(runs, dict) or not runs:
        return
    names = (
        "nodehealth_nccl_busbw_gbps",
        "nodehealth_nccl_floor_gbps",
        "nodehealth_nccl_selftest_status",
        "nodehealth_nccl_transport_info",
        "nodehealth_nccl_last_run_timestamp_seconds",
        "nodehealth_nccl_run_duration_seconds",
    )
    bw, floor, status, transport, last, took = (new(n) for n in names)
    for mode, run in sorted(runs.items()):
        if not isinstance(run, dict):
            continue
        if isinstance(run.get("busbw_gbps"), (int, float)):
            bw.add([mode], run["busbw_gbps"])
        if isinstance(run.get("floor_gbps"), (int, float)):
            floor.add([mode], run["floor_gbps"])
        if run.get("status") in Status.__members__:
            status.add([mode], int(Status[run["status"]]))
        if run.get("transport"):
            transport.add([mode, str(run["transport"])], 1)
        if isinstance(run.get("finished_at"), (int, float)) and run["finished_at"] > 0:
            last.add([mode], run["finished_at"])
        if isinstance(run.get("elapsed_s"), (int, float)):
            took.add([mode], run["elapsed_s"])
    yield from (bw, floor, status, transport, last, took)


# Per-GPU families with one sample per GPU: how to read the value (None: no sample).
GPU_VALUES: tuple[tuple[str, Callable[[GpuObservation], Any]], ...] = (
    ("nodehealth_gpu_lost", lambda g: b(g.lost)),
    ("nodehealth_gpu_temperature_celsius", lambda g: g.temperature_c),
    ("nodehealth_gpu_temperature_slowdown_celsius", lambda g: g.slowdown_c),
    ("nodehealth_gpu_power_watts", lambda g: g.power_w),
    ("nodehealth_gpu_power_limit_watts", lambda g: g.power_limit_w),
    ("nodehealth_gpu_power_default_limit_watts", lambda g: g.power_default_limit_w),
    (
        "nodehealth_gpu_utilization_ratio",
        lambda g: None if g.utilization_gpu_pct is None else g.utilization_gpu_pct / 100.0,
    ),
    (
        "nodehealth_gpu_memory_utilization_ratio",
        lambda g: None if g.utilization_memory_pct is None else g.utilization_memory_pct / 100.0,
    ),
    ("nodehealth_gpu_memory_used_bytes", lambda g: g.memory_used_bytes),
    ("nodehealth_gpu_memory_total_bytes", lambda g: g.memory_total_bytes),
    ("nodehealth_gpu_ecc_enabled", lambda g: None if g.ecc_enabled is None else b(g.ecc_enabled)),
    ("nodehealth_gpu_row_remap_pending", lambda g: None if g.remapped_rows is None else b(g.remapped_rows.pending)),
    ("nodehealth_gpu_row_remap_failed", lambda g: None if g.remapped_rows is None else b(g.remapped_rows.failure)),
    (
        "nodehealth_gpu_retired_pages_pending",
        lambda g: None if g.retired_pages_pending is None else b(g.retired_pages_pending),
    ),
    ("nodehealth_gpu_pcie_link_width", lambda g: g.pcie_width),
    ("nodehealth_gpu_pcie_link_width_max", lambda g: g.pcie_max_width),
    ("nodehealth_gpu_pcie_link_generation", lambda g: g.pcie_gen),
    ("nodehealth_gpu_pcie_link_generation_max", lambda g: g.pcie_max_gen),
    (
        "nodehealth_gpu_persistence_mode_enabled",
        lambda g: None if g.persistence_mode is None else b(g.persistence_mode),
    ),
    ("nodehealth_gpu_recovery_action", lambda g: g.recovery_action),
    ("nodehealth_gpu_fabric_state", lambda g: g.fabric_state),
    ("nodehealth_gpu_processes", lambda g: None if g.processes is None else len(g.processes)),
)


def _gpu_series(detail: bool) -> dict[str, Series]:
    """Every per-GPU family of the table but the job ledger's, created empty, in the table's order."""
    return {f.name: new(f.name, detail) for f in FAMILIES if f.per_gpu and f.name != "nodehealth_gpu_job_info"}


def gpu_families(snap: NvmlSnapshot, detail: bool = False) -> Iterator[Metric]:
    """The per-GPU families of a snapshot; without ``detail``, what the default page carries of them."""
    yield one("nodehealth_nvml_devices", snap.device_count if snap.device_count is not None else len(snap.gpus))
    fams = _gpu_series(detail)
    info, ecc = fams["nodehealth_gpu_info"], fams["nodehealth_gpu_ecc_errors_total"]
    remapped, retired = fams["nodehealth_gpu_remapped_rows"], fams["nodehealth_gpu_retired_pages"]
    nvl_up, nvl_err = fams["nodehealth_gpu_nvlink_up"], fams["nodehealth_gpu_nvlink_link_errors_total"]
    nvl_total = fams["nodehealth_gpu_nvlink_errors_total"]
    throttle = fams["nodehealth_gpu_throttle_reason_active"]
    throttled = fams["nodehealth_gpu_throttle_seconds_total"]
    for g in snap.gpus:
        lab = gpu_labels(g)
        info.add([*lab, snap.driver_version or ""], 1)
        for name, read in GPU_VALUES:
            value = read(g)
            if value is not None:
                fams[name].add(lab, value)
        for value, typ, scope in (
            (g.ecc.volatile_corrected, "corrected", "volatile"),
            (g.ecc.volatile_uncorrected, "uncorrected", "volatile"),
            (g.ecc.aggregate_corrected, "corrected", "aggregate"),
            (g.ecc.aggregate_uncorrected, "uncorrected", "aggregate"),
        ):
            if value is not None:
                ecc.add([*lab, typ, scope], value)
        if g.remapped_rows is not None:
            remapped.add([*lab, "correctable"], g.remapped_rows.correctable)
            remapped.add([*lab, "uncorrectable"], g.remapped_rows.uncorrectable)
        if g.retired_pages_sbe is not None:
            retired.add([*lab, "sbe"], g.retired_pages_sbe)
        if g.retired_pages_dbe is not None:
            retired.add([*lab, "dbe"], g.retired_pages_dbe)
        errors: Optional[int] = None
        for link in g.nvlinks or ():
            nvl_up.add([*lab, str(link.link)], b(link.active))
            for typ in NVLINK_COUNTERS:
                value = getattr(link, typ)
                if value is not None:
                    nvl_err.add([*lab, str(link.link), typ], value)
                    errors = (errors or 0) + value
        if errors is not None:
            nvl_total.add(lab, errors)
        if g.throttle_reasons is not None:
            for bit, reason in THROTTLE_BITS:
                throttle.add([*lab, reason], b(g.throttle_reasons & bit))
        for reason, ns in g.throttle_ns or ():
            throttled.add([*lab, reason], ns / 1e9)
    yield from (f for f in fams.values() if detail or not f.family.detail)


def job_family(jobs: dict[int, str], snap: Optional[NvmlSnapshot]) -> Metric:
    """The job ledger's GPU -> job, labelled like the GPU families (only the index for a GPU not read)."""
    fam = new("nodehealth_gpu_job_info")
    by_index = {g.index: g for g in snap.gpus} if snap is not None else {}
    for index, job in sorted(jobs.items()):
        g = by_index.get(index)
        lab = gpu_labels(g) if g is not None else [str(index), "", "", ""]
        fam.add([*lab, job], 1)
    return fam


__all__ = ["GPU", "b", "gpu_families", "gpu_labels", "job_family", "probe_timeouts", "report_families"]
