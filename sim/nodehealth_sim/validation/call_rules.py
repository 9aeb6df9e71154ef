"""How each answered NVML call sets a recorded node's scenario keys (``scenario_writer``'s table).

``CALL_RULES`` has one entry per NVML function (``rule(gpu, call)``), ``NOTING_RULES`` the ones that
also note what the scenario format cannot say, ``FIELD_KEYS`` the ``nvmlDeviceGetFieldValues`` field
ids; ``GpuTables`` collects one GPU's keys while the calls are read. The one table to extend for a
new call.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from nodehealth.validation.record import Call
from nodehealth_sim import scenario_keys
from nodehealth_sim.scenario_keys import THROTTLE_BITS

# nvml.h values (the same in every pynvml and in the simulator).
SUCCESS, INVALID_ARGUMENT, NOT_SUPPORTED, FUNCTION_NOT_FOUND = 0, 2, 3, 13
ARGUMENT_VERSION_MISMATCH = 25
FEATURE_ENABLED = 1
# A return that says "this driver or wheel lacks the call": the driver branch models it.
DRIVER_SHAPE_CODES = frozenset({FUNCTION_NOT_FOUND, ARGUMENT_VERSION_MISMATCH})
INIT_STATES = {9: "driver_not_loaded", 4: "no_permission", 12: "library_not_found", 999: "init_error"}
THRESHOLD_KEYS = {0: "shutdown_c", 1: "slowdown_c", 2: "mem_max_c", 3: "gpu_max_c"}
ECC_KEYS = {
    (0, 0): "volatile_corrected",
    (1, 0): "volatile_uncorrected",
    (0, 1): "aggregate_corrected",
    (1, 1): "aggregate_uncorrected",
}  # (error type, counter type)
NVLINK_COUNTERS = {0: "replay", 1: "recovery", 2: "crc_flit", 3: "crc_data"}
# the scenario's names of the recovery actions and fabric states, by nvml.h's value
RECOVERY_ACTIONS = {value: name for name, value in scenario_keys.RECOVERY_ACTIONS.items()}
FABRIC_STATES = {value: name for name, value in scenario_keys.FABRIC_STATES.items()}

# nvmlDeviceGetFieldValues: field id -> (scenario key, conversion). Per-link fields (scopeId =
# link) are in LINK_FIELDS. The function a field stands for in ``unsupported`` is FIELD_CALL.
FIELD_KEYS: dict[int, tuple[str, Callable[[Any], Any]]] = {
    3: ("ecc.volatile_corrected", int),
    4: ("ecc.volatile_uncorrected", int),
    5: ("ecc.aggregate_corrected", int),
    6: ("ecc.aggregate_uncorrected", int),
    29: ("retired_pages.sbe", int),
    30: ("retired_pages.dbe", int),
    31: ("retired_pages.pending", bool),
    82: ("memory_temp_c", int),
    91: ("nvlink.links", int),
    142: ("remapped_rows.correctable", int),
    143: ("remapped_rows.uncorrectable", int),
    144: ("remapped_rows.pending", bool),
    145: ("remapped_rows.failure", bool),
    230: ("recovery_action", lambda v: RECOVERY_ACTIONS.get(int(v), f"unknown({int(v)})")),
}
LINK_FIELDS = {165: "state", 161: "replay", 162: "recovery", 163: "crc_flit"}
FIELD_CALL = {
    "ecc": "nvmlDeviceGetTotalEccErrors",
    "retired_pages": "nvmlDeviceGetRetiredPages",
    "remapped_rows": "nvmlDeviceGetRemappedRows",
    "nvlink": "nvmlDeviceGetNvLinkState",
}


@dataclass
class GpuTables:
    """One GPU's scenario keys as the calls set them, and what they said about its links."""

    values: dict[str, Any] = field(default_factory=dict)
    unsupported: list[str] = field(default_factory=list)
    link_state: dict[int, int] = field(default_factory=dict)
    link_counters: dict[int, dict[str, int]] = field(default_factory=dict)
    link_end: Optional[int] = None  # the first link number that answered "no such link"
    counters_unsupported: bool = False

    def set(self, key: str, value: Any) -> None:
        table = self.values
        parts = key.split(".")
        for part in parts[:-1]:
            table = table.setdefault(part, {})
        table[parts[-1]] = value

    def unsupport(self, fn: str) -> None:
        if fn not in self.unsupported:
            self.unsupported.append(fn)


def arg(call: Call, i: int) -> Any:
    return call.argv[i] if len(call.argv) > i else None


def sysfs_bus_id(bus: Any) -> Optional[str]:
    """NVML's busId ("00000000:3B:00.0") as sysfs spells it ("0000:3b:00.0")."""
    text = str(bus or "").strip().lower()
    domain, sep, rest = text.partition(":")
    if not sep:
        return None
    if len(domain) > 4:
        domain = domain.lstrip("0").rjust(4, "0")
    return f"{domain}:{rest}"


def mib(value: Any) -> int:
    return int(round(int(value) / float(1 << 20)))


def watts(mw: Any) -> float:
    return round(int(mw) / 1000.0, 3)


def pair(value: Any) -> tuple[Any, Any]:
    if isinstance(value, (list, tuple)) and len(value) >= 2:
        return value[0], value[1]
    return value, value


# --------------------------------------------------------------------------- the call rules


def _temperature(g: GpuTables, c: Call) -> None:
    if arg(c, 1) in (0, None):
        g.set("temperature_c", int(c.value))


def _threshold(g: GpuTables, c: Call) -> None:
    key = THRESHOLD_KEYS.get(arg(c, 1))
    if key:
        g.set(key, int(c.value))


def _memory(g: GpuTables, c: Call) -> None:
    if isinstance(c.value, dict):
        g.set("memory_total_mib", mib(c.value.get("total", 0)))
        g.set("memory_used_mib", mib(c.value.get("used", 0)))


def _utilization(g: GpuTables, c: Call) -> None:
    if isinstance(c.value, dict):
        g.set("utilization_gpu_pct", int(c.value.get("gpu", 0)))
        g.set("utilization_memory_pct", int(c.value.get("memory", 0)))


def _ecc_mode(g: GpuTables, c: Call) -> None:
    current, pending = pair(c.value)
    g.set("ecc_enabled", current == FEATURE_ENABLED)
    g.set("ecc_pending_enabled", pending == FEATURE_ENABLED)


def _ecc_errors(g: GpuTables, c: Call) -> None:
    key = ECC_KEYS.get((arg(c, 1), arg(c, 2)))
    if key:
        g.set(f"ecc.{key}", int(c.value))


def _retired(g: GpuTables, c: Call) -> None:
    g.set("retired_pages.dbe" if arg(c, 1) == 1 else "retired_pages.sbe", len(c.value or []))


def _remapped(g: GpuTables, c: Call) -> None:
    corr, unc, pending, failure = (list(c.value) + [0, 0, 0, 0])[:4]
    g.set("remapped_rows.correctable", int(corr))
    g.set("remapped_rows.uncorrectable", int(unc))
    g.set("remapped_rows.pending", bool(pending))
    g.set("remapped_rows.failure", bool(failure))


def _nvlink_state(g: GpuTables, c: Call) -> None:
    g.link_state[int(arg(c, 1) or 0)] = int(c.value)


def _nvlink_counter(g: GpuTables, c: Call) -> None:
    name = NVLINK_COUNTERS.get(arg(c, 2))
    if name:
        g.link_counters.setdefault(int(arg(c, 1) or 0), {})[name] = int(c.value)


def _fabric(g: GpuTables, c: Call) -> None:
    info = c.out[0] if c.out and isinstance(c.out[0], dict) else {}
    if "state" in info:
        g.set("fabric.state", FABRIC_STATES.get(int(info["state"]), "not_supported"))
        g.set("fabric.status", int(info.get("status", 0)))
    for src, key in (("healthMask", "health_mask"), ("healthSummary", "health_summary")):
        if src in info:
            g.set(f"fabric.{key}", int(info[src]))


def _processes(g: GpuTables, c: Call) -> None:
    procs = []
    for p in c.value or []:
        if isinstance(p, dict) and "pid" in p:
            used = p.get("usedGpuMemory")
            procs.append({"pid": int(p["pid"]), "used_memory_mib": mib(used) if isinstance(used, int) else 0})
    g.set("processes", procs)


def _throttle(g: GpuTables, c: Call, notes: list[str], where: str) -> None:
    bits = int(c.value)
    g.set("throttle_reasons", [name for name, bit in THROTTLE_BITS.items() if bits & bit])
    unknown = bits & ~sum(THROTTLE_BITS.values())
    if unknown:
        notes.append(f"{where}: {c.fn} bits {unknown:#x} have no scenario name (not reproduced)")


def _fields(g: GpuTables, c: Call, notes: list[str], where: str) -> None:
    wanted = c.argv[1] if len(c.argv) > 1 and isinstance(c.argv[1], list) else []
    unsupported_groups: Counter[str] = Counter()
    supported_groups: Counter[str] = Counter()
    for asked, got in zip(wanted, c.value or []):
        if not isinstance(got, dict):
            continue
        asked_id, asked_scope = (asked[0], asked[1] if len(asked) > 1 else 0) if isinstance(asked, list) else (asked, 0)
        fid = int(got["fieldId"] if got.get("fieldId") is not None else asked_id)
        scope = int(got["scopeId"] if got.get("scopeId") is not None else asked_scope or 0)
        rc = int(got.get("nvmlReturn", 0))
        value = got.get("value")
        if fid in LINK_FIELDS:
            group = "nvlink_state" if fid == 165 else "nvlink_counters"
            if rc == SUCCESS and value is not None:
                supported_groups[group] += 1
                if fid == 165:
                    g.link_state[scope] = int(value)
                else:
                    g.link_counters.setdefault(scope, {})[LINK_FIELDS[fid]] = int(value)
            elif rc in (NOT_SUPPORTED, INVALID_ARGUMENT):
                unsupported_groups[group] += 1
            else:
                notes.append(f"{where}: field {fid} link {scope} answered {rc}: a per-field error (not reproduced)")
            continue
        if fid not in FIELD_KEYS:
            continue
        key, convert = FIELD_KEYS[fid]
        group = key.split(".")[0]
        if rc == SUCCESS and value is not None:
            supported_groups[group] += 1
            g.set(key, convert(value))
        elif rc in (NOT_SUPPORTED, INVALID_ARGUMENT):
            unsupported_groups[group] += 1
            if key == "nvlink.links":
                g.set("nvlink.links", 0)
        else:
            notes.append(f"{where}: field {fid} ({key}) answered {rc}: a per-field error (not reproduced)")
    for group, fn in FIELD_CALL.items():
        if group != "nvlink" and unsupported_groups[group] and not supported_groups[group]:
            g.unsupport(fn)
    if unsupported_groups["nvlink_counters"] and not supported_groups["nvlink_counters"]:
        g.counters_unsupported = True


# fn -> rule(gpu, call) for a call that answered. The one table to extend for a new call.
CALL_RULES: dict[str, Callable[[GpuTables, Call], None]] = {
    "nvmlDeviceGetName": lambda g, c: g.set("name", str(c.value)),
    "nvmlDeviceGetUUID": lambda g, c: g.set("uuid", str(c.value)),
    "nvmlDeviceGetPciInfo": lambda g, c: g.set(
        "pci_bus_id", sysfs_bus_id((c.value or {}).get("busId") or (c.value or {}).get("busIdLegacy"))
    ),
    "nvmlDeviceGetTemperature": _temperature,
    "nvmlDeviceGetTemperatureThreshold": _threshold,
    "nvmlDeviceGetPowerUsage": lambda g, c: g.set("power_w", watts(c.value)),
    "nvmlDeviceGetEnforcedPowerLimit": lambda g, c: g.set("power_limit_w", watts(c.value)),
    "nvmlDeviceGetUtilizationRates": _utilization,
    "nvmlDeviceGetMemoryInfo": _memory,
    "nvmlDeviceGetEccMode": _ecc_mode,
    "nvmlDeviceGetTotalEccErrors": _ecc_errors,
    "nvmlDeviceGetRetiredPages": _retired,
    "nvmlDeviceGetRetiredPagesPendingStatus": lambda g, c: g.set(
        "retired_pages.pending", int(c.value) == FEATURE_ENABLED
    ),
    "nvmlDeviceGetRemappedRows": _remapped,
    "nvmlDeviceGetCurrPcieLinkGeneration": lambda g, c: g.set("pcie.gen", int(c.value)),
    "nvmlDeviceGetMaxPcieLinkGeneration": lambda g, c: g.set("pcie.max_gen", int(c.value)),
    "nvmlDeviceGetCurrPcieLinkWidth": lambda g, c: g.set("pcie.width", int(c.value)),
    "nvmlDeviceGetMaxPcieLinkWidth": lambda g, c: g.set("pcie.max_width", int(c.value)),
    "nvmlDeviceGetNvLinkState": _nvlink_state,
    "nvmlDeviceGetNvLinkErrorCounter": _nvlink_counter,
    "nvmlDeviceGetGpuFabricInfo": _fabric,
    "nvmlDeviceGetGpuFabricInfoV": _fabric,
    "nvmlDeviceGetComputeRunningProcesses": _processes,
    "nvmlDeviceGetComputeRunningProcesses_v2": _processes,
    "nvmlDeviceGetComputeRunningProcesses_v3": _processes,
    "nvmlDeviceGetPersistenceMode": lambda g, c: g.set("persistence_mode", int(c.value) == FEATURE_ENABLED),
    "nvmlDeviceGetMigMode": lambda g, c: g.set("mig_mode", pair(c.value)[0] == FEATURE_ENABLED),
}
# Rules that also report what they cannot reproduce.
NOTING_RULES: dict[str, Callable[[GpuTables, Call, list[str], str], None]] = {
    "nvmlDeviceGetCurrentClocksEventReasons": _throttle,
    "nvmlDeviceGetCurrentClocksThrottleReasons": _throttle,
    "nvmlDeviceGetFieldValues": _fields,
}
NODE_RULES: dict[str, str] = {
    "nvmlSystemGetDriverVersion": "driver_version",
    "nvmlSystemGetCudaDriverVersion": "cuda_driver_version",
}
NVLINK_CALLS = ("nvmlDeviceGetNvLinkState", "nvmlDeviceGetNvLinkErrorCounter")
