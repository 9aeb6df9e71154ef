"""The NVML probe: reads every GPU through a module with pynvml's surface, in a child process.

A wedged GPU makes NVML calls block in the kernel, possibly forever, and such a process may
not even die on SIGKILL. So the reading happens in a forked child that streams what it read
over a pipe, one frame per call and per GPU; the parent waits until its deadline, then kills
the child and walks away without waiting for it. What arrived before the deadline is kept,
and the last call announced names where NVML stopped answering.

A wedged GPU costs one stuck child, not one per round: before it forks, ``start`` reaps every
abandoned child that has exited since, and while the last abandoned reader is still there
(blocked in the driver, it survives SIGKILL) it forks no new one and reports the stall instead
(a ``timeout``, as a hang is).

The module is always ``pynvml`` (package nvidia-ml-py), unmodified. In tests and demos it
runs over the simulated driver (``nodehealth.sim``: a fake ``libnvidia-ml.so.1`` built from
C, loaded by pynvml's own loader), so a simulated run goes through the vendor's Python code
and this probe exactly as production does. Vendor errors are translated here into our
error kinds; nothing the vendor raises (``NVMLLibraryMismatchError`` is not an NVMLError)
and no constant an older wheel lacks can make the probe crash.

Slow is not hung: every call has its own deadline (a call past it is hung: the GPU is
wedged); the whole read has a budget (when it ends with calls still answering, the driver
is slow, and what was not read is named as not read).
"""

from __future__ import annotations

import ctypes
import os
import pickle
import select
import signal
import struct
import threading
import time
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, Optional, Union

from nodehealth.observations import (
    EccCounts,
    FieldError,
    GpuObservation,
    GpuProcess,
    NvLink,
    NvmlSnapshot,
    ProbeError,
    RemappedRows,
)
from nodehealth.platform import child

# Every pynvml function this probe calls (first choice, then what it falls back to).
NVML_FUNCTIONS = (
    "nvmlInit",
    "nvmlShutdown",
    "nvmlSystemGetDriverVersion",
    "nvmlSystemGetCudaDriverVersion",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetName",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetPciInfo",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetTemperatureThreshold",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetEccMode",
    "nvmlDeviceGetCurrPcieLinkGeneration",
    "nvmlDeviceGetMaxPcieLinkGeneration",
    "nvmlDeviceGetCurrPcieLinkWidth",
    "nvmlDeviceGetMaxPcieLinkWidth",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetGpuFabricInfoV",
    "nvmlDeviceGetGpuFabricInfo",
    "nvmlDeviceGetComputeRunningProcesses_v3",  # called through pynvml's library (_processes)
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
    "nvmlDeviceGetPersistenceMode",
    "nvmlDeviceGetFieldValues",
    # Only where the driver predates the per-link NVLink fields (drivers before 525):
    "nvmlDeviceGetNvLinkState",
    "nvmlDeviceGetNvLinkErrorCounter",
)
NVML_CLASSES = ("NVMLError",)

# nvmlReturn_t (nvml.h). The probe keeps its own table: the installed nvidia-ml-py may be
# older or newer than the driver, and a missing constant must never become a crash.
RETURN_CODES = {
    0: "success", 1: "uninitialized", 2: "invalid_argument", 3: "not_supported", 4: "no_permission",
    5: "already_initialized", 6: "not_found", 7: "insufficient_size", 8: "insufficient_power",
    9: "driver_not_loaded", 10: "timeout", 11: "irq_issue", 12: "library_not_found",
    13: "function_not_found", 14: "corrupted_inforom", 15: "gpu_lost", 16: "reset_required",
    17: "operating_system", 18: "version_mismatch", 19: "in_use", 20: "memory", 21: "no_data",
    22: "vgpu_ecc_not_supported", 23: "insufficient_resources", 24: "freq_not_supported",
    25: "argument_version_mismatch", 26: "deprecated", 27: "not_ready", 28: "gpu_not_found", 29: "invalid_state",
    30: "reset_type_not_supported", 999: "unknown",
}  # complete up to the nvml.h of CUDA 13.3 (go-nvml 8b8585b): 30 is the last before 999
SUCCESS, INVALID_ARGUMENT, NOT_SUPPORTED, FUNCTION_NOT_FOUND, GPU_IS_LOST = 0, 2, 3, 13, 15
ARGUMENT_VERSION_MISMATCH = 25
# A call that answered one of these does not apply to this GPU or driver: the field is None.
_NOT_APPLICABLE = frozenset({"not_supported", "function_not_found", "library_mismatch"})

# nvml.h constants by value (pynvml's names; the oldest wheels lack some of them).
TEMPERATURE_GPU = 0
THRESHOLD_SHUTDOWN, THRESHOLD_SLOWDOWN, THRESHOLD_MEM_MAX, THRESHOLD_GPU_MAX = 0, 1, 2, 3
FEATURE_ENABLED = 1
# NVML_NVLINK_MAX_LINKS: 12 up to CUDA 11.8, 18 from 12.0 to 13.2, 36 in the CUDA 13.3 nvml.h. The link
# count itself is NVML_FI_DEV_NVLINK_LINK_COUNT; this only bounds it, at the newest header's value.
NVLINK_MAX_LINKS = 36
NVLINK_ERROR_DL_REPLAY, NVLINK_ERROR_DL_RECOVERY, NVLINK_ERROR_DL_CRC_FLIT, NVLINK_ERROR_DL_CRC_DATA = 0, 1, 2, 3

# Field ids (NVML_FI_DEV_*, nvml.h). One nvmlDeviceGetFieldValues call reads them all.
FI_ECC_SBE_VOL_TOTAL, FI_ECC_DBE_VOL_TOTAL, FI_ECC_SBE_AGG_TOTAL, FI_ECC_DBE_AGG_TOTAL = 3, 4, 5, 6
FI_RETIRED_SBE, FI_RETIRED_DBE, FI_RETIRED_PENDING = 29, 30, 31
FI_MEMORY_TEMP = 82
FI_NVLINK_LINK_COUNT = 91
FI_REMAPPED_COR, FI_REMAPPED_UNC, FI_REMAPPED_PENDING, FI_REMAPPED_FAILURE = 142, 143, 144, 145
# Per link, with scopeId = link (CUDA 12.0 / driver 525 and later):
FI_NVLINK_ERROR_DL_REPLAY, FI_NVLINK_ERROR_DL_RECOVERY, FI_NVLINK_ERROR_DL_CRC = 161, 162, 163
FI_NVLINK_GET_STATE = 165
FI_GET_GPU_RECOVERY_ACTION = 230  # drivers 570 and later; nvidia-ml-py from 12.570.86
_GPU_FIELDS = (
    FI_ECC_SBE_VOL_TOTAL, FI_ECC_DBE_VOL_TOTAL, FI_ECC_SBE_AGG_TOTAL, FI_ECC_DBE_AGG_TOTAL,
    FI_RETIRED_SBE, FI_RETIRED_DBE, FI_RETIRED_PENDING, FI_MEMORY_TEMP, FI_NVLINK_LINK_COUNT,
    FI_REMAPPED_COR, FI_REMAPPED_UNC, FI_REMAPPED_PENDING, FI_REMAPPED_FAILURE, FI_GET_GPU_RECOVERY_ACTION,
)
_LINK_FIELDS = (FI_NVLINK_GET_STATE, FI_NVLINK_ERROR_DL_REPLAY, FI_NVLINK_ERROR_DL_RECOVERY, FI_NVLINK_ERROR_DL_CRC)
# Before 525: per-link counter ids, links 0-5 then 6-11 (NVML_FI_DEV_NVLINK_{REPLAY,RECOVERY,
# CRC_FLIT,CRC_DATA}_ERROR_COUNT_L<n>, nvml.h of CUDA 11.4), no scope.
LEGACY_MAX_LINKS = 12
_LEGACY_BASES = ((46, 108), (53, 114), (32, 96), (39, 102))  # replay, recovery, crc flit, crc data


def _legacy_link_fields(link: int) -> tuple[int, ...]:
    return tuple(low + link if link < 6 else high + link - 6 for low, high in _LEGACY_BASES)


# Which observation a field feeds (for the errors a check reads).
_FIELD_GROUP = {
    FI_ECC_SBE_VOL_TOTAL: "ecc_errors", FI_ECC_DBE_VOL_TOTAL: "ecc_errors", FI_ECC_SBE_AGG_TOTAL: "ecc_errors",
    FI_ECC_DBE_AGG_TOTAL: "ecc_errors", FI_RETIRED_SBE: "retired_pages", FI_RETIRED_DBE: "retired_pages",
    FI_RETIRED_PENDING: "retired_pages", FI_MEMORY_TEMP: "temperature", FI_NVLINK_LINK_COUNT: "nvlink",
    FI_REMAPPED_COR: "remapped_rows", FI_REMAPPED_UNC: "remapped_rows", FI_REMAPPED_PENDING: "remapped_rows",
    FI_REMAPPED_FAILURE: "remapped_rows", FI_GET_GPU_RECOVERY_ACTION: "recovery_action",
    FI_NVLINK_GET_STATE: "nvlink", FI_NVLINK_ERROR_DL_REPLAY: "nvlink", FI_NVLINK_ERROR_DL_RECOVERY: "nvlink",
    FI_NVLINK_ERROR_DL_CRC: "nvlink",
    **{low + n: "nvlink" for low, high in _LEGACY_BASES for n in range(6)},
    **{high + n: "nvlink" for low, high in _LEGACY_BASES for n in range(6)},
}


class _FabricInfoV1(ctypes.Structure):
    """nvmlGpuFabricInfo_t as nvml.h lays it out: the state is one byte at offset 24.

    nvidia-ml-py before 13.615.71 declares an 80-byte clusterUuid (state read at offset 88,
    always 0 = "not supported"), so the probe passes its own structure.
    """

    _fields_ = [("clusterUuid", ctypes.c_ubyte * 16), ("status", ctypes.c_uint),  # noqa: RUF012
                ("cliqueId", ctypes.c_uint), ("state", ctypes.c_ubyte)]


class _FabricInfoV3(ctypes.Structure):
    """nvmlGpuFabricInfo_v3_t (nvml.h): adds the health mask and summary (version 0x3000028)."""

    _fields_ = [("version", ctypes.c_uint), ("clusterUuid", ctypes.c_ubyte * 16),  # noqa: RUF012
                ("status", ctypes.c_uint), ("cliqueId", ctypes.c_uint), ("state", ctypes.c_ubyte),
                ("healthMask", ctypes.c_uint), ("healthSummary", ctypes.c_ubyte)]


class _FabricInfoV2(ctypes.Structure):
    """nvmlGpuFabricInfo_v2_t (nvml.h): version 0x02000024, health mask, no summary."""

    _fields_ = [("version", ctypes.c_uint), ("clusterUuid", ctypes.c_ubyte * 16),  # noqa: RUF012
                ("status", ctypes.c_uint), ("cliqueId", ctypes.c_uint), ("state", ctypes.c_ubyte),
                ("healthMask", ctypes.c_uint)]


_FABRIC_VERSIONS = ((_FabricInfoV3, 0x3000028), (_FabricInfoV2, 0x02000024))

_FRAME = struct.Struct("!I")
SHUTDOWN_GRACE_S = 0.2
# A killed reader that can die has died this long after SIGKILL; one still there is stuck. Counted
# from the kill, not from the next look: on a loaded machine a killed process may wait a while for
# a CPU to exit on, and a round that starts right after the kill gives it the rest of this time.
STUCK_GRACE_S = 1.0
STUCK_LOOK_S = 0.05  # and each later look waits this long for one that is exiting just then
# Calls that may legitimately take seconds: nvmlInit, and opening a GPU ("this API causes NVML to
# initialize the target GPU", nvml.h, nvmlDeviceGetHandleByIndex_v2), which without persistence mode
# brings the GPU up again. They get the longer deadline, counted from their last visible progress.
SLOW_CALLS = frozenset({"nvmlInit", "nvmlDeviceGetHandleByIndex"})
# How often the parent looks at a slow call's progress (the reader's page faults and open files in
# /proc/<pid>: bringing a GPU up opens its device node and maps memory; a call blocked in the kernel
# does neither).
PROGRESS_POLL_S = 0.25
# A quick call (any but the slow ones) that alone takes this share of the read's budget is hung even
# under its own deadline: such calls answer in milliseconds, so one that eats a small prolog budget
# is stuck, not slow. Never applied to the slow calls or the reader's start-up.
HUNG_SHARE = 0.9

# The reader abandoned at its last deadline, until it is reaped: (pid, wall-clock time it was
# started). While it is still there no new reader is forked.
_abandoned: Optional[tuple[int, float]] = None
_abandoned_at = 0.0  # time.monotonic() when it was killed and abandoned
_abandoned_lock = threading.Lock()


class NvmlUnavailable(Exception):
    """NVML cannot be used on this node (library or driver missing, init refused)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


# The oldest nvidia-ml-py the version matrix passes with (pyproject.toml's floor; `make nvml-matrix`).
# Older wheels lack wrappers the probe relies on (11.450.51 has no nvmlDeviceGetGpuFabricInfo, so a
# fabric that never registered read as "not supported": OK on a node that cannot run CUDA).
PYNVML_FLOOR = (12, 535, 77)


def wheel_version(nv: ModuleType) -> Optional[str]:
    """The nvidia-ml-py release of the module imported, from the metadata beside its file
    (``nvidia_ml_py-<version>.dist-info`` or ``.egg-info``: pip, pip --target, Debian, the vendored
    copy), whatever path it came from; None when there is none to read."""
    origin = getattr(nv, "__file__", None)
    if not origin:
        return None
    here = os.path.dirname(os.path.abspath(origin))
    if os.path.basename(origin) == "__init__.py":  # a pynvml package (the other "pynvml" project)
        here = os.path.dirname(here)
    try:
        names = sorted(os.listdir(here))
    except OSError:
        return None
    for prefix in ("nvidia_ml_py-", "pynvml-"):
        for name in names:
            if name.startswith(prefix) and name.endswith((".dist-info", ".egg-info")):
                return name[len(prefix):].rsplit(".", 1)[0].split("-py", 1)[0]
    return None


def wheel_too_old(nv: ModuleType) -> Optional[str]:
    """Why the imported nvidia-ml-py cannot be used (below PYNVML_FLOOR), or None."""
    version = wheel_version(nv)
    if version is None:
        return None
    parts = []
    for piece in version.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    if tuple(parts) >= PYNVML_FLOOR:
        return None
    floor = ".".join(map(str, PYNVML_FLOOR))
    return (f"nvidia-ml-py {version} ({getattr(nv, '__file__', '?')}) is older than {floor}, the oldest this "
            f"probe is tested with: its verdicts cannot be trusted (install nvidia-ml-py>={floor})")


def load_module() -> ModuleType:
    """pynvml (nvidia-ml-py); NvmlUnavailable when it is not installed. Runs in the child."""
    try:
        import pynvml
    except ImportError as exc:  # pragma: no cover - nvidia-ml-py is a dependency
        raise NvmlUnavailable("library_not_found", f"nvidia-ml-py is not installed ({exc})") from None
    return pynvml


# --------------------------------------------------------------------------- error translation


def error_kind(nv: ModuleType, exc: BaseException) -> str:
    """Our name for what a call raised: not_supported, gpu_lost, no_permission, library_mismatch, ...

    Not only NVMLError: nvidia-ml-py raises NVMLLibraryMismatchError (an Exception) when the
    driver lacks the versioned symbol it wants (``_v3`` on drivers before 510), and an older
    wheel lacks attributes a newer driver has.
    """
    if type(exc).__name__ == "NVMLLibraryMismatchError":
        return "library_mismatch"
    if isinstance(exc, AttributeError):
        return "function_not_found"
    code = getattr(exc, "value", None)
    if isinstance(exc, nv.NVMLError) and isinstance(code, int):
        return RETURN_CODES.get(code, "error")
    return "error"


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


# --------------------------------------------------------------------------- reading (child side)


class _Reader:
    """Reads one GPU; ``call`` announces each NVML call before making it."""

    def __init__(self, nv: ModuleType, announce: Callable[[Any], None],
                 node: Optional[dict[str, Any]] = None) -> None:
        self.nv = nv
        self.announce = announce
        self.node = {} if node is None else node  # what one GPU taught about the driver, for the next
        self.errors: list[FieldError] = []
        self.lost = False

    def _fail(self, fieldname: str, kind: str, message: str) -> None:
        if kind == "gpu_lost":
            self.lost = True
        if not any(e.field == fieldname for e in self.errors):
            self.errors.append(FieldError(fieldname, kind, message))

    def call(self, fieldname: str, fns: Union[str, tuple[str, ...]], *args: Any) -> Any:
        """The first answer among ``fns`` (a function, then its fallbacks for older drivers
        or wheels), or None when none applies or a call failed (failure kept in errors)."""
        if self.lost:
            return None
        for fn in (fns,) if isinstance(fns, str) else fns:
            self.announce(("call", fn))
            try:
                if fn in _DIRECT:
                    return _DIRECT[fn](self.nv, fn, *args)
                wrapper = getattr(self.nv, fn, None)
                if wrapper is None:
                    raise AttributeError(fn)
                return wrapper(*args)
            except Exception as exc:  # noqa: BLE001 - every vendor failure becomes a kind
                kind = error_kind(self.nv, exc)
                if kind in ("function_not_found", "library_mismatch"):
                    continue  # this driver or wheel lacks it: try the older spelling
                if kind != "not_supported":
                    self._fail(fieldname, kind, f"{fn}: {exc}")
                return None
        return None

    def read(self, index: int) -> GpuObservation:
        handle = self.call("handle", "nvmlDeviceGetHandleByIndex", index)
        if handle is None:
            # nvidia-smi's "Unable to determine the device handle for GPU": counted by
            # nvmlDeviceGetCount, yet unreachable. Never a GPU that is merely "not read".
            if not self.errors and not self.lost:
                self._fail("handle", "error", "nvmlDeviceGetHandleByIndex gave no handle")
            return GpuObservation(index=index, lost=self.lost, errors=tuple(self.errors), unreachable=True)
        c = self.call
        pci = c("pci", "nvmlDeviceGetPciInfo", handle)
        util = c("utilization", "nvmlDeviceGetUtilizationRates", handle)
        mem = c("memory", "nvmlDeviceGetMemoryInfo", handle)
        ecc_mode = c("ecc_mode", "nvmlDeviceGetEccMode", handle)
        power_mw = c("power", "nvmlDeviceGetPowerUsage", handle)
        limit_mw = c("power", "nvmlDeviceGetEnforcedPowerLimit", handle)
        procs = c("processes", ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2"),
                  handle)
        persistence = c("persistence_mode", "nvmlDeviceGetPersistenceMode", handle)
        mig = c("mig_mode", "nvmlDeviceGetMigMode", handle)
        fields = self._fields(handle, [(fid, 0) for fid in _GPU_FIELDS])
        links = self._nvlinks(handle, fields.get(FI_NVLINK_LINK_COUNT))
        remap: list[Any] = [fields.get(f) for f in (FI_REMAPPED_COR, FI_REMAPPED_UNC, FI_REMAPPED_PENDING,
                                                     FI_REMAPPED_FAILURE)]
        retired = [fields.get(f) for f in (FI_RETIRED_SBE, FI_RETIRED_DBE, FI_RETIRED_PENDING)]
        return GpuObservation(
            index=index,
            name=_opt(_text, c("name", "nvmlDeviceGetName", handle)),
            uuid=_opt(_text, c("uuid", "nvmlDeviceGetUUID", handle)),
            pci_bus_id=_bus_id(pci),
            temperature_c=c("temperature", "nvmlDeviceGetTemperature", handle, TEMPERATURE_GPU),
            slowdown_c=c("temperature", "nvmlDeviceGetTemperatureThreshold", handle, THRESHOLD_SLOWDOWN),
            shutdown_c=c("temperature", "nvmlDeviceGetTemperatureThreshold", handle, THRESHOLD_SHUTDOWN),
            gpu_max_c=c("temperature", "nvmlDeviceGetTemperatureThreshold", handle, THRESHOLD_GPU_MAX),
            mem_max_c=c("temperature", "nvmlDeviceGetTemperatureThreshold", handle, THRESHOLD_MEM_MAX),
            memory_temp_c=_opt(int, fields.get(FI_MEMORY_TEMP)),
            power_w=None if power_mw is None else power_mw / 1000.0,
            power_limit_w=None if limit_mw is None else limit_mw / 1000.0,
            utilization_gpu_pct=None if util is None else int(util.gpu),
            utilization_memory_pct=None if util is None else int(util.memory),
            memory_used_bytes=None if mem is None else int(mem.used),
            memory_total_bytes=None if mem is None else int(mem.total),
            ecc_enabled=None if ecc_mode is None else bool(ecc_mode[0] == FEATURE_ENABLED),
            ecc_pending_enabled=None if ecc_mode is None else bool(ecc_mode[1] == FEATURE_ENABLED),
            ecc=EccCounts(
                volatile_corrected=_opt(int, fields.get(FI_ECC_SBE_VOL_TOTAL)),
                volatile_uncorrected=_opt(int, fields.get(FI_ECC_DBE_VOL_TOTAL)),
                aggregate_corrected=_opt(int, fields.get(FI_ECC_SBE_AGG_TOTAL)),
                aggregate_uncorrected=_opt(int, fields.get(FI_ECC_DBE_AGG_TOTAL)),
            ) if ecc_mode is not None else EccCounts(),
            retired_pages_sbe=_opt(int, retired[0]),
            retired_pages_dbe=_opt(int, retired[1]),
            retired_pages_pending=None if retired[2] is None else bool(retired[2]),
            remapped_rows=None if None in remap else RemappedRows(
                int(remap[0]), int(remap[1]), bool(remap[2]), bool(remap[3])),
            pcie_gen=c("pcie", "nvmlDeviceGetCurrPcieLinkGeneration", handle),
            pcie_max_gen=c("pcie", "nvmlDeviceGetMaxPcieLinkGeneration", handle),
            pcie_width=c("pcie", "nvmlDeviceGetCurrPcieLinkWidth", handle),
            pcie_max_width=c("pcie", "nvmlDeviceGetMaxPcieLinkWidth", handle),
            nvlinks=links,
            **self._fabric(handle),
            processes=None if procs is None else tuple(
                GpuProcess(int(p.pid), _opt(int, getattr(p, "usedGpuMemory", None))) for p in procs),
            # The event-reason call exists from driver 535; the deprecated throttle-reason
            # call has the same bits on every driver.
            throttle_reasons=c("throttle", ("nvmlDeviceGetCurrentClocksEventReasons",
                                            "nvmlDeviceGetCurrentClocksThrottleReasons"), handle),
            persistence_mode=None if persistence is None else bool(persistence == FEATURE_ENABLED),
            mig_enabled=None if mig is None else bool(mig[0] == FEATURE_ENABLED),
            recovery_action=_opt(int, fields.get(FI_GET_GPU_RECOVERY_ACTION)),
            lost=self.lost,
            errors=tuple(self.errors),
        )

    def _fields(self, handle: Any, wanted: list[tuple[int, int]]) -> dict[Any, Any]:
        """One nvmlDeviceGetFieldValues call: {fieldId: value} ({(fieldId, scope): value} for
        scoped ones). A field the driver does not know or the GPU lacks is absent; any other
        per-field failure is an error on the observation the field feeds."""
        values = self.call("fields", "nvmlDeviceGetFieldValues", handle, wanted)
        out: dict[Any, Any] = {}
        if values is None:
            failed = next((e for e in self.errors if e.field == "fields"), None)
            if failed is not None:  # the call itself failed: so did every value it carries
                for group in sorted({_FIELD_GROUP.get(fid, "fields") for fid, _ in wanted}):
                    self._fail(group, failed.kind, failed.message)
            return out
        for (fid, scope), value in zip(wanted, values):
            ret = int(value.nvmlReturn)
            key = fid if not scope and fid not in _LINK_FIELDS else (fid, scope)
            if ret == SUCCESS:
                out[key] = _field_value(value)
            elif ret not in (NOT_SUPPORTED, INVALID_ARGUMENT):
                kind = RETURN_CODES.get(ret, "error")
                self._fail(_FIELD_GROUP.get(fid, "fields"), kind,
                           f"nvmlDeviceGetFieldValues field {fid}{f' link {scope}' if scope else ''}: "
                           f"{kind.replace('_', ' ')} (NVML return {ret})")
        return out

    def _nvlinks(self, handle: Any, count: Any) -> Optional[tuple[NvLink, ...]]:
        if not count:
            return None  # no NVLink on this GPU (or not reported)
        count = min(int(count), NVLINK_MAX_LINKS)
        wanted = [(fid, link) for link in range(count) for fid in _LINK_FIELDS]
        got = self._fields(handle, wanted)
        if not any((FI_NVLINK_GET_STATE, link) in got for link in range(count)):
            if any(e.field == "nvlink" for e in self.errors):
                return None
            return self._nvlinks_by_call(handle, count)  # driver before the per-link fields
        links = []
        for link in range(count):
            state = got.get((FI_NVLINK_GET_STATE, link))
            if state is None:
                continue
            links.append(NvLink(link, bool(int(state) == FEATURE_ENABLED),
                                replay=_opt(int, got.get((FI_NVLINK_ERROR_DL_REPLAY, link))),
                                recovery=_opt(int, got.get((FI_NVLINK_ERROR_DL_RECOVERY, link))),
                                crc_flit=_opt(int, got.get((FI_NVLINK_ERROR_DL_CRC, link)))))
        return tuple(links) or None

    def _nvlinks_by_call(self, handle: Any, count: int) -> Optional[tuple[NvLink, ...]]:
        """Drivers before 525: a state call per link, the counters of links 0-11 in one
        field-values call (the per-link ids of the 11.x nvml.h)."""
        count = min(count, LEGACY_MAX_LINKS)
        states = [self.call("nvlink", "nvmlDeviceGetNvLinkState", handle, link) for link in range(count)]
        wanted = [(fid, 0) for link in range(count) for fid in _legacy_link_fields(link)]
        got = self._fields(handle, wanted)
        links = []
        for link, state in enumerate(states):
            if state is None:
                continue
            replay, recovery, flit, data = (_opt(int, got.get(fid)) for fid in _legacy_link_fields(link))
            links.append(NvLink(link, bool(state == FEATURE_ENABLED), replay=replay, recovery=recovery,
                                crc_flit=flit, crc_data=data))
        return tuple(links) or None

    def _fabric(self, handle: Any) -> dict[str, Any]:
        """The fabric state through the versioned call (with the health mask) where the driver
        and wheel have it, else the v1 call; always with the C layout of nvml.h."""
        none = {"fabric_state": None, "fabric_status": None, "fabric_health_mask": None,
                "fabric_health_summary": None}
        info: Any = None
        if not self.node.get("fabric_v1"):
            for cls, version in _FABRIC_VERSIONS[self.node.get("fabric_version", 0):]:
                candidate = cls(version=version)
                self.announce(("call", "nvmlDeviceGetGpuFabricInfoV"))
                try:
                    _fabric_v(self.nv, handle, ctypes.byref(candidate))
                except Exception as exc:  # noqa: BLE001
                    code = getattr(exc, "value", None)
                    if code == ARGUMENT_VERSION_MISMATCH:
                        # An older driver: try the previous struct version, and start there on the next GPU.
                        self.node["fabric_version"] = self.node.get("fabric_version", 0) + 1
                        continue
                    kind = error_kind(self.nv, exc)
                    if kind in _NOT_APPLICABLE:
                        self.node["fabric_v1"] = True
                        break  # the driver predates the versioned call: use v1
                    self._fail("fabric", kind, f"nvmlDeviceGetGpuFabricInfoV: {exc}")
                    return none
                info = candidate
                break
        if info is None:
            v1 = _FabricInfoV1()
            # pynvml hands the argument to the C function as is: it must be a pointer.
            if self.call("fabric", "nvmlDeviceGetGpuFabricInfo", handle, ctypes.byref(v1)) is None:
                return none
            info = v1
        status = int(info.status)
        return {
            "fabric_state": int(info.state),
            "fabric_status": None if status == SUCCESS else f"NVML error {status} "
                                                            f"({RETURN_CODES.get(status, 'unknown')})",
            "fabric_health_mask": int(info.healthMask) if hasattr(info, "healthMask") else None,
            "fabric_health_summary": int(info.healthSummary) if hasattr(info, "healthSummary") else None,
        }


class _ProcessInfoV2(ctypes.Structure):
    """nvmlProcessInfo_v2_t (nvml.h), what nvmlDeviceGetComputeRunningProcesses_v2 fills."""

    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),  # noqa: RUF012
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


def _processes(nv: ModuleType, symbol: str, handle: Any) -> list[Any]:
    """nvmlDeviceGetComputeRunningProcesses_v3 / _v2 through pynvml's loaded library, with the
    structure nvml.h gives both (nvmlProcessInfo_v2_t, 24 bytes): nvidia-ml-py 12.535.77 reads
    ``_v3`` with a 32-byte structure (every process after the first misread), and wheels before
    12.560 have no ``_v2`` wrapper for drivers before 510, which lack ``_v3``."""
    fn = nv._nvmlGetFunctionPointer(symbol)  # NVMLError(FUNCTION_NOT_FOUND) when the driver lacks it
    count = ctypes.c_uint(0)
    ret = fn(handle, ctypes.byref(count), None)
    for _ in range(3):
        if ret == SUCCESS:
            return []
        if ret != 7:  # NVML_ERROR_INSUFFICIENT_SIZE: ask again with room for more
            raise nv.NVMLError(ret)
        count.value = count.value * 2 + 5
        procs = (_ProcessInfoV2 * count.value)()
        ret = fn(handle, ctypes.byref(count), procs)
        if ret == SUCCESS:
            return [procs[i] for i in range(count.value)]
    raise nv.NVMLError(ret)


# Calls the probe makes itself through pynvml's loaded library (its function lookup, its error
# class), where a wrapper is wrong or missing in an allowed wheel.
_DIRECT: dict[str, Callable[..., Any]] = {
    "nvmlDeviceGetComputeRunningProcesses_v3": _processes,
    "nvmlDeviceGetComputeRunningProcesses_v2": _processes,
}


def _fabric_v(nv: ModuleType, handle: Any, info: Any) -> None:
    """nvmlDeviceGetGpuFabricInfoV: pynvml's wrapper, or (wheels before 12.560 have none) the C
    function through pynvml's lookup: the health mask and summary must not depend on the wheel."""
    wrapper = getattr(nv, "nvmlDeviceGetGpuFabricInfoV", None)
    if wrapper is not None:
        wrapper(handle, info)
        return
    ret = nv._nvmlGetFunctionPointer("nvmlDeviceGetGpuFabricInfoV")(handle, info)
    if ret != SUCCESS:
        raise nv.NVMLError(ret)


def _field_value(value: Any) -> Any:
    """The union member nvmlFieldValue_t's valueType names (NVML_VALUE_TYPE_*, nvml.h)."""
    member = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
    return getattr(value.value, member.get(int(value.valueType), "ullVal"))


def _opt(fn: Callable[[Any], Any], value: Any) -> Any:
    return None if value is None else fn(value)


def _bus_id(pci: Any) -> Optional[str]:
    """NVML's busId ("00000000:3B:00.0") as sysfs spells it ("0000:3b:00.0").

    The domain keeps every significant digit: VMD domains are five ("10000:e1:00.0").
    """
    if pci is None:
        return None
    text = _text(getattr(pci, "busId", "") or getattr(pci, "busIdLegacy", "")).strip().lower()
    domain, sep, rest = text.partition(":")
    if sep and len(domain) > 4:
        domain = domain.lstrip("0").rjust(4, "0")
    return f"{domain}{sep}{rest}" if sep else text or None


def read_node(nv: ModuleType, announce: Callable[[Any], None]) -> None:
    """Read the whole node, announcing progress and results through ``announce``.

    Frames: ("call", fn) before each call, ("header", dict) after init, ("begin", index),
    ("gpu", GpuObservation), ("end", None), or ("unavailable", (kind, message)).
    """
    announce(("call", "nvmlInit"))
    try:
        nv.nvmlInit()
    except Exception as exc:  # noqa: BLE001
        announce(("unavailable", (error_kind(nv, exc), f"nvmlInit: {exc}")))
        return
    try:
        announce(("call", "nvmlSystemGetDriverVersion"))
        driver = _safe(nv.nvmlSystemGetDriverVersion)
        announce(("call", "nvmlSystemGetCudaDriverVersion"))
        cuda = _safe(nv.nvmlSystemGetCudaDriverVersion)
        announce(("call", "nvmlDeviceGetCount"))
        try:
            count = int(nv.nvmlDeviceGetCount())
        except Exception as exc:  # noqa: BLE001
            announce(("unavailable", (error_kind(nv, exc), f"nvmlDeviceGetCount: {exc}")))
            return
        announce(("header", {"driver_version": None if driver is None else _text(driver),
                             "cuda_driver_version": cuda, "device_count": count}))
        node: dict[str, Any] = {}
        for index in range(count):
            announce(("begin", index))
            announce(("gpu", _Reader(nv, announce, node).read(index)))
        announce(("end", None))
    finally:
        try:
            nv.nvmlShutdown()
        except Exception:  # noqa: BLE001 - shutdown failure changes nothing we report
            pass


def _safe(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception:  # noqa: BLE001
        return None


# --------------------------------------------------------------------------- the child (parent side)


@dataclass
class PendingProbe:
    """A forked NVML reader; ``collect`` waits for it, never past its deadlines.

    Two deadlines: each call has its own (``call_timeout_s``; ``slow_call_timeout_s`` for
    nvmlInit and opening a GPU, which initialises it when persistence mode is off, counted
    from the call's last visible progress): a call past it is *hung*. The whole read has
    ``timeout_s``: when that ends first, the driver is *slow* (whatever share of the budget
    one call took), and what was not read is named, not called hung.
    """

    pid: int
    fd: int
    started: float
    timeout_s: float
    simulated: bool
    started_wall: float = 0.0
    call_timeout_s: float = 3.0
    slow_call_timeout_s: float = 30.0

    def _call_limit(self, call: Optional[str]) -> float:
        """The call's own deadline. Before the first call (the reader starting: fork, import,
        loading the library; no driver call yet) there is none but the budget: how fast Python
        starts says nothing about the GPU. Slow calls count theirs from their last progress."""
        if call is None:
            return self.timeout_s
        if call in SLOW_CALLS:
            return self.slow_call_timeout_s
        return min(self.call_timeout_s, HUNG_SHARE * self.timeout_s)

    def collect(self, clock: Callable[[], float] = time.monotonic) -> Union[NvmlSnapshot, ProbeError]:
        deadline = self.started + self.timeout_s
        buf = bytearray()
        frames: list[Any] = []
        eof = False
        stop: Optional[str] = None
        current: Optional[str] = None
        announced = self.started  # when the call in flight was announced
        since = self.started  # ... or, for a slow call, when it last showed progress
        seen: Optional[tuple[int, ...]] = None
        try:
            while not eof:
                now = clock()
                call_deadline = since + self._call_limit(current)
                if now >= call_deadline and call_deadline <= deadline:
                    stop = "hung"
                    break
                if now >= deadline:
                    stop = "budget"
                    break
                wait = min(deadline, call_deadline) - now
                slow = current in SLOW_CALLS
                ready, _, _ = select.select([self.fd], [], [], min(wait, PROGRESS_POLL_S) if slow else wait)
                if not ready:
                    if slow:
                        mark = _progress(self.pid)
                        if seen is not None and mark is not None and mark != seen:
                            since = clock()  # slow, and getting somewhere: not hung
                        seen = mark
                    continue  # the loop head tells which deadline passed
                chunk = os.read(self.fd, 65536)
                if not chunk:
                    eof = True
                buf += chunk
                new = _take_frames(buf)
                frames.extend(new)
                for kind, value in new:
                    if kind == "call":
                        current, since, seen = value, clock(), None
                        announced = since
                if any(frame[0] == "end" for frame in new):
                    # Everything is read; only nvmlShutdown is left. Give it a moment, not the
                    # rest of the deadline: a shutdown that hangs changes nothing we report.
                    deadline = min(deadline, clock() + SHUTDOWN_GRACE_S)
                    current, since = "nvmlShutdown", clock() + 3600.0
                    announced = since
        finally:
            os.close(self.fd)
        elapsed = clock() - self.started
        if not eof:
            _abandon(self.pid, self.started_wall)
        else:
            child.reap(self.pid, clock)
        ended = any(frame[0] == "end" for frame in frames)
        return _assemble(frames, complete=eof or ended, elapsed=elapsed, timeout_s=self.timeout_s,
                         simulated=self.simulated, stop=None if ended else stop,
                         call_limit=self._call_limit(current), in_flight_s=clock() - announced)


def _progress(pid: int) -> Optional[tuple[int, ...]]:
    """What changes while a process gets work done in the kernel and not while it is blocked there:
    its minor and major page faults (/proc/<pid>/stat fields 10 and 12) and its open files."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().rsplit(b")", 1)[1].split()
        return int(stat[7]), int(stat[9]), len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, IndexError, ValueError):
        return None


@dataclass(frozen=True)
class StalledProbe:
    """No reader forked: the previous one is still stuck. ``collect`` gives the stall at once."""

    error: ProbeError
    pid: int

    def collect(self, clock: Callable[[], float] = time.monotonic) -> ProbeError:
        return self.error


def _abandon(pid: int, started_wall: float) -> None:
    global _abandoned, _abandoned_at
    child.abandon(pid)
    with _abandoned_lock:
        _abandoned, _abandoned_at = (pid, started_wall), time.monotonic()


def stuck_reader() -> Optional[tuple[int, float]]:
    """(pid, started) of the abandoned reader while it has not exited; reaps it once it has.

    Reaps every other abandoned child that has exited too: this runs before each fork, so
    every round reaps.
    """
    global _abandoned
    child.reap_orphans()
    with _abandoned_lock:
        last, killed_at = _abandoned, _abandoned_at
    if last is None:
        return None
    if child.orphaned(last[0], max(STUCK_LOOK_S, killed_at + STUCK_GRACE_S - time.monotonic())):
        return last
    with _abandoned_lock:
        if _abandoned == last:
            _abandoned = None
    return None


def start(loader: Callable[[], ModuleType], timeout_s: float, simulated: bool = False,
          clock: Callable[[], float] = time.monotonic, call_timeout_s: float = 3.0,
          slow_call_timeout_s: float = 30.0) -> Union[PendingProbe, StalledProbe]:
    """Fork the reader. Call it before starting other threads (fork copies only this one).

    ``loader`` runs in the child and returns the NVML module: pynvml is imported (and
    libnvidia-ml loaded) there, never in the caller. While the reader abandoned at an earlier
    deadline is still stuck, nothing is forked: the answer is that stall (``StalledProbe``).
    """
    stuck = stuck_reader()
    if stuck is not None:
        pid, since = stuck
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(since))
        return StalledProbe(ProbeError(
            "nvml", "timeout", f"NVML still not answering since {when} (child pid {pid} stuck in the driver "
            "after SIGKILL; no new reader until it exits)"), pid)
    rfd, wfd = os.pipe()
    started, started_wall = clock(), time.time()
    pid = os.fork()
    if pid == 0:  # child: read, stream, and leave without running any parent cleanup
        code = 0
        try:
            os.close(rfd)
            os.setpgid(0, 0)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            send: Callable[[Any], None] = lambda frame: _send(wfd, frame)  # noqa: E731
            try:
                nv = loader()
            except NvmlUnavailable as exc:
                send(("unavailable", (exc.kind, str(exc))))
            else:
                old = wheel_too_old(nv)
                if old is not None:
                    send(("unavailable", ("old_library", old)))
                else:
                    read_node(nv, send)
        except BaseException as exc:  # noqa: BLE001 - report anything, then exit
            try:
                _send(wfd, ("crash", f"{type(exc).__name__}: {exc}"))
            except BaseException:  # noqa: BLE001
                code = 3
        finally:
            os._exit(code)
    os.close(wfd)
    return PendingProbe(pid=pid, fd=rfd, started=started, timeout_s=timeout_s, simulated=simulated,
                        started_wall=started_wall, call_timeout_s=call_timeout_s,
                        slow_call_timeout_s=slow_call_timeout_s)


def _send(fd: int, frame: Any) -> None:
    data = pickle.dumps(frame, protocol=pickle.HIGHEST_PROTOCOL)
    os.write(fd, _FRAME.pack(len(data)) + data)


def _take_frames(buf: bytearray) -> list[Any]:
    out = []
    while len(buf) >= _FRAME.size:
        (size,) = _FRAME.unpack_from(buf)
        if len(buf) < _FRAME.size + size:
            break
        payload = bytes(buf[_FRAME.size:_FRAME.size + size])
        del buf[:_FRAME.size + size]
        out.append(pickle.loads(payload))  # noqa: S301 - our own child, over our own pipe
    return out


def _assemble(frames: list[Any], complete: bool, elapsed: float, timeout_s: float,
              simulated: bool, stop: Optional[str] = None, call_limit: Optional[float] = None,
              in_flight_s: float = 0.0) -> Union[NvmlSnapshot, ProbeError]:
    header: dict[str, Any] = {}
    gpus: list[GpuObservation] = []
    last_call: Optional[str] = None
    current: Optional[int] = None
    ended = False
    for kind, value in frames:
        if kind == "call":
            last_call = value
        elif kind == "header":
            header = value
        elif kind == "begin":
            current = value
        elif kind == "gpu":
            gpus.append(value)
            current = None
        elif kind == "end":
            ended = True
        elif kind == "unavailable":
            err_kind, message = value
            if err_kind in ("library_not_found", "driver_not_loaded"):
                return ProbeError("nvml", "unavailable", message)
            if err_kind == "no_permission":
                return ProbeError("nvml", "permission", message)
            if err_kind == "old_library":
                return ProbeError("nvml", "old_library", message)
            return ProbeError("nvml", "error", message)
        elif kind == "crash":
            return ProbeError("nvml", "error", f"NVML probe crashed: {value}")
    if complete and not ended:
        return ProbeError("nvml", "error", "NVML probe exited before it finished")
    return NvmlSnapshot(
        driver_version=header.get("driver_version"),
        cuda_driver_version=header.get("cuda_driver_version"),
        device_count=header.get("device_count"),
        gpus=tuple(gpus),
        elapsed_s=elapsed,
        complete=ended,
        timeout_s=timeout_s,
        stalled_gpu=None if ended else current,
        stalled_call=None if ended else last_call,
        simulated=simulated,
        stop=None if ended else (stop or "budget"),
        call_timeout_s=call_limit,
        in_flight_s=None if ended else round(in_flight_s, 3),
    )
