"""What a scenario file can say, and the GPU it starts from.

nvml.h's return codes, throttle reasons, recovery actions and fabric states by the names a scenario
uses; the calls read through ``nvmlDeviceGetFieldValues``; the ``[[gpu]]`` keys with their types
(docs/simulation.md); the GPU under every scenario (the H100 SXM5 of ``nodehealth_sim.models``)
and a named model's values. ``nodehealth_sim.nvml`` parses and checks a file against these.
"""

from __future__ import annotations

import functools
from typing import Any, Optional

from nodehealth.probes.nvml_h import THROTTLE_FIELDS, THROTTLE_FIELDS_580

# nvmlReturn_t (nvml.h), by the names a scenario uses.
ERROR_CODES = {
    "UNINITIALIZED": 1,
    "INVALID_ARGUMENT": 2,
    "NOT_SUPPORTED": 3,
    "NO_PERMISSION": 4,
    "ALREADY_INITIALIZED": 5,
    "NOT_FOUND": 6,
    "INSUFFICIENT_SIZE": 7,
    "INSUFFICIENT_POWER": 8,
    "DRIVER_NOT_LOADED": 9,
    "TIMEOUT": 10,
    "IRQ_ISSUE": 11,
    "LIBRARY_NOT_FOUND": 12,
    "FUNCTION_NOT_FOUND": 13,
    "CORRUPTED_INFOROM": 14,
    "GPU_IS_LOST": 15,
    "RESET_REQUIRED": 16,
    "OPERATING_SYSTEM": 17,
    "LIB_RM_VERSION_MISMATCH": 18,
    "IN_USE": 19,
    "MEMORY": 20,
    "NO_DATA": 21,
    "VGPU_ECC_NOT_SUPPORTED": 22,
    "INSUFFICIENT_RESOURCES": 23,
    "FREQ_NOT_SUPPORTED": 24,
    "ARGUMENT_VERSION_MISMATCH": 25,
    "DEPRECATED": 26,
    "NOT_READY": 27,
    "GPU_NOT_FOUND": 28,
    "INVALID_STATE": 29,
    "RESET_TYPE_NOT_SUPPORTED": 30,
    "UNKNOWN": 999,
}
# [faults] nvml: how nvmlInit fails. library_not_found: the simulated library is not loaded
# at all, so pynvml's own loader fails as on a node without the driver.
NVML_STATES = {
    "ok": None,
    "library_not_found": None,
    "driver_not_loaded": ERROR_CODES["DRIVER_NOT_LOADED"],
    "init_error": ERROR_CODES["UNKNOWN"],
    "no_permission": ERROR_CODES["NO_PERMISSION"],
}
THROTTLE_BITS = {
    "gpu_idle": 0x1,
    "applications_clocks": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clocks": 0x100,
}
# The reasons the probe reads throttle time for, in field order: the fake library's key names too.
THROTTLE_TIME_REASONS = tuple(reason for _, reason in THROTTLE_FIELDS + THROTTLE_FIELDS_580)
RECOVERY_ACTIONS = {
    "none": 0,
    "gpu_reset": 1,
    "node_reboot": 2,
    "drain_p2p": 3,
    "drain_and_reset": 4,
    "recover_imex_domain": 5,
    "bus_reset": 6,
    "system_reboot": 7,
}
FABRIC_STATES = {"not_supported": 0, "not_started": 1, "in_progress": 2, "completed": 3}
# Calls whose data the probe reads through nvmlDeviceGetFieldValues (one call for many
# values): a fault on one of them is a fault on that call, and "unsupported" removes the data.
FIELD_CALLS = {
    "nvmlDeviceGetTotalEccErrors": "ecc",
    "nvmlDeviceGetRetiredPages": "retired_pages",
    "nvmlDeviceGetRetiredPagesPendingStatus": "retired_pages",
    "nvmlDeviceGetRemappedRows": "remapped_rows",
    "nvmlDeviceGetNvLinkState": "nvlink",
    "nvmlDeviceGetNvLinkErrorCounter": "nvlink",
}


GPU_KEYS: dict[str, Any] = {
    "model": str,
    "name": str,
    "uuid": str,
    "pci_bus_id": str,
    "missing": bool,
    "temperature_c": int,
    "slowdown_c": int,
    "shutdown_c": int,
    "gpu_max_c": int,
    "mem_max_c": int,
    "memory_temp_c": int,
    "mig_mode": bool,
    "init_ms": float,
    "power_w": float,
    "power_limit_w": float,
    "power_default_limit_w": float,
    "utilization_gpu_pct": int,
    "utilization_memory_pct": int,
    "memory_total_mib": int,
    "memory_used_mib": int,
    "ecc_enabled": bool,
    "ecc_pending_enabled": bool,
    "ecc": {
        "volatile_corrected": int,
        "volatile_uncorrected": int,
        "aggregate_corrected": int,
        "aggregate_uncorrected": int,
    },
    "retired_pages": {"sbe": int, "dbe": int, "pending": bool},
    "remapped_rows": {"correctable": int, "uncorrectable": int, "pending": bool, "failure": bool},
    "pcie": {"gen": int, "max_gen": int, "width": int, "max_width": int},
    "nvlink": {
        "links": int,
        "down": [int],
        "counters": bool,
        "replay": int,
        "recovery": int,
        "crc_flit": int,
        "crc_data": int,
        "errors": [{"link": int, "replay": int, "recovery": int, "crc_flit": int, "crc_data": int}],
    },
    "fabric": {"state": str, "status": int, "health_mask": int, "health_summary": int},
    "processes": [{"pid": int, "used_memory_mib": int}],
    "throttle_reasons": [str],
    # ns throttled per reason since the driver loaded (NVML_FI_DEV_PERF_POLICY_*; hw_* on 580 only)
    "throttle_time_ns": {reason: int for reason in THROTTLE_TIME_REASONS},
    "persistence_mode": bool,
    "recovery_action": str,
    "unsupported": [str],
}

# An idle, healthy H100 SXM5 80GB (HGX): the built-in defaults, used as is when
# nodehealth_sim.models (values from published nvidia-smi output) has no entry.
H100 = {
    "name": "NVIDIA H100 80GB HBM3",
    "temperature_c": 34,
    "slowdown_c": 87,
    "shutdown_c": 92,
    "power_w": 71.5,
    "power_limit_w": 700.0,
    "utilization_gpu_pct": 0,
    "utilization_memory_pct": 0,
    "memory_total_mib": 81559,
    "memory_used_mib": 0,
    "ecc_enabled": True,
    "ecc_pending_enabled": True,
    "ecc": {"volatile_corrected": 0, "volatile_uncorrected": 0, "aggregate_corrected": 0, "aggregate_uncorrected": 0},
    "retired_pages": {"sbe": 0, "dbe": 0, "pending": False},
    "remapped_rows": {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False},
    "pcie": {"gen": 5, "max_gen": 5, "width": 16, "max_width": 16},
    "nvlink": {
        "links": 18,
        "down": [],
        "counters": True,
        "replay": 0,
        "recovery": 0,
        "crc_flit": 0,
        "crc_data": 0,
        "errors": [],
    },
    "fabric": {"state": "completed", "status": 0},
    "processes": [],
    "throttle_reasons": ["gpu_idle"],
    "throttle_time_ns": {reason: 0 for reason in THROTTLE_TIME_REASONS},
    "persistence_mode": True,
    "recovery_action": "none",
    "mig_mode": False,
    "init_ms": 0.0,
    "unsupported": [],
}


@functools.lru_cache(maxsize=1)
def default_gpu() -> dict[str, Any]:
    """The built-in GPU under every scenario: the H100 SXM5 of the model table, as published."""
    from nodehealth_sim import models

    known = model_defaults(models.DEFAULT_MODEL)
    return overlay(H100, known) if known else H100


def model_defaults(model: str) -> Optional[dict[str, Any]]:
    """The scenario values of a GPU model in nodehealth_sim.models, or None if unknown."""
    try:
        from nodehealth_sim import models
    except ImportError:  # pragma: no cover - the table ships with the package
        return None
    entry = models.MODELS.get(model)
    if entry is None:
        return None
    # the model's values of the scalar [[gpu]] keys, in GPU_KEYS' order; its tables below
    out: dict[str, Any] = {
        key: entry[key] for key, kind in GPU_KEYS.items() if isinstance(kind, type) and entry.get(key) is not None
    }
    if isinstance(entry.get("pcie"), dict):
        out["pcie"] = dict(entry["pcie"])
    unsupported = []
    if entry.get("retired_pages_supported") is False:
        unsupported.append("nvmlDeviceGetRetiredPages")
    if entry.get("remapped_rows_supported") is False:
        unsupported.append("nvmlDeviceGetRemappedRows")
    out["unsupported"] = unsupported
    nvlink = entry.get("nvlink") or {}
    links = int(nvlink.get("links", 0) or 0)
    out["nvlink"] = {
        "links": links,
        "counters": bool(nvlink.get("counters", True)),
        # PCIe cards with NVLink hardware report their links down without a bridge.
        "down": list(range(links)) if entry.get("form_factor") in ("pcie", "nvl") else [],
    }
    if entry.get("fabric"):
        out["fabric"] = {"state": str(entry["fabric"])}
    return out


def overlay(base: dict[str, Any], table: dict[str, Any]) -> dict[str, Any]:
    """``table`` over ``base``; a nested table (ecc, pcie, nvlink, ...) is merged key by key."""
    out = dict(base)
    for key, value in table.items():
        out[key] = {**out[key], **value} if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out
