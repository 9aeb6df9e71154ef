"""platform/child.py, the one child mechanism: streamed frames, torn frames, the child ending when
its parent is gone, and no other fork in the product."""

from __future__ import annotations

import ast
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable

from nodehealth.platform import child

ROOT = Path(__file__).resolve().parent.parent
DEADLINE_S = 120.0  # only stops a broken test: every wait below polls for the state it expects


def _wait_for(predicate: Callable[[], bool], deadline_s: float = DEADLINE_S) -> bool:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def _gone(pid: int) -> bool:
    """``pid`` has exited (or is a zombie its parent, init, is about to reap)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


def _receive_until(c: child.Child, want: int) -> list[Any]:
    frames: list[Any] = []
    end = time.monotonic() + DEADLINE_S
    while len(frames) < want and not c.eof and time.monotonic() < end:
        frames += c.receive(0.5)
    return frames


def test_a_stream_keeps_the_frames_sent_before_the_child_hangs(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)

    def body(send: Callable[[Any], None]) -> None:
        send(("call", "first"))
        send(("value", 1))
        send(("call", "blocks"))
        open(fifo).read()  # no writer: blocks for ever

    c = child.stream(body)
    try:
        assert _receive_until(c, 3) == [("call", "first"), ("value", 1), ("call", "blocks")]
        assert c.receive(0.2) == [] and not c.eof  # nothing more: the last frame names where it stopped
    finally:
        c.end()
    assert not c.eof and c.fd == -1
    assert _wait_for(lambda: child.orphaned(c.pid) is False)  # killed, then reaped


def test_a_stream_body_that_raises_ends_with_a_crash_frame() -> None:
    def body(send: Callable[[Any], None]) -> None:
        send(("call", "x"))
        raise RuntimeError("boom")

    c = child.stream(body)
    frames = _receive_until(c, 2)
    frames += _receive_until(c, 99)  # to the end of file
    c.end()
    assert frames == [("call", "x"), (child.CRASH, "RuntimeError: boom")] and c.eof


def test_a_torn_frame_is_unreadable_not_a_crash_of_the_parent() -> None:
    c = child.Child(pid=0, fd=-1, started=0.0)
    buf = bytearray(child.FRAME.pack(10) + b"abc")
    assert child._take_frames(buf) == [] and len(buf) == child.FRAME.size + 3  # waits for the rest
    r, w = os.pipe()
    os.write(w, child.FRAME.pack(3) + b"bad" + child.FRAME.pack(10) + b"abc")
    os.close(w)
    c.fd = r
    frames = _receive_until(c, 99)
    os.close(r)
    assert c.eof and [f[0] for f in frames] == [child.UNREADABLE, child.UNREADABLE], frames
    assert "torn frame" in frames[1][1]


def test_a_child_never_collects_what_it_inherited() -> None:
    """gc.freeze first: a collection in the child walks its own objects, not the parent's heap
    (which would copy every page it touched)."""
    import gc

    (end,) = child.wait_all([child.start(gc.get_freeze_count)], DEADLINE_S)
    assert end.ok and end.value >= len(gc.get_objects()) // 2, end


def test_an_unpicklable_answer_is_an_error_not_a_hang() -> None:
    (end,) = child.wait_all([child.start(lambda: threading.Lock())], DEADLINE_S)
    assert not end.ok and not end.timed_out and "pickle" in end.value.lower(), end


def _agent(parent_gone: str, marker: Path) -> tuple[int, int]:
    """Fork an agent that starts a child which blocks for ever; returns (agent pid, child pid) once the
    child is in its body. (A parent gone before that ends the child before its body, cleanup and all:
    right for the product, nothing to clean up yet, but not what these tests ask about.)"""
    started = marker.with_name(marker.name + ".started")
    r, w = os.pipe()
    agent = os.fork()
    if agent == 0:  # the agent: starts the child from its main thread, tells its pid, then waits
        try:
            os.close(r)

            def body(send: Callable[[Any], None]) -> None:
                try:
                    started.write_text("in the body")
                    signal.pause()
                finally:
                    marker.write_text("cleaned up")

            c = child.stream(body, parent_gone=parent_gone)
            os.write(w, f"{c.pid}\n".encode())
            os.close(w)
            signal.pause()
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    while not data.endswith(b"\n"):  # not to the end of file: the agent's child holds the pipe too
        chunk = os.read(r, 64)
        if not chunk:
            break
        data += chunk
    os.close(r)
    if not _wait_for(started.exists):
        os.kill(agent, signal.SIGKILL)
        os.waitpid(agent, 0)
        raise AssertionError(f"the child {int(data)} did not reach its body")
    return agent, int(data)


def _kill_agent(agent: int) -> None:
    os.kill(agent, signal.SIGKILL)
    os.waitpid(agent, 0)


def test_a_child_dies_with_its_parent(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    agent, pid = _agent("kill", marker)
    try:
        assert not _gone(pid)
        _kill_agent(agent)
        assert _wait_for(lambda: _gone(pid)), f"child {pid} outlived its parent"
        assert not marker.exists()  # SIGKILL: nothing of the body ran after
    finally:
        if not _gone(pid):
            os.kill(pid, signal.SIGKILL)


def test_a_raise_child_runs_its_cleanup_when_its_parent_dies(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    agent, pid = _agent("raise", marker)
    try:
        _kill_agent(agent)
        assert _wait_for(lambda: _gone(pid)), f"child {pid} outlived its parent"
        assert _wait_for(lambda: marker.exists()) and marker.read_text() == "cleaned up"
    finally:
        if not _gone(pid):
            os.kill(pid, signal.SIGKILL)


def test_a_child_forked_by_a_thread_that_ends_still_answers() -> None:
    """PR_SET_PDEATHSIG fires when the forking *thread* ends: a thread's child does not ask for it."""
    started: list[child.Child] = []

    def body() -> Any:
        os.read(rfd, 1)  # until the forking thread has ended
        return "still here"

    rfd, wfd = os.pipe()
    thread = threading.Thread(target=lambda: started.append(child.start(body)))
    thread.start()
    thread.join()
    os.write(wfd, b"x")
    (end,) = child.wait_all(started, DEADLINE_S)
    os.close(rfd)
    os.close(wfd)
    assert end.ok and end.value == "still here", end


def test_only_the_child_mechanism_forks() -> None:
    """One child mechanism: no module of the product but platform/child.py calls os.fork."""
    offenders = _forks(ROOT / "nodehealth")
    assert offenders == [], offenders


def test_the_fork_rule_catches_a_fork(tmp_path: Path) -> None:
    (tmp_path / "platform").mkdir()
    (tmp_path / "platform" / "child.py").write_text("import os\nos.fork()\n")
    (tmp_path / "probes.py").write_text("import os\n\ndef start():\n    pid = os.fork()\n")
    (tmp_path / "other.py").write_text("from os import fork\nfork()\n")
    assert _forks(tmp_path) == ["other.py:2", "probes.py:4"]


def _forks(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel == "platform/child.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                fn = node.func
                name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else ""
                if name in ("fork", "forkpty"):
                    found.append(f"{rel}:{node.lineno}")
    return found
