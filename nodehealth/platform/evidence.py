"""Read-only evidence from the host for the validation kit: a query program's output.

``run_readonly`` runs a query program (``nvidia-smi -q``, ``dmesg``) by absolute path and argv
list, under a timeout, with its output bounded; it changes nothing: ``dmesg`` is never given
``-c``/``-C`` (which clear the ring buffer). The kernel log itself is read by the one kmsg reader,
``nodehealth.probes.kernel_log`` (the kit's ``kernel_lines``).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from typing import Optional

from nodehealth.platform import proc

MAX_OUTPUT_BYTES = 8 << 20
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
    search = (
        path
        if path is not None
        else os.pathsep.join([os.environ.get("PATH", ""), "/usr/bin", "/usr/sbin", "/bin", "/sbin"])
    )
    found = shutil.which(name, path=search)
    return os.path.abspath(found) if found else None


def run_readonly(argv: list[str], timeout_s: float, max_bytes: int = MAX_OUTPUT_BYTES) -> ProgramOutput:
    """Run a query program (``argv[0]`` an absolute path) and return its output, within ``timeout_s``
    (``platform.proc.run``: trusted path, ``cwd="/"``, only ``proc.BASE_ENV`` for environment, output
    cut at ``max_bytes`` while reading, its process group killed on every way out)."""
    if not argv or not os.path.isabs(argv[0]):
        raise ValueError(f"run a program by its absolute path, not {argv[:1]!r}")
    if os.path.basename(argv[0]) == "dmesg" and any(a in _CLEARING_FLAGS for a in argv[1:]):
        raise ValueError(f"refused: {' '.join(argv)} would change the kernel log")
    try:
        done = proc.run(argv, timeout_s, max_output=max_bytes)
    except proc.CommandError as exc:
        return ProgramOutput(tuple(argv), None, "", "", f"cannot run: {exc}")
    if done.timed_out:
        return ProgramOutput(
            tuple(argv), None, done.stdout, "", f"did not finish within {timeout_s:g} s", done.truncated
        )
    return ProgramOutput(tuple(argv), done.returncode, done.stdout, done.stderr, None, done.truncated)
