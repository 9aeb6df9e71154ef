"""The one runner of external programs: trusted, isolated, bounded, no survivors.

Every process nodehealth starts goes through ``run``:

* **trusted program**: ``argv[0]`` an absolute path; running as root it must pass
  ``config.trust.problem`` (root's own, in directories nobody else can write);
* **isolated**: no shell; ``cwd="/"``; stdin ``/dev/null``; a Python child must be started
  ``[python, "-I", ...]`` (no current or script directory on ``sys.path``, no user site, no
  ``PYTHON*`` variables); the environment is built from an allow-list: ``BASE_ENV`` plus only
  the names in ``allow`` taken from ``env`` (never the caller's or a job's ``LD_*``,
  ``PYTHON*``, ``PATH``, ``NCCL_*`` unless the caller names them itself); no descriptor but 0-2
  reaches it, except those in ``pass_fds`` that are open sockets above 2 (a launcher's PMI socket,
  ``fd_problem``); any other is not passed, and the result's ``notes`` say which and why;
* **bounded**: stdout and stderr are read as they come (one ``selectors`` loop) and each is
  cut at ``max_output`` bytes *while reading*: at the cap the reading stops and the group is
  killed, so a program printing without end costs the caller ``max_output`` plus one read;
* **no survivors**: the program leads a session (and process group) of its own, and that
  group is SIGKILLed on every way out: the deadline, the output cap, an exception (including
  one raised by ``check``), a terminating signal, and the program's normal exit too (a
  background child it left behind dies with it). The leader is reaped only after the group
  was killed, so its process-group id cannot be reused by an unrelated process before the
  kill. In the main thread, SIGTERM/SIGINT/SIGHUP whose disposition would end the process
  are caught for the run's length: the group is killed, then the signal is raised again with
  the caller's disposition. Elsewhere (a daemon thread) the caller's own signal handling
  ends the runs (``platform.reap.kill_children``).

What escapes: a descendant that leaves the group itself (``setsid``, ``setpgid``) is not in
the group any more; only a cgroup holds those (the daemon's unit kills its control group).
"""

from __future__ import annotations

import os
import re
import selectors
import signal
import stat
import subprocess
import threading
import time
from typing import Any, Callable, Mapping, Optional, Sequence

from nodehealth.observations.record import record

MAX_OUTPUT = 1 << 20
READ_CHUNK = 1 << 16
BASE_ENV: Mapping[str, str] = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C", "LC_ALL": "C", "HOME": "/"}
# Passed from ``env`` unless the caller says otherwise: the one variable scontrol needs from its caller.
ALLOW: tuple[str, ...] = ("SLURM_CONF",)
POLL_S = 0.5  # how often ``check`` runs while the program runs
DRAIN_S = 0.2  # after the program exited, how long its last output may take to arrive
REAP_S = 1.0  # after SIGKILL, how long we wait to reap the leader (one stuck in the kernel is left)
MAX_PASS_FD = 1023  # a launcher's socket is a low descriptor: a larger number is refused, never looked up
_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_PYTHON = re.compile(r"python[0-9.]*(-dbg)?$")


@record
class CommandResult:
    argv: tuple[str, ...]
    returncode: Optional[int]  # None: killed at the deadline
    stdout: str
    stderr: str
    timed_out: bool = False
    truncated: bool = False  # stdout or stderr reached ``max_output``: reading stopped, the group was killed
    notes: tuple[str, ...] = ()  # what was asked and not done (a descriptor of ``pass_fds`` not passed)


class CommandError(Exception):
    """The program could not be started (missing, not executable, not trusted, not isolated)."""


def is_python(path: str) -> bool:
    """Whether ``path`` (or what it resolves to) is a Python interpreter, by its name."""
    return bool(_PYTHON.match(os.path.basename(path)) or _PYTHON.match(os.path.basename(os.path.realpath(path))))


def python_argv(python: str, module: str, args: Sequence[str] = ()) -> list[str]:
    """``python -I -m module args``: the only way a Python child is started."""
    return [python, "-I", "-m", module, *args]


def environment(env: Optional[Mapping[str, str]], allow: Sequence[str]) -> dict[str, str]:
    """``BASE_ENV`` plus the variables of ``env`` named in ``allow`` (nothing else of ``env``)."""
    out = dict(BASE_ENV)
    for name in allow:
        if env is not None and name in env:
            out[name] = env[name]
    return out


def refuse(argv: Sequence[str]) -> str:
    """Why ``argv`` may not be started ("" when it may)."""
    if not argv or not os.path.isabs(argv[0]):
        return f"{argv[0] if argv else '(empty)'}: not an absolute path"
    from nodehealth.config import trust

    why = trust.problem(argv[0])
    if why:
        return (
            f"{argv[0]} not trusted: {why} (running as root, nodehealth runs only programs root owns "
            "and nobody else can write)"
        )
    if is_python(argv[0]):
        first = argv[1] if len(argv) > 1 else ""
        if not (first.startswith("-") and not first.startswith("--") and "I" in first[1:]):
            return f"{argv[0]}: a Python child runs isolated ({argv[0]} -I ...), not {' '.join(argv[:3])}"
    return ""


def fd_problem(fd: object) -> str:
    """Why ``fd`` may not stay open in a child ("" when it may): only an open socket above 2, at most
    ``MAX_PASS_FD`` (a launcher's PMI socket); never stdio, a file, a pipe or a closed number."""
    if isinstance(fd, bool) or not isinstance(fd, int) or not 2 < fd <= MAX_PASS_FD:
        return f"fd {fd!r} is not a descriptor number from 3 to {MAX_PASS_FD}"
    try:
        mode = os.fstat(fd).st_mode
    except OSError as exc:
        return f"fd {fd} is not open ({exc.strerror or exc})"
    if not stat.S_ISSOCK(mode):
        return f"fd {fd} is not a socket ({_kind(mode)})"
    return ""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISREG, "a regular file"), (stat.S_ISFIFO, "a pipe"), (stat.S_ISCHR, "a device")):
        if test(mode):
            return name
    return "a directory" if stat.S_ISDIR(mode) else "another kind of file"


def run(
    argv: Sequence[str],
    timeout_s: float,
    env: Optional[Mapping[str, str]] = None,
    max_output: int = MAX_OUTPUT,
    allow: Sequence[str] = ALLOW,
    check: Optional[Callable[[], None]] = None,
    pass_fds: Sequence[int] = (),
) -> CommandResult:
    """Run ``argv`` (see the module's rules); kill its whole process group on every way out.

    ``env``: where the variables named in ``allow`` come from (any other name in it is dropped).
    ``check``: called about every ``POLL_S`` while the program runs; an exception it raises ends
    the run (the group is killed) and propagates. ``pass_fds``: descriptors kept open in the child,
    each only if ``fd_problem`` has nothing against it (the others are named in the result's notes).
    """
    why = refuse(argv)
    if why:
        raise CommandError(why)
    keep: list[int] = []
    notes: list[str] = []
    for fd in pass_fds:
        problem = fd_problem(fd)
        if problem:
            notes.append(f"not passed to {os.path.basename(argv[0])}: {problem}")
        elif fd not in keep:
            keep.append(fd)
    caught: list[int] = []
    wake_r, wake_w = os.pipe()
    old = _catch_signals(caught, wake_w)
    proc: Optional[subprocess.Popen[bytes]] = None
    try:
        try:
            proc = subprocess.Popen(  # noqa: S603 - argv list, absolute trusted path, no shell
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd="/",
                env=environment(env, allow),
                start_new_session=True,
                close_fds=True,
                pass_fds=tuple(keep),
            )
        except OSError as exc:
            raise CommandError(f"{argv[0]}: {exc.strerror or exc}") from None
        out, err, timed_out, truncated = _read(proc, timeout_s, max_output, check, wake_r, caught)
    finally:
        code = _end(proc)
        _restore_signals(old)
        os.close(wake_r)
        os.close(wake_w)
        if caught:
            signal.raise_signal(caught[0])  # the caller's disposition: usually the end of this process
    if caught:  # the caller's handler returned: the run was cut short all the same
        raise CommandError(f"{argv[0]}: interrupted by signal {caught[0]}")
    return CommandResult(
        tuple(argv),
        None if timed_out else code,
        out.decode("utf-8", "replace"),
        err.decode("utf-8", "replace"),
        timed_out=timed_out,
        truncated=truncated,
        notes=tuple(notes),
    )


def _read(
    proc: subprocess.Popen[bytes],
    timeout_s: float,
    cap: int,
    check: Optional[Callable[[], None]],
    wake_r: int,
    caught: list[int],
) -> tuple[bytes, bytes, bool, bool]:
    """Read both pipes until the program is done (exited and its output drained), the deadline,
    the cap or a signal; returns (stdout, stderr, timed out, truncated)."""
    assert proc.stdout is not None and proc.stderr is not None
    bufs = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    deadline = time.monotonic() + max(0.0, timeout_s)
    next_check = time.monotonic() + POLL_S
    exited_at: Optional[float] = None
    timed_out = truncated = False
    with selectors.DefaultSelector() as sel:
        for fd in bufs:
            sel.register(fd, selectors.EVENT_READ)
        sel.register(wake_r, selectors.EVENT_READ)
        while not caught:
            now = time.monotonic()
            if check is not None and now >= next_check:
                check()
                next_check = now + POLL_S
            if exited_at is None and _exited(proc.pid):
                exited_at = now
            open_fds = [fd for fd in bufs if _registered(sel, fd)]
            if exited_at is not None and (not open_fds or now >= exited_at + DRAIN_S):
                break  # done; a background child still holding a pipe dies with the group
            if now >= deadline:
                timed_out = True
                break
            # Wake for the deadline, the next check and, while the leader runs, to see it exit
            # (a background child may hold the pipes open after it).
            wait = min(
                deadline - now,
                next_check - now if check is not None else POLL_S,
                0.02 if exited_at is not None or not open_fds else 0.1,
            )
            for key, _ in sel.select(max(0.0, wait)):
                fd = key.fd
                if fd == wake_r:
                    continue  # a signal: ``caught`` says which
                buf = bufs[fd]
                chunk = os.read(fd, min(READ_CHUNK, cap - len(buf) + 1))
                if not chunk:
                    sel.unregister(fd)
                    continue
                buf += chunk
                if len(buf) > cap:
                    del buf[cap:]
                    truncated = True
            if truncated:
                break
    return bytes(bufs[proc.stdout.fileno()]), bytes(bufs[proc.stderr.fileno()]), timed_out, truncated


def _registered(sel: selectors.BaseSelector, fd: int) -> bool:
    try:
        sel.get_key(fd)
    except KeyError:
        return False
    return True


def _exited(pid: int) -> bool:
    """Whether the leader has exited, without reaping it (its pid, the group's id, stays ours)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _end(proc: Optional[subprocess.Popen[bytes]]) -> Optional[int]:
    """Kill the group (whatever happened), then reap the leader; its exit status, None if not reaped."""
    if proc is None:
        return None
    kill_group(proc.pid)
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()
    try:
        return proc.wait(timeout=REAP_S)
    except subprocess.TimeoutExpired:  # stuck in the kernel (a wedged GPU): left to subprocess's own reaping
        return None


def kill_group(pgid: int) -> None:
    """SIGKILL the process group ``pgid`` (never our own)."""
    if pgid <= 1 or pgid == os.getpgrp():
        return
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass


def _catch_signals(caught: list[int], wake_w: int) -> dict[int, Any]:
    """In the main thread, catch the signals that would end this process while a run is on."""
    if threading.current_thread() is not threading.main_thread():
        return {}

    def on_signal(signum: int, frame: Any) -> None:
        caught.append(signum)
        try:
            os.write(wake_w, b"s")
        except OSError:
            pass

    old: dict[int, Any] = {}
    for sig in _SIGNALS:
        current = signal.getsignal(sig)
        if current in (signal.SIG_DFL, signal.default_int_handler):
            old[sig] = signal.signal(sig, on_signal)
    return old


def _restore_signals(old: Mapping[int, Any]) -> None:
    for sig, handler in old.items():
        signal.signal(sig, handler)
