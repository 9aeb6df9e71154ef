"""Read-only evidence from the host for the validation kit: a program's output, the kernel log.

``run_readonly`` runs a query program (``nvidia-smi -q``, ``dmesg``) by absolute path and argv
list, under a timeout, with its output bounded; ``kernel_lines`` reads ``/dev/kmsg`` to its
end without ever waiting for new records, falling back to ``dmesg``. Neither changes anything:
``dmesg`` is never given ``-c``/``-C`` (which clear the ring buffer).
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from dataclasses import dataclass
from typing import Callable, Optional

MAX_OUTPUT_BYTES = 8 << 20
_READ_SIZE = 64 * 1024  # a /dev/kmsg read shorter than the record fails with EINVAL
_CLEARING_FLAGS = ("-c", "-C", "--clear", "--read-clear", "--console-off", "-D", "-E", "-n", "--console-level")


@dataclass(frozen=True)
class ProgramOutput:
    """What one program run gave: ``rc`` None when it did not run to its end (``error`` says why)."""

    argv: tuple[str, ...]
    rc: Optional[int]
    stdout: str
    stderr: str
    error: Optional[str] = None
    truncated: bool = False


def find_program(name: str, path: Optional[str] = None) -> Optional[str]:
    """The absolute path of ``name`` on ``path`` (default: $PATH plus the sbin directories)."""
    search = path if path is not None else os.pathsep.join(
        [os.environ.get("PATH", ""), "/usr/bin", "/usr/sbin", "/bin", "/sbin"])
    found = shutil.which(name, path=search)
    return os.path.abspath(found) if found else None


def run_readonly(argv: list[str], timeout_s: float, max_bytes: int = MAX_OUTPUT_BYTES) -> ProgramOutput:
    """Run a query program (``argv[0]`` an absolute path) and return its output, within ``timeout_s``."""
    if not argv or not os.path.isabs(argv[0]):
        raise ValueError(f"run a program by its absolute path, not {argv[:1]!r}")
    if os.path.basename(argv[0]) == "dmesg" and any(a in _CLEARING_FLAGS for a in argv[1:]):
        raise ValueError(f"refused: {' '.join(argv)} would change the kernel log")
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout_s,
                              check=False, shell=False)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout if isinstance(exc.stdout, bytes) else b""
        return ProgramOutput(tuple(argv), None, _text(out, max_bytes), "", f"did not finish within {timeout_s:g} s",
                             len(out) > max_bytes)
    except OSError as exc:
        return ProgramOutput(tuple(argv), None, "", "", f"cannot run: {exc.strerror or exc}")
    return ProgramOutput(tuple(argv), done.returncode, _text(done.stdout, max_bytes), _text(done.stderr, max_bytes),
                         None, len(done.stdout) > max_bytes)


def _text(data: bytes, max_bytes: int) -> str:
    return data[:max_bytes].decode("utf-8", errors="replace")


@dataclass(frozen=True)
class KernelLog:
    """The kernel log lines ``keep`` accepted, where they came from, and why a source failed."""

    source: Optional[str]  # "/dev/kmsg", "dmesg", or None when neither could be read
    lines: tuple[str, ...]
    notes: tuple[str, ...]
    truncated: bool = False


def _kmsg_records(path: str, max_bytes: int) -> tuple[list[str], bool]:
    """Every record of ``path`` (a /dev/kmsg-like device or file) to its current end, as text."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    records: list[str] = []
    total = 0
    try:
        while True:
            try:
                chunk = os.read(fd, _READ_SIZE)
            except BlockingIOError:
                break  # the end of the buffer: never wait for new records
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    continue  # records overwritten while reading: go on with the next one
                raise
            if not chunk:
                break
            total += len(chunk)
            records += chunk.decode("utf-8", errors="replace").splitlines()
            if total > max_bytes:
                return records, True
    finally:
        os.close(fd)
    return records, False


def kernel_lines(keep: Callable[[str], bool], kmsg_path: str = "/dev/kmsg", timeout_s: float = 10.0,
                 max_bytes: int = MAX_OUTPUT_BYTES, max_lines: int = 20000) -> KernelLog:
    """The kernel log lines ``keep`` accepts (the last ``max_lines``): /dev/kmsg, else dmesg."""
    notes: list[str] = []
    try:
        records, truncated = _kmsg_records(kmsg_path, max_bytes)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        if exc.errno in (errno.EACCES, errno.EPERM):
            reason += " (reading the kernel log needs root or CAP_SYSLOG)"
        notes.append(f"{kmsg_path}: {reason}")
    else:
        lines = [r for r in records if keep(r)]
        return KernelLog(kmsg_path, tuple(lines[-max_lines:]), tuple(notes), truncated or len(lines) > max_lines)
    dmesg = find_program("dmesg")
    if dmesg is None:
        notes.append("dmesg: not found")
        return KernelLog(None, (), tuple(notes))
    out = run_readonly([dmesg], timeout_s, max_bytes)
    if out.rc != 0:
        notes.append(f"dmesg: {out.error or f'exit {out.rc}'}: {out.stderr.strip()[:500]}")
        return KernelLog(None, (), tuple(notes))
    lines = [r for r in out.stdout.splitlines() if keep(r)]
    return KernelLog("dmesg", tuple(lines[-max_lines:]), tuple(notes), out.truncated or len(lines) > max_lines)
