"""A stand-in for pynvml, driven by a scenario file that describes one node's GPUs and faults.

It has pynvml's function surface (same names, same parameters, same error class shape), so
``nodehealth.probes.nvml`` runs unchanged on top of it. The format is documented in
docs/simulation.md; examples/scenarios/ holds ready-made nodes.

``load(path)`` parses and validates a scenario and returns a module-like object. Every
problem in the file is a ``ScenarioError`` naming the file and the key.
"""

from __future__ import annotations

import ctypes
import math
import re
import sys
import time
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# The constants the probe uses, with pynvml's values (nvml.h).
NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_CORRUPTED_INFOROM = 14
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_UNKNOWN = 999
NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1
NVML_TEMPERATURE_GPU = 0
NVML_TEMPERATURE_THRESHOLD_SHUTDOWN = 0
NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = 1
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0
NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1
NVML_NVLINK_MAX_LINKS = 36
NVML_NVLINK_ERROR_DL_REPLAY = 0
NVML_NVLINK_ERROR_DL_RECOVERY = 1
NVML_NVLINK_ERROR_DL_CRC_FLIT = 2
NVML_NVLINK_ERROR_DL_CRC_DATA = 3
NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 230
NVML_GPU_FABRIC_STATE_NOT_SUPPORTED = 0
NVML_GPU_FABRIC_STATE_NOT_STARTED = 1
NVML_GPU_FABRIC_STATE_IN_PROGRESS = 2
NVML_GPU_FABRIC_STATE_COMPLETED = 3

ERROR_CODES = {
    "UNINITIALIZED": NVML_ERROR_UNINITIALIZED,
    "INVALID_ARGUMENT": NVML_ERROR_INVALID_ARGUMENT,
    "NOT_SUPPORTED": NVML_ERROR_NOT_SUPPORTED,
    "NO_PERMISSION": NVML_ERROR_NO_PERMISSION,
    "NOT_FOUND": NVML_ERROR_NOT_FOUND,
    "DRIVER_NOT_LOADED": NVML_ERROR_DRIVER_NOT_LOADED,
    "TIMEOUT": NVML_ERROR_TIMEOUT,
    "LIBRARY_NOT_FOUND": NVML_ERROR_LIBRARY_NOT_FOUND,
    "FUNCTION_NOT_FOUND": NVML_ERROR_FUNCTION_NOT_FOUND,
    "CORRUPTED_INFOROM": NVML_ERROR_CORRUPTED_INFOROM,
    "GPU_IS_LOST": NVML_ERROR_GPU_IS_LOST,
    "RESET_REQUIRED": NVML_ERROR_RESET_REQUIRED,
    "LIB_RM_VERSION_MISMATCH": NVML_ERROR_LIB_RM_VERSION_MISMATCH,
    "UNKNOWN": NVML_ERROR_UNKNOWN,
}
_ERROR_TEXT = {code: name.replace("_", " ").capitalize() for name, code in ERROR_CODES.items()}
NVML_STATES = {"ok": None, "library_not_found": NVML_ERROR_LIBRARY_NOT_FOUND,
               "driver_not_loaded": NVML_ERROR_DRIVER_NOT_LOADED, "init_error": NVML_ERROR_UNKNOWN,
               "no_permission": NVML_ERROR_NO_PERMISSION}
THROTTLE_BITS = {
    "gpu_idle": 0x1, "applications_clocks": 0x2, "sw_power_cap": 0x4, "hw_slowdown": 0x8,
    "sync_boost": 0x10, "sw_thermal_slowdown": 0x20, "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80, "display_clocks": 0x100,
}
RECOVERY_ACTIONS = {"none": 0, "gpu_reset": 1, "node_reboot": 2, "drain_p2p": 3, "drain_and_reset": 4,
                    "recover_imex_domain": 5, "bus_reset": 6, "system_reboot": 7}
FABRIC_STATES = {"not_supported": 0, "not_started": 1, "in_progress": 2, "completed": 3}
HANG_SECONDS = 10 ** 6
_PCI_BUS_ID = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


class ScenarioError(Exception):
    """A scenario file problem, worded for a one-line error naming file and key."""


class NVMLError(Exception):
    """Same shape as pynvml.NVMLError: ``value`` is the NVML return code."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _ERROR_TEXT.get(self.value, f"NVML error {self.value}")


class c_nvmlGpuFabricInfo_t(ctypes.Structure):  # noqa: N801 - pynvml's name and layout
    """Zero-initialised like pynvml's: status NVML_SUCCESS, state NOT_SUPPORTED."""

    _fields_ = [  # noqa: RUF012 - ctypes' own attribute
        ("clusterUuid", ctypes.c_uint8 * 16),
        ("status", ctypes.c_uint),
        ("cliqueId", ctypes.c_uint32),
        ("state", ctypes.c_uint),
    ]


# --------------------------------------------------------------------------- the scenario


@dataclass(frozen=True)
class SimGpu:
    index_on_bus: int
    values: dict[str, Any]
    missing: bool
    unsupported: frozenset[str]


@dataclass(frozen=True)
class Scenario:
    path: str
    driver_version: str
    cuda_driver_version: int
    nvml: str  # key of NVML_STATES
    gpus: tuple[SimGpu, ...]
    errors: tuple[tuple[str, Optional[int], int], ...] = ()  # (call, gpu index or None, code)
    hangs: tuple[tuple[str, Optional[int]], ...] = ()
    call_delay_s: float = 0.0

    @property
    def visible(self) -> tuple[SimGpu, ...]:
        return tuple(g for g in self.gpus if not g.missing)

    @property
    def pci_bus_ids(self) -> tuple[str, ...]:
        """Every GPU on the simulated PCI bus, including those NVML no longer sees."""
        return tuple(str(g.values["pci_bus_id"]) for g in self.gpus)


_GPU_KEYS: dict[str, Any] = {
    "name": str, "uuid": str, "pci_bus_id": str, "missing": bool,
    "temperature_c": int, "slowdown_c": int, "shutdown_c": int,
    "power_w": float, "power_limit_w": float,
    "utilization_gpu_pct": int, "utilization_memory_pct": int,
    "memory_total_mib": int, "memory_used_mib": int,
    "ecc_enabled": bool, "ecc_pending_enabled": bool,
    "ecc": {"volatile_corrected": int, "volatile_uncorrected": int,
            "aggregate_corrected": int, "aggregate_uncorrected": int},
    "retired_pages": {"sbe": int, "dbe": int, "pending": bool},
    "remapped_rows": {"correctable": int, "uncorrectable": int, "pending": bool, "failure": bool},
    "pcie": {"gen": int, "max_gen": int, "width": int, "max_width": int},
    "nvlink": {"links": int, "down": [int], "replay": int, "recovery": int, "crc_flit": int, "crc_data": int,
               "errors": [{"link": int, "replay": int, "recovery": int, "crc_flit": int, "crc_data": int}]},
    "fabric": {"state": str, "status": int},
    "processes": [{"pid": int, "used_memory_mib": int}],
    "throttle_reasons": [str],
    "persistence_mode": bool,
    "recovery_action": str,
    "unsupported": [str],
}

_H100 = {
    "name": "NVIDIA H100 80GB HBM3", "temperature_c": 34, "slowdown_c": 87, "shutdown_c": 92,
    "power_w": 71.5, "power_limit_w": 700.0, "utilization_gpu_pct": 0, "utilization_memory_pct": 0,
    "memory_total_mib": 81559, "memory_used_mib": 0, "ecc_enabled": True, "ecc_pending_enabled": True,
    "ecc": {"volatile_corrected": 0, "volatile_uncorrected": 0, "aggregate_corrected": 0,
            "aggregate_uncorrected": 0},
    "retired_pages": {"sbe": 0, "dbe": 0, "pending": False},
    "remapped_rows": {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False},
    "pcie": {"gen": 5, "max_gen": 5, "width": 16, "max_width": 16},
    "nvlink": {"links": 18, "down": [], "replay": 0, "recovery": 0, "crc_flit": 0, "crc_data": 0, "errors": []},
    "fabric": {"state": "completed", "status": 0},
    "processes": [], "throttle_reasons": ["gpu_idle"], "persistence_mode": True, "recovery_action": "none",
    "unsupported": [],
}


def load(path: str) -> types.ModuleType:
    """Parse and validate ``path``; return a module with pynvml's surface over it."""
    return module_for(parse(path))


def parse(path: str) -> Scenario:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ScenarioError(f"{path}: no such scenario file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(f"{path}: cannot read: {exc}") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{path}: invalid TOML: {exc}") from None
    except RecursionError:
        raise ScenarioError(f"{path}: invalid TOML: nested too deeply") from None
    return build(raw, path)


def build(raw: dict[str, Any], path: str) -> Scenario:
    def err(key: str, msg: str) -> ScenarioError:
        return ScenarioError(f"{path}: {key}: {msg}")

    _known(raw, {"node", "defaults", "gpu", "faults"}, "", err)
    node = raw.get("node", {})
    _known(node, {"driver_version", "cuda_driver_version", "call_delay_ms"}, "node.", err)
    driver = _typed(node.get("driver_version", "550.127.05"), str, "node.driver_version", err)
    cuda = _typed(node.get("cuda_driver_version", 12040), int, "node.cuda_driver_version", err)
    delay_ms = _typed(node.get("call_delay_ms", 0), float, "node.call_delay_ms", err)
    user_defaults = raw.get("defaults", {})
    _check_gpu(user_defaults, "defaults.", err)
    defaults: dict[str, Any] = _overlay(_H100, user_defaults)
    gpu_tables = raw.get("gpu", [])
    if not isinstance(gpu_tables, list):
        raise err("gpu", "expected an array of tables ([[gpu]])")
    gpus = []
    seen_bus: set[str] = set()
    for i, table in enumerate(gpu_tables):
        where = f"gpu[{i}]."
        if not isinstance(table, dict):
            raise err(f"gpu[{i}]", "expected a table")
        _check_gpu(table, where, err)
        values: dict[str, Any] = _overlay(defaults, table)
        values.setdefault("uuid", f"GPU-{i:08x}-5151-4e4f-8d48-{i:012x}")
        values.setdefault("pci_bus_id", f"0000:{0x18 + 0x11 * i:02x}:00.0")
        bus = str(values["pci_bus_id"]).lower()
        if not _PCI_BUS_ID.match(bus):
            raise err(f"gpu[{i}].pci_bus_id", f"{bus!r} is not a PCI address like \"0000:18:00.0\"")
        if bus in seen_bus:
            raise err(f"gpu[{i}].pci_bus_id", f"{bus} is used by another GPU")
        seen_bus.add(bus)
        values["pci_bus_id"] = bus
        for name in values.get("throttle_reasons", []):
            if name not in THROTTLE_BITS:
                raise err(f"{where}throttle_reasons", f"unknown reason {name!r} (known: {', '.join(THROTTLE_BITS)})")
        if values.get("recovery_action") not in RECOVERY_ACTIONS:
            raise err(f"{where}recovery_action", f"unknown action {values.get('recovery_action')!r} "
                      f"(known: {', '.join(RECOVERY_ACTIONS)})")
        if values["fabric"].get("state", "completed") not in FABRIC_STATES:
            raise err(f"{where}fabric.state", f"unknown state (known: {', '.join(FABRIC_STATES)})")
        for call in values.get("unsupported", []):
            _call_name({"call": call}, f"{where}unsupported", err)
        for n, proc in enumerate(values["processes"]):
            if "pid" not in proc:
                raise err(f"{where}processes[{n}].pid", "missing (each process needs a pid)")
        for n, entry in enumerate(values["nvlink"].get("errors", [])):
            if "link" not in entry:
                raise err(f"{where}nvlink.errors[{n}].link", "missing (which link the counters are for)")
        gpus.append(SimGpu(i, values, bool(values.get("missing", False)), frozenset(values.get("unsupported", []))))

    faults = raw.get("faults", {})
    _known(faults, {"nvml", "errors", "hangs"}, "faults.", err)
    state = faults.get("nvml", "ok")
    if state not in NVML_STATES:
        raise err("faults.nvml", f"{state!r} is not one of {', '.join(NVML_STATES)}")
    errors = []
    for i, e in enumerate(_tables(faults.get("errors", []), "faults.errors", err)):
        _known(e, {"call", "gpu", "error"}, f"faults.errors[{i}].", err)
        call = _call_name(e, f"faults.errors[{i}].call", err)
        code_name = e.get("error")
        if code_name not in ERROR_CODES:
            raise err(f"faults.errors[{i}].error", f"{code_name!r} is not an NVML error "
                      f"(one of: {', '.join(ERROR_CODES)})")
        errors.append((call, _gpu_ref(e, f"faults.errors[{i}].gpu", err), ERROR_CODES[code_name]))
    hangs = []
    for i, h in enumerate(_tables(faults.get("hangs", []), "faults.hangs", err)):
        _known(h, {"call", "gpu"}, f"faults.hangs[{i}].", err)
        hangs.append((_call_name(h, f"faults.hangs[{i}].call", err), _gpu_ref(h, f"faults.hangs[{i}].gpu", err)))
    return Scenario(path, driver, cuda, state, tuple(gpus), tuple(errors), tuple(hangs), delay_ms / 1000.0)


def _overlay(base: dict[str, Any], table: dict[str, Any]) -> dict[str, Any]:
    """``table`` over ``base``; a nested table (ecc, pcie, nvlink, ...) is merged key by key."""
    out = dict(base)
    for key, value in table.items():
        out[key] = {**out[key], **value} if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _known(table: Any, keys: set[str], where: str, err: Any) -> None:
    if not isinstance(table, dict):
        raise err(where.rstrip(".") or "(top)", "expected a table")
    for key in table:
        if key not in keys:
            raise err(f"{where}{key}", f"unknown key (known here: {', '.join(sorted(keys))})")


def _typed(value: Any, kind: Any, key: str, err: Any) -> Any:
    if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise err(key, f"must be a finite number, got {value!r}")
        return float(value)
    if kind is int and isinstance(value, bool):
        raise err(key, f"expected an integer, got {value!r}")
    if not isinstance(value, kind):
        raise err(key, f"expected {kind.__name__}, got {value!r}")
    if kind in (int, float) and value < 0:
        raise err(key, f"must not be negative, got {value!r}")
    return value


def _check_gpu(table: Any, where: str, err: Any) -> None:
    _check_schema(table, _GPU_KEYS, where, err)


def _check_schema(value: Any, schema: Any, key: str, err: Any) -> None:
    if isinstance(schema, dict):
        _known(value, set(schema), key, err)
        for k, v in value.items():
            _check_schema(v, schema[k], f"{key}{k}" if not isinstance(schema[k], dict) else f"{key}{k}.", err)
    elif isinstance(schema, list):
        if not isinstance(value, list):
            raise err(key, f"expected an array, got {value!r}")
        for i, item in enumerate(value):
            inner = f"{key}[{i}]." if isinstance(schema[0], dict) else f"{key}[{i}]"
            _check_schema(item, schema[0], inner, err)
    else:
        _typed(value, schema, key, err)


def _tables(value: Any, key: str, err: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise err(key, "expected an array of tables")
    return value


def _call_name(table: dict[str, Any], key: str, err: Any) -> str:
    call = table.get("call")
    if not isinstance(call, str) or not call.startswith("nvml"):
        raise err(key, f"expected an NVML function name such as \"nvmlDeviceGetTemperature\", got {call!r}")
    from nodehealth.probes.nvml import NVML_FUNCTIONS

    if call not in NVML_FUNCTIONS:
        raise err(key, f"{call!r} is not a call the NVML probe makes, so it would never fire")
    return call


def _gpu_ref(table: dict[str, Any], key: str, err: Any) -> Optional[int]:
    gpu = table.get("gpu")
    if gpu is None:
        return None
    if not isinstance(gpu, int) or isinstance(gpu, bool) or gpu < 0:
        raise err(key, f"expected a GPU index (0, 1, ...), got {gpu!r}")
    return gpu


# --------------------------------------------------------------------------- the module


@dataclass
class _Handle:
    index: int  # NVML index (position among visible GPUs)
    gpu: SimGpu


@dataclass
class _Util:
    gpu: int
    memory: int


@dataclass
class _Memory:
    total: int
    used: int
    free: int


@dataclass
class _Pci:
    busId: str  # noqa: N815 - pynvml's name
    busIdLegacy: str  # noqa: N815


@dataclass
class _Process:
    pid: int
    usedGpuMemory: Optional[int]  # noqa: N815


@dataclass
class _FieldValueUnion:
    uiVal: int = 0  # noqa: N815


@dataclass
class _FieldValue:
    fieldId: int  # noqa: N815
    nvmlReturn: int  # noqa: N815
    value: _FieldValueUnion = field(default_factory=_FieldValueUnion)


class _Sim:
    """The behaviour behind the module functions; one per loaded scenario."""

    def __init__(self, scenario: Scenario) -> None:
        self.s = scenario
        self.initialised = False

    def enter(self, call: str, handle: Optional[_Handle] = None) -> None:
        """Apply the scenario's faults for ``call`` on ``handle``'s GPU."""
        if self.s.call_delay_s:
            time.sleep(self.s.call_delay_s)
        gpu = None if handle is None else handle.index
        for name, where in self.s.hangs:
            if name == call and (where is None or where == gpu):
                time.sleep(HANG_SECONDS)
        for name, where, code in self.s.errors:
            if name == call and (where is None or where == gpu):
                raise NVMLError(code)
        if call != "nvmlInit" and not self.initialised:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        if handle is not None and call in handle.gpu.unsupported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)


def module_for(scenario: Scenario) -> types.ModuleType:
    sim = _Sim(scenario)
    mod = types.ModuleType("simnvml_scenario", f"simulated NVML: {scenario.path}")
    for name, value in globals().items():
        if name.startswith("NVML_") or name in ("NVMLError", "c_nvmlGpuFabricInfo_t"):
            setattr(mod, name, value)
    mod.__dict__["SCENARIO"] = scenario

    def v(h: _Handle, key: str) -> Any:
        return h.gpu.values[key]

    def nvmlInit() -> None:
        sim.enter("nvmlInit")
        code = NVML_STATES[scenario.nvml]
        if code is not None:
            raise NVMLError(code)
        sim.initialised = True

    def nvmlShutdown() -> None:
        sim.enter("nvmlShutdown")
        sim.initialised = False

    def nvmlSystemGetDriverVersion() -> str:
        sim.enter("nvmlSystemGetDriverVersion")
        return scenario.driver_version

    def nvmlSystemGetCudaDriverVersion() -> int:
        sim.enter("nvmlSystemGetCudaDriverVersion")
        return scenario.cuda_driver_version

    def nvmlDeviceGetCount() -> int:
        sim.enter("nvmlDeviceGetCount")
        return len(scenario.visible)

    def nvmlDeviceGetHandleByIndex(index: int) -> _Handle:
        visible = scenario.visible
        if not 0 <= index < len(visible):
            sim.enter("nvmlDeviceGetHandleByIndex")
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        handle = _Handle(index, visible[index])
        sim.enter("nvmlDeviceGetHandleByIndex", handle)
        return handle

    def simple(call: str, fn: Any) -> Any:
        def wrapper(handle: _Handle) -> Any:
            sim.enter(call, handle)
            return fn(handle)
        wrapper.__name__ = call
        return wrapper

    def nvmlDeviceGetTemperature(handle: _Handle, sensor: int) -> int:
        sim.enter("nvmlDeviceGetTemperature", handle)
        if sensor != NVML_TEMPERATURE_GPU:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return int(v(handle, "temperature_c"))

    def nvmlDeviceGetTemperatureThreshold(handle: _Handle, threshold: int) -> int:
        sim.enter("nvmlDeviceGetTemperatureThreshold", handle)
        key = {NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: "slowdown_c", NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: "shutdown_c"}
        if threshold not in key:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return int(v(handle, key[threshold]))

    def nvmlDeviceGetMemoryInfo(handle: _Handle, version: Any = None) -> _Memory:
        sim.enter("nvmlDeviceGetMemoryInfo", handle)
        total, used = v(handle, "memory_total_mib") << 20, v(handle, "memory_used_mib") << 20
        return _Memory(total, used, total - used)

    def nvmlDeviceGetTotalEccErrors(handle: _Handle, errorType: int, counterType: int) -> int:  # noqa: N803
        sim.enter("nvmlDeviceGetTotalEccErrors", handle)
        scope = "volatile" if counterType == NVML_VOLATILE_ECC else "aggregate"
        kind = "corrected" if errorType == NVML_MEMORY_ERROR_TYPE_CORRECTED else "uncorrected"
        return int(v(handle, "ecc").get(f"{scope}_{kind}", 0))

    def nvmlDeviceGetRetiredPages(device: _Handle, sourceFilter: int) -> list[int]:  # noqa: N803
        sim.enter("nvmlDeviceGetRetiredPages", device)
        key = "dbe" if sourceFilter == NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR else "sbe"
        count = int(v(device, "retired_pages").get(key, 0))
        return [0x1000 * (n + 1) for n in range(count)]

    def nvmlDeviceGetRetiredPagesPendingStatus(device: _Handle) -> int:
        sim.enter("nvmlDeviceGetRetiredPagesPendingStatus", device)
        return NVML_FEATURE_ENABLED if v(device, "retired_pages").get("pending") else NVML_FEATURE_DISABLED

    def nvmlDeviceGetRemappedRows(device: _Handle) -> tuple[int, int, int, int]:
        sim.enter("nvmlDeviceGetRemappedRows", device)
        r = v(device, "remapped_rows")
        return (int(r.get("correctable", 0)), int(r.get("uncorrectable", 0)),
                int(bool(r.get("pending"))), int(bool(r.get("failure"))))

    def pcie(call: str, key: str) -> Any:
        return simple(call, lambda h: int(v(h, "pcie")[key]))

    def _link_check(device: _Handle, link: int) -> dict[str, Any]:
        nv = v(device, "nvlink")
        if not 0 <= link < int(nv.get("links", 0)):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return dict(nv)

    def nvmlDeviceGetNvLinkState(device: _Handle, link: int) -> int:
        sim.enter("nvmlDeviceGetNvLinkState", device)
        nv = _link_check(device, link)
        return NVML_FEATURE_DISABLED if link in nv.get("down", []) else NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkErrorCounter(device: _Handle, link: int, counter: int) -> int:
        sim.enter("nvmlDeviceGetNvLinkErrorCounter", device)
        nv = _link_check(device, link)
        name = {NVML_NVLINK_ERROR_DL_REPLAY: "replay", NVML_NVLINK_ERROR_DL_RECOVERY: "recovery",
                NVML_NVLINK_ERROR_DL_CRC_FLIT: "crc_flit", NVML_NVLINK_ERROR_DL_CRC_DATA: "crc_data"}[counter]
        for entry in nv.get("errors", []):
            if entry.get("link") == link:
                return int(entry.get(name, 0))
        return int(nv.get(name, 0))

    def nvmlDeviceGetGpuFabricInfo(device: _Handle, gpuFabricInfo: Any) -> int:  # noqa: N803
        sim.enter("nvmlDeviceGetGpuFabricInfo", device)
        # Like the C API behind pynvml, this wants a pointer: ctypes.byref(info) or pointer(info).
        info = getattr(gpuFabricInfo, "_obj", None) or getattr(gpuFabricInfo, "contents", None)
        if not isinstance(info, c_nvmlGpuFabricInfo_t):
            raise TypeError("nvmlDeviceGetGpuFabricInfo: pass ctypes.byref(c_nvmlGpuFabricInfo_t()), "
                            f"not {type(gpuFabricInfo).__name__}")
        fabric = v(device, "fabric")
        info.state = FABRIC_STATES[fabric.get("state", "completed")]
        info.status = int(fabric.get("status", 0))
        return NVML_SUCCESS

    def nvmlDeviceGetComputeRunningProcesses(handle: _Handle) -> list[_Process]:
        sim.enter("nvmlDeviceGetComputeRunningProcesses", handle)
        return [_Process(int(p["pid"]), int(p.get("used_memory_mib", 0)) << 20) for p in v(handle, "processes")]

    def nvmlDeviceGetCurrentClocksEventReasons(handle: _Handle) -> int:
        sim.enter("nvmlDeviceGetCurrentClocksEventReasons", handle)
        bits = 0
        for name in v(handle, "throttle_reasons"):
            bits |= THROTTLE_BITS[name]
        return bits

    def nvmlDeviceGetFieldValues(handle: _Handle, fieldIds: list[Any]) -> list[_FieldValue]:  # noqa: N803
        sim.enter("nvmlDeviceGetFieldValues", handle)
        out = []
        for fid in fieldIds:
            if fid == NVML_FI_DEV_GET_GPU_RECOVERY_ACTION:
                action = RECOVERY_ACTIONS[v(handle, "recovery_action")]
                out.append(_FieldValue(fid, NVML_SUCCESS, _FieldValueUnion(action)))
            else:
                out.append(_FieldValue(fid, NVML_ERROR_NOT_SUPPORTED))
        return out

    functions = {
        "nvmlInit": nvmlInit,
        "nvmlShutdown": nvmlShutdown,
        "nvmlSystemGetDriverVersion": nvmlSystemGetDriverVersion,
        "nvmlSystemGetCudaDriverVersion": nvmlSystemGetCudaDriverVersion,
        "nvmlDeviceGetCount": nvmlDeviceGetCount,
        "nvmlDeviceGetHandleByIndex": nvmlDeviceGetHandleByIndex,
        "nvmlDeviceGetName": simple("nvmlDeviceGetName", lambda h: str(v(h, "name"))),
        "nvmlDeviceGetUUID": simple("nvmlDeviceGetUUID", lambda h: str(v(h, "uuid"))),
        "nvmlDeviceGetPciInfo": simple("nvmlDeviceGetPciInfo", lambda h: _Pci(
            "0000" + str(v(h, "pci_bus_id")).upper(), str(v(h, "pci_bus_id")).upper())),
        "nvmlDeviceGetTemperature": nvmlDeviceGetTemperature,
        "nvmlDeviceGetTemperatureThreshold": nvmlDeviceGetTemperatureThreshold,
        "nvmlDeviceGetPowerUsage": simple("nvmlDeviceGetPowerUsage", lambda h: int(v(h, "power_w") * 1000)),
        "nvmlDeviceGetEnforcedPowerLimit": simple("nvmlDeviceGetEnforcedPowerLimit",
                                                  lambda h: int(v(h, "power_limit_w") * 1000)),
        "nvmlDeviceGetUtilizationRates": simple("nvmlDeviceGetUtilizationRates", lambda h: _Util(
            int(v(h, "utilization_gpu_pct")), int(v(h, "utilization_memory_pct")))),
        "nvmlDeviceGetMemoryInfo": nvmlDeviceGetMemoryInfo,
        "nvmlDeviceGetEccMode": simple("nvmlDeviceGetEccMode", lambda h: [
            NVML_FEATURE_ENABLED if v(h, "ecc_enabled") else NVML_FEATURE_DISABLED,
            NVML_FEATURE_ENABLED if v(h, "ecc_pending_enabled") else NVML_FEATURE_DISABLED]),
        "nvmlDeviceGetTotalEccErrors": nvmlDeviceGetTotalEccErrors,
        "nvmlDeviceGetRetiredPages": nvmlDeviceGetRetiredPages,
        "nvmlDeviceGetRetiredPagesPendingStatus": nvmlDeviceGetRetiredPagesPendingStatus,
        "nvmlDeviceGetRemappedRows": nvmlDeviceGetRemappedRows,
        "nvmlDeviceGetCurrPcieLinkGeneration": pcie("nvmlDeviceGetCurrPcieLinkGeneration", "gen"),
        "nvmlDeviceGetMaxPcieLinkGeneration": pcie("nvmlDeviceGetMaxPcieLinkGeneration", "max_gen"),
        "nvmlDeviceGetCurrPcieLinkWidth": pcie("nvmlDeviceGetCurrPcieLinkWidth", "width"),
        "nvmlDeviceGetMaxPcieLinkWidth": pcie("nvmlDeviceGetMaxPcieLinkWidth", "max_width"),
        "nvmlDeviceGetNvLinkState": nvmlDeviceGetNvLinkState,
        "nvmlDeviceGetNvLinkErrorCounter": nvmlDeviceGetNvLinkErrorCounter,
        "nvmlDeviceGetGpuFabricInfo": nvmlDeviceGetGpuFabricInfo,
        "nvmlDeviceGetComputeRunningProcesses": nvmlDeviceGetComputeRunningProcesses,
        "nvmlDeviceGetCurrentClocksEventReasons": nvmlDeviceGetCurrentClocksEventReasons,
        "nvmlDeviceGetPersistenceMode": simple("nvmlDeviceGetPersistenceMode", lambda h: (
            NVML_FEATURE_ENABLED if v(h, "persistence_mode") else NVML_FEATURE_DISABLED)),
        "nvmlDeviceGetFieldValues": nvmlDeviceGetFieldValues,
    }
    for name, fn in functions.items():
        setattr(mod, name, fn)
    return mod
