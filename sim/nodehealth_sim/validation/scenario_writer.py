"""A simulator scenario that reproduces a recorded node (docs/simulation.md's format).

``scenario_from_calls`` turns the calls of ``calls.jsonl`` into the scenario's tables: each
call that answered sets the keys the simulator answers that call from (``CALL_RULES``, one
entry per NVML function; ``FIELD_KEYS`` for ``nvmlDeviceGetFieldValues``), a call that answered
NOT_SUPPORTED puts the function in the GPU's ``unsupported`` list, any other error becomes a
``[[faults.errors]]`` entry, and a call that never returned a ``[[faults.hangs]]`` entry.
What the format cannot say is kept as a note for the report.

``write`` renders the tables as TOML and checks the file with ``nodehealth_sim.nvml.parse``:
a key the simulator does not take (an older or newer scenario format) is dropped, with a
note, until the file parses. So the writer may know keys ahead of the simulator.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from nodehealth.validation.record import Call

# nvml.h values (the same in every pynvml and in the simulator).
SUCCESS, INVALID_ARGUMENT, NOT_SUPPORTED, FUNCTION_NOT_FOUND = 0, 2, 3, 13
ARGUMENT_VERSION_MISMATCH = 25
FEATURE_ENABLED = 1
# A return that says "this driver or wheel lacks the call": the driver branch models it.
DRIVER_SHAPE_CODES = frozenset({FUNCTION_NOT_FOUND, ARGUMENT_VERSION_MISMATCH})
INIT_STATES = {9: "driver_not_loaded", 4: "no_permission", 12: "library_not_found", 999: "init_error"}
THRESHOLD_KEYS = {0: "shutdown_c", 1: "slowdown_c", 2: "mem_max_c", 3: "gpu_max_c"}
ECC_KEYS = {(0, 0): "volatile_corrected", (1, 0): "volatile_uncorrected", (0, 1): "aggregate_corrected",
            (1, 1): "aggregate_uncorrected"}  # (error type, counter type)
NVLINK_COUNTERS = {0: "replay", 1: "recovery", 2: "crc_flit", 3: "crc_data"}
THROTTLE_BITS = {
    "gpu_idle": 0x1, "applications_clocks": 0x2, "sw_power_cap": 0x4, "hw_slowdown": 0x8,
    "sync_boost": 0x10, "sw_thermal_slowdown": 0x20, "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80, "display_clocks": 0x100,
}
RECOVERY_ACTIONS = {0: "none", 1: "gpu_reset", 2: "node_reboot", 3: "drain_p2p", 4: "drain_and_reset",
                    5: "recover_imex_domain", 6: "bus_reset", 7: "system_reboot"}
FABRIC_STATES = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}

# nvmlDeviceGetFieldValues: field id -> (scenario key, conversion). Per-link fields (scopeId =
# link) are in LINK_FIELDS. The function a field stands for in ``unsupported`` is FIELD_CALL.
FIELD_KEYS: dict[int, tuple[str, Callable[[Any], Any]]] = {
    3: ("ecc.volatile_corrected", int), 4: ("ecc.volatile_uncorrected", int),
    5: ("ecc.aggregate_corrected", int), 6: ("ecc.aggregate_uncorrected", int),
    29: ("retired_pages.sbe", int), 30: ("retired_pages.dbe", int), 31: ("retired_pages.pending", bool),
    82: ("memory_temp_c", int), 91: ("nvlink.links", int),
    142: ("remapped_rows.correctable", int), 143: ("remapped_rows.uncorrectable", int),
    144: ("remapped_rows.pending", bool), 145: ("remapped_rows.failure", bool),
    230: ("recovery_action", lambda v: RECOVERY_ACTIONS.get(int(v), f"unknown({int(v)})")),
}
LINK_FIELDS = {165: "state", 161: "replay", 162: "recovery", 163: "crc_flit"}
FIELD_CALL = {"ecc": "nvmlDeviceGetTotalEccErrors", "retired_pages": "nvmlDeviceGetRetiredPages",
              "remapped_rows": "nvmlDeviceGetRemappedRows", "nvlink": "nvmlDeviceGetNvLinkState"}

# The order keys are written in (one [[gpu]] table); a key not listed goes last.
GPU_KEY_ORDER = (
    "name", "uuid", "pci_bus_id", "missing", "temperature_c", "slowdown_c", "shutdown_c", "gpu_max_c", "mem_max_c",
    "memory_temp_c", "power_w", "power_limit_w", "utilization_gpu_pct", "utilization_memory_pct",
    "memory_total_mib", "memory_used_mib", "ecc_enabled", "ecc_pending_enabled", "ecc", "retired_pages",
    "remapped_rows", "pcie", "nvlink", "fabric", "processes", "throttle_reasons", "persistence_mode", "mig_mode",
    "recovery_action", "unsupported",
)


@dataclass
class _Gpu:
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


@dataclass
class Built:
    """The scenario's tables and what could not be said in them."""

    node: dict[str, Any] = field(default_factory=dict)
    gpus: list[dict[str, Any]] = field(default_factory=list)
    faults: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _arg(call: Call, i: int) -> Any:
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


def _mib(value: Any) -> int:
    return int(round(int(value) / float(1 << 20)))


def _watts(mw: Any) -> float:
    return round(int(mw) / 1000.0, 3)


def _pair(value: Any) -> tuple[Any, Any]:
    if isinstance(value, (list, tuple)) and len(value) >= 2:
        return value[0], value[1]
    return value, value


# --------------------------------------------------------------------------- the call rules


def _temperature(g: _Gpu, c: Call) -> None:
    if _arg(c, 1) in (0, None):
        g.set("temperature_c", int(c.value))


def _threshold(g: _Gpu, c: Call) -> None:
    key = THRESHOLD_KEYS.get(_arg(c, 1))
    if key:
        g.set(key, int(c.value))


def _memory(g: _Gpu, c: Call) -> None:
    if isinstance(c.value, dict):
        g.set("memory_total_mib", _mib(c.value.get("total", 0)))
        g.set("memory_used_mib", _mib(c.value.get("used", 0)))


def _utilization(g: _Gpu, c: Call) -> None:
    if isinstance(c.value, dict):
        g.set("utilization_gpu_pct", int(c.value.get("gpu", 0)))
        g.set("utilization_memory_pct", int(c.value.get("memory", 0)))


def _ecc_mode(g: _Gpu, c: Call) -> None:
    current, pending = _pair(c.value)
    g.set("ecc_enabled", current == FEATURE_ENABLED)
    g.set("ecc_pending_enabled", pending == FEATURE_ENABLED)


def _ecc_errors(g: _Gpu, c: Call) -> None:
    key = ECC_KEYS.get((_arg(c, 1), _arg(c, 2)))
    if key:
        g.set(f"ecc.{key}", int(c.value))


def _retired(g: _Gpu, c: Call) -> None:
    g.set("retired_pages.dbe" if _arg(c, 1) == 1 else "retired_pages.sbe", len(c.value or []))


def _remapped(g: _Gpu, c: Call) -> None:
    corr, unc, pending, failure = (list(c.value) + [0, 0, 0, 0])[:4]
    g.set("remapped_rows.correctable", int(corr))
    g.set("remapped_rows.uncorrectable", int(unc))
    g.set("remapped_rows.pending", bool(pending))
    g.set("remapped_rows.failure", bool(failure))


def _nvlink_state(g: _Gpu, c: Call) -> None:
    g.link_state[int(_arg(c, 1) or 0)] = int(c.value)


def _nvlink_counter(g: _Gpu, c: Call) -> None:
    name = NVLINK_COUNTERS.get(_arg(c, 2))
    if name:
        g.link_counters.setdefault(int(_arg(c, 1) or 0), {})[name] = int(c.value)


def _fabric(g: _Gpu, c: Call) -> None:
    info = c.out[0] if c.out and isinstance(c.out[0], dict) else {}
    if "state" in info:
        g.set("fabric.state", FABRIC_STATES.get(int(info["state"]), "not_supported"))
        g.set("fabric.status", int(info.get("status", 0)))
    for src, key in (("healthMask", "health_mask"), ("healthSummary", "health_summary")):
        if src in info:
            g.set(f"fabric.{key}", int(info[src]))


def _processes(g: _Gpu, c: Call) -> None:
    procs = []
    for p in c.value or []:
        if isinstance(p, dict) and "pid" in p:
            used = p.get("usedGpuMemory")
            procs.append({"pid": int(p["pid"]), "used_memory_mib": _mib(used) if isinstance(used, int) else 0})
    g.set("processes", procs)


def _throttle(g: _Gpu, c: Call, notes: list[str], where: str) -> None:
    bits = int(c.value)
    g.set("throttle_reasons", [name for name, bit in THROTTLE_BITS.items() if bits & bit])
    unknown = bits & ~sum(THROTTLE_BITS.values())
    if unknown:
        notes.append(f"{where}: {c.fn} bits {unknown:#x} have no scenario name (not reproduced)")


def _fields(g: _Gpu, c: Call, notes: list[str], where: str) -> None:
    wanted = c.argv[1] if len(c.argv) > 1 and isinstance(c.argv[1], list) else []
    unsupported_groups: Counter[str] = Counter()
    supported_groups: Counter[str] = Counter()
    for asked, got in zip(wanted, c.value or []):
        if not isinstance(got, dict):
            continue
        asked_id, asked_scope = ((asked[0], asked[1] if len(asked) > 1 else 0) if isinstance(asked, list)
                                 else (asked, 0))
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
CALL_RULES: dict[str, Callable[[_Gpu, Call], None]] = {
    "nvmlDeviceGetName": lambda g, c: g.set("name", str(c.value)),
    "nvmlDeviceGetUUID": lambda g, c: g.set("uuid", str(c.value)),
    "nvmlDeviceGetPciInfo": lambda g, c: g.set("pci_bus_id", sysfs_bus_id(
        (c.value or {}).get("busId") or (c.value or {}).get("busIdLegacy"))),
    "nvmlDeviceGetTemperature": _temperature,
    "nvmlDeviceGetTemperatureThreshold": _threshold,
    "nvmlDeviceGetPowerUsage": lambda g, c: g.set("power_w", _watts(c.value)),
    "nvmlDeviceGetEnforcedPowerLimit": lambda g, c: g.set("power_limit_w", _watts(c.value)),
    "nvmlDeviceGetUtilizationRates": _utilization,
    "nvmlDeviceGetMemoryInfo": _memory,
    "nvmlDeviceGetEccMode": _ecc_mode,
    "nvmlDeviceGetTotalEccErrors": _ecc_errors,
    "nvmlDeviceGetRetiredPages": _retired,
    "nvmlDeviceGetRetiredPagesPendingStatus": lambda g, c: g.set("retired_pages.pending",
                                                                 int(c.value) == FEATURE_ENABLED),
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
    "nvmlDeviceGetMigMode": lambda g, c: g.set("mig_mode", _pair(c.value)[0] == FEATURE_ENABLED),
}
# Rules that also report what they cannot reproduce.
NOTING_RULES: dict[str, Callable[[_Gpu, Call, list[str], str], None]] = {
    "nvmlDeviceGetCurrentClocksEventReasons": _throttle,
    "nvmlDeviceGetCurrentClocksThrottleReasons": _throttle,
    "nvmlDeviceGetFieldValues": _fields,
}
NODE_RULES: dict[str, str] = {
    "nvmlSystemGetDriverVersion": "driver_version",
    "nvmlSystemGetCudaDriverVersion": "cuda_driver_version",
}
NVLINK_CALLS = ("nvmlDeviceGetNvLinkState", "nvmlDeviceGetNvLinkErrorCounter")


def _driver_branch(version: str) -> Optional[int]:
    """The simulator's driver branch for ``version`` (nodehealth_sim.driver.branch_for), None when unparsable."""
    from nodehealth_sim import driver

    try:
        return driver.branch_for(version)
    except ValueError:  # an unparsable version: no branch
        return None


def scenario_from_calls(calls: list[Call], pci_bus_ids: Optional[list[str]] = None,
                        unavailable: Optional[tuple[str, str]] = None) -> Built:
    """The scenario tables that make the simulator answer ``calls`` as the node did."""
    built = Built()
    gpus: dict[int, _Gpu] = {}
    errors: list[dict[str, Any]] = []
    hangs: list[dict[str, Any]] = []
    count: Optional[int] = None
    if unavailable is not None and unavailable[0] == "library_not_found":
        built.faults["nvml"] = "library_not_found"
    for c in calls:
        where = f"GPU {c.gpu}" if c.gpu is not None else "node"
        if c.fn == "nvmlDeviceGetHandleByIndex" and isinstance(_arg(c, 0), int):
            index = int(_arg(c, 0))
            gpus.setdefault(index, _Gpu())
            gpu: Optional[int] = index
        else:
            gpu = c.gpu
        g = gpus.setdefault(gpu, _Gpu()) if gpu is not None else None
        if not c.returned:
            hangs.append({"call": c.fn, **({"gpu": gpu} if gpu is not None else {})})
            continue
        if c.rc == SUCCESS:
            if c.fn in NODE_RULES:
                built.node[NODE_RULES[c.fn]] = c.value if c.fn != "nvmlSystemGetDriverVersion" else str(c.value)
            elif c.fn == "nvmlDeviceGetCount":
                count = int(c.value)
            elif g is not None and c.fn in CALL_RULES:
                try:
                    CALL_RULES[c.fn](g, c)
                except (TypeError, ValueError, AttributeError) as exc:
                    built.notes.append(f"{where}: {c.fn} answered {c.value!r}, not understood ({exc})")
            elif g is not None and c.fn in NOTING_RULES:
                NOTING_RULES[c.fn](g, c, built.notes, where)
            elif c.fn not in ("nvmlInit", "nvmlInitWithFlags", "nvmlShutdown", "nvmlDeviceGetHandleByIndex"):
                built.notes.append(f"{where}: {c.fn}: no scenario key answers this call (not reproduced)")
            continue
        if not isinstance(c.rc, int):
            built.notes.append(f"{where}: {c.fn} raised {c.rc} ({c.error}): the wheel and driver disagree; "
                               "modelled by the driver branch, not by a fault")
            continue
        if c.fn.startswith("nvmlInit"):
            if c.rc in INIT_STATES:
                built.faults["nvml"] = INIT_STATES[c.rc]
            else:
                errors.append({"call": "nvmlInit", "error": c.error})
            continue
        if c.rc in DRIVER_SHAPE_CODES:
            built.notes.append(f"{where}: {c.fn} answered {c.error}: modelled by the driver branch, not by a fault")
            continue
        if g is not None and c.fn in NVLINK_CALLS and c.rc in (INVALID_ARGUMENT, NOT_SUPPORTED):
            link = int(_arg(c, 1) or 0)
            if c.fn == "nvmlDeviceGetNvLinkState" and link == 0 and c.rc == NOT_SUPPORTED:
                g.unsupport(c.fn)
            elif c.fn == "nvmlDeviceGetNvLinkState":
                g.link_end = link if g.link_end is None else min(g.link_end, link)
            else:
                g.counters_unsupported = True
            continue
        if g is not None and c.rc == NOT_SUPPORTED:
            g.unsupport(c.fn)
            continue
        entry = {"call": c.fn, **({"gpu": gpu} if gpu is not None else {}), "error": c.error}
        if entry not in errors:
            errors.append(entry)
    if "driver_version" in built.node:
        branch = _driver_branch(built.node["driver_version"])
        if branch is not None:
            built.node["driver_branch"] = branch
    for index in sorted(gpus):
        built.gpus.append(_finish(gpus[index], index, built.notes))
    if count is not None and count > len(built.gpus):
        built.gpus += [{} for _ in range(count - len(built.gpus))]
    _place_buses(built.gpus, pci_bus_ids or [])
    if errors:
        built.faults["errors"] = errors
    if hangs:
        built.faults["hangs"] = hangs
    built.notes = group_notes(built.notes)
    return built


def group_notes(notes: list[str]) -> list[str]:
    """The same note for several GPUs as one line naming them: "GPU 0-3, 5: ..."."""
    by_text: dict[str, list[int]] = {}
    order: list[str] = []
    for note in notes:
        m = re.match(r"^GPU (\d+): (.*)$", note, re.S)
        text, gpu = (m.group(2), int(m.group(1))) if m else (note, None)
        if text not in by_text:
            by_text[text] = []
            order.append(text)
        if gpu is not None and gpu not in by_text[text]:
            by_text[text].append(gpu)
    out = []
    for text in order:
        gpus = sorted(by_text[text])
        out.append(f"GPU {_ranges(gpus)}: {text}" if gpus else text)
    return out


def _ranges(numbers: list[int]) -> str:
    parts: list[str] = []
    for n in numbers:
        if parts and _last(parts[-1]) == n - 1:
            first = parts[-1].split("-")[0]
            parts[-1] = f"{first}-{n}"
        else:
            parts.append(str(n))
    return ", ".join(parts)


def _last(part: str) -> int:
    return int(part.split("-")[-1])


def _finish(g: _Gpu, index: int, notes: list[str]) -> dict[str, Any]:
    values = g.values
    if g.link_state or g.link_end is not None:
        links = max(list(g.link_state) + [-1]) + 1 if g.link_state else 0
        if g.link_end is not None and not g.link_state:
            links = g.link_end
        nvlink = values.setdefault("nvlink", {})
        nvlink.setdefault("links", links)
        nvlink["down"] = sorted(n for n, state in g.link_state.items() if state != FEATURE_ENABLED)
    if g.link_counters:
        nvlink = values.setdefault("nvlink", {})
        names = sorted({n for counters in g.link_counters.values() for n in counters})
        base = {}
        for name in names:
            seen = Counter(c[name] for c in g.link_counters.values() if name in c)
            base[name] = max(seen.items(), key=lambda kv: (kv[1], -kv[0]))[0]  # a tie: the smaller
            nvlink[name] = base[name]
        per_link = []
        for link in sorted(g.link_counters):
            diff = {n: v for n, v in g.link_counters[link].items() if v != base.get(n)}
            if diff:
                per_link.append({"link": link, **diff})
        if per_link:
            nvlink["errors"] = per_link
    if g.counters_unsupported:
        values.setdefault("nvlink", {})["counters"] = False
    if g.unsupported:
        values["unsupported"] = list(g.unsupported)
    ordered = {k: values[k] for k in GPU_KEY_ORDER if k in values}
    ordered.update({k: v for k, v in values.items() if k not in ordered})
    return ordered


def _default_bus(i: int) -> str:
    return f"0000:{(0x18 + 0x11 * i) & 0xFF:02x}:00.0"


def _place_buses(gpus: list[dict[str, Any]], pci_bus_ids: list[str]) -> None:
    """A GPU NVML counts but whose address was not read takes the next PCI address no read GPU
    has (NVML numbers GPUs in bus order); PCI addresses left over are GPUs NVML does not see
    (``missing`` tables, in bus order); a GPU with no address at all gets one nobody has."""
    seen = {str(g["pci_bus_id"]).lower() for g in gpus if g.get("pci_bus_id")}
    unclaimed = [b.lower() for b in pci_bus_ids if b.lower() not in seen]
    for i, g in enumerate(gpus):
        if g.get("pci_bus_id"):
            continue
        g.pop("pci_bus_id", None)
        if unclaimed:
            bus = unclaimed.pop(0)
        else:
            n, bus = i, _default_bus(i)
            while bus in seen:
                n += 1
                bus = f"0000:{0xE0 + n % 0x20:02x}:{n // 0x20:02x}.0"
        g["pci_bus_id"] = bus
        seen.add(bus)
    if not unclaimed:
        return
    buses = [g["pci_bus_id"] for g in gpus]
    tables = [{"pci_bus_id": b, "missing": True} for b in unclaimed]
    if buses == sorted(buses):
        gpus[:] = sorted(gpus + tables, key=lambda t: str(t["pci_bus_id"]))
    else:
        gpus.extend(tables)


# --------------------------------------------------------------------------- TOML


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"not a finite number: {value!r}")
        text = repr(value)
        return text if any(ch in text for ch in ".eE") else text + ".0"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items()) + " }" \
            if value else "{}"
    raise ValueError(f"no TOML for {type(value).__name__}")


def _toml_key(key: str) -> str:
    return key if re.match(r"^[A-Za-z0-9_-]+$", key) else json.dumps(key)


def to_toml(built: Built, header: str = "") -> str:
    lines = [f"# {line}" if line else "#" for line in header.splitlines()]
    if lines:
        lines.append("")
    if built.node:
        lines.append("[node]")
        lines += [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in built.node.items()]
        lines.append("")
    for i, gpu in enumerate(built.gpus):
        lines.append(f"[[gpu]]  # {'on PCI, not seen by NVML' if gpu.get('missing') else f'GPU {i}'}")
        lines += [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in gpu.items()]
        lines.append("")
    if "nvml" in built.faults:
        lines += ["[faults]", f"nvml = {_toml_value(built.faults['nvml'])}", ""]
    for kind in ("errors", "hangs"):
        for entry in built.faults.get(kind, []):
            lines.append(f"[[faults.{kind}]]")
            lines += [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in entry.items()]
            lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


# --------------------------------------------------------------------------- writing, checked

_ERROR_KEY = re.compile(r"^(?P<key>[A-Za-z_][\w.\[\]]*): (?P<msg>.*)$", re.S)


def _drop(built: Built, key: str, msg: str) -> bool:
    """Remove what the scenario parser named ``key``; False when it names nothing of ours."""
    m = re.match(r"^(node|gpu\[(\d+)\]|faults\.(errors|hangs)\[(\d+)\]|faults)\.?(.*)$", key)
    if not m:
        return False
    head, gpu_i, fault_kind, fault_i, rest = m.groups()
    if fault_kind is not None:
        entries = built.faults.get(fault_kind, [])
        if int(fault_i) < len(entries):
            del entries[int(fault_i)]
            if not entries:
                del built.faults[fault_kind]
            return True
        return False
    table: Any
    if head == "node":
        table = built.node
    elif head == "faults":
        table = built.faults
    else:
        if int(gpu_i) >= len(built.gpus):
            return False
        table = built.gpus[int(gpu_i)]
    parts = re.sub(r"\[\d+\]", "", rest).split(".") if rest else []
    if not parts:
        return False
    for part in parts[:-1]:
        if not isinstance(table.get(part), dict):
            return False
        table = table[part]
    last = parts[-1]
    if last not in table:
        return False
    if isinstance(table[last], list) and all(isinstance(v, str) for v in table[last]):
        named = [v for v in table[last] if repr(v) in msg or f'"{v}"' in msg]
        if named:
            table[last] = [v for v in table[last] if v not in named]
            if not table[last]:
                del table[last]
            return True
    del table[last]
    return True


def write(path: str, built: Built, header: str = "", parse: Optional[Callable[[str], Any]] = None,
          max_drops: int = 100, dir_fd: Optional[int] = None) -> list[str]:
    """Write ``built`` to ``path`` as TOML that ``parse`` (default: the simulator's) accepts.

    The file is a fresh temp name renamed over ``path``'s last component (``ground.replace_own``),
    through ``dir_fd`` when given (the ``--out`` directory's descriptor; ``path`` is then only what
    the parser reads): a link planted there is replaced, never written through.
    Returns the notes for the keys dropped because the parser refused them.
    """
    if parse is None:
        from nodehealth_sim import nvml as simnvml

        parse = simnvml.parse
    dropped: list[str] = []
    own_fd = dir_fd if dir_fd is not None else os.open(os.path.dirname(os.path.abspath(path)),
                                                       os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return _write(path, built, header, parse, max_drops, own_fd, dropped)
    finally:
        if dir_fd is None:
            os.close(own_fd)


def _write(path: str, built: Built, header: str, parse: Callable[[str], Any], max_drops: int, dir_fd: int,
           dropped: list[str]) -> list[str]:
    from nodehealth.platform import ground
    from nodehealth_sim.nvml import ScenarioError

    for _ in range(max_drops):
        ground.replace_own(dir_fd, os.path.basename(path), to_toml(built, header).encode(), 0o644)
        try:
            parse(path)
            return dropped
        except ScenarioError as exc:
            text = str(exc)
            rest = text[len(path) + 2:] if text.startswith(path + ": ") else text
            m = _ERROR_KEY.match(rest)
            if not m or not _drop(built, m.group("key"), m.group("msg")):
                raise
            dropped.append(f"{m.group('key')}: dropped, the simulator does not take it ({m.group('msg')})")
    raise ValueError(f"{path}: the simulator refused over {max_drops} keys")
