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

The module is ``pynvml`` (package nvidia-ml-py) in production, or the scenario-driven
stand-in ``nodehealth.sim.nvml`` in tests and demos: the swap happens below this code,
so both run the same probe. Vendor errors are translated here into our error kinds.
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

# Every pynvml name this probe uses. The contract test checks each exists, with the same
# parameters, in the installed nvidia-ml-py and in the stand-in.
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
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetRetiredPages",
    "nvmlDeviceGetRetiredPagesPendingStatus",
    "nvmlDeviceGetRemappedRows",
    "nvmlDeviceGetCurrPcieLinkGeneration",
    "nvmlDeviceGetMaxPcieLinkGeneration",
    "nvmlDeviceGetCurrPcieLinkWidth",
    "nvmlDeviceGetMaxPcieLinkWidth",
    "nvmlDeviceGetNvLinkState",
    "nvmlDeviceGetNvLinkErrorCounter",
    "nvmlDeviceGetGpuFabricInfo",
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetPersistenceMode",
    "nvmlDeviceGetFieldValues",
)
NVML_CONSTANTS = (
    "NVML_TEMPERATURE_GPU",
    "NVML_TEMPERATURE_THRESHOLD_SLOWDOWN",
    "NVML_TEMPERATURE_THRESHOLD_SHUTDOWN",
    "NVML_MEMORY_ERROR_TYPE_CORRECTED",
    "NVML_MEMORY_ERROR_TYPE_UNCORRECTED",
    "NVML_VOLATILE_ECC",
    "NVML_AGGREGATE_ECC",
    "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS",
    "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR",
    "NVML_NVLINK_MAX_LINKS",
    "NVML_NVLINK_ERROR_DL_REPLAY",
    "NVML_NVLINK_ERROR_DL_RECOVERY",
    "NVML_NVLINK_ERROR_DL_CRC_FLIT",
    "NVML_NVLINK_ERROR_DL_CRC_DATA",
    "NVML_FEATURE_ENABLED",
    "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION",
    "NVML_SUCCESS",
    "NVML_ERROR_NOT_SUPPORTED",
    "NVML_ERROR_INVALID_ARGUMENT",
    "NVML_ERROR_GPU_IS_LOST",
    "NVML_ERROR_RESET_REQUIRED",
    "NVML_ERROR_NO_PERMISSION",
    "NVML_ERROR_LIBRARY_NOT_FOUND",
    "NVML_ERROR_DRIVER_NOT_LOADED",
    "NVML_ERROR_FUNCTION_NOT_FOUND",
    "NVML_ERROR_TIMEOUT",
    "NVML_ERROR_UNINITIALIZED",
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH",
)
NVML_CLASSES = ("NVMLError", "c_nvmlGpuFabricInfo_t")

_FRAME = struct.Struct("!I")
SHUTDOWN_GRACE_S = 0.2
# A killed reader that can die has died this long after SIGKILL; one still there is stuck.
STUCK_GRACE_S = 0.05

# The reader abandoned at its last deadline, until it is reaped: (pid, wall-clock time it was
# started). While it is still there no new reader is forked.
_abandoned: Optional[tuple[int, float]] = None
_abandoned_lock = threading.Lock()


class NvmlUnavailable(Exception):
    """NVML cannot be used on this node (library or driver missing, init refused)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def load_module() -> ModuleType:
    """pynvml (nvidia-ml-py); NvmlUnavailable when it is not installed. Runs in the child."""
    try:
        import pynvml
    except ImportError as exc:  # pragma: no cover - nvidia-ml-py is a dependency
        raise NvmlUnavailable("library_not_found", f"nvidia-ml-py is not installed ({exc})") from None
    return pynvml


# --------------------------------------------------------------------------- error translation


def error_kind(nv: ModuleType, exc: BaseException) -> str:
    """Our name for a vendor error: not_supported, gpu_lost, reset_required, no_permission, ..."""
    code = getattr(exc, "value", None)
    table = {
        getattr(nv, "NVML_ERROR_NOT_SUPPORTED", -1): "not_supported",
        getattr(nv, "NVML_ERROR_FUNCTION_NOT_FOUND", -1): "not_supported",
        getattr(nv, "NVML_ERROR_INVALID_ARGUMENT", -1): "not_supported",
        getattr(nv, "NVML_ERROR_GPU_IS_LOST", -1): "gpu_lost",
        getattr(nv, "NVML_ERROR_RESET_REQUIRED", -1): "reset_required",
        getattr(nv, "NVML_ERROR_NO_PERMISSION", -1): "no_permission",
        getattr(nv, "NVML_ERROR_TIMEOUT", -1): "timeout",
        getattr(nv, "NVML_ERROR_LIBRARY_NOT_FOUND", -1): "library_not_found",
        getattr(nv, "NVML_ERROR_DRIVER_NOT_LOADED", -1): "driver_not_loaded",
        getattr(nv, "NVML_ERROR_LIB_RM_VERSION_MISMATCH", -1): "version_mismatch",
    }
    return table.get(code, "error")


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


# --------------------------------------------------------------------------- reading (child side)


class _Reader:
    """Reads one GPU; ``call`` announces each NVML call before making it."""

    def __init__(self, nv: ModuleType, announce: Callable[[Any], None]) -> None:
        self.nv = nv
        self.announce = announce
        self.errors: list[FieldError] = []
        self.lost = False

    def call(self, fieldname: str, fn: str, *args: Any) -> Any:
        """The call's value, or None when not supported or failed (failure kept in errors)."""
        if self.lost:
            return None
        self.announce(("call", fn))
        try:
            return getattr(self.nv, fn)(*args)
        except self.nv.NVMLError as exc:
            kind = error_kind(self.nv, exc)
            if kind == "not_supported":
                return None
            if kind == "gpu_lost":
                self.lost = True
            if not any(e.field == fieldname for e in self.errors):
                self.errors.append(FieldError(fieldname, kind, f"{fn}: {exc}"))
            return None

    def read(self, index: int) -> GpuObservation:
        nv = self.nv
        handle = self.call("handle", "nvmlDeviceGetHandleByIndex", index)
        if handle is None:
            return GpuObservation(index=index, lost=self.lost, errors=tuple(self.errors))
        c = self.call
        pci = c("pci", "nvmlDeviceGetPciInfo", handle)
        util = c("utilization", "nvmlDeviceGetUtilizationRates", handle)
        mem = c("memory", "nvmlDeviceGetMemoryInfo", handle)
        ecc_mode = c("ecc_mode", "nvmlDeviceGetEccMode", handle)
        power_mw = c("power", "nvmlDeviceGetPowerUsage", handle)
        limit_mw = c("power", "nvmlDeviceGetEnforcedPowerLimit", handle)
        pending_retire = c("retired_pages", "nvmlDeviceGetRetiredPagesPendingStatus", handle)
        remap = c("remapped_rows", "nvmlDeviceGetRemappedRows", handle)
        procs = c("processes", "nvmlDeviceGetComputeRunningProcesses", handle)
        persistence = c("persistence_mode", "nvmlDeviceGetPersistenceMode", handle)
        return GpuObservation(
            index=index,
            name=_opt(_text, c("name", "nvmlDeviceGetName", handle)),
            uuid=_opt(_text, c("uuid", "nvmlDeviceGetUUID", handle)),
            pci_bus_id=_bus_id(pci),
            temperature_c=c("temperature", "nvmlDeviceGetTemperature", handle, nv.NVML_TEMPERATURE_GPU),
            slowdown_c=c("temperature", "nvmlDeviceGetTemperatureThreshold", handle,
                         nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
            shutdown_c=c("temperature", "nvmlDeviceGetTemperatureThreshold", handle,
                         nv.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN),
            power_w=None if power_mw is None else power_mw / 1000.0,
            power_limit_w=None if limit_mw is None else limit_mw / 1000.0,
            utilization_gpu_pct=None if util is None else int(util.gpu),
            utilization_memory_pct=None if util is None else int(util.memory),
            memory_used_bytes=None if mem is None else int(mem.used),
            memory_total_bytes=None if mem is None else int(mem.total),
            ecc_enabled=None if ecc_mode is None else bool(ecc_mode[0] == nv.NVML_FEATURE_ENABLED),
            ecc_pending_enabled=None if ecc_mode is None else bool(ecc_mode[1] == nv.NVML_FEATURE_ENABLED),
            ecc=self._ecc(handle) if ecc_mode is not None else EccCounts(),
            retired_pages_sbe=self._retired(handle, nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS),
            retired_pages_dbe=self._retired(handle, nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR),
            retired_pages_pending=None if pending_retire is None else bool(
                pending_retire == nv.NVML_FEATURE_ENABLED),
            remapped_rows=None if remap is None else RemappedRows(
                int(remap[0]), int(remap[1]), bool(remap[2]), bool(remap[3])),
            pcie_gen=c("pcie", "nvmlDeviceGetCurrPcieLinkGeneration", handle),
            pcie_max_gen=c("pcie", "nvmlDeviceGetMaxPcieLinkGeneration", handle),
            pcie_width=c("pcie", "nvmlDeviceGetCurrPcieLinkWidth", handle),
            pcie_max_width=c("pcie", "nvmlDeviceGetMaxPcieLinkWidth", handle),
            nvlinks=self._nvlinks(handle),
            **self._fabric(handle),
            processes=None if procs is None else tuple(
                GpuProcess(int(p.pid), _opt(int, getattr(p, "usedGpuMemory", None))) for p in procs),
            throttle_reasons=c("throttle", "nvmlDeviceGetCurrentClocksEventReasons", handle),
            persistence_mode=None if persistence is None else bool(persistence == nv.NVML_FEATURE_ENABLED),
            recovery_action=self._recovery_action(handle),
            lost=self.lost,
            errors=tuple(self.errors),
        )

    def _ecc(self, handle: Any) -> EccCounts:
        nv, c = self.nv, self.call
        fn = "nvmlDeviceGetTotalEccErrors"
        return EccCounts(
            volatile_corrected=c("ecc_errors", fn, handle, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC),
            volatile_uncorrected=c("ecc_errors", fn, handle, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                   nv.NVML_VOLATILE_ECC),
            aggregate_corrected=c("ecc_errors", fn, handle, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED,
                                  nv.NVML_AGGREGATE_ECC),
            aggregate_uncorrected=c("ecc_errors", fn, handle, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                    nv.NVML_AGGREGATE_ECC),
        )

    def _retired(self, handle: Any, cause: int) -> Optional[int]:
        pages = self.call("retired_pages", "nvmlDeviceGetRetiredPages", handle, cause)
        return None if pages is None else len(pages)

    def _nvlinks(self, handle: Any) -> Optional[tuple[NvLink, ...]]:
        nv = self.nv
        links = []
        for link in range(nv.NVML_NVLINK_MAX_LINKS):
            # Links past the GPU's last one answer "not supported" / "invalid argument".
            state = self.call("nvlink", "nvmlDeviceGetNvLinkState", handle, link)
            if state is None:
                break  # links are numbered from 0; the first unsupported one ends the list
            counters = {
                name: self.call("nvlink", "nvmlDeviceGetNvLinkErrorCounter", handle, link, const)
                for name, const in (
                    ("replay", nv.NVML_NVLINK_ERROR_DL_REPLAY),
                    ("recovery", nv.NVML_NVLINK_ERROR_DL_RECOVERY),
                    ("crc_flit", nv.NVML_NVLINK_ERROR_DL_CRC_FLIT),
                    ("crc_data", nv.NVML_NVLINK_ERROR_DL_CRC_DATA),
                )
            }
            links.append(NvLink(link, bool(state == nv.NVML_FEATURE_ENABLED), **counters))
        return tuple(links) or None

    def _fabric(self, handle: Any) -> dict[str, Any]:
        nv = self.nv
        info = nv.c_nvmlGpuFabricInfo_t()
        # pynvml hands the argument to the C function as is: it must be a pointer.
        if self.call("fabric", "nvmlDeviceGetGpuFabricInfo", handle, ctypes.byref(info)) is None:
            return {"fabric_state": None, "fabric_status": None}
        status = int(info.status)
        return {
            "fabric_state": int(info.state),
            "fabric_status": None if status == nv.NVML_SUCCESS else f"NVML error {status}",
        }

    def _recovery_action(self, handle: Any) -> Optional[int]:
        nv = self.nv
        values = self.call("recovery_action", "nvmlDeviceGetFieldValues", handle,
                           [nv.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])
        if not values:
            return None
        value = values[0]
        if int(value.nvmlReturn) != nv.NVML_SUCCESS:
            return None  # older drivers: field unknown / not supported
        return int(value.value.uiVal)


def _opt(fn: Callable[[Any], Any], value: Any) -> Any:
    return None if value is None else fn(value)


def _bus_id(pci: Any) -> Optional[str]:
    """NVML's busId ("00000000:3B:00.0") as sysfs spells it ("0000:3b:00.0")."""
    if pci is None:
        return None
    text = _text(getattr(pci, "busId", "") or getattr(pci, "busIdLegacy", "")).strip().lower()
    domain, sep, rest = text.partition(":")
    if sep and len(domain) > 4:
        domain = domain[-4:]
    return f"{domain}{sep}{rest}" if sep else text or None


def read_node(nv: ModuleType, announce: Callable[[Any], None]) -> None:
    """Read the whole node, announcing progress and results through ``announce``.

    Frames: ("call", fn) before each call, ("header", dict) after init, ("begin", index),
    ("gpu", GpuObservation), ("end", None), or ("unavailable", (kind, message)).
    """
    announce(("call", "nvmlInit"))
    try:
        nv.nvmlInit()
    except nv.NVMLError as exc:
        kind = error_kind(nv, exc)
        announce(("unavailable", (kind, f"nvmlInit: {exc}")))
        return
    try:
        announce(("call", "nvmlSystemGetDriverVersion"))
        driver = _safe(nv, nv.nvmlSystemGetDriverVersion)
        announce(("call", "nvmlSystemGetCudaDriverVersion"))
        cuda = _safe(nv, nv.nvmlSystemGetCudaDriverVersion)
        announce(("call", "nvmlDeviceGetCount"))
        try:
            count = int(nv.nvmlDeviceGetCount())
        except nv.NVMLError as exc:
            announce(("unavailable", (error_kind(nv, exc), f"nvmlDeviceGetCount: {exc}")))
            return
        announce(("header", {"driver_version": None if driver is None else _text(driver),
                             "cuda_driver_version": cuda, "device_count": count}))
        for index in range(count):
            announce(("begin", index))
            announce(("gpu", _Reader(nv, announce).read(index)))
        announce(("end", None))
    finally:
        try:
            nv.nvmlShutdown()
        except Exception:  # noqa: BLE001 - shutdown failure changes nothing we report
            pass


def _safe(nv: ModuleType, fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except nv.NVMLError:
        return None


# --------------------------------------------------------------------------- the child (parent side)


@dataclass
class PendingProbe:
    """A forked NVML reader; ``collect`` waits for it until the deadline, never longer."""

    pid: int
    fd: int
    started: float
    timeout_s: float
    simulated: bool
    started_wall: float = 0.0

    def collect(self, clock: Callable[[], float] = time.monotonic) -> Union[NvmlSnapshot, ProbeError]:
        deadline = self.started + self.timeout_s
        buf = bytearray()
        frames: list[Any] = []
        eof = False
        try:
            while not eof:
                left = deadline - clock()
                if left <= 0:
                    break
                ready, _, _ = select.select([self.fd], [], [], left)
                if not ready:
                    break
                chunk = os.read(self.fd, 65536)
                if not chunk:
                    eof = True
                buf += chunk
                new = _take_frames(buf)
                frames.extend(new)
                if any(frame[0] == "end" for frame in new):
                    # Everything is read; only nvmlShutdown is left. Give it a moment, not the
                    # rest of the deadline: a shutdown that hangs changes nothing we report.
                    deadline = min(deadline, clock() + SHUTDOWN_GRACE_S)
        finally:
            os.close(self.fd)
        elapsed = clock() - self.started
        if not eof:
            _abandon(self.pid, self.started_wall)
        else:
            child.reap(self.pid, clock)
        ended = any(frame[0] == "end" for frame in frames)
        return _assemble(frames, complete=eof or ended, elapsed=elapsed, timeout_s=self.timeout_s,
                         simulated=self.simulated)


@dataclass(frozen=True)
class StalledProbe:
    """No reader forked: the previous one is still stuck. ``collect`` gives the stall at once."""

    error: ProbeError
    pid: int

    def collect(self, clock: Callable[[], float] = time.monotonic) -> ProbeError:
        return self.error


def _abandon(pid: int, started_wall: float) -> None:
    global _abandoned
    child.abandon(pid)
    with _abandoned_lock:
        _abandoned = (pid, started_wall)


def stuck_reader() -> Optional[tuple[int, float]]:
    """(pid, started) of the abandoned reader while it has not exited; reaps it once it has.

    Reaps every other abandoned child that has exited too: this runs before each fork, so
    every round reaps.
    """
    global _abandoned
    child.reap_orphans()
    with _abandoned_lock:
        last = _abandoned
    if last is None:
        return None
    if child.orphaned(last[0], STUCK_GRACE_S):
        return last
    with _abandoned_lock:
        if _abandoned == last:
            _abandoned = None
    return None


def start(loader: Callable[[], ModuleType], timeout_s: float, simulated: bool = False,
          clock: Callable[[], float] = time.monotonic) -> Union[PendingProbe, StalledProbe]:
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
                        started_wall=started_wall)


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
              simulated: bool) -> Union[NvmlSnapshot, ProbeError]:
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
    )
