"""Every process the agent starts: trusted, isolated, bounded, and no survivor on any way out.

The attacks are real: a program in a directory others can write, a Python package planted in
the working directory, a poisoned environment (LD_PRELOAD, PYTHONPATH, NCCL_*), a runner that
prints without end (``yes``), and runners that fork and double-fork (``sleep M &``,
``(sleep M &)``, ``exec sleep M``) ended by the deadline, the normal exit, an exception, a
SIGTERM of the agent, the probe's parent killing the probe child, the agent killed outright and
the daemon's shutdown. After each, /proc is scanned for any live process carrying the test's
unique marker argument (``sleep 1000.<random>``); a zombie is no survivor.
"""

from __future__ import annotations

import json
import os
import random
import resource
import signal
import sys
import time
from pathlib import Path
from typing import Callable

import pytest

from nodehealth.nccl import runner as nccl_runner
from nodehealth.observations import ProbeError
from nodehealth.platform import child, proc, reap
from nodehealth.platform.deadline import Deadline
from nodehealth.slurm.client import Scontrol

ROOT = Path(__file__).resolve().parent.parent
FAKE = str(ROOT / "tests" / "fakes" / "all_reduce_perf")
A100 = str(ROOT / "tests" / "fixtures" / "nccl_selftest" / "gcm_single_node_8xA100.txt")
SH = "/bin/sh"
WAIT_S = 10.0  # how long a killed process may take to be gone (a busy machine)
START_S = 60.0  # how long the runner's processes may take to appear


# --------------------------------------------------------------------------- the /proc scan


def _live_with(marker: str) -> list[int]:
    """Pids of live (not zombie) processes with ``marker`` among their arguments."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
            if marker.encode() not in args:
                continue
            with open(f"/proc/{entry}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if state != b"Z":
            found.append(int(entry))
    return found


def _wait_for(cond: Callable[[], bool], timeout_s: float) -> bool:
    end = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > end:
            return False
        time.sleep(0.05)
    return True


def _survivors(marker: str) -> list[int]:
    """What is still alive after ``WAIT_S`` of waiting for all of it to die."""
    _wait_for(lambda: not _live_with(marker), WAIT_S)
    return _live_with(marker)


@pytest.fixture
def marker():
    """A unique ``sleep`` argument; whatever carries it is killed after the test (by pid)."""
    m = f"1000.{random.randrange(10**8):08d}"
    yield m
    for pid in _live_with(m):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _spawner(m: str, redirect: str = "") -> list[str]:
    """A runner that forks (``sleep M &``), double-forks (``(sleep M &)``: re-parented to init) and
    execs ``sleep M``."""
    return [SH, "-c", f"sleep {m} {redirect} & (sleep {m} {redirect} &); exec sleep {m} {redirect}"]


def _fake_plan(**env: str) -> nccl_runner.Plan:
    extra = {"FAKE_NCCL_FIXTURE": A100, **env}
    return nccl_runner.Plan(
        runner="nccl-tests", all_reduce_perf=FAKE, json="off", env=tuple(f"{k}={v}" for k, v in extra.items())
    )


# --------------------------------------------------------------------------- trusted, isolated


def test_a_program_others_can_write_is_refused_as_root(tmp_path):
    assert os.geteuid() == 0
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # writable by all, no sticky bit: anyone may replace the program
    prog = shared / "tool"
    prog.write_text("#!/bin/sh\necho ran\n")
    prog.chmod(0o755)
    with pytest.raises(proc.CommandError, match="not trusted"):
        proc.run([str(prog)], 30)
    theirs = tmp_path / "theirs"
    theirs.write_text("#!/bin/sh\necho ran\n")
    theirs.chmod(0o755)
    os.chown(theirs, 65534, 65534)
    with pytest.raises(proc.CommandError, match="uid 65534"):
        proc.run([str(theirs)], 30)
    with pytest.raises(proc.CommandError, match="absolute"):
        proc.run(["sh", "-c", "true"], 30)


def test_a_python_child_runs_isolated_or_not_at_all(tmp_path):
    with pytest.raises(proc.CommandError, match="-I"):
        proc.run([sys.executable, "-c", "print(1)"], 30)
    done = proc.run(proc.python_argv(sys.executable, "json.tool", ["--help"]), 60)
    assert done.returncode == 0 and done.argv[1] == "-I"


POISON = {
    "LD_PRELOAD": "/nonexistent/evil.so",
    "LD_LIBRARY_PATH": "/tmp/evil",
    "PYTHONPATH": "/tmp/evil",
    "PYTHONSTARTUP": "/tmp/evil.py",
    "PATH": "/tmp/evil:/usr/bin:/bin",
    "NCCL_SOCKET_IFNAME": "evil0",
    "NCCL_DEBUG_FILE": "/tmp/evil.log",
    "CUDA_VISIBLE_DEVICES": "7",
    "BASH_ENV": "/tmp/evil.sh",
}


def _env_of(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def test_the_callers_environment_does_not_reach_the_child(monkeypatch):
    for k, v in POISON.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("SLURM_CONF", "/etc/slurm/slurm.conf")
    seen = _env_of(proc.run(["/usr/bin/env"], 30).stdout)
    assert seen == dict(proc.BASE_ENV)
    seen = _env_of(proc.run(["/usr/bin/env"], 30, env=os.environ).stdout)  # a caller handing over a whole env
    assert seen == {**proc.BASE_ENV, "SLURM_CONF": "/etc/slurm/slurm.conf"}
    assert proc.run(["/bin/pwd"], 30).stdout.strip() == "/"


def test_scontrol_gets_slurm_conf_and_nothing_else_of_the_environment(tmp_path, monkeypatch):
    for k, v in POISON.items():
        monkeypatch.setenv(k, v)
    seen = tmp_path / "env"
    fake = tmp_path / "scontrol"
    fake.write_text(f"#!/bin/sh\nenv > {seen}\npwd >> {seen}\necho 'NodeName=n1 State=IDLE'\n")
    fake.chmod(0o755)
    client = Scontrol(str(fake), 30.0, Deadline(60.0), slurm_conf="/etc/slurm/x.conf")
    got = client.show("n1")
    assert not isinstance(got, ProbeError) and [n.name for n in got] == ["n1"]
    lines = seen.read_text().splitlines()
    assert lines[-1] == "/"
    shell_own = ("PWD", "SHLVL", "_", "OLDPWD")  # what /bin/sh sets by itself
    seen_env = {k: v for k, v in _env_of("\n".join(lines[:-1])).items() if k not in shell_own}
    assert seen_env == {**proc.BASE_ENV, "SLURM_CONF": "/etc/slurm/x.conf"}


def test_scontrol_answering_without_end_is_an_error_not_a_record(tmp_path, monkeypatch):
    fake = tmp_path / "scontrol"
    fake.write_text("#!/bin/sh\nexec /usr/bin/yes 'NodeName=n1 State=IDLE'\n")
    fake.chmod(0o755)
    got = Scontrol(str(fake), 60.0, Deadline(120.0)).show("n1")
    assert isinstance(got, ProbeError) and got.kind == "invalid" and "answered more than" in got.message


def test_the_nccl_runner_gets_only_its_own_and_the_configured_variables(tmp_path, monkeypatch):
    for k, v in POISON.items():
        monkeypatch.setenv(k, v)
    argv_file = tmp_path / "argv.json"
    plan = _fake_plan(FAKE_NCCL="replay", FAKE_NCCL_ARGV=str(argv_file), NCCL_IB_HCA="mlx5_0")
    run = nccl_runner.run_mode("nvlink", plan, 8, 60.0)
    assert run.returncode == 0, run.output_tail
    seen = json.loads(argv_file.read_text())
    assert seen["cwd"] == "/"
    own = nccl_runner.mode_env("nvlink")
    configured = dict(e.split("=", 1) for e in plan.env)
    assert seen["environ"] == {**proc.BASE_ENV, **own, **configured}
    assert not set(POISON) & set(seen["environ"]) - set(proc.BASE_ENV)


PLANTED = 'open({marker!r}, "w").write("planted code ran as uid %d" % __import__("os").getuid())\n'


def test_a_builtin_runner_planted_in_the_working_directory_never_runs(tmp_path, monkeypatch):
    """Root runs the self-test from a directory someone else could write: their
    ``nodehealth/nccl/builtin.py`` there (and on PYTHONPATH) must not be what runs."""
    evil = tmp_path / "evil"
    ran = tmp_path / "planted-code-ran"
    pkg = evil / "nodehealth" / "nccl"
    pkg.mkdir(parents=True)
    (evil / "nodehealth" / "__init__.py").write_text(PLANTED.format(marker=str(ran)))
    (pkg / "__init__.py").write_text("")
    (pkg / "builtin.py").write_text(PLANTED.format(marker=str(ran)))
    monkeypatch.chdir(evil)
    monkeypatch.setenv("PYTHONPATH", str(evil))
    plan = nccl_runner.Plan(
        runner="builtin",
        builtin_backend="cpu",
        python=sys.executable,
        args=("-b", "4K", "-e", "4K", "-n", "1", "-w", "0", "-c", "1"),
    )
    obs = nccl_runner.gather(plan, 2, 120.0)
    assert not ran.exists(), ran.read_text()
    run = obs.runs[0]
    assert run.returncode == 0 and run.perf is not None and run.perf.ranks == 2, run.output_tail


# --------------------------------------------------------------------------- bounded


def _peak_rss_running(argv: list[str], cap: int) -> tuple[int, int, bool, int]:
    """In a child with its address space limited to what it has plus 512 MiB: run ``argv`` under
    ``cap``; (stdout bytes kept, VmHWM growth in bytes, truncated, VmHWM before)."""

    def hwm() -> int:
        with open("/proc/self/status") as f:
            line = next(ln for ln in f if ln.startswith("VmHWM:"))
        return int(line.split()[1]) * 1024

    def body() -> tuple[int, int, bool, int]:
        with open("/proc/self/status") as f:
            size = int(next(ln for ln in f if ln.startswith("VmSize:")).split()[1]) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (size + (512 << 20), resource.RLIM_INFINITY))
        before = hwm()
        done = proc.run(argv, 600, max_output=cap)
        return len(done.stdout), hwm() - before, done.truncated, before

    (outcome,) = child.wait_all([child.start(body)], 300)
    assert outcome.ok, outcome.value
    return outcome.value


def test_a_runner_printing_without_end_is_cut_at_the_cap_while_reading():
    cap = 16 << 20
    kept, grew, truncated, _ = _peak_rss_running(["/usr/bin/yes"], cap)
    assert truncated and kept == cap
    assert grew < cap * 3 + (64 << 20), f"the agent grew {grew >> 20} MiB for a {cap >> 20} MiB cap"


def test_each_pipe_is_capped_and_nothing_past_the_cap_is_read(tmp_path):
    done = proc.run([SH, "-c", "exec /usr/bin/yes >&2"], 600, max_output=1 << 20)
    assert done.truncated and len(done.stderr) == 1 << 20 and done.stdout == ""
    assert done.returncode == -signal.SIGKILL  # killed at the cap, not run to any deadline


def test_a_flooding_nccl_runner_is_killed_at_the_cap_and_judged_unknown(tmp_path, monkeypatch):
    from nodehealth.checks import nccl_selftest
    from nodehealth.checks.base import Context
    from nodehealth.model import Status
    from nodehealth.observations import Observations

    monkeypatch.setattr(nccl_runner, "MAX_OUTPUT", 4 << 20)
    t0 = time.monotonic()
    obs = nccl_runner.gather(_fake_plan(FAKE_NCCL="flood"), 8, 300.0)
    run = obs.runs[0]
    assert run.truncated and not run.timed_out and run.output_bytes <= (4 << 20) + 1
    assert time.monotonic() - t0 < 300.0 - nccl_runner.MARGIN_S  # ended by the cap, not the deadline
    res = nccl_selftest.evaluate(
        Observations(nccl=obs),
        nccl_selftest.Settings(gpus=8),
        Context(name="nccl_selftest", phase="manual", node="n1", expected_gpus=8),
    )
    assert res.status == Status.UNKNOWN and "output cap" in res.summary


# --------------------------------------------------------------------------- no survivors


def test_no_survivor_at_the_deadline(marker):
    seen: list[int] = []
    done = proc.run(_spawner(marker), 5.0, check=lambda: seen.append(len(_live_with(marker))))
    assert done.timed_out and done.returncode is None
    assert max(seen) == 3, seen  # the three were running when the deadline came
    assert _survivors(marker) == []


def test_no_survivor_after_a_normal_exit_that_left_children_behind(marker, tmp_path):
    """The runner exits 0 once its background children run; they no longer hold its pipes."""
    go = tmp_path / "go"
    argv = [
        SH,
        "-c",
        f"sleep {marker} >/dev/null 2>&1 & (sleep {marker} >/dev/null 2>&1 &); "
        f"while [ ! -e {go} ]; do sleep 0.05; done; exit 0",
    ]

    def check() -> None:
        if len(_live_with(marker)) == 2:
            go.touch()

    done = proc.run(argv, 120.0, check=check)
    assert done.returncode == 0 and not done.timed_out and go.exists()
    assert _survivors(marker) == []


def test_no_survivor_when_the_reading_raises(marker):
    class ReaderFailed(Exception):
        pass

    def check() -> None:
        if len(_live_with(marker)) == 3:
            raise ReaderFailed("the reader failed mid-run")

    with pytest.raises(ReaderFailed):
        proc.run(_spawner(marker), 600.0, check=check)
    assert _survivors(marker) == []


def _fork_agent(body: Callable[[], None]) -> int:
    """A separate agent process (signals at their defaults) running ``body``."""
    pid = os.fork()
    if pid == 0:
        try:
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                signal.signal(sig, signal.SIG_DFL)
            os.setpgid(0, 0)
            body()
        finally:
            os._exit(0)
    return pid


def _wait_exit(pid: int, timeout_s: float = 60.0) -> int:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    return os.waitpid(pid, 0)[1]


def test_no_survivor_when_the_agent_gets_sigterm(marker):
    agent = _fork_agent(lambda: proc.run(_spawner(marker), 600.0) and None)
    assert _wait_for(lambda: len(_live_with(marker)) == 3, START_S)
    os.kill(agent, signal.SIGTERM)
    status = _wait_exit(agent)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM  # it still dies of it
    assert _survivors(marker) == []


def test_no_survivor_when_the_probe_child_is_killed_by_its_parent(marker):
    pending = nccl_runner.start(_fake_plan(FAKE_NCCL="spawn", FAKE_NCCL_MARKER=marker), 8, 600.0)
    try:
        assert _wait_for(lambda: len(_live_with(marker)) == 3, START_S)
        child.abandon(pending.child.pid)  # what wait_all does at the probe's deadline
        assert _survivors(marker) == []
    finally:
        os.close(pending.child.fd)


def test_no_survivor_when_the_agent_dies_while_the_probe_child_runs(marker):
    """The agent killed outright (SIGKILL: no handler runs): the probe child sees its parent gone."""
    agent = _fork_agent(
        lambda: nccl_runner.start(_fake_plan(FAKE_NCCL="spawn", FAKE_NCCL_MARKER=marker), 8, 600.0).collect() and None
    )
    assert _wait_for(lambda: len(_live_with(marker)) == 3, START_S)
    os.kill(agent, signal.SIGKILL)
    _wait_exit(agent)
    assert _survivors(marker) == []


def test_no_survivor_when_the_daemon_ends_its_probe_children(marker):
    """The daemon's shutdown (``reap.kill_children``) while the self-test runs.

    The agent ends its children only once this test has seen all three alive (it says so through
    a pipe), so no scheduling order can make the test miss them."""
    seen_r, seen_w = os.pipe()

    def agent() -> None:
        os.close(seen_w)
        nccl_runner.start(_fake_plan(FAKE_NCCL="spawn", FAKE_NCCL_MARKER=marker), 8, 600.0)
        if os.read(seen_r, 1) == b"k":
            reap.kill_children()
        time.sleep(3600)  # the agent lives on: only kill_children may end the runner

    pid = _fork_agent(agent)
    os.close(seen_r)
    try:
        assert _wait_for(lambda: len(_live_with(marker)) == 3, START_S)
        os.write(seen_w, b"k")
        assert _survivors(marker) == []
    finally:
        os.close(seen_w)
        os.kill(pid, signal.SIGKILL)
        _wait_exit(pid)


def test_no_survivor_and_the_runners_verdict_when_the_probe_deadline_comes(marker, tmp_path, capsys):
    """The whole check: the runner's own deadline ends first, so the verdict is its "hung"
    finding (FAIL, exit 1 of ``nodehealth nccl run``), never the probe's "did not finish"."""
    from nodehealth.cli import main

    cfg = tmp_path / "nodehealth.toml"
    env = ", ".join(json.dumps(e) for e in _fake_plan(FAKE_NCCL="spawn", FAKE_NCCL_MARKER=marker).env)
    cfg.write_text(
        f'[paths]\nstate_dir = "{tmp_path}/state"\n[slurm]\nscontrol = "{tmp_path}/no-scontrol"\n'
        f'[checks.nccl_selftest]\nall_reduce_perf = "{FAKE}"\ngpus = 8\njson_output = "off"\n'
        f"env = [{env}]\n"
    )
    code = main(["nccl", "run", "--config", str(cfg), "--timeout", "4", "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1 and doc["status"] == "FAIL", doc
    assert "hung: killed with its process group" in doc["summary"] and "did not finish" not in doc["summary"]
    assert "(0 bytes of output)" not in doc["summary"]  # the run's own deadline: its header was read
    assert _survivors(marker) == []
