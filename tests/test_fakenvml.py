"""The fake libnvidia-ml.so.1 (sim/nodehealth_sim/fakenvml, docs/fake-nvml.md) under the real, unmodified pynvml.

Each test runs a short program in a subprocess: it preloads one branch's library (nodehealth.sim.driver.preload)
and imports pynvml from one of the .matrix/pynvml-<version> directories (scripts/nvml-matrix.sh installs them),
so the vendor's Python code runs against the simulated GPUs exactly as it would against a real driver. Most
assertions are batched into one subprocess per (pynvml version, driver branch).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Optional

import pytest
from conftest import Timing
from nodehealth_sim import driver

ROOT = Path(__file__).resolve().parent.parent
MATRIX = ROOT / ".matrix"
VERSIONS = ("12.535.77", "12.560.30", "12.570.86", "13.615.71")
# NVML_FI_MAX of each branch's nvml.h (go-nvml commits in sim/nodehealth_sim/fakenvml/symbols.tsv).
FI_MAX = {470: 161, 525: 170, 535: 197, 550: 200, 570: 269, 580: 274}


@pytest.fixture(scope="session", autouse=True)
def built() -> None:
    """Build every branch (make fakenvml) and install the pynvml matrix when a version is missing."""
    proc = subprocess.run(["make", "-s", "-C", str(ROOT), "fakenvml"], capture_output=True, text=True)
    assert proc.returncode == 0, f"make fakenvml failed:\n{proc.stdout}\n{proc.stderr}"
    if any(not (MATRIX / f"pynvml-{v}" / "pynvml.py").is_file() for v in VERSIONS):
        proc = subprocess.run(
            ["bash", str(ROOT / "scripts" / "nvml-matrix.sh")],
            capture_output=True,
            text=True,
            env=dict(os.environ, PYTHON=sys.executable),
        )
        assert proc.returncode == 0, f"scripts/nvml-matrix.sh failed:\n{proc.stdout}\n{proc.stderr}"


PRELUDE = '''
import ctypes, json, os, sys, time
from nodehealth_sim import driver
LIB = driver.preload(int(os.environ["FAKE_BRANCH"]))
import pynvml
assert pynvml.__file__ == os.environ["FAKE_PYNVML"], pynvml.__file__
R = {}

def q(fn, *args, **kwargs):
    """The call's result, or ["NVMLError", code] / ["EXC", class name]."""
    try:
        return fn(*args, **kwargs)
    except pynvml.NVMLError as e:
        return ["NVMLError", e.value]
    except Exception as e:
        return ["EXC", type(e).__name__]

def s(v):
    return v.decode() if isinstance(v, bytes) else v
'''


def run(
    version: str,
    branch: int,
    body: str,
    spec: Optional[str],
    timeout: float = 30.0,
    env: Optional[dict[str, str]] = None,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    pydir = MATRIX / f"pynvml-{version}"
    e = {k: v for k, v in os.environ.items() if k not in (driver.SPEC_ENV, driver.LOG_ENV)}
    e.update(PYTHONPATH=f"{pydir}{os.pathsep}{ROOT}", FAKE_BRANCH=str(branch), FAKE_PYNVML=str(pydir / "pynvml.py"))
    if spec is not None:
        e[driver.SPEC_ENV] = spec
    e.update(env or {})
    program = PRELUDE + textwrap.dedent(body) + "\nprint(json.dumps(R))\n"
    proc = subprocess.run([sys.executable, "-c", program], env=e, capture_output=True, text=True, timeout=timeout)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def results(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


NOT_FOUND = ["NVMLError", 13]  # NVML_ERROR_FUNCTION_NOT_FOUND, pynvml's answer to a symbol the library lacks
NOT_SUPPORTED = ["NVMLError", 3]
INVALID = ["NVMLError", 2]

NODE = """\
version 1                      # a three-GPU node
driver_version 550.127.05
cuda_driver_version 12040
gpus 3
gpu 0 name NVIDIA H100 80GB HBM3
gpu 0 uuid GPU-11111111-2222-3333-4444-555555555555
gpu 0 serial 1652023012345
gpu 0 pci_bus_id 00000000:18:00.0
gpu 0 pci_device_id 0x233010DE
gpu 0 pci_subsystem_id 0x16C110DE
gpu 0 architecture 9
gpu 0 cc 9.0
gpu 0 temperature_c 41
gpu 0 slowdown_c 92
gpu 0 shutdown_c 95
gpu 0 gpu_max_c 87
gpu 0 mem_max_c 95
gpu 0 memory_temp_c 38
gpu 0 power_mw 123456
gpu 0 power_limit_mw 700000
gpu 0 util_gpu 17
gpu 0 util_memory 3
gpu 0 memory_total 85899345920
gpu 0 memory_used 1073741824
gpu 0 memory_reserved 536870912
gpu 0 ecc_current 1
gpu 0 ecc_pending 0
gpu 0 ecc_vol_corrected 11
gpu 0 ecc_vol_uncorrected 12
gpu 0 ecc_agg_corrected 13
gpu 0 ecc_agg_uncorrected 14
gpu 0 retired_sbe 2
gpu 0 retired_dbe 1
gpu 0 retired_pending 1
gpu 0 remap_corrected 5
gpu 0 remap_uncorrected 6
gpu 0 remap_pending 1
gpu 0 remap_failure 0
gpu 0 pcie_gen 4
gpu 0 pcie_max_gen 5
gpu 0 pcie_width 8
gpu 0 pcie_max_width 16
gpu 0 nvlink_links 12
gpu 0 nvlink_down 3,7
gpu 0 nvlink 2 21 22 23 24
gpu 0 fabric_state 3
gpu 0 fabric_status 0
gpu 0 fabric_clique 7
gpu 0 fabric_health_mask 0x22
gpu 0 fabric_health_summary 2
gpu 0 throttle 0x44
gpu 0 persistence 1
gpu 0 recovery_action 2
gpu 0 mig_current 0
gpu 0 mig_pending 1
gpu 0 processes 4242:1048576,4343:2097152
gpu 1 name NVIDIA H100 80GB HBM3
gpu 1 pci_bus_id 00010000:E1:00.0
gpu 1 remap_corrected 1
gpu 1 mig_current 1
gpu 1 nvlink_links 18
gpu 1 nvlink_counters 0
gpu 1 processes -
gpu 1 unsupported nvmlDeviceGetTemperature
gpu 1 temperature_c 50
gpu 2 name Minimal
"""

ROUND_TRIP = """
N = pynvml
N.nvmlInit()
R["driver"] = s(N.nvmlSystemGetDriverVersion())
R["nvml"] = s(N.nvmlSystemGetNVMLVersion())
R["cuda"] = N.nvmlSystemGetCudaDriverVersion()
R["cuda_v2"] = q(N.nvmlSystemGetCudaDriverVersion_v2)
R["count"] = N.nvmlDeviceGetCount()
h = N.nvmlDeviceGetHandleByIndex(0)
h1 = N.nvmlDeviceGetHandleByIndex(1)
h2 = N.nvmlDeviceGetHandleByIndex(2)
R["index"] = [N.nvmlDeviceGetIndex(x) for x in (h, h1, h2)]
R["minor"] = N.nvmlDeviceGetMinorNumber(h1)
R["name"] = s(N.nvmlDeviceGetName(h))
R["uuid"] = s(N.nvmlDeviceGetUUID(h))
R["serial"] = s(N.nvmlDeviceGetSerial(h))
R["serial2"] = q(N.nvmlDeviceGetSerial, h2)
R["arch"] = N.nvmlDeviceGetArchitecture(h)
R["cc"] = list(N.nvmlDeviceGetCudaComputeCapability(h))
p = N.nvmlDeviceGetPciInfo(h)
R["pci"] = [s(p.busId), s(p.busIdLegacy), p.domain, p.bus, p.device, p.pciDeviceId, p.pciSubSystemId]
p1 = N.nvmlDeviceGetPciInfo(h1)
R["pci1"] = [s(p1.busId), p1.domain, p1.bus]
R["by_bus"] = N.nvmlDeviceGetIndex(N.nvmlDeviceGetHandleByPciBusId(b"00010000:e1:00.0"))
R["by_bus_missing"] = q(N.nvmlDeviceGetHandleByPciBusId, b"00000000:99:00.0")
R["temp"] = N.nvmlDeviceGetTemperature(h, N.NVML_TEMPERATURE_GPU)
R["thresholds"] = [N.nvmlDeviceGetTemperatureThreshold(h, t) for t in (
    N.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN, N.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
    N.NVML_TEMPERATURE_THRESHOLD_MEM_MAX, N.NVML_TEMPERATURE_THRESHOLD_GPU_MAX)]
R["temp_unsupported_key"] = q(N.nvmlDeviceGetTemperature, h1, 0)
R["temp_missing"] = q(N.nvmlDeviceGetTemperature, h2, 0)
R["power"] = [N.nvmlDeviceGetPowerUsage(h), N.nvmlDeviceGetEnforcedPowerLimit(h)]
u = N.nvmlDeviceGetUtilizationRates(h)
R["util"] = [u.gpu, u.memory]
m = N.nvmlDeviceGetMemoryInfo(h)
R["mem"] = [m.total, m.free, m.used]
m2 = q(N.nvmlDeviceGetMemoryInfo, h, version=N.nvmlMemory_v2)
R["mem2"] = m2 if isinstance(m2, list) else [m2.total, m2.reserved, m2.free, m2.used]
R["ecc_mode"] = list(N.nvmlDeviceGetEccMode(h))
R["ecc"] = [N.nvmlDeviceGetTotalEccErrors(h, e, c) for e in (0, 1) for c in (0, 1)]
R["retired"] = [N.nvmlDeviceGetRetiredPages(h, 0), N.nvmlDeviceGetRetiredPages(h, 1)]
R["retired_v2"] = N.nvmlDeviceGetRetiredPages_v2(h, 0)
R["retired_pending"] = N.nvmlDeviceGetRetiredPagesPendingStatus(h)
R["retired_missing"] = q(N.nvmlDeviceGetRetiredPages, h1, 0)
R["remap"] = list(N.nvmlDeviceGetRemappedRows(h))
R["remap_mig"] = q(N.nvmlDeviceGetRemappedRows, h1)
R["pcie"] = [N.nvmlDeviceGetCurrPcieLinkGeneration(h), N.nvmlDeviceGetMaxPcieLinkGeneration(h),
             N.nvmlDeviceGetCurrPcieLinkWidth(h), N.nvmlDeviceGetMaxPcieLinkWidth(h)]
R["nvlink_state"] = [N.nvmlDeviceGetNvLinkState(h, link) for link in range(12)]
R["nvlink_state_beyond"] = q(N.nvmlDeviceGetNvLinkState, h, 12)
R["nvlink_state_past_max"] = q(N.nvmlDeviceGetNvLinkState, h, 40)
R["util_mig"] = q(N.nvmlDeviceGetUtilizationRates, h1)
R["nvlink_counter"] = [N.nvmlDeviceGetNvLinkErrorCounter(h, 2, c) for c in range(4)]
R["nvlink_counter_off"] = q(N.nvmlDeviceGetNvLinkErrorCounter, h1, 0, 0)
R["nvlink_none"] = q(N.nvmlDeviceGetNvLinkState, h2, 0)
procs = q(N.nvmlDeviceGetComputeRunningProcesses, h)
R["procs"] = procs if isinstance(procs, list) and procs and procs[0] in ("NVMLError", "EXC") else [
    [x.pid, x.usedGpuMemory] for x in procs]
R["procs_none"] = q(N.nvmlDeviceGetComputeRunningProcesses, h1)
R["throttle"] = q(N.nvmlDeviceGetCurrentClocksThrottleReasons, h)
R["events"] = q(N.nvmlDeviceGetCurrentClocksEventReasons, h)
R["persistence"] = N.nvmlDeviceGetPersistenceMode(h)
R["mig"] = [list(N.nvmlDeviceGetMigMode(h)), list(N.nvmlDeviceGetMigMode(h1))]
ids = [3, 4, 5, 6, 29, 30, 31, 82, 91, 142, 143, 144, 145, (161, 2), (162, 2), (163, 2), (165, 3), (165, 2),
       (161, 12), 230, 160, FI_MAX - 1, FI_MAX, 100000]
vals = N.nvmlDeviceGetFieldValues(h, ids)
def fv(v):
    if v.nvmlReturn != 0:
        return ["ret", v.nvmlReturn]
    return v.value.ullVal if v.valueType == 3 else v.value.uiVal
R["fields"] = [fv(v) for v in vals]
R["fields_ts"] = all(v.timestamp > 1.6e15 for v in vals)
R["fields_mig"] = [fv(v) for v in N.nvmlDeviceGetFieldValues(h1, [142, 145, (161, 0), (165, 0), 91])]
R["fields_none"] = [fv(v) for v in N.nvmlDeviceGetFieldValues(h2, [3, 142, (165, 0)])]

# fabric, v1 struct: pynvml's structure, and the raw C layout (state at byte 24)
try:
    fab = N.c_nvmlGpuFabricInfo_t()
    ret = q(N.nvmlDeviceGetGpuFabricInfo, h, ctypes.byref(fab))
    clique = fab.cliqueId if hasattr(fab, "cliqueId") else fab.partitionId  # 12.535.77's name for it
    R["fabric"] = ret if isinstance(ret, list) else [fab.state, fab.status, clique]
    R["fabric_size"] = ctypes.sizeof(fab)
    raw = (ctypes.c_ubyte * 28)(*([0xAB] * 28))
    ret = q(N.nvmlDeviceGetGpuFabricInfo, h, ctypes.byref(raw))
    R["fabric_raw"] = ret if isinstance(ret, list) else list(raw)
except AttributeError as e:
    R["fabric"] = ["EXC", str(e)]

class V2(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("clusterUuid", ctypes.c_ubyte * 16), ("status", ctypes.c_int),
                ("cliqueId", ctypes.c_uint), ("state", ctypes.c_ubyte), ("healthMask", ctypes.c_uint)]
class V3(ctypes.Structure):
    _fields_ = V2._fields_ + [("healthSummary", ctypes.c_ubyte)]
assert ctypes.sizeof(V2) == 0x24 and ctypes.sizeof(V3) == 0x28
def fabric_v(cls, version):
    st = cls(version=version)
    try:
        fn = N._nvmlGetFunctionPointer("nvmlDeviceGetGpuFabricInfoV")
    except N.NVMLError as e:
        return ["NVMLError", e.value]
    rc = fn(h, ctypes.byref(st))
    if rc:
        return ["rc", rc]
    return [st.version, st.state, st.cliqueId, st.healthMask, getattr(st, "healthSummary", None)]
R["fabric_v2"] = fabric_v(V2, 0x02000024)
R["fabric_v3"] = fabric_v(V3, 0x03000028)
R["fabric_vbad"] = fabric_v(V3, 0x01000028)
if hasattr(N, "nvmlDeviceGetGpuFabricInfoV"):  # pynvml's own wrapper and struct (v2; v3 in 13.x)
    st = N.c_nvmlGpuFabricInfoV_t()
    ret = q(N.nvmlDeviceGetGpuFabricInfoV, h, ctypes.byref(st))
    R["fabric_v_pynvml"] = ret if isinstance(ret, list) else [st.version, st.state, st.healthMask]
    R["fabric_v_size"] = ctypes.sizeof(st)
if hasattr(N, "c_nvmlGpuFabricInfo_v3_t"):
    st = N.c_nvmlGpuFabricInfo_v3_t()
    ret = q(N.nvmlDeviceGetGpuFabricInfoV, h, ctypes.byref(st))
    R["fabric_v3_pynvml"] = ret if isinstance(ret, list) else [st.state, st.healthMask, st.healthSummary]
R["error_string"] = s(N.nvmlErrorString(999))
R["error_str"] = str(N.NVMLError(15))
N.nvmlShutdown()
R["after_shutdown"] = q(N.nvmlDeviceGetCount)
"""


@pytest.mark.parametrize("branch", driver.BRANCHES)
@pytest.mark.parametrize("version", VERSIONS)
def test_values_round_trip(version: str, branch: int) -> None:
    r = results(run(version, branch, f"FI_MAX = {FI_MAX[branch]}\n" + ROUND_TRIP, NODE))
    assert r["driver"] == "550.127.05"
    assert r["nvml"] == {470: "11", 580: "13"}.get(branch, "12") + ".550.127.05"
    assert r["cuda"] == 12040 and r["cuda_v2"] == 12040
    assert r["count"] == 3 and r["index"] == [0, 1, 2] and r["minor"] == 1
    assert r["name"] == "NVIDIA H100 80GB HBM3"
    assert r["uuid"] == "GPU-11111111-2222-3333-4444-555555555555"
    assert r["serial"] == "1652023012345" and r["serial2"] == NOT_SUPPORTED
    assert r["arch"] == 9 and r["cc"] == [9, 0]
    assert r["pci"] == ["00000000:18:00.0", "0000:18:00.0", 0, 0x18, 0, 0x233010DE, 0x16C110DE]
    assert r["pci1"] == ["00010000:E1:00.0", 0x10000, 0xE1]
    assert r["by_bus"] == 1 and r["by_bus_missing"] == ["NVMLError", 6]
    assert r["temp"] == 41 and r["thresholds"] == [95, 92, 95, 87]
    assert r["temp_unsupported_key"] == NOT_SUPPORTED and r["temp_missing"] == NOT_SUPPORTED
    assert r["power"] == [123456, 700000] and r["util"] == [17, 3]
    total, used, reserved = 85899345920, 1073741824, 536870912
    assert r["mem"] == [total, total - used, used]
    # nvmlDeviceGetMemoryInfo_v2: first in the 12.0 header (525)
    assert r["mem2"] == (NOT_FOUND if branch == 470 else [total, reserved, total - used, used - reserved])
    assert r["ecc_mode"] == [1, 0] and r["ecc"] == [11, 13, 12, 14]
    assert len(r["retired"][0]) == 2 and len(r["retired"][1]) == 1 and len(set(r["retired"][0])) == 2
    assert [p["address"] for p in r["retired_v2"]] == r["retired"][0]
    assert r["retired_pending"] == 1 and r["retired_missing"] == NOT_SUPPORTED
    assert r["remap"] == [5, 6, 1, 0] and r["remap_mig"] == NOT_SUPPORTED
    assert r["pcie"] == [4, 5, 8, 16]
    assert r["nvlink_state"] == [0 if link in (3, 7) else 1 for link in range(12)]
    # A link at or above the GPU's link count but within the header's NVML_NVLINK_MAX_LINKS: NOT_SUPPORTED, as a
    # real A100 answers (leptonai/gpud pkg/nvidia-query/nvml/nvlink.go stops its loop to NVLINK_MAX_LINKS there);
    # beyond the header's maximum, INVALID_ARGUMENT (nvml.h: "if device or link is invalid").
    # (470's header has 12 links at most: there link 12 is already past it.)
    assert r["nvlink_state_beyond"] == (INVALID if branch == 470 else NOT_SUPPORTED)
    assert r["nvlink_state_past_max"] == INVALID
    # MIG on: "On MIG-enabled GPUs, querying device utilization rates is not currently supported" (nvml.h).
    assert r["util_mig"] == NOT_SUPPORTED
    assert r["nvlink_counter"] == [21, 22, 23, 24]
    assert r["nvlink_counter_off"] == NOT_SUPPORTED and r["nvlink_none"] == NOT_SUPPORTED

    # processes: pynvml calls _v3 (first in the 12.0 header; the 11.4 header maps the name to _v2)
    if branch == 470:
        # pynvml >= 12.560 wraps it in throwOnVersionMismatch; 12.535.77 lets FunctionNotFound through
        assert r["procs"] == (NOT_FOUND if version == "12.535.77" else ["EXC", "NVMLLibraryMismatchError"])
    elif version == "12.535.77":
        # that pynvml's c_nvmlProcessInfo_t has an extra usedGpuCcProtectedMemory (32 bytes) while _v3 fills
        # nvmlProcessInfo_t (24 bytes, every header): the first entry reads right, the next ones are shifted
        assert r["procs"][0] == [4242, 1048576]
        assert r["procs"][1] == [2097152 & 0xFFFFFFFF, None]
    else:
        assert r["procs"] == [[4242, 1048576], [4343, 2097152]]
    if branch != 470:
        assert r["procs_none"] == []

    assert r["throttle"] == 0x44
    # nvmlDeviceGetCurrentClocksEventReasons: first in the 12.2 header (535)
    assert r["events"] == (NOT_FOUND if branch < 535 else 0x44)
    assert r["persistence"] == 1 and r["mig"] == [[0, 1], [1, 1]]

    # 161-165 (NVLink DL counters, link state; scopeId = link) are beyond the 11.4 header's NVML_FI_MAX (161)
    nvlink = [21, 22, 23 + 24, 0, 1, ["ret", 2]] if branch > 470 else [["ret", 2]] * 6
    expect = [
        11,
        12,
        13,
        14,
        2,
        1,
        1,
        38,
        12,
        5,
        6,
        1,
        0,
        *nvlink,
        2 if branch >= 570 else ["ret", 2],  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (230): 12.8 header on
        ["ret", 3],  # 160: a field every branch knows, not simulated: NOT_SUPPORTED
        ["ret", 3],
        ["ret", 2],
        ["ret", 2],
    ]  # FI_MAX - 1: known; FI_MAX and beyond: INVALID_ARGUMENT
    assert FI_MAX[branch] > 160
    assert r["fields"] == expect
    assert r["fields_ts"]
    assert r["fields_mig"] == (
        [["ret", 3], ["ret", 3], ["ret", 3], 1, 18]
        if branch > 470
        else [["ret", 3], ["ret", 3], ["ret", 2], ["ret", 2], 18]
    )
    assert r["fields_none"] == [["ret", 3], ["ret", 3], ["ret", 3] if branch > 470 else ["ret", 2]]

    # fabric: nvmlDeviceGetGpuFabricInfo from the 12.0 header (525), ...V from 12.4 (550) with v2 structs,
    # v3 (healthSummary) from 13.0 (580)
    if branch == 470:
        assert r["fabric"] == NOT_FOUND and r["fabric_raw"] == NOT_FOUND
    else:
        # pynvml 12.535.77-12.570.86 declare c_nvmlGpuFabricInfo_t.clusterUuid as 80 bytes (the device-UUID
        # buffer) where nvml.h has 16: the C layout is filled, and those versions read zeros past it
        assert r["fabric"] == ([3, 0, 7] if r["fabric_size"] == 28 else [0, 0, 0])
        assert r["fabric_size"] == (28 if version == "13.615.71" else 92)
        raw = r["fabric_raw"]
        assert raw[:16] == [0] * 16 and raw[16:20] == [0, 0, 0, 0] and raw[20:24] == [7, 0, 0, 0]
        assert raw[24] == 3
    if branch < 550:
        assert r["fabric_v2"] == NOT_FOUND and r["fabric_v3"] == NOT_FOUND
    else:
        assert r["fabric_v2"] == [0x02000024, 3, 7, 0x22, None]
        assert r["fabric_v3"] == ([0x03000028, 3, 7, 0x22, 2] if branch >= 580 else ["rc", 25])
        assert r["fabric_vbad"] == ["rc", 25]
    if "fabric_v_pynvml" in r:
        # 12.560.30's c_nvmlGpuFabricInfoV_t has the same 80-byte clusterUuid; 12.570.86 on have nvml.h's 16
        assert r["fabric_v_size"] == (0x24 if version != "12.560.30" else 100)
        good = [0x02000024, 3, 0x22] if r["fabric_v_size"] == 0x24 else [0x02000024, 0, 0]
        assert r["fabric_v_pynvml"] == (NOT_FOUND if branch < 550 else good)
    if "fabric_v3_pynvml" in r:
        assert r["fabric_v3_pynvml"] == (
            [3, 0x22, 2] if branch >= 580 else NOT_FOUND if branch < 550 else ["NVMLError", 25]
        )
    assert version != "13.615.71" or "fabric_v3_pynvml" in r

    assert r["error_string"] == "Unknown Error" and r["error_str"] == "GPU is lost"
    assert r["after_shutdown"] == ["NVMLError", 1]


def _tsv() -> tuple[list[int], dict[str, dict[int, bool]]]:
    rows = [
        line.split("\t")
        for line in (ROOT / "sim/nodehealth_sim/fakenvml/symbols.tsv").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    branches = [int(b) for b in rows[0][1:]]
    return branches, {r[0]: {b: r[i + 1] == "1" for i, b in enumerate(branches)} for r in rows[1:]}


def test_exported_symbols_are_exactly_the_branch_column() -> None:
    branches, table = _tsv()
    assert tuple(branches) == driver.BRANCHES
    # facts from the headers that the rest of the suite leans on
    assert not table["nvmlDeviceGetComputeRunningProcesses_v3"][470]
    assert table["nvmlDeviceGetComputeRunningProcesses_v3"][525]
    assert [b for b in branches if table["nvmlDeviceGetCurrentClocksEventReasons"][b]] == [535, 550, 570, 580]
    assert [b for b in branches if table["nvmlDeviceGetGpuFabricInfo"][b]] == [525, 535, 550, 570, 580]
    assert [b for b in branches if table["nvmlDeviceGetGpuFabricInfoV"][b]] == [550, 570, 580]
    assert all(table["nvmlInit"].values()) and all(table["nvmlDeviceGetPciInfo"].values())
    for branch in branches:
        nm = subprocess.run(
            ["nm", "-D", "--defined-only", str(driver.library_path(branch))], capture_output=True, text=True, check=True
        )
        exported = {line.split()[-1] for line in nm.stdout.splitlines() if " T " in line}
        assert exported == {sym for sym, col in table.items() if col[branch]}, branch


def test_loaded_by_soname_into_the_preloaded_object() -> None:
    proc = run(
        "13.615.71",
        550,
        """
        pynvml.nvmlInit()
        R["same"] = pynvml.nvmlLib._handle == LIB._handle == ctypes.CDLL("libnvidia-ml.so.1")._handle
        maps = {line.split()[-1] for line in open("/proc/self/maps") if "libnvidia-ml" in line}
        R["maps"] = sorted(maps)
    """,
        NODE,
    )
    r = results(proc)
    assert r["same"] is True
    assert r["maps"] == [str(driver.library_path(550))]


def test_errors_unreachable_gpu_unsupported_and_raw_validation(tmp_path: Path) -> None:
    spec = NODE + textwrap.dedent("""\
        error nvmlDeviceGetHandleByIndex 2 999
        error nvmlDeviceGetTemperature * 15
        error nvmlDeviceGetPowerUsage 0 4
        error nvmlSystemGetDriverVersion * 18
    """)
    proc = run(
        "13.615.71",
        570,
        """
        c = ctypes.c_uint()
        R["raw_uninit"] = LIB.nvmlDeviceGetCount_v2(ctypes.byref(c))
        pynvml.nvmlInit()
        R["count"] = pynvml.nvmlDeviceGetCount()
        R["h2"] = q(pynvml.nvmlDeviceGetHandleByIndex, 2)
        R["h3"] = q(pynvml.nvmlDeviceGetHandleByIndex, 3)
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        R["temp"] = q(pynvml.nvmlDeviceGetTemperature, h, 0)
        R["power0"] = q(pynvml.nvmlDeviceGetPowerUsage, h)
        R["power1"] = q(pynvml.nvmlDeviceGetPowerUsage, pynvml.nvmlDeviceGetHandleByIndex(1))
        R["drv"] = q(pynvml.nvmlSystemGetDriverVersion)
        R["raw_null"] = LIB.nvmlDeviceGetCount_v2(None)
        R["raw_badhandle"] = LIB.nvmlDeviceGetIndex(ctypes.c_void_p(4096), ctypes.byref(c))
        R["raw_null_out"] = LIB.nvmlDeviceGetIndex(h, None)
        buf = ctypes.create_string_buffer(4)
        R["raw_small"] = LIB.nvmlDeviceGetName(h, buf, 4)
        R["raw_threshold"] = LIB.nvmlDeviceGetTemperatureThreshold(h, 99, ctypes.byref(c))
    """,
        spec,
    )
    r = results(proc)
    assert r["raw_uninit"] == 1  # NVML_ERROR_UNINITIALIZED
    assert r["count"] == 3  # the driver still counts the GPU it cannot open
    assert r["h2"] == ["NVMLError", 999] and r["h3"] == INVALID
    assert r["temp"] == ["NVMLError", 15]
    assert r["power0"] == ["NVMLError", 4] and r["power1"] == NOT_SUPPORTED
    assert r["drv"] == ["NVMLError", 18]
    assert r["raw_null"] == 2 and r["raw_badhandle"] == 2 and r["raw_null_out"] == 2
    assert r["raw_small"] == 7  # NVML_ERROR_INSUFFICIENT_SIZE
    assert r["raw_threshold"] == 2


def test_init_outcomes() -> None:
    body = """
        try:
            pynvml.nvmlInit()
            R["init"] = 0
        except pynvml.NVMLError as e:
            R["init"] = e.value
            R["cls"] = type(e).__name__
    """
    assert results(run("12.570.86", 550, body, None)) == {"init": 9, "cls": "NVMLError_DriverNotLoaded"}
    assert results(run("12.570.86", 550, body, "version 1\ninit_error 4\ngpus 1\n"))["init"] == 4
    assert results(run("12.570.86", 550, body, "version 1\nerror nvmlInit * 999\n"))["init"] == 999
    assert results(run("12.570.86", 550, body, "version 1\ngpus 0\n"))["init"] == 0
    bad = run("12.570.86", 550, body, "version 1\ngpus 2\n\ngpu 0 temperature_c hot\n")
    assert results(bad)["init"] == 999
    assert bad.stderr.count("\n") == 1 and "line 4" in bad.stderr and "temperature_c" in bad.stderr
    for spec, line in (
        ("version 2\n", 1),
        ("gpus 1\ngpu 1 name X\n", 2),
        ("gpus 1\nfrobnicate\n", 2),
        ("gpus 1\nerror nvmlDeviceGetNothing 0 3\n", 2),
        ("gpus 1\ngpu 0 nvlink 1 2\n", 2),
    ):
        bad = run("12.570.86", 550, body, spec)
        assert results(bad)["init"] == 999 and f"line {line}:" in bad.stderr, (spec, bad.stderr)


def test_spec_is_read_again_at_each_init() -> None:
    r = results(
        run(
            "13.615.71",
            580,
            """
        pynvml.nvmlInit()
        R["a"] = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
        os.environ["NODEHEALTH_FAKE_NVML_SPEC"] = "version 1\\ngpus 5\\n"
        pynvml.nvmlInit()
        R["b"] = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
        del os.environ["NODEHEALTH_FAKE_NVML_SPEC"]
        R["c"] = q(pynvml.nvmlInit)
    """,
            "version 1\ngpus 2\n",
        )
    )
    assert r == {"a": 2, "b": 5, "c": ["NVMLError", 9]}


@pytest.mark.timing
def test_delay_and_init_ms(tmp_path: Path, timing: Timing) -> None:
    log = tmp_path / "calls.log"
    spec = textwrap.dedent("""\
        version 1
        gpus 2
        gpu 0 power_mw 1000
        gpu 0 init_ms 300
        gpu 1 power_mw 2000
        delay nvmlDeviceGetPowerUsage 0 200000
        delay * 0 50000
    """)
    r = results(
        run(
            "12.560.30",
            535,
            """
        pynvml.nvmlInit()
        def timed(fn, *a):
            t = time.monotonic()
            fn(*a)
            return time.monotonic() - t
        R["open0"] = timed(pynvml.nvmlDeviceGetHandleByIndex, 0)
        R["open0_again"] = timed(pynvml.nvmlDeviceGetHandleByIndex, 0)
        pynvml.nvmlShutdown()
        pynvml.nvmlInit()
        R["open0_after_reinit"] = timed(pynvml.nvmlDeviceGetHandleByIndex, 0)
        h0, h1 = pynvml.nvmlDeviceGetHandleByIndex(0), pynvml.nvmlDeviceGetHandleByIndex(1)
        R["power0"] = timed(pynvml.nvmlDeviceGetPowerUsage, h0)
        R["power1"] = timed(pynvml.nvmlDeviceGetPowerUsage, h1)
    """,
            spec,
            env={driver.LOG_ENV: str(log)},
        )
    )
    assert r["open0"] >= 0.35  # init_ms 300 + the `delay * 0` 50 ms
    # A call without its delay is fast: a quiet machine's bound, scaled, never up to the delay it lacks.
    fast_s, open_s = min(timing.slack(0.1), 0.2), min(timing.slack(0.2), 0.3)  # the delays: 250 ms, 350 ms
    assert r["open0_again"] < open_s and r["open0_after_reinit"] < open_s  # once per process
    assert r["power0"] >= 0.25  # 200 ms + 50 ms: matching delays add up
    assert r["power1"] < fast_s
    calls = driver.read_log(log)
    power = [c for c in calls if c.symbol == "nvmlDeviceGetPowerUsage"]
    assert [(c.gpu, c.rc) for c in power] == [(0, 0), (1, 0)]
    assert power[0].elapsed_us >= 250000 and power[1].elapsed_us < fast_s * 1e6
    opens = [c for c in calls if c.symbol == "nvmlDeviceGetHandleByIndex_v2" and c.gpu == 0]
    assert opens[0].elapsed_us >= 350000 and all(c.elapsed_us < open_s * 1e6 for c in opens[1:])


def test_hang_never_returns() -> None:
    spec = "version 1\ngpus 2\ngpu 1 temperature_c 40\nhang nvmlDeviceGetTemperature 1\n"
    body = """
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(1)
        print("opened", flush=True)
        pynvml.nvmlDeviceGetTemperature(h, 0)
        print("returned", flush=True)
    """
    t = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as exc:
        run("12.535.77", 525, body, spec, timeout=1.5)
    assert time.monotonic() - t < 10
    out = exc.value.stdout or b""
    out = out.decode() if isinstance(out, bytes) else out
    assert "opened" in out and "returned" not in out


def test_call_log(tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    spec = "version 1\ngpus 2\ngpu 1 memory_temp_c 40\nerror nvmlDeviceGetHandleByIndex 0 8\n"
    run(
        "13.615.71",
        580,
        """
        pynvml.nvmlInit()
        pynvml.nvmlDeviceGetCount()
        q(pynvml.nvmlDeviceGetHandleByIndex, 0)
        h = pynvml.nvmlDeviceGetHandleByIndex(1)
        pynvml.nvmlDeviceGetFieldValues(h, [82, 3, (161, 0)])
        q(pynvml.nvmlDeviceGetName, h)
        pynvml.nvmlShutdown()
    """,
        spec,
        env={driver.LOG_ENV: str(log)},
    )
    lines = log.read_text().splitlines()
    assert all(len(line.split()) in (4, 5) for line in lines)
    calls = [(c.symbol, c.gpu, c.rc, c.values) for c in driver.read_log(log)]
    assert calls == [
        ("nvmlInitWithFlags", -1, 0, None),
        ("nvmlDeviceGetCount_v2", -1, 0, None),
        ("nvmlDeviceGetHandleByIndex_v2", 0, 8, None),
        ("nvmlDeviceGetHandleByIndex_v2", 1, 0, None),
        ("nvmlDeviceGetFieldValues", 1, 0, 3),
        ("nvmlDeviceGetName", 1, 3, None),
        ("nvmlShutdown", -1, 0, None),
    ], calls


def test_driver_module() -> None:
    assert driver.branch_for("550.127.05") == 550
    assert driver.branch_for("560.35.03") == 550
    assert driver.branch_for("575.51") == 570
    assert driver.branch_for("590") == 580
    assert driver.branch_for("460.32.03") == 470
    assert driver.branch_for("535.216.01") == 535
    with pytest.raises(ValueError):
        driver.branch_for("garbage")
    with pytest.raises(ValueError):
        driver.library_path(999)
    assert driver.library_path(550).name == "libnvidia-ml.so.1"
    assert driver.read_log("/nonexistent/log") == []
