"""A slow ``nodehealth check`` says on a terminal what it waits for and its budget, and nothing on a pipe:
the real program with its stderr on a pseudo-terminal (``pty.openpty``), then on a pipe."""

from __future__ import annotations

import io
import os
import pty
import select
import subprocess
import sys
from pathlib import Path

from nodehealth.commands import progress

ROOT = Path(__file__).resolve().parent.parent
HUNG = ROOT / "examples" / "scenarios" / "hung-nvml-init.toml"  # nvmlInit never returns
DEADLINE_S = 300


def config(tmp_path: Path) -> Path:
    path = tmp_path / "nh.toml"  # a short budget: the hung init ends the run in seconds
    path.write_text(f'[phases.manual]\nbudget_s = 2\n[paths]\nstate_dir = "{tmp_path / "state"}"\n')
    return path


def args(tmp_path: Path) -> list[str]:
    return [sys.executable, "-m", "nodehealth", "check", "--config", str(config(tmp_path)), "--simulate", str(HUNG)]


def env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "NODEHEALTH_CONFIG"} | {"NO_COLOR": "1"}


def on_a_terminal(argv: list[str]) -> tuple[int, str, str]:
    """Run ``argv`` with its stderr on a pseudo-terminal: (exit code, what the terminal got, stdout)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave, env=env(), cwd=ROOT)
    os.close(slave)
    seen = b""
    while True:  # read the terminal until the program closes it
        ready, _, _ = select.select([master], [], [], DEADLINE_S)
        if not ready:
            proc.kill()
            raise AssertionError(f"no output and no exit within {DEADLINE_S} s: {seen!r}")
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the program exited and the terminal's last writer is gone
            break
        if not chunk:
            break
        seen += chunk
    os.close(master)
    out = proc.stdout.read().decode() if proc.stdout else ""
    return proc.wait(timeout=DEADLINE_S), seen.decode(), out


def test_a_slow_check_on_a_terminal_names_what_it_waits_for_and_the_budget(tmp_path: Path) -> None:
    code, text, out = on_a_terminal(args(tmp_path))
    # UNKNOWN (slow, exit 0) on a quiet machine, FAIL (hung, exit 1) when a busy one stretches the hung
    # call's share of the budget: the point is the line, never an OK
    assert code in (0, 1)
    assert "nodehealth: waiting for nvml (" in text and "; budget 2 s" in text, text
    assert text.endswith(progress.ERASE), text  # erased at the end: the report reads as without it
    assert ("UNKNOWN nvml" in out or "FAIL    nvml" in out) and "waiting for" not in out


def test_a_slow_preview_on_a_terminal_names_what_it_waits_for(tmp_path: Path) -> None:
    cfg = tmp_path / "nh.toml"
    cfg.write_text(f'[phases.healthcheck]\nbudget_s = 2\n[paths]\nstate_dir = "{tmp_path / "state"}"\n')
    argv = [sys.executable, "-m", "nodehealth", "check", "--as", "healthcheck", "--config", str(cfg), "--simulate"]
    code, text, out = on_a_terminal([*argv, str(HUNG)])
    assert "nodehealth: waiting for nvml (" in text and "within the face's budget" in text, text
    assert text.endswith(progress.ERASE) and "healthcheck exit code would be" in out, out


def test_a_slow_check_on_a_pipe_prints_no_progress(tmp_path: Path) -> None:
    proc = subprocess.run(args(tmp_path), capture_output=True, text=True, env=env(), cwd=ROOT, timeout=DEADLINE_S)
    assert proc.returncode == 0 and "UNKNOWN nvml" in proc.stdout
    assert "waiting for" not in proc.stderr and "\x1b" not in proc.stderr and "\r" not in proc.stderr, proc.stderr


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_line_names_each_probe_not_answered_longest_first() -> None:
    clock = Clock()
    watch = progress.Watch(clock)
    watch.start("nvml", 10.0)
    clock.now += 1.0
    watch.start("pci_gpus", 2.0)
    watch.start("host", 2.0)
    watch.answered("host")
    clock.now += 3.25
    assert progress.describe(watch, 10.0, 4.25) == (
        "nodehealth: waiting for nvml (4.2 s of its 10 s), pci_gpus (3.2 s of its 2 s); budget 10 s"
    )
    watch.answered("nvml")
    watch.answered("pci_gpus")
    assert progress.describe(watch, 10.0, 4.25) == "nodehealth: deciding, 4.2 s so far; budget 10 s"
    assert progress.describe(watch, None, 4.25) == "nodehealth: deciding, 4.2 s so far; within the face's budget"


def test_a_watched_forking_probe_is_answered_when_its_read_is_collected() -> None:
    class Pending:
        def collect(self) -> str:
            assert [w[0] for w in watch.waiting()] == ["nvml"]  # still waited for while collecting
            return "snapshot"

    watch = progress.Watch()
    probe = progress.Probe("nvml", lambda ctx, timeout: Pending(), forks=True)
    table = progress.watched(watch, {"nvml": probe})
    pending = table["nvml"].gather(None, 5.0)
    assert pending.collect() == "snapshot" and watch.waiting() == []


def test_no_terminal_no_line() -> None:
    stream = io.StringIO()  # not a terminal
    with progress.Line(stream, lambda t: "x", after_s=0.0, every_s=0.01) as line:
        assert not line.active() and line.thread is None
    assert stream.getvalue() == ""
