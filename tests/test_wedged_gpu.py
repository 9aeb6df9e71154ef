"""A wedged GPU costs one stuck child, not one per round: abandoned readers are reaped every
round, and no new NVML reader is forked while the last one is still stuck."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil
import pytest
from test_daemon_util import free_port, write_config

from nodehealth import runner
from nodehealth.config import loader
from nodehealth.platform import child
from nodehealth.probes import nvml

# Kills, reaps and per-call deadlines against a hung child: the scheduler's business (make test-busy).
pytestmark = pytest.mark.timing

ROUNDS = 6
ONLY = ("nvml",)  # the check that carries a hung NVML; its deadline is the probe's


def _children() -> dict[int, str]:
    """This process's children, alive or zombie: pid -> status."""
    out = {}
    for p in psutil.Process().children():
        try:
            out[p.pid] = p.status()
        except psutil.NoSuchProcess:
            pass
    return out


# The hung nvmlInit is found by its own deadline, counted from the call (the reader announces each
# call before making it), so the reader's start-up on a slow or loaded machine is no part of it. The
# read's budget is far above any start-up, so it never ends a round first: hung, never "slow".
HANG_DEADLINE_S = 0.3
BUDGET_S = 120.0


@pytest.fixture
def hung_config(tmp_path: Path):
    path = write_config(tmp_path, "hung-nvml-init", free_port(), nvml_timeout_s=BUDGET_S)
    text = path.read_text()
    assert text.count("[nvml]\n") == 1
    path.write_text(
        text.replace("[nvml]\n", f"[nvml]\ninit_timeout_s = {HANG_DEADLINE_S}\ncall_timeout_s = {HANG_DEADLINE_S}\n")
    )
    cfg = loader.load(str(path))
    before = set(_children())
    yield cfg, before
    # Leave no reader behind for the next test (a stuck one is ended for real here).
    for pid in set(_children()) - before:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except OSError:
            pass
    nvml.stuck_reader()


def _wait_exited(pid: int, deadline_s: float = 120.0) -> None:
    """Until ``pid`` has exited (a zombie nobody reaped yet): a killed process on a loaded machine
    may wait a while for a CPU before it is gone. The deadline only stops a broken test."""
    end = time.monotonic() + deadline_s
    while _children().get(pid) not in (psutil.STATUS_ZOMBIE, None) and time.monotonic() < end:
        time.sleep(0.01)
    assert _children().get(pid) in (psutil.STATUS_ZOMBIE, None), _children().get(pid)


def _nvml(report):
    return next(r for r in report.results if r.name == "nvml")


def test_rounds_against_a_hung_nvml_leave_no_zombies(hung_config):
    cfg, before = hung_config
    for _ in range(ROUNDS):
        result = _nvml(runner.execute(cfg, phase="daemon", only=ONLY).report)
        assert result.status.name == "FAIL" and result.action.value == "reboot", result
        assert f"nvmlInit did not return within {HANG_DEADLINE_S:g} s (hung)" in result.summary, result.summary
    new = {pid: st for pid, st in _children().items() if pid not in before}
    # Each round's reader was killed at its deadline; the next round reaped it before forking.
    assert len(new) <= 1, new
    assert sum(st == psutil.STATUS_ZOMBIE for st in new.values()) <= 1, new


def test_a_reader_that_survives_sigkill_is_the_only_one_and_the_rounds_report_it(hung_config, monkeypatch):
    cfg, before = hung_config
    real_killpg, real_kill = os.killpg, os.kill
    spared: list[int] = []

    def unkillable(real):  # a process blocked in the driver does not die on SIGKILL
        def kill(pid: int, sig: int) -> None:
            if sig == signal.SIGKILL and pid not in before:
                spared.append(pid)
                return
            real(pid, sig)

        return kill

    monkeypatch.setattr(child.os, "killpg", unkillable(real_killpg))
    monkeypatch.setattr(child.os, "kill", unkillable(real_kill))

    first = _nvml(runner.execute(cfg, phase="daemon", only=ONLY).report)
    assert "did not return within" in first.summary, first.summary
    stuck = set(_children()) - before
    assert len(stuck) == 1 and spared, (stuck, spared)
    (pid,) = stuck
    for _ in range(ROUNDS - 1):
        outcome = runner.execute(cfg, phase="daemon", only=ONLY)
        result = _nvml(outcome.report)
        assert result.status.name == "FAIL" and result.action.value == "reboot", result
        assert "still not answering since" in result.summary and f"child pid {pid} stuck" in result.summary, (
            result.summary
        )
        assert outcome.observations.nvml.kind == "timeout"
        assert set(_children()) - before == {pid}  # no new reader forked

    # The GPU comes back (the stuck reader finally exits): the next round reaps it and asks again.
    real_kill(pid, signal.SIGKILL)
    _wait_exited(pid)
    again = _nvml(runner.execute(cfg, phase="daemon", only=ONLY).report)
    assert "did not return within" in again.summary, again.summary
    now = set(_children()) - before
    assert pid not in now and len(now) == 1, now  # reaped, not a zombie; the new reader stuck in its place


def test_each_nvml_round_reaps_every_abandoned_child_that_has_exited(hung_config):
    """Not only its own last reader: any child given up on (a reader that closed its pipe but
    was slow to exit, a mount probe's child) is reaped by the next round's NVML start."""
    cfg, before = hung_config
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # exits once the parent lets it, after it was given up on
        os.close(w)
        os.read(r, 1)
        os._exit(0)
    os.close(r)
    ticks = iter(range(1000))
    child.reap(pid, clock=lambda: float(next(ticks)))  # gives up at once: remembered as an orphan
    os.close(w)
    _wait_exited(pid)
    assert _children().get(pid) == psutil.STATUS_ZOMBIE
    _nvml(runner.execute(cfg, phase="daemon", only=ONLY).report)
    assert pid not in _children()
