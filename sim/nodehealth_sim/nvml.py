"""Scenario files: one node's simulated GPUs and faults, compiled for the simulated driver.

A scenario (TOML, documented in docs/simulation.md; examples/scenarios/ holds ready-made
nodes) is parsed and validated here, against the keys and names of ``nodehealth_sim.scenario_keys``,
then compiled (``nodehealth_sim.spec``) into the line-oriented spec that the fake
``libnvidia-ml.so.1`` (``sim/nodehealth_sim/fakenvml``, docs/fake-nvml.md) reads. ``loader``
returns what the NVML probe runs in its child: it loads that library for the scenario's
driver branch and imports the real, unmodified pynvml over it.

Every problem in the file is a ``ScenarioError`` naming the file and the key.
"""

from __future__ import annotations

import math
import os
import re
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from nodehealth_sim.scenario_keys import ERROR_CODES as ERROR_CODES
from nodehealth_sim.scenario_keys import FABRIC_STATES as FABRIC_STATES
from nodehealth_sim.scenario_keys import FIELD_CALLS as FIELD_CALLS
from nodehealth_sim.scenario_keys import GPU_KEYS, H100, default_gpu, overlay
from nodehealth_sim.scenario_keys import NVML_STATES as NVML_STATES
from nodehealth_sim.scenario_keys import RECOVERY_ACTIONS as RECOVERY_ACTIONS
from nodehealth_sim.scenario_keys import THROTTLE_BITS as THROTTLE_BITS
from nodehealth_sim.scenario_keys import model_defaults as model_defaults

_PCI_BUS_ID = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


class ScenarioError(Exception):
    """A scenario file problem, worded for a one-line error naming file and key."""


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
    branch: int = 550  # the driver branch: which symbols and struct versions the library has
    slow: tuple[tuple[str, Optional[int], float], ...] = ()  # (call or "*", gpu or None, seconds)
    field_errors: tuple[tuple[int, Optional[int], int], ...] = ()  # (field id, gpu or None, code)

    @property
    def visible(self) -> tuple[SimGpu, ...]:
        return tuple(g for g in self.gpus if not g.missing)

    @property
    def pci_bus_ids(self) -> tuple[str, ...]:
        """Every GPU on the simulated PCI bus, including those NVML no longer sees."""
        return tuple(str(g.values["pci_bus_id"]) for g in self.gpus)


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
    _known(node, {"driver_version", "driver_branch", "cuda_driver_version", "call_delay_ms"}, "node.", err)
    driver = _typed(node.get("driver_version", "550.127.05"), str, "node.driver_version", err)
    cuda = _typed(node.get("cuda_driver_version", 12040), int, "node.cuda_driver_version", err)
    delay_ms = _typed(node.get("call_delay_ms", 0), float, "node.call_delay_ms", err)
    from nodehealth_sim import driver as simdriver

    branch = node.get("driver_branch")
    if branch is None:
        branch = simdriver.branch_for(driver)
    elif _typed(branch, int, "node.driver_branch", err) not in simdriver.BRANCHES:
        raise err(
            "node.driver_branch",
            f"{branch} is not a simulated branch (one of: {', '.join(str(b) for b in simdriver.BRANCHES)})",
        )
    user_defaults = raw.get("defaults", {})
    _check_gpu(user_defaults, "defaults.", err)
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
        model = table.get("model", user_defaults.get("model"))
        base = default_gpu()
        if model is not None:
            known = model_defaults(model)
            if known is None:
                from nodehealth_sim import models

                raise err(
                    f"{where}model" if "model" in table else "defaults.model",
                    f"unknown GPU model {model!r} (known: {', '.join(sorted(models.MODELS))})",
                )
            base = overlay(H100, known)
        values: dict[str, Any] = overlay(overlay(base, user_defaults), table)
        values.setdefault("uuid", f"GPU-{i:08x}-5151-4e4f-8d48-{i:012x}")
        values.setdefault("pci_bus_id", f"0000:{0x18 + 0x11 * i:02x}:00.0")
        bus = str(values["pci_bus_id"]).lower()
        if not _PCI_BUS_ID.match(bus):
            raise err(f"gpu[{i}].pci_bus_id", f'{bus!r} is not a PCI address like "0000:18:00.0"')
        if bus in seen_bus:
            raise err(f"gpu[{i}].pci_bus_id", f"{bus} is used by another GPU")
        seen_bus.add(bus)
        values["pci_bus_id"] = bus
        for name in values.get("throttle_reasons", []):
            if name not in THROTTLE_BITS:
                raise err(f"{where}throttle_reasons", f"unknown reason {name!r} (known: {', '.join(THROTTLE_BITS)})")
        if values.get("recovery_action") not in RECOVERY_ACTIONS:
            raise err(
                f"{where}recovery_action",
                f"unknown action {values.get('recovery_action')!r} (known: {', '.join(RECOVERY_ACTIONS)})",
            )
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
    _known(faults, {"nvml", "errors", "hangs", "slow", "fields"}, "faults.", err)
    state = faults.get("nvml", "ok")
    if state not in NVML_STATES:
        raise err("faults.nvml", f"{state!r} is not one of {', '.join(NVML_STATES)}")
    errors = []
    for i, e in enumerate(_tables(faults.get("errors", []), "faults.errors", err)):
        _known(e, {"call", "gpu", "error"}, f"faults.errors[{i}].", err)
        call = _call_name(e, f"faults.errors[{i}].call", err)
        code_name = e.get("error")
        if code_name not in ERROR_CODES:
            raise err(
                f"faults.errors[{i}].error", f"{code_name!r} is not an NVML error (one of: {', '.join(ERROR_CODES)})"
            )
        errors.append((call, _gpu_ref(e, f"faults.errors[{i}].gpu", err), ERROR_CODES[code_name]))
    hangs = []
    for i, h in enumerate(_tables(faults.get("hangs", []), "faults.hangs", err)):
        _known(h, {"call", "gpu"}, f"faults.hangs[{i}].", err)
        hangs.append((_call_name(h, f"faults.hangs[{i}].call", err), _gpu_ref(h, f"faults.hangs[{i}].gpu", err)))
    slow = []
    for i, d in enumerate(_tables(faults.get("slow", []), "faults.slow", err)):
        _known(d, {"call", "gpu", "ms"}, f"faults.slow[{i}].", err)
        call = "*" if d.get("call", "*") == "*" else _call_name(d, f"faults.slow[{i}].call", err)
        if "ms" not in d:
            raise err(f"faults.slow[{i}].ms", "missing (how long the call takes)")
        ms = _typed(d["ms"], float, f"faults.slow[{i}].ms", err)
        slow.append((call, _gpu_ref(d, f"faults.slow[{i}].gpu", err), ms / 1000.0))
    fields = []
    for i, f in enumerate(_tables(faults.get("fields", []), "faults.fields", err)):
        _known(f, {"field", "gpu", "error"}, f"faults.fields[{i}].", err)
        fid = f.get("field")
        if not isinstance(fid, int) or isinstance(fid, bool) or fid < 0:
            raise err(f"faults.fields[{i}].field", f"expected a field id (NVML_FI_DEV_*, e.g. 230), got {fid!r}")
        code_name = f.get("error")
        if code_name not in ERROR_CODES:
            raise err(
                f"faults.fields[{i}].error", f"{code_name!r} is not an NVML error (one of: {', '.join(ERROR_CODES)})"
            )
        fields.append((fid, _gpu_ref(f, f"faults.fields[{i}].gpu", err), ERROR_CODES[code_name]))
    return Scenario(
        path,
        driver,
        cuda,
        state,
        tuple(gpus),
        tuple(errors),
        tuple(hangs),
        delay_ms / 1000.0,
        branch=int(branch),
        slow=tuple(slow),
        field_errors=tuple(fields),
    )


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
    _check_schema(table, GPU_KEYS, where, err)


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
        raise err(key, f'expected an NVML function name such as "nvmlDeviceGetTemperature", got {call!r}')
    from nodehealth.probes.nvml_h import NVML_FUNCTIONS

    if call not in NVML_FUNCTIONS and call not in FIELD_CALLS:
        raise err(key, f"{call!r} is not a call the NVML probe makes, so it would never fire")
    return call


def _gpu_ref(table: dict[str, Any], key: str, err: Any) -> Optional[int]:
    gpu = table.get("gpu")
    if gpu is None:
        return None
    if not isinstance(gpu, int) or isinstance(gpu, bool) or gpu < 0:
        raise err(key, f"expected a GPU index (0, 1, ...), got {gpu!r}")
    return gpu


# --------------------------------------------------------------------------- the simulated driver


def check_built(scenario: Scenario) -> None:
    """ScenarioError when the simulated driver library for the scenario's branch is not built."""
    from nodehealth_sim import driver

    try:
        driver.library_path(scenario.branch)
    except driver.FakeDriverMissing as exc:
        raise ScenarioError(f"{scenario.path}: {exc}") from None


def loader(scenario: Scenario) -> Callable[[], types.ModuleType]:
    """What the NVML probe's child runs instead of a bare ``import pynvml``: put the scenario
    where the simulated driver reads it, load that driver's library for the scenario's branch
    (pynvml's own ``CDLL("libnvidia-ml.so.1")`` then finds it by its soname), import pynvml."""
    from nodehealth_sim.spec import compile_spec

    spec = compile_spec(scenario)

    def load() -> types.ModuleType:
        from nodehealth.probes.nvml_lib import load_module
        from nodehealth_sim import driver

        os.environ[driver.SPEC_ENV] = spec
        if scenario.nvml != "library_not_found":
            driver.preload(scenario.branch)
        return load_module()

    return load
