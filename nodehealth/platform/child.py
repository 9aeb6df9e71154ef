"""The one way to run a call that may block in the kernel: a forked child, abandoned at the deadline.

``statvfs``, ``open``, ``write`` and ``fsync`` on a hung NFS or Lustre mount, or an NVML call on a
wedged GPU, block in the kernel, possibly forever, and a process blocked there may not even die
on SIGKILL. So such a call runs in a forked child that streams pickled frames back over a pipe
(each one a 4-byte length and its pickle); the parent reads them until its deadline, then kills
the child and walks away without waiting for it. What arrived before the deadline is kept.

Two ways to start one, over the same fork, lock and frames:

- ``start(fn)``: one answer, the value ``fn`` returns (or the exception it raised); ``wait_all``
  waits for many such children, each under the same timeout from its own start (``ChildEnd``).
- ``stream(body)``: ``body(send)`` sends as many frames as it likes (the NVML reader: one per
  call and per GPU); the caller reads them with ``Child.receive`` under deadlines of its own (a
  per-call deadline, a budget), so a deadline names the last frame that arrived. A body that
  raises sends a last ``(CRASH, "Type: message")`` frame.

One fork lock (``_FORK_LOCK``) covers every child: held from ``pipe()`` until the parent closed
its write end, so a child forked by another thread never inherits that write end (which would
delay the first child's end of file).

A killed child that could not be reaped is remembered (``orphaned``) and reaped by
``reap_orphans``, which every start calls before it forks (so every round of the daemon reaps).

A child ends when its parent is gone. Forked from the main thread (every face, ``check``,
preflight), it asks the kernel for a signal when its parent dies (``PR_SET_PDEATHSIG``): SIGKILL
with ``parent_gone="kill"`` (the default); SIGTERM with ``"raise"``, which raises ``ParentGone``
in the child so its cleanup runs (a child that owns a process group of its own ends that group
first). The kernel sends that signal when the *thread* that forked ends, so a child forked by
another thread (the daemon's rounds) does not ask for it: systemd ends the daemon's children with
its cgroup. Any child whose parent is gone fails its next write to the pipe and leaves.

The function run in the child must only make system calls and run plain Python (no threads,
no imports, no locks another thread of the parent may hold: fork copies only the calling
thread). The child leaves with ``os._exit`` so no parent cleanup runs twice. What it inherits is
moved out of the garbage collector's reach first (``gc.freeze``): a collection in the child
would otherwise walk the parent's whole heap and copy every page it touches (copy-on-write);
the child's own objects are collected as usual.
"""

from __future__ import annotations

import ctypes
import gc
import os
import pickle
import select
import signal
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, NoReturn, Optional, Sequence

from nodehealth.observations.record import record
from nodehealth.platform.reap import end_tree as reap_tree

_ORPHANS: set[int] = set()
_ORPHANS_LOCK = threading.Lock()
# Held from pipe() until the parent closed its write end, so a child forked by another thread
# never inherits that write end (which would delay the first child's end-of-file).
_FORK_LOCK = threading.Lock()

FRAME = struct.Struct("!I")  # each frame: its length, then its pickle
CRASH = "crash"  # (CRASH, "Type: message"): the last frame of a streaming body that raised
UNREADABLE = "unreadable"  # (UNREADABLE, why): what the parent makes of bytes that are no frame
_PR_SET_PDEATHSIG = 1  # prctl(2)


class ParentGone(BaseException):
    """Raised in a ``parent_gone="raise"`` child when its parent is gone (not an ``Exception``: a
    body's ``except Exception`` does not swallow it, its ``finally`` runs)."""


@record
class ChildEnd:
    """How one single-answer child ended.

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
    """A started child; ``pid`` 0 and ``failure`` set when it could not be forked.

    ``started`` is on the caller's clock (monotonic), ``started_wall`` on the wall clock.
    ``eof`` becomes True once the child closed its end of the pipe (it is exiting).
    """

    pid: int
    fd: int
    started: float
    failure: Optional[str] = None
    started_wall: float = 0.0
    eof: bool = False
    _buf: bytearray = field(default_factory=bytearray, repr=False)

    def receive(self, wait_s: float) -> list[Any]:
        """The frames that arrive within ``wait_s`` (one read of the pipe at most); ``[]`` when
        none did. At the end of file ``eof`` is set, and bytes that make no whole frame come back
        as one ``(UNREADABLE, why)`` frame."""
        if self.eof or self.fd < 0:
            return []
        ready, _, _ = select.select([self.fd], [], [], max(0.0, wait_s))
        if not ready:
            return []
        return self._read()

    def _read(self) -> list[Any]:
        chunk = os.read(self.fd, 65536)
        if not chunk:
            self.eof = True
        self._buf += chunk
        frames = _take_frames(self._buf)
        if self.eof and self._buf:
            frames.append((UNREADABLE, f"a torn frame ({len(self._buf)} bytes) at the end"))
            self._buf.clear()
        return frames

    def progress(self) -> Optional[tuple[int, ...]]:
        """What changes while the child gets work done in the kernel and not while it is blocked
        there: its minor and major page faults (/proc/<pid>/stat fields 10 and 12) and its open
        files. None when it cannot be read."""
        try:
            with open(f"/proc/{self.pid}/stat", "rb") as f:
                stat = f.read().rsplit(b")", 1)[1].split()
            return int(stat[7]), int(stat[9]), len(os.listdir(f"/proc/{self.pid}/fd"))
        except (OSError, IndexError, ValueError):
            return None

    def end(self, clock: Callable[[], float] = time.monotonic) -> None:
        """Done with the child: reap it when it closed its pipe, else kill and abandon it."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self.pid:
            if self.eof:
                reap(self.pid, clock)
            else:
                abandon(self.pid)


def describe(exc: BaseException) -> str:
    """An exception as a one-line message: ``OSError`` by its strerror (and errno name)."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return f"{type(exc).__name__}: {exc}"


def start(fn: Callable[[], Any], clock: Callable[[], float] = time.monotonic, parent_gone: str = "kill") -> Child:
    """Fork a child that runs ``fn`` and sends back its result (or its exception): one frame,
    ``("ok", value)`` or ``("error", message)``; ``wait_all`` reads it."""

    def answer(send: Callable[[Any], None]) -> None:
        try:
            reply: tuple[str, Any] = ("ok", fn())
        except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent
            reply = ("error", describe(exc))
        send(reply)

    return stream(answer, clock, parent_gone)


def stream(
    body: Callable[[Callable[[Any], None]], None],
    clock: Callable[[], float] = time.monotonic,
    parent_gone: str = "kill",
) -> Child:
    """Fork a child that runs ``body(send)``; every ``send(frame)`` reaches the parent as one frame
    (``Child.receive``). ``parent_gone``: "kill" or "raise" (the module's docstring)."""
    if parent_gone not in ("kill", "raise"):
        raise ValueError(f"parent_gone must be 'kill' or 'raise', not {parent_gone!r}")
    reap_orphans()
    # Looked up here: the child imports and loads nothing. Only from the main thread (see above).
    prctl = _prctl() if threading.current_thread() is threading.main_thread() else None
    parent = os.getpid()
    with _FORK_LOCK:
        started, started_wall = clock(), time.time()
        try:
            rfd, wfd = os.pipe()
        except OSError as exc:
            return Child(0, -1, started, f"cannot create a pipe: {describe(exc)}", started_wall)
        try:
            pid = os.fork()
        except OSError as exc:
            os.close(rfd)
            os.close(wfd)
            return Child(0, -1, started, f"cannot fork: {describe(exc)}", started_wall)
        if pid != 0:
            os.close(wfd)
            return Child(pid, rfd, started, None, started_wall)
    _child(body, rfd, wfd, parent, prctl, parent_gone)


def _child(
    body: Callable[[Callable[[Any], None]], None],
    rfd: int,
    wfd: int,
    parent: int,
    prctl: Optional[Callable[..., int]],
    parent_gone: str,
) -> NoReturn:
    """The child's whole life: run ``body``, its frames over ``wfd``, and leave."""
    code = 0
    try:
        gc.freeze()  # the parent's objects: never walked here (see the module's docstring)
        os.close(rfd)
        os.setpgid(0, 0)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if parent_gone == "raise":
            signal.signal(signal.SIGTERM, _raise_parent_gone)
        else:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, signal.SIGKILL if parent_gone == "kill" else signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # gone before the signal was asked for
            os._exit(0)

        def send(frame: Any) -> None:
            _send(wfd, frame)

        try:
            body(send)
        except BaseException as exc:  # noqa: BLE001 - report anything, then exit
            try:
                send((CRASH, f"{type(exc).__name__}: {exc}"))
            except BaseException:  # noqa: BLE001 - the parent is gone: nobody to tell
                code = 3
    finally:
        os._exit(code)


def _raise_parent_gone(signum: int, frame: Any) -> None:
    raise ParentGone(f"the parent is gone (signal {signum})")


_PRCTL: list[Optional[Callable[..., int]]] = []


def _prctl() -> Optional[Callable[..., int]]:
    """libc's prctl, resolved once in the parent (None where there is none: not Linux)."""
    if not _PRCTL:
        try:
            _PRCTL.append(ctypes.CDLL(None, use_errno=True).prctl)
        except (OSError, AttributeError):
            _PRCTL.append(None)
    return _PRCTL[0]


def _send(fd: int, frame: Any) -> None:
    data = pickle.dumps(frame, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(FRAME.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


def _take_frames(buf: bytearray) -> list[Any]:
    """Every whole frame at the head of ``buf`` (removed from it); an unpicklable one is an
    ``(UNREADABLE, why)`` frame."""
    out: list[Any] = []
    pos, end = 0, len(buf)
    while end - pos >= FRAME.size:
        (size,) = FRAME.unpack_from(buf, pos)
        start = pos + FRAME.size
        if end - start < size:
            break
        pos = start + size
        try:
            out.append(pickle.loads(buf[start:pos]))  # noqa: S301 - our own child, over our own pipe
        except Exception as exc:  # noqa: BLE001 - a torn answer is an error, not a crash
            out.append((UNREADABLE, describe(exc)))
    del buf[:pos]  # once: a read holds a hundred frames, and each cut moved the rest
    return out


def wait_all(
    children: Sequence[Child], timeout_s: float, clock: Callable[[], float] = time.monotonic
) -> list[ChildEnd]:
    """Wait for every single-answer child until its own start plus ``timeout_s``, never longer.

    Children still running at their deadline are killed and abandoned.
    """
    ends: dict[int, ChildEnd] = {}
    frames: dict[int, list[Any]] = {}
    for i, child in enumerate(children):
        if child.failure is not None:
            ends[i] = ChildEnd(False, child.failure, False, 0.0)
        else:
            frames[i] = []
    try:
        while frames:
            now = clock()
            for i in [i for i in frames if children[i].started + timeout_s <= now]:
                del frames[i]
                children[i].end(clock)
                ends[i] = ChildEnd(False, f"did not answer within {timeout_s:g} s", True, now - children[i].started)
            if not frames:
                break
            left = min(children[i].started + timeout_s for i in frames) - now
            by_fd = {children[i].fd: i for i in frames}
            ready, _, _ = select.select(list(by_fd), [], [], max(0.0, left))
            for fd in ready:
                i = by_fd[fd]
                frames[i] += children[i]._read()
                if children[i].eof:
                    got = frames.pop(i)
                    children[i].end(clock)
                    ends[i] = _answer(got, clock() - children[i].started)
    finally:
        for child in children:
            if child.fd >= 0:
                os.close(child.fd)
                child.fd = -1
    return [ends[i] for i in range(len(children))]


def _answer(frames: list[Any], elapsed: float) -> ChildEnd:
    if not frames:
        return ChildEnd(False, "the child exited without an answer", False, elapsed)
    kind, value = frames[0]
    if kind == UNREADABLE:
        return ChildEnd(False, f"unreadable answer from the child: {value}", False, elapsed)
    if kind == CRASH:
        return ChildEnd(False, value, False, elapsed)
    return ChildEnd(kind == "ok", value, False, elapsed)


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
