"""proc.run's ``pass_fds``: only an open socket above 2 stays open in the child, nothing else of ours.

The child is an isolated Python writing to the descriptor it was given; the socket's other end is read here.
A descriptor that is stdio, a regular file, a pipe, closed or not a number is not passed (the result's
notes say why), and the child finds it closed.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest

from nodehealth.platform import proc

SH = "/bin/sh"


def _write_to(fd: int) -> list[str]:
    """A child that writes to ``fd`` and says whether it could (sh takes one-digit descriptors only)."""
    code = (
        f"import os\ntry:\n    os.write({fd}, b'through\\n')\n"
        "except OSError:\n    print('closed')\nelse:\n    print('wrote')"
    )
    return [sys.executable, "-I", "-c", code]


def test_a_socket_named_in_pass_fds_is_open_in_the_child() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        res = proc.run(_write_to(theirs.fileno()), 30, pass_fds=(theirs.fileno(),))
        assert res.stdout.strip() == "wrote" and res.notes == ()
        ours.settimeout(10)
        assert ours.recv(64) == b"through\n"


def test_without_pass_fds_the_socket_is_closed_in_the_child() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        res = proc.run(_write_to(theirs.fileno()), 30)
        assert res.stdout.strip() == "closed"


def test_only_the_named_descriptor_is_passed() -> None:
    one, other = socket.socketpair()
    with one, other:
        res = proc.run(_write_to(other.fileno()), 30, pass_fds=(one.fileno(),))
        assert res.stdout.strip() == "closed"


def test_a_regular_file_is_not_passed(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "f", os.O_CREAT | os.O_WRONLY, 0o600)
    try:
        assert proc.fd_problem(fd) == f"fd {fd} is not a socket (a regular file)"
        res = proc.run(_write_to(fd), 30, pass_fds=(fd,))
        assert res.stdout.strip() == "closed"
        assert res.notes == (
            f"not passed to {os.path.basename(sys.executable)}: fd {fd} is not a socket (a regular file)",
        )
    finally:
        os.close(fd)
    assert (tmp_path / "f").read_bytes() == b""


def test_a_pipe_is_not_passed() -> None:
    r, w = os.pipe()
    try:
        assert proc.fd_problem(w) == f"fd {w} is not a socket (a pipe)"
        assert proc.run(_write_to(w), 30, pass_fds=(w,)).stdout.strip() == "closed"
    finally:
        os.close(r)
        os.close(w)


def test_a_closed_descriptor_is_not_passed() -> None:
    ours, theirs = socket.socketpair()
    fd = theirs.fileno()
    ours.close()
    theirs.close()
    assert proc.fd_problem(fd).startswith(f"fd {fd} is not open (")
    res = proc.run([SH, "-c", "true"], 30, pass_fds=(fd,))
    assert res.returncode == 0 and res.notes and "is not open" in res.notes[0]


@pytest.mark.parametrize("fd", [0, 1, 2, -1, proc.MAX_PASS_FD + 1, True, "5", 3.0])
def test_stdio_and_what_is_no_small_descriptor_number_are_refused(fd: object) -> None:
    assert "is not a descriptor number from 3 to" in proc.fd_problem(fd)


def test_stdout_is_not_passed_even_when_it_is_a_socket() -> None:
    # The child's stdout is our pipe whatever fd 1 is here: naming it changes nothing and is said.
    res = proc.run([SH, "-c", "echo out"], 30, pass_fds=(1,))
    assert res.stdout == "out\n" and res.notes == ("not passed to sh: fd 1 is not a descriptor number from 3 to 1023",)
