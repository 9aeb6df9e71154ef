"""Record every NVML call the probe makes, through a read-only proxy of the NVML module.

``RecordingNvml`` wraps a module with pynvml's surface (pynvml itself, or the simulator): it
exposes the module's attributes unchanged, except that every ``nvml*`` callable is wrapped to
write two records, one when the call starts and one when it returns or raises. A function whose
name says it changes the GPU (``MUTATING_WORDS``) is refused before it can be called.

``record`` runs the probe's own reading code (``nodehealth.probes.nvml.read_node``) on that
proxy in a forked child, under a deadline, and streams the records to ``calls.jsonl`` as they
are made (one unbuffered ``write`` each): a call that hangs in the driver is on disk as
"started" and, once the child is abandoned at the deadline, marked "never returned".

The file is JSON lines, each with a ``type``:

- ``meta``: the NVML module's name and path, the installed nvidia-ml-py version and the
  path of its ``pynvml`` module, the pid.
- ``start``: ``seq``, ``fn``, ``gpu`` (index of the handle argument, or null), ``args`` (repr,
  a handle as ``<gpu N>``), ``argv`` (the arguments as JSON).
- ``return``: ``seq``, ``fn``, ``gpu``, ``rc`` (0, the NVMLError's ``value``, or the class name of
  any other exception), ``error`` (the code's name, e.g. ``NOT_SUPPORTED``), ``value`` (JSON
  rendering), ``value_type``, ``out`` (pointer arguments after the call), ``us`` (duration).
- ``library``: the paths of ``libnvidia-ml.so*`` mapped into the recording process after init.
- ``never_returned``: ``seq``, ``fn``, ``gpu``, ``waited_s``: started, no answer by the deadline.
- ``end``: ``outcome`` (``complete``, ``timed_out`` or ``error``) and ``message``.

``observations.jsonl`` holds the probe's own frames (``announce``): each call it announces
before making it, the header, each GPU's observation, the end. ``load`` reads ``calls.jsonl``
back as one ``Call`` per call (``validation/calls.py`` reads the file).
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import math
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

from nodehealth.platform import ground
from nodehealth.validation.calls import CALLS_FILE as CALLS_FILE
from nodehealth.validation.calls import MAX_RECORDING_BYTES as MAX_RECORDING_BYTES
from nodehealth.validation.calls import Call as Call
from nodehealth.validation.calls import Recording as Recording
from nodehealth.validation.calls import load as load
from nodehealth.validation.calls import parse as parse
from nodehealth.validation.calls import read as read
from nodehealth.validation.calls import read_at as read_at

# A name made of these words changes the GPU or the driver's state: never called.
MUTATING_WORDS = frozenset(
    {
        "Set",
        "Clear",
        "Reset",
        "Register",
        "Unregister",
        "Enable",
        "Disable",
        "Create",
        "Destroy",
        "Modify",
        "Remove",
        "Discover",
        "Freeze",
        "Flush",
        "Write",
        "Activate",
        "Force",
        "Update",
        "Unload",
        "Repair",
        "Inject",
        "Alloc",
        "Free",
        "Start",
        "Stop",
        "Kill",
    }
)
# Raw access to the library would go around the wrapper.
RAW_ACCESS = ("_nvml", "nvmlLib")

OBSERVATIONS_FILE = "observations.jsonl"
LIBRARY_PREFIX = "libnvidia-ml.so"
_WORD = re.compile(r"[A-Z][a-z0-9]*")
_VALUE_FIELD = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


class MutatingCallRefused(AttributeError):
    """The recorder refuses an NVML function that could change a GPU setting."""


def mutating(name: str) -> bool:
    """True for an NVML function name with a word that changes state (Set, Clear, Reset, ...)."""
    if name.startswith(RAW_ACCESS):
        return True
    return bool(MUTATING_WORDS & set(_WORD.findall(name[4:] if name.startswith("nvml") else name)))


def pynvml_version() -> Optional[str]:
    from importlib import metadata

    try:
        return metadata.version("nvidia-ml-py")
    except metadata.PackageNotFoundError:
        return None


def pynvml_path() -> Optional[str]:
    """Where the installed pynvml module is (found, not imported)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("pynvml")
    except (ImportError, ValueError):
        return None
    return None if spec is None else spec.origin


def _meta(nv: Any) -> dict[str, Any]:
    return {
        "type": "meta",
        "module": None if nv is None else getattr(nv, "__name__", type(nv).__name__),
        "path": None if nv is None else getattr(nv, "__file__", None),
        "pynvml_version": pynvml_version(),
        "pynvml_path": pynvml_path(),
        "pid": os.getpid(),
    }


# --------------------------------------------------------------------------- JSON rendering


def render(value: Any, handles: Optional[Callable[[Any], Optional[int]]] = None, depth: int = 0) -> Any:
    """A JSON-safe rendering: structures as dicts of their fields, arrays as lists."""
    if depth > 8:
        return repr(value)
    if handles is not None and value is not None and not isinstance(value, (bool, int, float, str, bytes)):
        gpu = handles(value)
        if gpu is not None:
            return {"handle": gpu}

    def again(v: Any) -> Any:
        return render(v, handles, depth + 1)

    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, bytes):
        return value.split(b"\0", 1)[0].decode("utf-8", errors="replace")
    if isinstance(value, ctypes._SimpleCData):
        return again(value.value)
    if isinstance(value, ctypes.Array):
        return [again(v) for v in value]
    if isinstance(value, ctypes._Pointer):
        return again(value.contents) if value else None
    if hasattr(value, "fieldId") and hasattr(value, "nvmlReturn"):
        return _field_value(value, again)
    if isinstance(value, (ctypes.Structure, ctypes.Union)):
        return {name: again(getattr(value, name)) for name, *_ in getattr(value, "_fields_", ())}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: again(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [again(v) for v in value]
    if isinstance(value, dict):
        return {str(k): again(v) for k, v in value.items()}
    if type(value).__name__ == "CArgObject" and hasattr(value, "_obj"):
        return {"byref": type(value._obj).__name__}
    attrs = getattr(value, "__dict__", None)
    if isinstance(attrs, dict):
        return {k: again(v) for k, v in attrs.items() if not k.startswith("_")}
    return repr(value)


def _field_value(value: Any, again: Callable[[Any], Any]) -> dict[str, Any]:
    """An nvmlFieldValue_t: the union's member chosen by valueType; no value when it failed."""
    rc = int(value.nvmlReturn)
    out: dict[str, Any] = {"fieldId": int(value.fieldId)}
    if hasattr(value, "scopeId"):
        out["scopeId"] = int(value.scopeId)
    out["nvmlReturn"] = rc
    member = _VALUE_FIELD.get(int(getattr(value, "valueType", 1)), "uiVal")
    out["value"] = again(getattr(value.value, member, None)) if rc == 0 else None
    return out


def _arg_repr(arg: Any, gpu: Optional[int]) -> str:
    if gpu is not None:
        return f"<gpu {gpu}>"
    if type(arg).__name__ == "CArgObject" and hasattr(arg, "_obj"):
        return f"byref({type(arg._obj).__name__}())"
    return repr(arg)


# --------------------------------------------------------------------------- the proxy


class RecordingNvml:
    """pynvml's surface, with every ``nvml*`` call recorded through ``sink`` and mutations refused."""

    def __init__(
        self, nv: Any, sink: Callable[[dict[str, Any]], None], on_init: Optional[Callable[[], None]] = None
    ) -> None:
        self._nv = nv
        self._sink = sink
        self._on_init = on_init
        self._handles: list[tuple[Any, int]] = []
        self._seq = 0
        self._wrapped: dict[str, Callable[..., Any]] = {}
        codes = {getattr(nv, n): n[len("NVML_ERROR_") :] for n in dir(nv) if n.startswith("NVML_ERROR_")}
        self._code_names: dict[Any, str] = codes

    def __getattr__(self, name: str) -> Any:
        if name == "_nvmlGetFunctionPointer":
            # The probe calls a few C functions itself (with nvml.h's structures): each symbol it
            # asks for passes the same guard, and its calls are recorded under the symbol's name.
            lookup = self._nv._nvmlGetFunctionPointer

            def guarded(symbol: str) -> Callable[..., Any]:
                if mutating(symbol):
                    raise MutatingCallRefused(f"{symbol}: refused, the validation kit never changes a GPU setting")
                return self._wrap(symbol, lookup(symbol))

            return guarded
        if name.startswith(RAW_ACCESS) or (name.startswith("nvml") and mutating(name)):
            raise MutatingCallRefused(f"{name}: refused, the validation kit never changes a GPU setting")
        value = getattr(self._nv, name)
        if name.startswith("nvml") and callable(value):
            if name not in self._wrapped:
                self._wrapped[name] = self._wrap(name, value)
            return self._wrapped[name]
        return value

    def __dir__(self) -> list[str]:
        return [n for n in dir(self._nv) if not mutating(n)]

    def gpu_of(self, obj: Any) -> Optional[int]:
        for handle, index in self._handles:
            if obj is handle:
                return index
        return None

    def _wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        error_class = getattr(self._nv, "NVMLError", ())

        def call(*args: Any, **kwargs: Any) -> Any:
            self._seq += 1
            seq = self._seq
            gpus = [self.gpu_of(a) for a in args]
            gpu = next((g for g in gpus if g is not None), None)
            self._sink(
                {
                    "type": "start",
                    "seq": seq,
                    "fn": name,
                    "gpu": gpu,
                    "args": [_arg_repr(a, g) for a, g in zip(args, gpus)] + [f"{k}={v!r}" for k, v in kwargs.items()],
                    "argv": [render(a, self.gpu_of) for a in args],
                }
            )
            rc: Any = 0
            error: Optional[str] = None
            value: Any = None
            t0 = time.perf_counter_ns()
            try:
                value = fn(*args, **kwargs)
            except error_class as exc:
                rc = getattr(exc, "value", type(exc).__name__)
                error = self._code_names.get(rc, str(exc))
                raise
            except BaseException as exc:
                rc, error = type(exc).__name__, str(exc)
                raise
            finally:
                us = (time.perf_counter_ns() - t0) // 1000
                if rc == 0 and name == "nvmlDeviceGetHandleByIndex" and args and isinstance(args[0], int):
                    self._handles.append((value, args[0]))
                outs = [render(a._obj) for a in args if type(a).__name__ == "CArgObject" and hasattr(a, "_obj")]
                self._sink(
                    {
                        "type": "return",
                        "seq": seq,
                        "fn": name,
                        "gpu": gpu,
                        "rc": rc,
                        "error": error,
                        "value": render(value, self.gpu_of) if rc == 0 else None,
                        "value_type": type(value).__name__ if rc == 0 else None,
                        "out": outs if rc == 0 else [],
                        "us": us,
                    }
                )
                if rc == 0 and name.startswith("nvmlInit") and self._on_init is not None:
                    self._on_init()
            return value

        call.__name__ = name
        call.__doc__ = getattr(fn, "__doc__", None)
        return call


# --------------------------------------------------------------------------- the recording child


def mapped_libraries(prefix: str = LIBRARY_PREFIX, maps: str = "/proc/self/maps") -> list[str]:
    """Paths of the files named ``prefix``* mapped into this process, in the order first seen."""
    found: list[str] = []
    try:
        with open(maps, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                parts = line.split(None, 5)
                if len(parts) == 6:
                    path = parts[5].strip()
                    if os.path.basename(path).startswith(prefix) and path not in found:
                        found.append(path)
    except OSError:
        pass
    return found


def _jsonable_frame(frame: Any) -> dict[str, Any]:
    kind, value = frame
    return {"type": str(kind), "value": render(value)}


def _recording_child(dir_fd: int, loader: Callable[[], Any]) -> str:
    """Runs in the forked child: record the probe's whole reading of the node (fresh files, never a link's
    target: the parent removed the earlier run's names)."""
    from nodehealth.probes import nvml as probe

    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_APPEND | os.O_CLOEXEC
    calls_fd = os.open(CALLS_FILE, flags, 0o644, dir_fd=dir_fd)
    obs_fd = os.open(OBSERVATIONS_FILE, flags, 0o644, dir_fd=dir_fd)

    def sink(record: dict[str, Any]) -> None:
        os.write(calls_fd, (json.dumps(record, sort_keys=True) + "\n").encode())

    def announce(frame: Any) -> None:  # the probe's own frames: the calls it announces, what it read
        os.write(obs_fd, (json.dumps(_jsonable_frame(frame), sort_keys=True) + "\n").encode())

    try:
        nv = loader()
    except probe.NvmlUnavailable as exc:
        sink({**_meta(None), "unavailable": [exc.kind, str(exc)]})
        announce(("unavailable", (exc.kind, str(exc))))
        return "unavailable"
    sink(_meta(nv))
    proxy = RecordingNvml(nv, sink, on_init=lambda: sink({"type": "library", "paths": mapped_libraries()}))
    probe.read_node(proxy, announce)  # type: ignore[arg-type]  # a module's surface, not a module
    return "complete"


@dataclass
class Recorded:
    """How the recording ended; ``calls`` as ``load`` reads them back."""

    outcome: str  # complete, timed_out, error
    message: str
    elapsed_s: float
    calls: list[Call] = field(default_factory=list)


def record(out_dir: Union[str, int], loader: Callable[[], Any], timeout_s: float = 60.0) -> Recorded:
    """Record the probe reading the node through ``loader``'s module, in a child, within ``timeout_s``.

    ``out_dir``: a directory of our own, by path (made, or refused as ``ground.Foreign``) or descriptor."""
    if isinstance(out_dir, int):
        return _record(out_dir, loader, timeout_s)
    fd = ground.ensure_own_dir(out_dir)
    try:
        return _record(fd, loader, timeout_s)
    finally:
        os.close(fd)


def _record(dir_fd: int, loader: Callable[[], Any], timeout_s: float) -> Recorded:
    from nodehealth.platform import child

    for name in (CALLS_FILE, OBSERVATIONS_FILE):  # an earlier run's, ours: the child makes them afresh
        ground.unlink_own(dir_fd, name)
    started = child.start(lambda: _recording_child(dir_fd, loader))
    (outcome,) = child.wait_all([started], timeout_s)
    if outcome.timed_out:
        state, message = "timed_out", f"the probe did not finish within {timeout_s:g} s"
    elif outcome.ok:
        state, message = "complete", str(outcome.value)
    else:
        state, message = "error", str(outcome.value)
    try:
        calls = read_at(dir_fd, CALLS_FILE).calls
    except FileNotFoundError:  # the child died before it made the file
        ground.create_new(dir_fd, CALLS_FILE, b"", 0o644)
        calls = []
    tail = [
        json.dumps(
            {
                "type": "never_returned",
                "seq": call.seq,
                "fn": call.fn,
                "gpu": call.gpu,
                "waited_s": round(outcome.elapsed_s, 3),
            },
            sort_keys=True,
        )
        + "\n"
        for call in calls
        if not call.returned
    ]
    tail.append(
        json.dumps(
            {"type": "end", "outcome": state, "message": message, "elapsed_s": round(outcome.elapsed_s, 3)},
            sort_keys=True,
        )
        + "\n"
    )
    ground.append_own(dir_fd, CALLS_FILE, "".join(tail).encode())
    return Recorded(state, message, outcome.elapsed_s, read_at(dir_fd, CALLS_FILE).calls)
