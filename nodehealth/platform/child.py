"""Blocking file-system calls in a forked child, under a deadline the caller never overstays.

``statvfs``, ``open``, ``write`` and ``fsync`` on a hung NFS or Lustre mount block in the
kernel, possibly forever, and a process blocked there may not even die on SIGKILL. So such a
call runs in a forked child that sends one pickled answer back over a pipe; the parent waits
until the deadline, then kills the child and walks away without waiting for it. A killed
child that could not be reaped is remembered (``orphaned``) and reaped by ``reap_orphans``,
which every forking probe calls before it forks (so every round of the daemon reaps).

The function run in the child must only make system calls and run plain Python (no threads,
no imports, no locks another thread of the parent may hold: fork copies only the calling
thread). The child leaves with ``os._exit`` so no parent cleanup runs twice.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, NoReturn, Optional, Sequence

from nodehealth.platform.reap import end_tree as reap_tree

_ORPHANS: set[int] = set()
_ORPHANS_LOCK = threading.Lock()
# Held from pipe() until the parent closed its write end, so a child forked by another thread
# never inherits that write end (which would delay the first child's end-of-file).
_FORK_LOCK = threading.Lock()


@dataclass(frozen=True)
class Outcome:
    """What one child answered.

    ``ok``: the function returned, and ``value`` is what it returned. Otherwise ``value`` is
    an error message: the exception the function raised (``OSError`` as its strerror), or
    why no answer came; ``timed_out`` is True when the deadline passed first.
    """

    ok: bool
    value: Any
    timed_out: bool
    elapsed_s: float


@dataclass
class Child:
    """A started child; ``pid`` 0 and ``failure`` set when it could not be forked."""

    pid: int
    fd: int
    started: float
    failure: Optional[str] = None


def describe(exc: BaseException) -> str:
    """An exception as a one-line message: ``OSError`` by its strerror (and errno name)."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return f"{type(exc).__name__}: {exc}"


def start(fn: Callable[[], Any], clock: Callable[[], float] = time.monotonic) -> Child:
    """Fork a child that runs ``fn`` and sends back its result (or its exception)."""
    reap_orphans()
    with _FORK_LOCK:
        started = clock()
        try:
            rfd, wfd = os.pipe()
        except OSError as exc:
            return Child(0, -1, started, f"cannot create a pipe: {describe(exc)}")
        try:
            pid = os.fork()
        except OSError as exc:
            os.close(rfd)
            os.close(wfd)
            return Child(0, -1, started, f"cannot fork: {describe(exc)}")
        if pid != 0:
            os.close(wfd)
            return Child(pid, rfd, started)
    _child(fn, rfd, wfd)


def _child(fn: Callable[[], Any], rfd: int, wfd: int) -> NoReturn:
    """The child's whole life: answer once over ``wfd`` and leave."""
    try:
        os.close(rfd)
        os.setpgid(0, 0)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        try:
            answer: tuple[str, Any] = ("ok", fn())
        except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent
            answer = ("error", describe(exc))
        data = pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
        view = memoryview(data)
        while view:
            view = view[os.write(wfd, view):]
    finally:
        os._exit(0)


def wait_all(children: Sequence[Child], timeout_s: float,
             clock: Callable[[], float] = time.monotonic) -> list[Outcome]:
    """Wait for every child until its own start plus ``timeout_s``, never longer.

    Children still running at their deadline are killed and abandoned.
    """
    outcomes: dict[int, Outcome] = {}
    buffers: dict[int, bytearray] = {}
    for i, child in enumerate(children):
        if child.failure is not None:
            outcomes[i] = Outcome(False, child.failure, False, 0.0)
        else:
            buffers[i] = bytearray()
    try:
        while buffers:
            now = clock()
            for i in [i for i in buffers if children[i].started + timeout_s <= now]:
                del buffers[i]
                abandon(children[i].pid)
                outcomes[i] = Outcome(False, f"did not answer within {timeout_s:g} s", True,
                                      now - children[i].started)
            if not buffers:
                break
            left = min(children[i].started + timeout_s for i in buffers) - now
            by_fd = {children[i].fd: i for i in buffers}
            ready, _, _ = select.select(list(by_fd), [], [], max(0.0, left))
            for fd in ready:
                i = by_fd[fd]
                chunk = os.read(fd, 65536)
                if chunk:
                    buffers[i] += chunk
                    continue
                data = bytes(buffers.pop(i))
                reap(children[i].pid, clock)
                outcomes[i] = _decode(data, clock() - children[i].started)
    finally:
        for child in children:
            if child.fd >= 0:
                os.close(child.fd)
                child.fd = -1
    return [outcomes[i] for i in range(len(children))]


def _decode(data: bytes, elapsed: float) -> Outcome:
    if not data:
        return Outcome(False, "the child exited without an answer", False, elapsed)
    try:
        kind, value = pickle.loads(data)  # noqa: S301 - our own child, over our own pipe
    except Exception as exc:  # noqa: BLE001 - a torn answer is an error, not a crash
        return Outcome(False, f"unreadable answer from the child: {describe(exc)}", False, elapsed)
    return Outcome(kind == "ok", value, False, elapsed)


def abandon(pid: int) -> None:
    """Kill a child stuck in the kernel and do not wait: it may not die until the I/O returns.

    A program the child runs (``platform.proc.run``: a process group of its own) dies with it
    (``platform.reap.end_tree``), background and double-forked descendants included."""
    reap_tree(pid)
    if not _try_reap(pid):
        with _ORPHANS_LOCK:
            _ORPHANS.add(pid)


def reap(pid: int, clock: Callable[[], float]) -> None:
    """Reap a child that closed its pipe: it is exiting; give it a moment to become a zombie."""
    until = clock() + 0.05
    while not _try_reap(pid):
        if clock() >= until:
            with _ORPHANS_LOCK:
                _ORPHANS.add(pid)
            return
        time.sleep(0.001)


def _try_reap(pid: int) -> bool:
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True  # already reaped (or never ours)
    return done != 0


def reap_orphans() -> int:
    """Reap every abandoned child that has exited since; returns how many are still not reaped."""
    with _ORPHANS_LOCK:
        for pid in [p for p in _ORPHANS if _try_reap(p)]:
            _ORPHANS.discard(pid)
        return len(_ORPHANS)


def orphaned(pid: int, grace_s: float = 0.0, clock: Callable[[], float] = time.monotonic) -> bool:
    """True while ``pid`` is an abandoned child that has not exited (reaping it if it has).

    A killed child that can die does so within milliseconds of SIGKILL; ``grace_s`` gives it
    that long. One still there after it is stuck in the kernel (a wedged GPU, a hung mount).
    """
    until = clock() + grace_s
    while True:
        with _ORPHANS_LOCK:
            if pid not in _ORPHANS:
                return False
            if _try_reap(pid):
                _ORPHANS.discard(pid)
                return False
        if clock() >= until:
            return True
        time.sleep(0.002)
