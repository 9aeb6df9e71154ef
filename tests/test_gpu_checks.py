"""Table tests of every GPU check's pure ``evaluate`` over hand-built observations.

Each row: a check, the observations (built from a healthy H100 with the fields that matter
changed), optional settings and phase, and the verdict (status, action, GPU, a piece of the
summary). No probe, no fork, no file: milliseconds.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType
from typing import Any, Optional, Union

import pytest

from nodehealth.checks import (
    gpu_count,
    gpu_driver,
    gpu_ecc,
    gpu_fabric,
    gpu_nvlink,
    gpu_pcie,
    gpu_persistence,
    gpu_processes,
    gpu_recovery_action,
    gpu_remapped_rows,
    gpu_retired_pages,
    gpu_temperature,
    gpu_throttle,
    nvml,
)
from nodehealth.checks.base import Context
from nodehealth.model import Action, Status
from nodehealth.observations import (
    EccCounts,
    FieldError,
    GpuObservation,
    GpuProcess,
    NvLink,
    NvmlSnapshot,
    Observations,
    PciGpus,
    ProbeError,
    RemappedRows,
    SlurmNode,
)
from nodehealth.registry import CHECKS
from nodehealth.slurm.nodes import parse_state

OK, SKIPPED, WARN, UNKNOWN, FAIL = Status.OK, Status.SKIPPED, Status.WARN, Status.UNKNOWN, Status.FAIL
NONE, RESTART, RESET, REBOOT, INSPECT = (
    Action.NONE,
    Action.RESTART_APP,
    Action.RESET_GPU,
    Action.REBOOT,
    Action.INSPECT,
)
BUS = (
    "0000:18:00.0",
    "0000:2a:00.0",
    "0000:3a:00.0",
    "0000:5d:00.0",
    "0000:9a:00.0",
    "0000:ab:00.0",
    "0000:ba:00.0",
    "0000:db:00.0",
)

# From the registry: every check that judges NVML's snapshot; all but the three that judge the node's
# answer as a whole are per-GPU (a new one is in the per-GPU tables below by its registry line).
ALL = tuple(spec.module for spec in CHECKS if "nvml" in spec.needs)
NODE_WIDE = (nvml, gpu_count, gpu_driver)
PER_GPU = tuple(m for m in ALL if m not in NODE_WIDE)


def h100(index: int = 0, **changes: Any) -> GpuObservation:
    """A healthy, idle H100 SXM as the probe reads it."""
    gpu = GpuObservation(
        index=index,
        name="NVIDIA H100 80GB HBM3",
        uuid=f"GPU-{index}",
        pci_bus_id=BUS[index],
        temperature_c=34,
        slowdown_c=87,
        shutdown_c=92,
        power_w=71.5,
        power_limit_w=700.0,
        power_default_limit_w=700.0,
        utilization_gpu_pct=0,
        utilization_memory_pct=0,
        memory_used_bytes=0,
        memory_total_bytes=81559 << 20,
        ecc_enabled=True,
        ecc_pending_enabled=True,
        ecc=EccCounts(0, 0, 0, 0),
        retired_pages_sbe=0,
        retired_pages_dbe=0,
        retired_pages_pending=False,
        remapped_rows=RemappedRows(0, 0, False, False),
        pcie_gen=5,
        pcie_max_gen=5,
        pcie_width=16,
        pcie_max_width=16,
        nvlinks=tuple(NvLink(n, True, 0, 0, 0, 0) for n in range(18)),
        fabric_state=3,
        fabric_status=None,
        processes=(),
        throttle_reasons=0x1,
        persistence_mode=True,
        recovery_action=0,
    )
    return replace(gpu, **changes)


def bare(index: int = 0) -> GpuObservation:
    """A GPU on which NVML answered "not supported" to everything (every field None)."""
    return GpuObservation(index=index, pci_bus_id=BUS[index])


def node(*gpus: GpuObservation, pci: Any = BUS, slurm: Any = None, **snap: Any) -> Observations:
    """Observations of a node with these GPUs (default: 8 healthy H100)."""
    gpus = gpus or tuple(h100(i) for i in range(8))
    base = dict(
        driver_version="550.127.05",
        cuda_driver_version=12040,
        device_count=len(gpus),
        gpus=gpus,
        elapsed_s=0.05,
        complete=True,
        timeout_s=10.0,
    )
    base.update(snap)
    return Observations(
        nvml=NvmlSnapshot(**base), pci_gpus=None if pci is None else PciGpus(tuple(pci), "sysfs"), slurm_node=slurm
    )


def eight(changed: int, **changes: Any) -> Observations:
    """8 healthy H100, GPU ``changed`` with ``changes``."""
    return node(*(h100(i, **changes) if i == changed else h100(i) for i in range(8)))


def all_down(name: Optional[str], fabric_state: Optional[int], links: int, gpus: int = 8) -> Observations:
    """``gpus`` GPUs named ``name``, every one of their ``links`` NVLinks inactive."""
    return node(
        *(
            h100(i, name=name, fabric_state=fabric_state, nvlinks=tuple(NvLink(n, False) for n in range(links)))
            for i in range(gpus)
        )
    )


def without(nvml_value: Any, pci: Any = BUS, slurm: Any = None) -> Observations:
    return Observations(
        nvml=nvml_value, pci_gpus=None if pci is None else PciGpus(tuple(pci), "sysfs"), slurm_node=slurm
    )


@dataclass(frozen=True)
class Row:
    id: str
    check: ModuleType
    obs: Observations
    status: Status
    action: Action = NONE
    gpu: Optional[int] = None
    summary_has: str = ""
    settings: dict[str, Any] = field(default_factory=dict)
    phase: str = "manual"
    expected: Union[int, str] = 8


def lost_field(name: str, kind: str) -> tuple[FieldError, ...]:
    return (FieldError(name, kind, f"nvmlDeviceGetX: {kind}"),)


TIMEOUT = ProbeError("nvml", "timeout", "nvml probe did not finish within 10.2 s")
MISSING = ProbeError("nvml", "unavailable", "nvmlInit: Library not found")
BROKEN = ProbeError("nvml", "error", "nvmlInit: Unknown")
STALLED_AT_INIT = NvmlSnapshot(
    None,
    None,
    None,
    (),
    elapsed_s=1.0,
    complete=False,
    timeout_s=10.0,
    stalled_gpu=None,
    stalled_call="nvmlInit",
    stop="hung",
    call_timeout_s=1.0,
)
STALLED_AT_GPU4 = NvmlSnapshot(
    "550.127.05",
    12040,
    8,
    tuple(h100(i) for i in range(4)),
    elapsed_s=1.0,
    complete=False,
    timeout_s=10.0,
    stalled_gpu=4,
    stalled_call="nvmlDeviceGetFieldValues",
    stop="hung",
    call_timeout_s=1.0,
)
# Slow, not hung: the read's budget ended while GPU 3 was still being opened.
SLOW_AT_GPU3 = NvmlSnapshot(
    "550.127.05",
    12040,
    8,
    tuple(h100(i) for i in range(3)),
    elapsed_s=2.0,
    complete=False,
    timeout_s=2.0,
    stalled_gpu=3,
    stalled_call="nvmlDeviceGetHandleByIndex",
    stop="budget",
    call_timeout_s=8.0,
    in_flight_s=0.4,
)


def slurm_node(gres_gpus: Optional[int]) -> SlurmNode:
    return SlurmNode("n1", parse_state("IDLE"), gres_gpus=gres_gpus)


ROWS = [
    # ---------------------------------------------------------------- nvml
    Row("nvml-ok", nvml, node(), OK, summary_has="driver 550.127.05, 8 GPU(s)"),
    Row("nvml-probe-timeout", nvml, without(TIMEOUT), FAIL, REBOOT, None, "did not answer"),
    Row(
        "nvml-stalled-in-init",
        nvml,
        without(STALLED_AT_INIT),
        FAIL,
        REBOOT,
        None,
        "NVML: nvmlInit did not return within 1 s (hung)",
    ),
    Row(
        "nvml-stalled-on-gpu4",
        nvml,
        without(STALLED_AT_GPU4),
        FAIL,
        REBOOT,
        4,
        "GPU 4: nvmlDeviceGetFieldValues did not return within 1 s (hung)",
    ),
    Row(
        "nvml-unreachable-handle",
        nvml,
        eight(
            3, unreachable=True, errors=(FieldError("handle", "unknown", "nvmlDeviceGetHandleByIndex: Unknown Error"),)
        ),
        FAIL,
        REBOOT,
        3,
        "unable to determine the device handle",
    ),
    Row(
        "nvml-unreachable-insufficient-power",
        nvml,
        eight(
            3,
            unreachable=True,
            errors=(
                FieldError("handle", "insufficient_power", "nvmlDeviceGetHandleByIndex: Insufficient External Power"),
            ),
        ),
        FAIL,
        INSPECT,
        3,
    ),
    Row(
        "nvml-init-no-permission",
        nvml,
        without(ProbeError("nvml", "permission", "nvmlInit: No permission")),
        FAIL,
        INSPECT,
        None,
        "refused access",
    ),
    Row(
        "nvml-slow-not-hung",
        nvml,
        without(SLOW_AT_GPU3),
        UNKNOWN,
        NONE,
        None,
        "3 of 8 GPU(s) read in 2.0 s (budget 2 s); GPU(s) 3, 4, 5, 6, 7 not read",
    ),
    Row(
        "temperature-slow-judges-what-was-read",
        gpu_temperature,
        without(SLOW_AT_GPU3),
        OK,
        summary_has="(5 GPU(s) not read",
    ),
    Row("nvml-unavailable-gpus-expected", nvml, without(MISSING), FAIL, INSPECT, None, "GPUs are expected"),
    Row("nvml-unavailable-gpus-expected-auto-pci", nvml, without(MISSING), FAIL, INSPECT, expected="auto"),
    Row(
        "nvml-unavailable-no-gpu-expected",
        nvml,
        without(MISSING, pci=()),
        SKIPPED,
        expected=0,
        summary_has="no GPU expected ([gpu] expected_count = 0)",
    ),
    Row(
        "nvml-unavailable-auto-empty-pci",
        nvml,
        without(MISSING, pci=()),
        SKIPPED,
        expected="auto",
        summary_has="no GPU expected (no NVIDIA GPU on the PCI bus)",
    ),
    Row(
        "nvml-unavailable-auto-slurm-no-gpu-gres-pci-has-gpus",
        nvml,
        without(MISSING, pci=BUS, slurm=slurm_node(None)),
        FAIL,
        INSPECT,
        expected="auto",
    ),
    Row("nvml-init-error", nvml, without(BROKEN), FAIL, REBOOT, None, "NVML failed"),
    Row("nvml-not-probed", nvml, without(None), UNKNOWN),
    Row("nvml-gpu-lost", nvml, eight(3, lost=True), FAIL, REBOOT, 3, "GPU 3 (0000:5d:00.0): GPU is lost"),
    Row(
        "nvml-two-gpus-lost-names-first",
        nvml,
        node(*(h100(i, lost=i in (2, 6)) for i in range(8))),
        FAIL,
        REBOOT,
        2,
        "GPU 6",
    ),
    # ---------------------------------------------------------------- gpu_count
    Row("count-ok-config", gpu_count, node(), OK, summary_has="as expected from config"),
    Row(
        "count-missing-names-pci",
        gpu_count,
        node(*(h100(i) for i in range(7))),
        FAIL,
        REBOOT,
        None,
        "7 of 8 GPUs visible",
    ),
    Row("count-more-than-expected", gpu_count, node(), WARN, expected=4, summary_has="8 GPUs visible, 4 expected"),
    Row(
        "count-auto-from-slurm-gres",
        gpu_count,
        node(slurm=slurm_node(8)),
        OK,
        expected="auto",
        summary_has="slurm gres",
    ),
    Row(
        "count-auto-slurm-says-more",
        gpu_count,
        node(slurm=slurm_node(10)),
        FAIL,
        REBOOT,
        expected="auto",
        summary_has="8 of 10",
    ),
    Row(
        "count-auto-from-pci",
        gpu_count,
        node(*(h100(i) for i in range(7))),
        FAIL,
        REBOOT,
        expected="auto",
        summary_has="pci",
    ),
    Row(
        "count-auto-unknown",
        gpu_count,
        node(pci=None, slurm=ProbeError("slurm_node", "timeout", "slow")),
        WARN,
        expected="auto",
        summary_has="expected count unknown",
    ),
    # MIG: Slurm's Gres counts MIG devices (here 16), the bus counts GPUs (8).
    Row(
        "count-mig-slurm-counts-slices",
        gpu_count,
        node(*(h100(i, mig_enabled=True) for i in range(8)), slurm=slurm_node(16)),
        OK,
        expected="auto",
        summary_has="MIG enabled",
    ),
    Row("count-stalled-before-any-gpu", gpu_count, without(STALLED_AT_INIT), UNKNOWN, summary_has="no NVML data"),
    Row("count-stalled-on-gpu4-knows-count", gpu_count, without(STALLED_AT_GPU4), OK),
    # ---------------------------------------------------------------- gpu_driver
    Row("driver-ok-no-list", gpu_driver, node(), OK, summary_has="no allowed list"),
    Row("driver-allowed-exact", gpu_driver, node(), OK, settings={"allowed": ("550.127.05",)}),
    Row("driver-allowed-prefix-dot", gpu_driver, node(), OK, settings={"allowed": ("535.", "550.")}),
    Row("driver-allowed-prefix-star", gpu_driver, node(), OK, settings={"allowed": ("550.1*",)}),
    Row(
        "driver-not-allowed",
        gpu_driver,
        node(),
        FAIL,
        INSPECT,
        None,
        "not in the allowed list",
        settings={"allowed": ("535.", "550.127.08")},
    ),
    Row("driver-prefix-without-dot-is-exact", gpu_driver, node(), FAIL, INSPECT, settings={"allowed": ("550",)}),
    Row("driver-unreported", gpu_driver, node(driver_version=None), UNKNOWN),
    # ---------------------------------------------------------------- gpu_temperature
    Row("temp-ok", gpu_temperature, node(), OK),
    Row("temp-near-slowdown-warn", gpu_temperature, eight(5, temperature_c=80), WARN, INSPECT, 5, "within 7 C"),
    Row(
        "temp-at-slowdown-fail",
        gpu_temperature,
        eight(2, temperature_c=87),
        FAIL,
        INSPECT,
        2,
        "slowdown threshold 87 C",
    ),
    Row(
        "temp-fallback-threshold",
        gpu_temperature,
        eight(1, temperature_c=85, slowdown_c=None),
        FAIL,
        INSPECT,
        1,
        "slowdown threshold 85 C",
    ),
    Row(
        "temp-hw-thermal-slowdown-warn",
        gpu_temperature,
        eight(4, throttle_reasons=0x40),
        WARN,
        INSPECT,
        4,
        "HW thermal slowdown",
    ),
    Row(
        "temp-power-brake-fail-when-configured",
        gpu_temperature,
        eight(6, throttle_reasons=0x80),
        FAIL,
        INSPECT,
        6,
        "power brake",
        settings={"hw_slowdown": "fail"},
    ),
    Row(
        "temp-hw-slowdown-ignored",
        gpu_temperature,
        eight(6, throttle_reasons=0x08),
        OK,
        settings={"hw_slowdown": "ignore"},
    ),
    Row("temp-software-reasons-not-judged", gpu_temperature, eight(0, throttle_reasons=0x1 | 0x4 | 0x10), OK),
    # SW thermal slowdown (0x20): the driver slows the GPU for heat (Hopper: for hot HBM).
    Row(
        "temp-sw-thermal-slowdown",
        gpu_temperature,
        eight(0, throttle_reasons=0x20),
        WARN,
        INSPECT,
        0,
        "SW thermal slowdown",
    ),
    Row(
        "temp-hbm-near-max",
        gpu_temperature,
        eight(3, memory_temp_c=90, mem_max_c=95),
        WARN,
        INSPECT,
        3,
        "memory (HBM) 90 C",
    ),
    Row(
        "temp-hbm-at-max",
        gpu_temperature,
        eight(3, memory_temp_c=95, mem_max_c=95),
        FAIL,
        INSPECT,
        3,
        "max operating 95 C",
    ),
    Row(
        "temp-throttle-error-unknown",
        gpu_temperature,
        eight(1, errors=(FieldError("throttle", "unknown", "x"),)),
        UNKNOWN,
        NONE,
        1,
    ),
    Row(
        "temp-fail-beats-warn-on-other-gpu",
        gpu_temperature,
        node(*(h100(i, temperature_c={1: 82, 3: 90}.get(i, 34)) for i in range(8))),
        FAIL,
        INSPECT,
        3,
    ),
    Row("temp-not-supported", gpu_temperature, node(*(bare(i) for i in range(8))), SKIPPED),
    Row(
        "temp-nvml-error-unknown",
        gpu_temperature,
        eight(3, temperature_c=None, errors=lost_field("temperature", "error")),
        UNKNOWN,
        NONE,
        3,
    ),
    Row(
        "temp-reset-required",
        gpu_temperature,
        eight(3, errors=lost_field("temperature", "reset_required")),
        FAIL,
        RESET,
        3,
    ),
    # ---------------------------------------------------------------- gpu_ecc
    Row("ecc-ok", gpu_ecc, node(), OK),
    # Current and pending off: a reset keeps it off, so the action is a person's (inspect).
    Row(
        "ecc-disabled",
        gpu_ecc,
        eight(2, ecc_enabled=False, ecc_pending_enabled=False),
        FAIL,
        INSPECT,
        2,
        "ECC disabled (pending mode off too",
    ),
    # Off now, on after the next reset: the reset is the repair.
    Row(
        "ecc-disabled-pending-on",
        gpu_ecc,
        eight(2, ecc_enabled=False, ecc_pending_enabled=True),
        FAIL,
        RESET,
        2,
        "enabled at the next reset",
    ),
    Row(
        "ecc-disabled-after-reset",
        gpu_ecc,
        eight(2, ecc_pending_enabled=False),
        FAIL,
        INSPECT,
        2,
        "disabled after the next reset",
    ),
    Row(
        "ecc-disabled-warn", gpu_ecc, eight(2, ecc_enabled=False), WARN, RESET, 2, settings={"require_enabled": "warn"}
    ),
    Row("ecc-disabled-ignored", gpu_ecc, eight(2, ecc_enabled=False), OK, settings={"require_enabled": "ignore"}),
    Row(
        "ecc-volatile-uncorrected",
        gpu_ecc,
        eight(6, ecc=EccCounts(0, 2, 0, 2)),
        FAIL,
        RESET,
        6,
        "2 volatile uncorrectable",
    ),
    Row(
        "ecc-volatile-uncorrected-under-threshold",
        gpu_ecc,
        eight(6, ecc=EccCounts(0, 2, 0, 2)),
        OK,
        settings={"max_volatile_uncorrected": 2},
    ),
    Row(
        "ecc-aggregate-uncorrected",
        gpu_ecc,
        eight(1, ecc=EccCounts(0, 0, 0, 11)),
        WARN,
        INSPECT,
        1,
        "11 uncorrectable ECC errors over its life",
    ),
    Row("ecc-many-corrected", gpu_ecc, eight(7, ecc=EccCounts(10001, 0, 10001, 0)), WARN, NONE, 7, "10001 corrected"),
    Row("ecc-counters-not-supported", gpu_ecc, eight(7, ecc=EccCounts()), OK),
    Row("ecc-not-supported", gpu_ecc, node(*(bare(i) for i in range(8))), SKIPPED),
    Row("ecc-nvml-error", gpu_ecc, eight(0, errors=lost_field("ecc_errors", "no_permission")), UNKNOWN, NONE, 0),
    # ---------------------------------------------------------------- gpu_retired_pages
    Row("retired-ok", gpu_retired_pages, node(), OK),
    Row(
        "retired-pending",
        gpu_retired_pages,
        eight(1, retired_pages_dbe=2, retired_pages_pending=True),
        FAIL,
        RESET,
        1,
        "page retirement pending",
    ),
    Row(
        "retired-too-many",
        gpu_retired_pages,
        eight(5, retired_pages_sbe=40, retired_pages_dbe=20),
        FAIL,
        INSPECT,
        5,
        "60 retired pages",
    ),
    Row(
        "retired-pending-and-too-many-inspect-wins",
        gpu_retired_pages,
        eight(5, retired_pages_sbe=64, retired_pages_pending=True),
        FAIL,
        INSPECT,
        5,
    ),
    Row("retired-some-pages-fine", gpu_retired_pages, eight(5, retired_pages_sbe=3), OK),
    Row("retired-not-supported", gpu_retired_pages, node(*(bare(i) for i in range(8))), SKIPPED),
    Row(
        "retired-nvml-error", gpu_retired_pages, eight(4, errors=lost_field("retired_pages", "error")), UNKNOWN, NONE, 4
    ),
    # ---------------------------------------------------------------- gpu_remapped_rows
    Row("remap-ok", gpu_remapped_rows, node(), OK),
    Row("remap-correctable-only-ok", gpu_remapped_rows, eight(1, remapped_rows=RemappedRows(3, 0, False, False)), OK),
    Row(
        "remap-pending",
        gpu_remapped_rows,
        eight(1, remapped_rows=RemappedRows(0, 1, True, False)),
        FAIL,
        RESET,
        1,
        "row remap pending",
    ),
    Row(
        "remap-failure",
        gpu_remapped_rows,
        eight(4, remapped_rows=RemappedRows(2, 9, False, True)),
        FAIL,
        INSPECT,
        4,
        "row remapping failed",
    ),
    Row(
        "remap-failure-and-pending-inspect-wins",
        gpu_remapped_rows,
        eight(4, remapped_rows=RemappedRows(0, 9, True, True)),
        FAIL,
        INSPECT,
        4,
    ),
    Row("remap-not-supported-volta", gpu_remapped_rows, eight(0, remapped_rows=None), OK),
    Row("remap-not-supported-anywhere", gpu_remapped_rows, node(*(bare(i) for i in range(8))), SKIPPED),
    Row(
        "remap-nvml-error", gpu_remapped_rows, eight(2, errors=lost_field("remapped_rows", "timeout")), UNKNOWN, NONE, 2
    ),
    # ---------------------------------------------------------------- gpu_pcie
    Row("pcie-ok", gpu_pcie, node(), OK),
    Row("pcie-narrow", gpu_pcie, eight(7, pcie_width=8), FAIL, INSPECT, 7, "x8, capable of x16"),
    Row("pcie-narrow-warn", gpu_pcie, eight(7, pcie_width=8), WARN, INSPECT, 7, settings={"width": "warn"}),
    Row("pcie-narrow-ignored", gpu_pcie, eight(7, pcie_width=8), OK, settings={"width": "ignore"}),
    Row("pcie-low-gen-idle-ok", gpu_pcie, eight(3, pcie_gen=1), OK),
    Row(
        "pcie-low-gen-busy-warn",
        gpu_pcie,
        eight(3, pcie_gen=3, utilization_gpu_pct=90),
        WARN,
        INSPECT,
        3,
        "Gen3 under load",
    ),
    Row(
        "pcie-low-gen-busy-fail",
        gpu_pcie,
        eight(3, pcie_gen=3, utilization_gpu_pct=90),
        FAIL,
        INSPECT,
        3,
        settings={"generation": "fail"},
    ),
    Row("pcie-not-supported", gpu_pcie, node(*(bare(i) for i in range(8))), SKIPPED),
    # ---------------------------------------------------------------- gpu_nvlink
    Row("nvlink-ok", gpu_nvlink, node(), OK),
    # PCIe cards with NVLink hardware and no bridge: every link of every GPU down is "not connected".
    Row(
        "nvlink-unbridged-pcie-not-judged",
        gpu_nvlink,
        all_down("NVIDIA A100 80GB PCIe", None, 12),
        SKIPPED,
        summary_has="no NVLink bridges fitted",
    ),
    Row(
        "nvlink-unbridged-h100-nvl-not-judged",
        gpu_nvlink,
        all_down("NVIDIA H100 NVL", 0, 18, gpus=4),
        SKIPPED,
        summary_has="no NVLink bridges fitted",
    ),
    # An SXM board (HGX, NVSwitch) has no optional bridge: every link down there is a fault.
    Row(
        "nvlink-all-down-sxm-fabric-completed",
        gpu_nvlink,
        all_down("NVIDIA H100 80GB HBM3", 3, 18),
        FAIL,
        REBOOT,
        0,
        "every NVLink of every GPU inactive",
    ),
    Row("nvlink-all-down-a100-sxm-no-fabric", gpu_nvlink, all_down("NVIDIA A100-SXM4-80GB", None, 12), FAIL, REBOOT, 0),
    # A PCIe name in an NVSwitch fabric, or a GPU whose name NVML did not give: not "no bridge".
    Row("nvlink-all-down-pcie-name-in-a-fabric", gpu_nvlink, all_down("NVIDIA H100 PCIe", 3, 18), FAIL, REBOOT, 0),
    Row("nvlink-all-down-name-unknown", gpu_nvlink, all_down(None, None, 12), FAIL, REBOOT, 0),
    Row(
        "nvlink-unbridged-but-expected",
        gpu_nvlink,
        node(*(h100(i, nvlinks=tuple(NvLink(n, False, 0, 0) for n in range(12))) for i in range(8))),
        FAIL,
        RESET,
        0,
        settings={"expected_links": 12},
    ),
    # One GPU's links all down while the others are up: bridges are fitted, so that is a fault.
    Row(
        "nvlink-one-gpu-all-down",
        gpu_nvlink,
        eight(4, nvlinks=tuple(NvLink(n, False, 0, 0) for n in range(18))),
        FAIL,
        RESET,
        4,
    ),
    # Blackwell: per-link counters unsupported are None, not 0 — and not judged.
    Row("nvlink-no-counters", gpu_nvlink, eight(1, nvlinks=tuple(NvLink(n, True) for n in range(18))), OK),
    Row(
        "nvlink-down",
        gpu_nvlink,
        eight(3, nvlinks=tuple(NvLink(n, n not in (5, 11), 0, 0, 0, 0) for n in range(18))),
        FAIL,
        RESET,
        3,
        "NVLink 5,11",
    ),
    Row(
        "nvlink-fewer-than-expected",
        gpu_nvlink,
        eight(2, nvlinks=tuple(NvLink(n, True) for n in range(12))),
        FAIL,
        RESET,
        2,
        "12 of 18 NVLinks active",
        settings={"expected_links": 18},
    ),
    Row(
        "nvlink-replays",
        gpu_nvlink,
        eight(0, nvlinks=(NvLink(0, True, replay=1001),)),
        WARN,
        INSPECT,
        0,
        "1001 replays",
    ),
    Row("nvlink-recoveries", gpu_nvlink, eight(0, nvlinks=(NvLink(0, True, recovery=101),)), WARN, INSPECT, 0),
    Row(
        "nvlink-crc-flit-plus-data",
        gpu_nvlink,
        eight(0, nvlinks=(NvLink(0, True, crc_flit=600, crc_data=401),)),
        WARN,
        INSPECT,
        0,
        "1001 CRC errors",
    ),
    Row("nvlink-counters-not-supported", gpu_nvlink, eight(0, nvlinks=(NvLink(0, True),)), OK),
    Row(
        "nvlink-none-pcie-card",
        gpu_nvlink,
        node(*(h100(i, nvlinks=None) for i in range(8))),
        SKIPPED,
        summary_has="not supported",
    ),
    Row("nvlink-nvml-error", gpu_nvlink, eight(0, errors=lost_field("nvlink", "error")), UNKNOWN, NONE, 0),
    # ---------------------------------------------------------------- gpu_fabric
    Row("fabric-ok", gpu_fabric, node(), OK),
    Row("fabric-not-started", gpu_fabric, eight(6, fabric_state=1), FAIL, REBOOT, 6, "not started"),
    # Registration under way (after a boot): no job may land, but nothing asks for a reboot.
    Row("fabric-in-progress", gpu_fabric, eight(6, fabric_state=2), FAIL, NONE, 6, "in progress"),
    # The v2 structure (no summary): any tri-state field reading TRUE is unhealthy (gpud), named.
    Row(
        "fabric-v2-mask-degraded-bandwidth",
        gpu_fabric,
        eight(2, fabric_state=3, fabric_health_mask=0xA9),
        FAIL,
        REBOOT,
        2,
        "degraded bandwidth (health mask)",
    ),
    Row(
        "fabric-v2-mask-route-unhealthy",
        gpu_fabric,
        eight(1, fabric_state=3, fabric_health_mask=0x9A),
        FAIL,
        REBOOT,
        1,
        "route unhealthy",
    ),
    Row(
        "fabric-v2-mask-route-recovery",
        gpu_fabric,
        eight(3, fabric_state=3, fabric_health_mask=0xA6),
        FAIL,
        NONE,
        3,
        "route recovery in progress",
    ),
    Row("fabric-v2-mask-all-false", gpu_fabric, node(*(h100(i, fabric_health_mask=0xAA) for i in range(8))), OK),
    Row("fabric-v2-mask-not-supported", gpu_fabric, node(*(h100(i, fabric_health_mask=0) for i in range(8))), OK),
    # With a v3 summary, NVIDIA's own reading of the mask decides: not unhealthy, so a WARN.
    Row(
        "fabric-v3-summary-healthy-mask-degraded",
        gpu_fabric,
        eight(2, fabric_state=3, fabric_health_mask=0xA9, fabric_health_summary=1),
        WARN,
        INSPECT,
        2,
    ),
    # The 13.0 header's incorrect-configuration field (4 bits at shift 8), whatever the summary says.
    Row(
        "fabric-incorrect-configuration",
        gpu_fabric,
        eight(4, fabric_state=3, fabric_health_mask=0x4AA, fabric_health_summary=1),
        FAIL,
        INSPECT,
        4,
        "incorrect configuration: no partition",
    ),
    Row(
        "fabric-configuration-correct",
        gpu_fabric,
        node(*(h100(i, fabric_health_mask=0x1AA, fabric_health_summary=1) for i in range(8))),
        OK,
    ),
    Row(
        "fabric-summary-unhealthy",
        gpu_fabric,
        eight(2, fabric_state=3, fabric_health_summary=2),
        FAIL,
        REBOOT,
        2,
        "fabric unhealthy",
    ),
    Row(
        "fabric-completed-with-error",
        gpu_fabric,
        eight(6, fabric_status="NVML error 999"),
        FAIL,
        REBOOT,
        6,
        "registration failed",
    ),
    Row("fabric-state-not-supported", gpu_fabric, node(*(h100(i, fabric_state=0) for i in range(8))), SKIPPED),
    Row("fabric-call-not-supported", gpu_fabric, node(*(h100(i, fabric_state=None) for i in range(8))), SKIPPED),
    # ---------------------------------------------------------------- gpu_recovery_action
    Row("recovery-none", gpu_recovery_action, node(), OK),
    Row("recovery-gpu-reset", gpu_recovery_action, eight(5, recovery_action=1), FAIL, RESET, 5, "GPU reset"),
    Row("recovery-node-reboot", gpu_recovery_action, eight(5, recovery_action=2), FAIL, REBOOT, 5, "node reboot"),
    Row("recovery-drain-p2p", gpu_recovery_action, eight(5, recovery_action=3), FAIL, RESTART, 5),
    Row(
        "recovery-field-error-unknown",
        gpu_recovery_action,
        eight(5, errors=(FieldError("recovery_action", "unknown", "field 230: unknown"),)),
        UNKNOWN,
        NONE,
        5,
    ),
    Row("recovery-drain-and-reset", gpu_recovery_action, eight(5, recovery_action=4), FAIL, RESET, 5),
    Row("recovery-imex", gpu_recovery_action, eight(5, recovery_action=5), FAIL, INSPECT, 5),
    Row("recovery-bus-reset", gpu_recovery_action, eight(5, recovery_action=6), FAIL, RESET, 5),
    Row("recovery-system-reboot", gpu_recovery_action, eight(5, recovery_action=7), FAIL, REBOOT, 5),
    Row(
        "recovery-unknown-code",
        gpu_recovery_action,
        eight(5, recovery_action=42),
        FAIL,
        INSPECT,
        5,
        "unknown action 42",
    ),
    Row(
        "recovery-older-driver", gpu_recovery_action, node(*(h100(i, recovery_action=None) for i in range(8))), SKIPPED
    ),
    # ---------------------------------------------------------------- gpu_persistence
    Row("persistence-on", gpu_persistence, node(), OK),
    Row("persistence-off-warn", gpu_persistence, eight(3, persistence_mode=False), WARN, NONE, 3),
    Row(
        "persistence-off-fail",
        gpu_persistence,
        eight(3, persistence_mode=False),
        FAIL,
        NONE,
        3,
        settings={"when_off": "fail"},
    ),
    Row("persistence-not-supported", gpu_persistence, node(*(bare(i) for i in range(8))), SKIPPED),
    # ---------------------------------------------------------------- gpu_processes
    Row("processes-idle-prolog", gpu_processes, node(), OK, phase="prolog"),
    Row(
        "processes-stray-prolog",
        gpu_processes,
        eight(4, processes=(GpuProcess(48213, 20 << 30),)),
        FAIL,
        RESTART,
        4,
        "pid 48213, 20480 MiB",
        phase="prolog",
    ),
    Row(
        "processes-stray-epilog",
        gpu_processes,
        eight(4, processes=(GpuProcess(1, None),)),
        FAIL,
        RESTART,
        4,
        phase="epilog",
    ),
    Row("processes-reported-manual", gpu_processes, eight(4, processes=(GpuProcess(1, 1 << 20),)), OK, phase="manual"),
    Row(
        "processes-daemon-if-configured",
        gpu_processes,
        eight(4, processes=(GpuProcess(1, 1 << 20),)),
        FAIL,
        RESTART,
        4,
        phase="daemon",
        settings={"idle_phases": ("daemon",)},
    ),
    Row("processes-not-supported", gpu_processes, node(*(bare(i) for i in range(8))), SKIPPED, phase="prolog"),
    # ---------------------------------------------------------------- gpu_throttle (windows: test_gpu_throttle.py)
    Row("throttle-ok", gpu_throttle, node(), OK, summary_has="throttle time not judged: no counter reading"),
    Row(
        "throttle-power-limit-below-default-warn",
        gpu_throttle,
        eight(6, power_limit_w=500.0),
        WARN,
        INSPECT,
        6,
        "power limit 500 W, below its default 700 W",
    ),
    Row(
        "throttle-power-limit-ignored",
        gpu_throttle,
        eight(6, power_limit_w=500.0),
        OK,
        settings={"power_limit": "ignore"},
    ),
]


def _run(row: Row) -> Any:
    settings = row.check.Settings(**row.settings)
    ctx = Context(name=row.check.__name__.rsplit(".", 1)[1], phase=row.phase, node="n1", expected_gpus=row.expected)
    return row.check.evaluate(row.obs, settings, ctx)


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.id)
def test_check(row: Row) -> None:
    res = _run(row)
    assert (res.status, res.action, res.gpu) == (row.status, row.action, row.gpu), res.summary
    assert row.summary_has in res.summary
    assert res.name == row.check.__name__.rsplit(".", 1)[1]
    if res.status > OK and res.gpu is not None and row.check in PER_GPU:
        assert f"GPU {res.gpu}" in res.summary


def _name(mod: ModuleType) -> str:
    return str(mod.__name__.rsplit(".", 1)[1])


# --------------------------------------------------------------------------- what no NVML data means
# nvml_gate: NVML unavailable where GPUs are expected -> UNKNOWN (the nvml check carries the FAIL);
# where none is expected -> SKIPPED; any other probe error or no probe -> UNKNOWN.

GATE = [
    ("unavailable-gpus-expected", without(MISSING), 8, UNKNOWN),
    ("unavailable-no-gpu-expected", without(MISSING, pci=()), 0, SKIPPED),
    ("unavailable-auto-empty-pci", without(MISSING, pci=()), "auto", SKIPPED),
    ("unavailable-auto-pci-has-gpus", without(MISSING), "auto", UNKNOWN),
    ("timeout", without(TIMEOUT), 8, UNKNOWN),
    ("timeout-no-gpu-expected", without(TIMEOUT, pci=()), 0, UNKNOWN),
    ("error", without(BROKEN), 8, UNKNOWN),
    ("not-probed", without(None), 8, UNKNOWN),
    ("stalled-before-any-gpu", without(STALLED_AT_INIT), 8, UNKNOWN),
]


@pytest.mark.parametrize("check", (gpu_count, gpu_driver, *PER_GPU), ids=_name)
@pytest.mark.parametrize(("obs", "expected", "status"), [g[1:] for g in GATE], ids=[g[0] for g in GATE])
def test_no_nvml_data(check: ModuleType, obs: Observations, expected: Any, status: Status) -> None:
    row = Row("gate", check, obs, status, expected=expected, phase="prolog")
    res = _run(row)
    assert (res.status, res.action, res.gpu) == (status, NONE, None), res.summary
    assert res.status != OK
    if status == SKIPPED:  # says what expects no GPU, as the nvml check does
        assert res.summary.startswith(
            "no GPU expected ([gpu] expected_count = 0"
            if expected == 0
            else "no GPU expected (no NVIDIA GPU on the PCI bus)"
        ), res.summary


@pytest.mark.parametrize("check", PER_GPU, ids=_name)
def test_not_supported_anywhere_is_skipped_never_ok(check: ModuleType) -> None:
    res = _run(Row("bare", check, node(*(bare(i) for i in range(8))), SKIPPED, phase="prolog"))
    assert res.status == SKIPPED
    assert "not supported" in res.summary


@pytest.mark.parametrize("check", PER_GPU, ids=_name)
def test_not_supported_on_one_gpu_is_recorded(check: ModuleType) -> None:
    obs = node(*(bare(i) if i == 2 else h100(i) for i in range(8)))
    res = _run(Row("mixed", check, obs, OK, phase="prolog"))
    assert res.status == OK
    assert res.details["not_supported_on"] == [2]
    assert res.details["gpus_judged"] == [0, 1, 3, 4, 5, 6, 7]


@pytest.mark.parametrize("check", PER_GPU, ids=_name)
def test_healthy_node_is_ok(check: ModuleType) -> None:
    res = _run(Row("healthy", check, node(), OK, phase="prolog"))
    assert res.status == OK, res.summary
    assert res.details["gpus_judged"] == list(range(8))


@pytest.mark.parametrize("check", PER_GPU, ids=_name)
def test_no_gpu_at_all_is_skipped(check: ModuleType) -> None:
    obs = Observations(nvml=NvmlSnapshot("550.127.05", 12040, 0, (), elapsed_s=0.01), pci_gpus=PciGpus((), "sysfs"))
    res = _run(Row("none", check, obs, SKIPPED, expected="auto"))
    assert res.status == SKIPPED
    assert "no GPU" in res.summary


@pytest.mark.parametrize("check", PER_GPU, ids=_name)
def test_lost_gpu_is_left_to_the_nvml_check(check: ModuleType) -> None:
    """A lost GPU's None fields are neither judged OK nor FAIL here; ``nvml`` reports it."""
    obs = node(*(replace(bare(i), lost=True) if i == 3 else h100(i) for i in range(8)))
    res = _run(Row("lost", check, obs, OK, phase="prolog"))
    assert res.status == OK
    assert 3 not in res.details["gpus_judged"]


def own_field(check: ModuleType) -> str:
    """The read whose error the check judges: the first ``field_error(gpu, "<field>")`` in its source."""
    tree = ast.parse(inspect.getsource(check))
    calls = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Name)
        and n.func.id == "field_error"
        and len(n.args) > 1
        and isinstance(n.args[1], ast.Constant)
    ]
    assert calls, f"{check.__name__} judges no read's error (field_error(gpu, <field>))"
    return str(min(calls, key=lambda n: (n.lineno, n.col_offset)).args[1].value)


def test_each_per_gpu_check_judges_a_read_the_nvml_probe_names() -> None:
    probes = Path(inspect.getfile(nvml)).parent.parent / "probes"
    literals = {
        n.value
        for path in probes.rglob("*.py")
        for n in ast.walk(ast.parse(path.read_text()))
        if isinstance(n, ast.Constant) and isinstance(n.value, str)
    }
    fields = [own_field(m) for m in PER_GPU]
    assert len(set(fields)) == len(fields), fields  # one read of its own each
    assert set(fields) <= literals, set(fields) - literals


@pytest.mark.parametrize("check", PER_GPU, ids=_name)
def test_gpu_lost_field_error_fails_with_reboot(check: ModuleType) -> None:
    """A gpu_lost error on the check's own field (GPU not flagged lost) is FAIL, reboot."""
    obs = eight(5, errors=lost_field(own_field(check), "gpu_lost"))
    res = _run(Row("field-lost", check, obs, FAIL, phase="prolog"))
    assert (res.status, res.action, res.gpu) == (FAIL, REBOOT, 5), res.summary


def test_every_check_module_has_rows() -> None:
    covered = {row.check for row in ROWS}
    assert covered == set(ALL)


def test_settings_are_frozen_dataclasses_with_timeout() -> None:
    for check in ALL:
        settings = check.Settings()
        assert dataclasses.is_dataclass(settings)
        assert settings.timeout_s > 0
