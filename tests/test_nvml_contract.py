"""The contract between the NVML probe, the installed nvidia-ml-py (``pynvml``) and the stand-in.

Every pynvml name the probe uses (``NVML_FUNCTIONS``, ``NVML_CONSTANTS``, ``NVML_CLASSES``) must
exist in both with the same parameters / value, and what the stand-in returns must have the
attributes the probe reads, as pynvml's ctypes structures declare them. Then a test that passes
on the stand-in says something about production.
"""

from __future__ import annotations

import ctypes
import inspect
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pynvml
import pytest

from nodehealth.probes import nvml
from nodehealth.sim import nvml as simnvml

HEALTHY = Path(__file__).resolve().parent.parent / "examples" / "scenarios" / "healthy-8x-h100.toml"


@pytest.fixture(scope="module")
def sim() -> ModuleType:
    return simnvml.load(str(HEALTHY))


@pytest.fixture()
def handle(sim: ModuleType) -> Any:
    sim.nvmlInit()
    yield sim.nvmlDeviceGetHandleByIndex(0)
    sim.nvmlShutdown()


def _params(fn: Any) -> list[tuple[str, Any, bool]]:
    """(name, kind, has a default) per parameter."""
    return [(p.name, p.kind, p.default is not inspect.Parameter.empty)
            for p in inspect.signature(fn).parameters.values()]


def test_the_lists_are_not_empty_and_have_no_duplicates() -> None:
    for names in (nvml.NVML_FUNCTIONS, nvml.NVML_CONSTANTS, nvml.NVML_CLASSES):
        assert names and len(set(names)) == len(names)


@pytest.mark.parametrize("name", nvml.NVML_FUNCTIONS)
def test_function_exists_in_both_with_the_same_parameters(name: str, sim: ModuleType) -> None:
    real = getattr(pynvml, name, None)
    fake = getattr(sim, name, None)
    assert callable(real), f"pynvml (nvidia-ml-py) has no {name}"
    assert callable(fake), f"the stand-in has no {name}"
    assert [p[0] for p in _params(fake)] == [p[0] for p in _params(real)]
    assert _params(fake) == _params(real)


@pytest.mark.parametrize("name", nvml.NVML_CONSTANTS)
def test_constant_exists_in_both_with_the_same_value(name: str, sim: ModuleType) -> None:
    assert hasattr(pynvml, name), f"pynvml (nvidia-ml-py) has no {name}"
    assert hasattr(sim, name), f"the stand-in has no {name}"
    assert getattr(sim, name) == getattr(pynvml, name)


@pytest.mark.parametrize("name", nvml.NVML_CLASSES)
def test_class_exists_in_both(name: str, sim: ModuleType) -> None:
    assert inspect.isclass(getattr(pynvml, name, None)), f"pynvml (nvidia-ml-py) has no class {name}"
    assert inspect.isclass(getattr(sim, name, None)), f"the stand-in has no class {name}"


def _names_in_probe(pattern: str) -> set[str]:
    found = set()
    for match in re.finditer(pattern, inspect.getsource(nvml)):
        found.update(g for g in match.groups() if g)
    return found


def test_every_function_the_probe_calls_is_listed() -> None:
    """A pynvml call added to the probe without listing it would escape the contract."""
    called = _names_in_probe(r"\bnv\.(nvml[A-Z]\w*)|\"(nvml[A-Z]\w*)\"")
    assert "nvmlDeviceGetRemappedRows" in called  # the pattern sees the probe's calls
    assert called <= set(nvml.NVML_FUNCTIONS)


def test_every_constant_the_probe_uses_is_listed() -> None:
    used = _names_in_probe(r"\bnv\.(NVML_\w+)|getattr\(nv, \"(NVML_\w+)\"")
    assert "NVML_ERROR_GPU_IS_LOST" in used and "NVML_VOLATILE_ECC" in used
    assert used <= set(nvml.NVML_CONSTANTS)


def test_error_codes_the_stand_in_raises_match_pynvml() -> None:
    for name, code in simnvml.ERROR_CODES.items():
        assert getattr(pynvml, f"NVML_ERROR_{name}") == code, name


def test_error_class_has_pynvml_shape(sim: ModuleType) -> None:
    real = pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
    fake = sim.NVMLError(sim.NVML_ERROR_GPU_IS_LOST)
    assert isinstance(fake, Exception) and fake.value == real.value
    assert nvml.error_kind(pynvml, real) == nvml.error_kind(sim, fake) == "gpu_lost"
    assert str(fake)


# --------------------------------------------------------------------------- structures


def _ctypes_fields(struct: Any) -> set[str]:
    return {f[0] for f in struct._fields_}


def test_fabric_info_struct_matches_pynvml(sim: ModuleType, handle: Any) -> None:
    real, fake = pynvml.c_nvmlGpuFabricInfo_t, sim.c_nvmlGpuFabricInfo_t
    assert [(n, ctypes.sizeof(t)) for n, t in fake._fields_] == [(n, ctypes.sizeof(t)) for n, t in real._fields_]
    info = fake()
    assert (info.state, info.status) == (0, 0)  # zeroed: NOT_SUPPORTED, NVML_SUCCESS
    # The probe passes a pointer, as the C function behind pynvml needs.
    assert sim.nvmlDeviceGetGpuFabricInfo(handle, ctypes.byref(info)) == sim.NVML_SUCCESS
    assert info.state == sim.NVML_GPU_FABRIC_STATE_COMPLETED
    assert info.status == sim.NVML_SUCCESS
    with pytest.raises(TypeError):
        sim.nvmlDeviceGetGpuFabricInfo(handle, fake())  # by value: what pynvml cannot pass on


def test_field_values_have_what_the_probe_reads(sim: ModuleType, handle: Any) -> None:
    values = sim.nvmlDeviceGetFieldValues(handle, [sim.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])
    value = values[0]
    for attr in ("fieldId", "nvmlReturn", "value"):
        assert attr in _ctypes_fields(pynvml.c_nvmlFieldValue_t)
        assert hasattr(value, attr)
    assert "uiVal" in _ctypes_fields(pynvml.c_nvmlValue_t)
    assert value.fieldId == sim.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
    assert value.nvmlReturn == sim.NVML_SUCCESS
    assert value.value.uiVal == 0


def test_processes_have_what_the_probe_reads(tmp_path: Path) -> None:
    scenario = tmp_path / "procs.toml"
    scenario.write_text('[[gpu]]\nprocesses = [{ pid = 4242, used_memory_mib = 2 }]\n', encoding="utf-8")
    sim = simnvml.load(str(scenario))
    sim.nvmlInit()
    procs = sim.nvmlDeviceGetComputeRunningProcesses(sim.nvmlDeviceGetHandleByIndex(0))
    assert {"pid", "usedGpuMemory"} <= _ctypes_fields(pynvml.c_nvmlProcessInfo_t)
    assert (procs[0].pid, procs[0].usedGpuMemory) == (4242, 2 << 20)


def test_pci_utilization_memory_have_what_the_probe_reads(sim: ModuleType, handle: Any) -> None:
    pci = sim.nvmlDeviceGetPciInfo(handle)
    assert {"busId", "busIdLegacy"} <= _ctypes_fields(pynvml.nvmlPciInfo_t)
    assert nvml._bus_id(pci) == "0000:18:00.0"
    # pynvml's busId is bytes, 8-digit domain, upper case: the probe normalises it the same way.
    assert nvml._bus_id(type("P", (), {"busId": b"00000000:18:00.0"})()) == "0000:18:00.0"
    util = sim.nvmlDeviceGetUtilizationRates(handle)
    assert {"gpu", "memory"} <= _ctypes_fields(pynvml.c_nvmlUtilization_t)
    assert (util.gpu, util.memory) == (0, 0)
    mem = sim.nvmlDeviceGetMemoryInfo(handle)
    assert {"total", "used", "free"} <= _ctypes_fields(pynvml.c_nvmlMemory_t)
    assert mem.total == 81559 << 20 and mem.used + mem.free == mem.total


def test_tuple_returns_have_pynvml_shape(sim: ModuleType, handle: Any) -> None:
    assert len(sim.nvmlDeviceGetRemappedRows(handle)) == 4  # (corr, unc, pending, failure)
    assert len(sim.nvmlDeviceGetEccMode(handle)) == 2  # [current, pending]


def test_the_probe_reads_a_full_gpu_from_the_stand_in(sim: ModuleType) -> None:
    """Every field of GpuObservation is filled from the healthy H100 (nothing silently None)."""
    frames: list[Any] = []
    nvml.read_node(sim, frames.append)
    gpus = [value for kind, value in frames if kind == "gpu"]
    assert len(gpus) == 8 and ("end", None) in frames
    gpu = gpus[0]
    assert not gpu.errors
    empty = [name for name, value in vars(gpu).items() if value is None]
    assert empty == ["fabric_status"]  # None = the fabric registration succeeded
    assert gpu.fabric_state == sim.NVML_GPU_FABRIC_STATE_COMPLETED
    assert len(gpu.nvlinks) == 18
