"""The NVML reader, in the child: one GPU at a time, each call announced before it is made.

``read_node`` reads the whole node through a module with pynvml's surface and announces every
step as a frame (``("call", fn)`` before each call, so a deadline names the call that did not
return). ``GpuReader`` reads one GPU, with the fallbacks for what a driver branch or a wheel
lacks: a function's older spelling, the NVLink counters of drivers before 525 (a state call per
link, the 11.x per-link field ids), the fabric structure's older versions and the v1 call. What
one GPU taught about the driver (which fabric version it has) is kept for the next GPU.
"""

from __future__ import annotations

import ctypes
from types import ModuleType
from typing import Any, Callable, Optional, Union

from nodehealth.observations import EccCounts, FieldError, GpuObservation, GpuProcess, NvLink, RemappedRows
from nodehealth.probes.nvml_h import (
    ARGUMENT_VERSION_MISMATCH,
    FABRIC_VERSIONS,
    FEATURE_ENABLED,
    FI_ECC_DBE_AGG_TOTAL,
    FI_ECC_DBE_VOL_TOTAL,
    FI_ECC_SBE_AGG_TOTAL,
    FI_ECC_SBE_VOL_TOTAL,
    FI_GET_GPU_RECOVERY_ACTION,
    FI_MEMORY_TEMP,
    FI_NVLINK_ERROR_DL_CRC,
    FI_NVLINK_ERROR_DL_RECOVERY,
    FI_NVLINK_ERROR_DL_REPLAY,
    FI_NVLINK_GET_STATE,
    FI_NVLINK_LINK_COUNT,
    FI_REMAPPED_COR,
    FI_REMAPPED_FAILURE,
    FI_REMAPPED_PENDING,
    FI_REMAPPED_UNC,
    FI_RETIRED_DBE,
    FI_RETIRED_PENDING,
    FI_RETIRED_SBE,
    FIELD_GROUP,
    GPU_FIELDS,
    INVALID_ARGUMENT,
    LEGACY_MAX_LINKS,
    LINK_FIELDS,
    NOT_APPLICABLE,
    NOT_SUPPORTED,
    NVLINK_MAX_LINKS,
    RETURN_CODES,
    SUCCESS,
    TEMPERATURE_GPU,
    THRESHOLD_GPU_MAX,
    THRESHOLD_MEM_MAX,
    THRESHOLD_SHUTDOWN,
    THRESHOLD_SLOWDOWN,
    THROTTLE_FIELDS,
    THROTTLE_FIELDS_580,
    THROTTLE_FIELDS_580_FROM,
    FabricInfoV1,
    legacy_link_fields,
)
from nodehealth.probes.nvml_lib import DIRECT_CALLS, as_text, error_kind, fabric_v


class GpuReader:
    """Reads one GPU; ``call`` announces each NVML call before making it."""

    def __init__(self, nv: ModuleType, announce: Callable[[Any], None], node: Optional[dict[str, Any]] = None) -> None:
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
                if fn in DIRECT_CALLS:
                    return DIRECT_CALLS[fn](self.nv, fn, *args)
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
        default_mw = c("power", "nvmlDeviceGetPowerManagementDefaultLimit", handle)
        procs = c(
            "processes", ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2"), handle
        )
        persistence = c("persistence_mode", "nvmlDeviceGetPersistenceMode", handle)
        mig = c("mig_mode", "nvmlDeviceGetMigMode", handle)
        newer = THROTTLE_FIELDS_580 if self.node.get("driver_major", 0) >= THROTTLE_FIELDS_580_FROM else ()
        fields = self._fields(handle, [(fid, 0) for fid in GPU_FIELDS + tuple(fid for fid, _ in newer)])
        throttled = ((reason, _counter(fields.get(fid))) for fid, reason in THROTTLE_FIELDS + newer)
        links = self._nvlinks(handle, fields.get(FI_NVLINK_LINK_COUNT))
        remap: list[Any] = [
            fields.get(f) for f in (FI_REMAPPED_COR, FI_REMAPPED_UNC, FI_REMAPPED_PENDING, FI_REMAPPED_FAILURE)
        ]
        retired = [fields.get(f) for f in (FI_RETIRED_SBE, FI_RETIRED_DBE, FI_RETIRED_PENDING)]
        return GpuObservation(
            index=index,
            name=_opt(as_text, c("name", "nvmlDeviceGetName", handle)),
            uuid=_opt(as_text, c("uuid", "nvmlDeviceGetUUID", handle)),
            pci_bus_id=bus_id(pci),
            temperature_c=c("temperature", "nvmlDeviceGetTemperature", handle, TEMPERATURE_GPU),
            slowdown_c=c("temperature", "nvmlDeviceGetTemperatureThreshold", handle, THRESHOLD_SLOWDOWN),
            shutdown_c=c("temperature", "nvmlDeviceGetTemperatureThreshold", handle, THRESHOLD_SHUTDOWN),
            gpu_max_c=c("temperature", "nvmlDeviceGetTemperatureThreshold", handle, THRESHOLD_GPU_MAX),
            mem_max_c=c("temperature", "nvmlDeviceGetTemperatureThreshold", handle, THRESHOLD_MEM_MAX),
            memory_temp_c=_opt(int, fields.get(FI_MEMORY_TEMP)),
            power_w=None if power_mw is None else power_mw / 1000.0,
            power_limit_w=None if limit_mw is None else limit_mw / 1000.0,
            power_default_limit_w=None if default_mw is None else default_mw / 1000.0,
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
            )
            if ecc_mode is not None
            else EccCounts(),
            retired_pages_sbe=_opt(int, retired[0]),
            retired_pages_dbe=_opt(int, retired[1]),
            retired_pages_pending=None if retired[2] is None else bool(retired[2]),
            remapped_rows=None
            if None in remap
            else RemappedRows(int(remap[0]), int(remap[1]), bool(remap[2]), bool(remap[3])),
            pcie_gen=c("pcie", "nvmlDeviceGetCurrPcieLinkGeneration", handle),
            pcie_max_gen=c("pcie", "nvmlDeviceGetMaxPcieLinkGeneration", handle),
            pcie_width=c("pcie", "nvmlDeviceGetCurrPcieLinkWidth", handle),
            pcie_max_width=c("pcie", "nvmlDeviceGetMaxPcieLinkWidth", handle),
            nvlinks=links,
            **self._fabric(handle),
            processes=None
            if procs is None
            else tuple(GpuProcess(int(p.pid), _opt(int, getattr(p, "usedGpuMemory", None))) for p in procs),
            # The event-reason call exists from driver 535; the deprecated throttle-reason
            # call has the same bits on every driver.
            throttle_reasons=c(
                "throttle",
                ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"),
                handle,
            ),
            throttle_ns=tuple((reason, ns) for reason, ns in throttled if ns is not None) or None,
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
                for group in sorted({FIELD_GROUP.get(fid, "fields") for fid, _ in wanted}):
                    self._fail(group, failed.kind, failed.message)
            return out
        for (fid, scope), value in zip(wanted, values):
            ret = int(value.nvmlReturn)
            key = fid if not scope and fid not in LINK_FIELDS else (fid, scope)
            if ret == SUCCESS:
                out[key] = _field_value(value)
            elif ret not in (NOT_SUPPORTED, INVALID_ARGUMENT):
                kind = RETURN_CODES.get(ret, "error")
                self._fail(
                    FIELD_GROUP.get(fid, "fields"),
                    kind,
                    f"nvmlDeviceGetFieldValues field {fid}{f' link {scope}' if scope else ''}: "
                    f"{kind.replace('_', ' ')} (NVML return {ret})",
                )
        return out

    def _nvlinks(self, handle: Any, count: Any) -> Optional[tuple[NvLink, ...]]:
        if not count:
            return None  # no NVLink on this GPU (or not reported)
        count = min(int(count), NVLINK_MAX_LINKS)
        wanted = [(fid, link) for link in range(count) for fid in LINK_FIELDS]
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
            links.append(
                NvLink(
                    link,
                    bool(int(state) == FEATURE_ENABLED),
                    replay=_opt(int, got.get((FI_NVLINK_ERROR_DL_REPLAY, link))),
                    recovery=_opt(int, got.get((FI_NVLINK_ERROR_DL_RECOVERY, link))),
                    crc_flit=_opt(int, got.get((FI_NVLINK_ERROR_DL_CRC, link))),
                )
            )
        return tuple(links) or None

    def _nvlinks_by_call(self, handle: Any, count: int) -> Optional[tuple[NvLink, ...]]:
        """Drivers before 525: a state call per link, the counters of links 0-11 in one
        field-values call (the per-link ids of the 11.x nvml.h)."""
        count = min(count, LEGACY_MAX_LINKS)
        states = [self.call("nvlink", "nvmlDeviceGetNvLinkState", handle, link) for link in range(count)]
        wanted = [(fid, 0) for link in range(count) for fid in legacy_link_fields(link)]
        got = self._fields(handle, wanted)
        links = []
        for link, state in enumerate(states):
            if state is None:
                continue
            replay, recovery, flit, data = (_opt(int, got.get(fid)) for fid in legacy_link_fields(link))
            links.append(
                NvLink(
                    link, bool(state == FEATURE_ENABLED), replay=replay, recovery=recovery, crc_flit=flit, crc_data=data
                )
            )
        return tuple(links) or None

    def _fabric(self, handle: Any) -> dict[str, Any]:
        """The fabric state through the versioned call (with the health mask) where the driver
        and wheel have it, else the v1 call; always with the C layout of nvml.h."""
        none = {"fabric_state": None, "fabric_status": None, "fabric_health_mask": None, "fabric_health_summary": None}
        info: Any = None
        if not self.node.get("fabric_v1"):
            for cls, version in FABRIC_VERSIONS[self.node.get("fabric_version", 0) :]:
                candidate = cls(version=version)
                self.announce(("call", "nvmlDeviceGetGpuFabricInfoV"))
                try:
                    fabric_v(self.nv, handle, ctypes.byref(candidate))
                except Exception as exc:  # noqa: BLE001
                    code = getattr(exc, "value", None)
                    if code == ARGUMENT_VERSION_MISMATCH:
                        # An older driver: try the previous struct version, and start there on the next GPU.
                        self.node["fabric_version"] = self.node.get("fabric_version", 0) + 1
                        continue
                    kind = error_kind(self.nv, exc)
                    if kind in NOT_APPLICABLE:
                        self.node["fabric_v1"] = True
                        break  # the driver predates the versioned call: use v1
                    self._fail("fabric", kind, f"nvmlDeviceGetGpuFabricInfoV: {exc}")
                    return none
                info = candidate
                break
        if info is None:
            v1 = FabricInfoV1()
            # pynvml hands the argument to the C function as is: it must be a pointer.
            if self.call("fabric", "nvmlDeviceGetGpuFabricInfo", handle, ctypes.byref(v1)) is None:
                return none
            info = v1
        status = int(info.status)
        return {
            "fabric_state": int(info.state),
            "fabric_status": None
            if status == SUCCESS
            else f"NVML error {status} ({RETURN_CODES.get(status, 'unknown')})",
            "fabric_health_mask": int(info.healthMask) if hasattr(info, "healthMask") else None,
            "fabric_health_summary": int(info.healthSummary) if hasattr(info, "healthSummary") else None,
        }


def _field_value(value: Any) -> Any:
    """The union member nvmlFieldValue_t's valueType names (NVML_VALUE_TYPE_*, nvml.h)."""
    member = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
    return getattr(value.value, member.get(int(value.valueType), "ullVal"))


def _counter(value: Any) -> Optional[int]:
    """A cumulative counter (0 to 2**64), else None: a float, a negative or a wrapped value is refused."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 64:
        return None
    return value


def _opt(fn: Callable[[Any], Any], value: Any) -> Any:
    return None if value is None else fn(value)


def bus_id(pci: Any) -> Optional[str]:
    """NVML's busId ("00000000:3B:00.0") as sysfs spells it ("0000:3b:00.0").

    The domain keeps every significant digit: VMD domains are five ("10000:e1:00.0").
    """
    if pci is None:
        return None
    text = as_text(getattr(pci, "busId", "") or getattr(pci, "busIdLegacy", "")).strip().lower()
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
        announce(
            (
                "header",
                {
                    "driver_version": None if driver is None else as_text(driver),
                    "cuda_driver_version": cuda,
                    "device_count": count,
                },
            )
        )
        node: dict[str, Any] = {"driver_major": _major(driver)}
        for index in range(count):
            announce(("begin", index))
            announce(("gpu", GpuReader(nv, announce, node).read(index)))
        announce(("end", None))
    finally:
        try:
            nv.nvmlShutdown()
        except Exception:  # noqa: BLE001 - shutdown failure changes nothing we report
            pass


def _major(driver: Any) -> int:
    """The driver's branch ("580.65.06" -> 580), 0 when it cannot be told."""
    head = (as_text(driver) if driver is not None else "").split(".", 1)[0]
    return int(head) if head.isdigit() and len(head) < 5 else 0


def _safe(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception:  # noqa: BLE001
        return None
