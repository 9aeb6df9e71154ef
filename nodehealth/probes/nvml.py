"""The NVML probe, parent side: the reader's child started, watched under its deadlines, assembled.

A wedged GPU makes NVML calls block in the kernel, possibly forever, and such a process may
not even die on SIGKILL. So the reading (``nvml_read``) happens in a child started by
``platform.child.stream``, which streams what it read over a pipe, one frame per call and per
GPU; this module waits until its deadline, then kills the child and walks away without waiting
for it. What arrived before the deadline is kept, and the last call announced names where NVML
stopped answering.

A wedged GPU costs one stuck child, not one per round: before it forks, ``start`` reaps every
abandoned child that has exited since, and while the last abandoned reader is still there
(blocked in the driver, it survives SIGKILL) it forks no new one and reports the stall instead
(a ``timeout``, as a hang is).

The module the child reads through is what the caller's ``loader`` returns: pynvml (package
nvidia-ml-py), unmodified, bound to the real driver (``nvml_lib.load_module``) or to another
``libnvidia-ml.so.1`` (``probes.source``: the simulator's, injected). The probe cannot tell them
apart and does not try: a simulated run goes through the vendor's Python code and this probe
exactly as production does.

Slow is not hung: every call has its own deadline (a call past it is hung: the GPU is
wedged); the whole read has a budget (when it ends with calls still answering, the driver
is slow, and what was not read is named as not read).

The modules of the probe: ``nvml_h`` (nvml.h's constants and structures by value), ``nvml_lib``
(the pynvml module: loading, the wheel floor, error translation, direct calls), ``nvml_read``
(the child side), this one (the parent side). The names other modules use are re-exported here.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, Optional, Union

from nodehealth.observations import GpuObservation, NvmlSnapshot, ProbeError
from nodehealth.observations.record import record
from nodehealth.platform import child
from nodehealth.probes.nvml_h import (
    ARGUMENT_VERSION_MISMATCH,
    GPU_IS_LOST,
    NVML_CLASSES,
    NVML_FUNCTIONS,
    RETURN_CODES,
)
from nodehealth.probes.nvml_lib import (
    PYNVML_FLOOR,
    NvmlUnavailable,
    error_kind,
    import_ahead,
    load_module,
    wheel_too_old,
    wheel_version,
)
from nodehealth.probes.nvml_read import read_node

__all__ = [
    "ARGUMENT_VERSION_MISMATCH",
    "GPU_IS_LOST",
    "NVML_CLASSES",
    "NVML_FUNCTIONS",
    "PYNVML_FLOOR",
    "RETURN_CODES",
    "NvmlUnavailable",
    "PendingProbe",
    "StalledProbe",
    "error_kind",
    "load_module",
    "read_node",
    "start",
    "stuck_reader",
    "wheel_too_old",
    "wheel_version",
]

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


@dataclass
class PendingProbe:
    """A forked NVML reader; ``collect`` waits for it, never past its deadlines.

    Two deadlines: each call has its own (``call_timeout_s``; ``slow_call_timeout_s`` for
    nvmlInit and opening a GPU, which initialises it when persistence mode is off, counted
    from the call's last visible progress): a call past it is *hung*. The whole read has
    ``timeout_s``: when that ends first, the driver is *slow* (whatever share of the budget
    one call took), and what was not read is named, not called hung.
    """

    child: child.Child
    timeout_s: float
    call_timeout_s: float = 3.0
    slow_call_timeout_s: float = 30.0

    @property
    def pid(self) -> int:
        return self.child.pid

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
        reader = self.child
        started = reader.started
        deadline = started + self.timeout_s
        frames: list[Any] = []
        stop: Optional[str] = None
        current: Optional[str] = None
        announced = started  # when the call in flight was announced
        since = started  # ... or, for a slow call, when it last showed progress
        seen: Optional[tuple[int, ...]] = None
        try:
            while not reader.eof:
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
                new = reader.receive(min(wait, PROGRESS_POLL_S) if slow else wait)
                if not new:
                    if slow and not reader.eof:
                        mark = reader.progress()
                        if seen is not None and mark is not None and mark != seen:
                            since = clock()  # slow, and getting somewhere: not hung
                        seen = mark
                    continue  # the loop head tells which deadline passed
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
            elapsed = clock() - started
            eof = reader.eof
            if not eof:
                _abandon(reader)
            else:
                reader.end(clock)
        ended = any(frame[0] == "end" for frame in frames)
        return _assemble(
            frames,
            complete=eof or ended,
            elapsed=elapsed,
            timeout_s=self.timeout_s,
            stop=None if ended else stop,
            call_limit=self._call_limit(current),
            in_flight_s=clock() - announced,
        )


@record
class StalledProbe:
    """No reader forked: the previous one is still stuck. ``collect`` gives the stall at once."""

    error: ProbeError
    pid: int

    def collect(self, clock: Callable[[], float] = time.monotonic) -> ProbeError:
        return self.error


def _abandon(reader: child.Child) -> None:
    global _abandoned, _abandoned_at
    reader.end()  # not at its end of file: killed and abandoned
    with _abandoned_lock:
        _abandoned, _abandoned_at = (reader.pid, reader.started_wall), time.monotonic()


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


def start(
    loader: Callable[[], ModuleType],
    timeout_s: float,
    clock: Callable[[], float] = time.monotonic,
    call_timeout_s: float = 3.0,
    slow_call_timeout_s: float = 30.0,
    keep_module: bool = False,
) -> Union[PendingProbe, StalledProbe]:
    """Fork the reader. Call it before starting other threads (fork copies only this one).

    ``loader`` runs in the child and returns the NVML module: pynvml is imported (and
    libnvidia-ml loaded) there, never in the caller. While the reader abandoned at an earlier
    deadline is still stuck, nothing is forked: the answer is that stall (``StalledProbe``).
    ``keep_module`` (the daemon, which forks a reader every round): import pynvml here once, so that
    the readers inherit it (``nvml_lib.import_ahead``: no library is loaded, no NVML call made here).
    """
    stuck = stuck_reader()
    if stuck is not None:
        pid, since = stuck
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(since))
        return StalledProbe(
            ProbeError(
                "nvml",
                "timeout",
                f"NVML still not answering since {when} (child pid {pid} stuck in the driver "
                "after SIGKILL; no new reader until it exits)",
            ),
            pid,
        )
    if keep_module:
        import_ahead()
    reader = child.stream(lambda send: _read(loader, send), clock)
    if reader.failure is not None:
        return StalledProbe(ProbeError("nvml", "error", f"cannot start the NVML reader: {reader.failure}"), 0)
    return PendingProbe(
        child=reader, timeout_s=timeout_s, call_timeout_s=call_timeout_s, slow_call_timeout_s=slow_call_timeout_s
    )


def _read(loader: Callable[[], ModuleType], send: Callable[[Any], None]) -> None:
    """The child's body: load the module, refuse a wheel below the floor, read the node."""
    try:
        nv = loader()
    except NvmlUnavailable as exc:
        send(("unavailable", (exc.kind, str(exc))))
        return
    old = wheel_too_old(nv)
    if old is not None:
        send(("unavailable", ("old_library", old)))
        return
    read_node(nv, send)


def _assemble(
    frames: list[Any],
    complete: bool,
    elapsed: float,
    timeout_s: float,
    stop: Optional[str] = None,
    call_limit: Optional[float] = None,
    in_flight_s: float = 0.0,
) -> Union[NvmlSnapshot, ProbeError]:
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
        elif kind == child.CRASH:
            return ProbeError("nvml", "error", f"NVML probe crashed: {value}")
        elif kind == child.UNREADABLE:
            return ProbeError("nvml", "error", f"unreadable frame from the NVML probe: {value}")
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
        stop=None if ended else (stop or "budget"),
        call_timeout_s=call_limit,
        in_flight_s=None if ended else round(in_flight_s, 3),
    )
