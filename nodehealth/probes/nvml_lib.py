"""The NVML library the probe reads through: pynvml (nvidia-ml-py), unmodified.

``load_module`` imports it (in the reader's child, never in the caller); ``wheel_too_old``
refuses a wheel below the tested floor; ``error_kind`` translates what the vendor raises into
our error kinds (``NVMLLibraryMismatchError`` is not an NVMLError; a missing wrapper is an
AttributeError); ``DIRECT_CALLS`` and ``fabric_v`` call C functions through pynvml's own loaded
library where an allowed wheel's wrapper is wrong or missing.
"""

from __future__ import annotations

import ctypes
import os
from types import ModuleType
from typing import Any, Callable, Optional

from nodehealth.probes.nvml_h import RETURN_CODES, SUCCESS, ProcessInfoV2


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
                return name[len(prefix) :].rsplit(".", 1)[0].split("-py", 1)[0]
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
    return (
        f"nvidia-ml-py {version} ({getattr(nv, '__file__', '?')}) is older than {floor}, the oldest this "
        f"probe is tested with: its verdicts cannot be trusted (install nvidia-ml-py>={floor})"
    )


def load_module() -> ModuleType:
    """pynvml (nvidia-ml-py); NvmlUnavailable when it is not installed. Runs in the child."""
    try:
        import pynvml
    except ImportError as exc:  # pragma: no cover - nvidia-ml-py is a dependency
        raise NvmlUnavailable("library_not_found", f"nvidia-ml-py is not installed ({exc})") from None
    return pynvml


def import_ahead() -> None:
    """Import pynvml here, in a long-lived caller (the daemon, before it forks a round's reader), so that
    each reader inherits the module instead of importing it: the import was more than half of a
    reader's CPU (~19 of ~34 ms on 8 simulated GPUs, docs/performance.md). Nothing of NVML runs
    here: nvidia-ml-py loads libnvidia-ml only in ``nvmlInit``, which only a reader calls, so the caller
    maps no driver library and a wedged GPU still costs a child, never the caller. An import that fails
    is left for the reader, which fails the same way and reports it (``load_module``)."""
    try:
        import pynvml  # noqa: F401
    except Exception:  # noqa: BLE001 - the reader's own import says what is wrong, in its report
        pass


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


def as_text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def processes(nv: ModuleType, symbol: str, handle: Any) -> list[Any]:
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
        procs = (ProcessInfoV2 * count.value)()
        ret = fn(handle, ctypes.byref(count), procs)
        if ret == SUCCESS:
            return [procs[i] for i in range(count.value)]
    raise nv.NVMLError(ret)


# Calls the probe makes itself through pynvml's loaded library (its function lookup, its error
# class), where a wrapper is wrong or missing in an allowed wheel.
DIRECT_CALLS: dict[str, Callable[..., Any]] = {
    "nvmlDeviceGetComputeRunningProcesses_v3": processes,
    "nvmlDeviceGetComputeRunningProcesses_v2": processes,
}


def fabric_v(nv: ModuleType, handle: Any, info: Any) -> None:
    """nvmlDeviceGetGpuFabricInfoV: pynvml's wrapper, or (wheels before 12.560 have none) the C
    function through pynvml's lookup: the health mask and summary must not depend on the wheel."""
    wrapper = getattr(nv, "nvmlDeviceGetGpuFabricInfoV", None)
    if wrapper is not None:
        wrapper(handle, info)
        return
    ret = nv._nvmlGetFunctionPointer("nvmlDeviceGetGpuFabricInfoV")(handle, info)
    if ret != SUCCESS:
        raise nv.NVMLError(ret)
