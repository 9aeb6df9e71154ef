"""The contract between the NVML probe, nvidia-ml-py (``pynvml``) and nvml.h.

The probe calls pynvml by name and passes some structures of its own (where pynvml's are wrong
or missing in older wheels); it carries nvml.h's return codes and field ids by value, since an
older wheel lacks some. These tests hold those copies against the installed nvidia-ml-py and
against nvml.h's layouts, and read a whole GPU through pynvml over the simulated driver.
"""

from __future__ import annotations

import ctypes
import inspect
import re
from pathlib import Path
from typing import Any

import pynvml
import pytest
from nodehealth_sim import nvml as simnvml

from nodehealth.observations import NvmlSnapshot
from nodehealth.probes import nvml, nvml_h, nvml_lib, nvml_read

PROBE_MODULES = (nvml, nvml_h, nvml_lib, nvml_read)  # the probe, split by what each part owns

HEALTHY = Path(__file__).resolve().parent.parent / "examples" / "scenarios" / "healthy-8x-h100.toml"
MATRIX = Path(__file__).resolve().parent.parent / ".matrix"
# What the probe reaches only through hasattr or a fallback: an older wheel may lack it.
OPTIONAL = {"nvmlDeviceGetGpuFabricInfoV", "nvmlDeviceGetComputeRunningProcesses_v2"}
# What the probe calls through pynvml's function lookup, with nvml.h's structure.
DIRECT = {"nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2"}


def test_the_lists_are_not_empty_and_have_no_duplicates() -> None:
    for names in (nvml.NVML_FUNCTIONS, nvml.NVML_CLASSES):
        assert names and len(set(names)) == len(names)


@pytest.mark.parametrize("name", nvml.NVML_FUNCTIONS)
def test_function_exists_in_the_installed_wheel(name: str) -> None:
    if name in DIRECT:
        assert callable(pynvml._nvmlGetFunctionPointer)
        return
    if name in OPTIONAL and not hasattr(pynvml, name):
        pytest.skip(f"{name} is optional and this older nvidia-ml-py lacks it")
    assert callable(getattr(pynvml, name, None)), f"pynvml (nvidia-ml-py) has no {name}"


def test_older_wheels_lack_only_what_the_probe_treats_as_optional() -> None:
    # Every allowed wheel: at or above the floor (one below it is in .matrix only to be refused).
    wheels = [
        p
        for p in sorted(MATRIX.glob("pynvml-*/pynvml.py"))
        if tuple(int(n) for n in p.parent.name.split("-", 1)[1].split(".")) >= nvml.PYNVML_FLOOR
    ]
    if not wheels:
        pytest.skip("no .matrix wheels here (scripts/nvml-matrix.sh makes them; make nvml-matrix runs them)")
    for path in wheels:
        source = path.read_text(encoding="utf-8")
        assert re.search(r"^def _nvmlGetFunctionPointer\(", source, re.M), path
        missing = {n for n in nvml.NVML_FUNCTIONS if n not in DIRECT and not re.search(rf"^def {n}\(", source, re.M)}
        assert missing <= OPTIONAL, (path.parent.name, missing)


def _names_in_probe(pattern: str) -> set[str]:
    found = set()
    for module in PROBE_MODULES:
        for match in re.finditer(pattern, inspect.getsource(module)):
            found.update(g for g in match.groups() if g)
    return found


def test_every_function_the_probe_calls_is_listed() -> None:
    """A pynvml call added to the probe without listing it would escape the contract."""
    called = _names_in_probe(r"\bnv\.(nvml[A-Z]\w*)|\"(nvml[A-Z]\w*)\"")
    assert "nvmlDeviceGetFieldValues" in called  # the pattern sees the probe's calls
    assert called <= set(nvml.NVML_FUNCTIONS)


def test_the_probe_uses_no_pynvml_constant() -> None:
    """Constants come from nvml.h by value: an older wheel lacking one must not crash the probe."""
    assert not _names_in_probe(r"\bnv\.(NVML_\w+)|getattr\(self\.nv, \"(NVML_\w+)\"")


def test_return_codes_match_pynvml() -> None:
    names = {v: k for k, v in vars(pynvml).items() if k.startswith("NVML_ERROR_") and isinstance(v, int)}
    for code, kind in nvml.RETURN_CODES.items():
        if code == 0 or kind in (
            "gpu_not_found",
            "invalid_state",
            "not_ready",
            "deprecated",
            "reset_type_not_supported",
        ):
            continue  # newer than the oldest wheels
        assert code in names, (code, kind)
    assert names[nvml.GPU_IS_LOST] == "NVML_ERROR_GPU_IS_LOST"
    assert names[nvml.ARGUMENT_VERSION_MISMATCH] == "NVML_ERROR_ARGUMENT_VERSION_MISMATCH"
    for code, name in simnvml.ERROR_CODES.items():
        assert getattr(pynvml, f"NVML_ERROR_{code}", name) == name


def test_field_ids_match_pynvml() -> None:
    assert sum(attr.startswith("FI_") for attr in vars(nvml_h)) > 10  # the field ids live there
    for attr, value in vars(nvml_h).items():
        if attr.startswith("FI_") and hasattr(pynvml, f"NVML_FI_DEV_{attr[3:]}"):  # old wheels lack some
            assert getattr(pynvml, f"NVML_FI_DEV_{attr[3:]}") == value, attr


def test_fabric_structures_have_the_nvml_h_layout() -> None:
    """nvml.h: 16-byte clusterUuid, nvmlReturn_t status, cliqueId, one-byte state at offset 24;
    the v2/v3 version words carry the structure's size (NVML_STRUCT_VERSION: size | v << 24)."""
    assert nvml_h.FabricInfoV1.state.offset == 24 and nvml_h.FabricInfoV1.state.size == 1
    for cls, version in nvml_h.FABRIC_VERSIONS:
        assert ctypes.sizeof(cls) == version & 0xFFFFFF, cls.__name__
        assert cls.state.offset == 28
    assert nvml_h.FABRIC_VERSIONS[0][1] == getattr(pynvml, "nvmlGpuFabricInfo_v3", 0x3000028)
    assert nvml_h.FABRIC_VERSIONS[1][1] == getattr(pynvml, "nvmlGpuFabricInfo_v2", 0x02000024)


def test_older_wheels_misplace_the_fabric_state() -> None:
    """Why the probe passes its own structure: nvidia-ml-py before 13.615.71 declares an 80-byte
    clusterUuid, so its state lands at offset 88, where nvml.h's driver writes nothing."""
    wheels = sorted(MATRIX.glob("pynvml-12.*/pynvml.py"))
    if not wheels:
        pytest.skip("no .matrix wheels here")
    for path in wheels:
        text = path.read_text(encoding="utf-8")
        block = text[text.index("class c_nvmlGpuFabricInfo_t") :][:400]
        assert "NVML_DEVICE_UUID_BUFFER_SIZE" in block, path  # 80 bytes


def _read(text: str, tmp_path: Path) -> NvmlSnapshot:
    scenario = tmp_path / "s.toml"
    scenario.write_text(text, encoding="utf-8")
    snap = nvml.start(simnvml.loader(simnvml.parse(str(scenario))), timeout_s=10.0).collect()
    assert isinstance(snap, NvmlSnapshot), snap
    return snap


def test_the_probe_reads_a_full_gpu_through_pynvml(tmp_path: Path) -> None:
    """Every field of GpuObservation is filled from the healthy H100 on driver 570, except what
    an H100 does not report (page retirement: N/A from Ampere on) or driver 570 lacks."""
    snap = _read(HEALTHY.read_text(encoding="utf-8"), tmp_path)
    assert snap.complete and len(snap.gpus) == 8 and snap.driver_version == "570.133.20"
    gpu = snap.gpus[0]
    assert not gpu.errors
    empty = sorted(name for name, value in vars(gpu).items() if value is None)
    # 570 answers the v2 fabric structure (health mask, no summary: v3 is in 580's nvml.h), with
    # every wheel: without pynvml's wrapper (before 12.560) the probe calls the C function itself.
    assert empty == [
        "fabric_health_summary",
        "fabric_status",
        "retired_pages_dbe",
        "retired_pages_pending",
        "retired_pages_sbe",
    ]
    assert gpu.fabric_state == 3 and gpu.fabric_health_mask == 0
    assert gpu.nvlinks is not None and len(gpu.nvlinks) == 18 and all(link.active for link in gpu.nvlinks)
    assert gpu.recovery_action == 0 and gpu.mig_enabled is False


@pytest.mark.parametrize("driver", ["470.256.02", "550.127.05"])
def test_processes_come_through_the_versioned_call(tmp_path: Path, driver: str) -> None:
    """Every process right, with every wheel (12.535.77's own _v3 wrapper misreads the second)."""
    snap = _read(
        f'[node]\ndriver_version = "{driver}"\n[[gpu]]\nprocesses = [{{ pid = 4242, used_memory_mib = 2 }}, '
        "{ pid = 4343, used_memory_mib = 3 }, { pid = 4444, used_memory_mib = 4 }]\n",
        tmp_path,
    )
    procs = snap.gpus[0].processes
    assert procs is not None
    assert [(p.pid, p.used_memory_bytes) for p in procs] == [(4242, 2 << 20), (4343, 3 << 20), (4444, 4 << 20)]


def test_bus_ids_keep_every_significant_domain_digit() -> None:
    class Pci:
        def __init__(self, bus: bytes) -> None:
            self.busId = bus

    assert nvml_read.bus_id(Pci(b"00000000:18:00.0")) == "0000:18:00.0"
    assert nvml_read.bus_id(Pci(b"00010000:E1:00.0")) == "10000:e1:00.0"
    assert nvml_read.bus_id(Pci(b"0000000B:00:00.0")) == "000b:00:00.0"


def test_a_vendor_exception_that_is_not_an_nvml_error_is_a_kind() -> None:
    mismatch = getattr(pynvml, "NVMLLibraryMismatchError", None) or type("NVMLLibraryMismatchError", (Exception,), {})
    err: Any = mismatch("Unversioned function called")
    assert not isinstance(err, pynvml.NVMLError)
    assert nvml.error_kind(pynvml, err) == "library_mismatch"
    assert nvml.error_kind(pynvml, AttributeError("NVML_FI_DEV_GET_GPU_RECOVERY_ACTION")) == "function_not_found"
    assert nvml.error_kind(pynvml, pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)) == "gpu_lost"
