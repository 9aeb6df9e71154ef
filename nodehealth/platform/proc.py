"""Running an external program: argv list, absolute path, new session, deadline, capped output."""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

MAX_OUTPUT = 1 << 20


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: Optional[int]  # None: killed at the deadline
    stdout: str
    stderr: str
    timed_out: bool = False
    truncated: bool = False  # stdout or stderr was longer than ``max_output`` and was cut


class CommandError(Exception):
    """The program could not be started (missing, not executable)."""


def run(argv: Sequence[str], timeout_s: float, env: Optional[Mapping[str, str]] = None,
        max_output: int = MAX_OUTPUT) -> CommandResult:
    """Run ``argv`` with no shell; kill its whole process group at the deadline."""
    if not argv or not os.path.isabs(argv[0]):
        raise CommandError(f"{argv[0] if argv else '(empty)'}: not an absolute path")
    try:
        proc = subprocess.Popen(  # noqa: S603 - argv list, absolute path, no shell
            list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True, env=dict(env) if env is not None else None)
    except OSError as exc:
        raise CommandError(f"{argv[0]}: {exc.strerror or exc}") from None
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        try:
            out, err = proc.communicate(timeout=0.2)
        except subprocess.TimeoutExpired:
            out, err = b"", b""
        return CommandResult(tuple(argv), None, _cap(out, max_output), _cap(err, max_output), timed_out=True,
                             truncated=max(len(out), len(err)) > max_output)
    return CommandResult(tuple(argv), proc.returncode, _cap(out, max_output), _cap(err, max_output),
                         truncated=max(len(out), len(err)) > max_output)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        proc.kill()


def _cap(data: bytes, limit: int) -> str:
    return data[:limit].decode("utf-8", errors="replace")
