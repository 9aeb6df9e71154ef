"""The NCCL self-test: runners, the all_reduce_perf test double's outcomes, the check's verdicts, the command.

The double (tests/fakes/all_reduce_perf) replays recorded real outputs (tests/fixtures/nccl_selftest/),
hangs, crashes, prints NCCL errors, nothing or wrong results on demand; the built-in runner runs
through the same runner with its ``cpu`` backend (no GPU and no torch here).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from conftest import Timing

from nodehealth import runner as check_runner
from nodehealth.checks import nccl_selftest
from nodehealth.checks.base import Context
from nodehealth.config.loader import ConfigError, resolve
from nodehealth.model import Action, Status
from nodehealth.nccl import floors
from nodehealth.nccl import plan as nccl_plan
from nodehealth.nccl import runner as nccl_runner
from nodehealth.observations import NcclObservation, NcclRun, Observations
from nodehealth.registry import BY_NAME

ROOT = Path(__file__).resolve().parent.parent
FAKE = str(ROOT / "tests" / "fakes" / "all_reduce_perf")
FIX = ROOT / "tests" / "fixtures" / "nccl_selftest"
A100 = str(FIX / "gcm_single_node_8xA100.txt")
A100_10G = str(FIX / "oci_1node_8xA100_10GiB.txt")
MODEL = "NVIDIA A100-SXM4-80GB"


# The double's controls. The runner inherits nothing of this process's environment, so they
# reach it the way every variable does: the check's ``env`` setting (NAME=value).
FAKE_VARS: dict[str, str] = {}


@pytest.fixture
def fake_env(monkeypatch, tmp_path):
    monkeypatch.setattr(
        sys.modules[__name__], "FAKE_VARS", {"FAKE_NCCL_FIXTURE": A100, "FAKE_NCCL_ARGV": str(tmp_path / "argv.json")}
    )
    return tmp_path


def _fake(**names: str) -> None:
    FAKE_VARS.update(names)


def _settings(**kw) -> nccl_selftest.Settings:
    base = dict(all_reduce_perf=FAKE, gpus=8, gpu_model=MODEL, timeout_s=20.0)
    base.update(kw)
    base["env"] = tuple(f"{k}={v}" for k, v in FAKE_VARS.items()) + tuple(kw.get("env", ()))
    return nccl_selftest.Settings(**base)


def _plan(**kw) -> nccl_runner.Plan:
    return nccl_runner.Plan.from_settings(_settings(**kw))


def _judge(obs: NcclObservation, settings=None):
    ctx = Context(name="nccl_selftest", phase="manual", node="n1", expected_gpus=8)
    return nccl_selftest.evaluate(Observations(nccl=obs), settings or _settings(), ctx)


def _run(outcome: str, monkeypatch, modes=("nvlink",), timeout_s=20.0, **kw):
    _fake(FAKE_NCCL=outcome)
    settings = _settings(modes=modes, timeout_s=timeout_s, **kw)
    obs = nccl_runner.gather(nccl_runner.Plan.from_settings(settings), 8, timeout_s)
    return obs, _judge(obs, settings)


# --------------------------------------------------------------------------- each outcome of the double

OUTCOMES = [
    # outcome, modes, status, action, words in the summary
    ("replay", ("nvlink", "ib_loopback"), Status.OK, Action.NONE, ("nvlink 231.72 GB/s", "via p2p", "via ib")),
    ("slow", ("nvlink",), Status.FAIL, Action.INSPECT, ("115.86 GB/s", "under 80%", "228 GB/s floor")),
    ("wrong", ("nvlink",), Status.FAIL, Action.INSPECT, ("24 wrong element(s)",)),
    ("socket", ("ib_loopback",), Status.FAIL, Action.INSPECT, ("NET/Socket", "not InfiniBand")),
    ("nccl_error", ("ib_loopback",), Status.FAIL, Action.INSPECT, ("NCCL failed", "vendor err 129")),
    ("nccl_error", ("nvlink",), Status.FAIL, Action.REBOOT, ("NCCL failed",)),
    ("crash", ("nvlink",), Status.FAIL, Action.REBOOT, ("crashed (SIGSEGV, exit -11)",)),
    ("crash139", ("nvlink",), Status.FAIL, Action.REBOOT, ("crashed (SIGSEGV, exit 139)",)),
    ("silent", ("nvlink",), Status.FAIL, Action.INSPECT, ("printed nothing and exited 0",)),
    ("garbage", ("nvlink",), Status.UNKNOWN, Action.NONE, ("could not parse",)),
    ("usage", ("nvlink",), Status.UNKNOWN, Action.NONE, ("rejected its arguments",)),
    ("warn", ("nvlink",), Status.WARN, Action.NONE, ("NCCL warned", "Could not find a path")),
    ("old", ("nvlink",), Status.OK, Action.NONE, ("231.72",)),
]


@pytest.mark.parametrize(
    "outcome,modes,status,action,words", OUTCOMES, ids=[f"{o[0]}-{'+'.join(o[1])}" for o in OUTCOMES]
)
def test_each_outcome_of_the_double_gives_its_verdict_and_action(
    fake_env, monkeypatch, outcome, modes, status, action, words
):
    obs, res = _run(outcome, monkeypatch, modes=modes)
    assert res.status == status, res.summary
    assert res.action == action, res.summary
    for w in words:
        assert w in res.summary
    assert set(res.details["runs"]) == set(modes)


def test_slow_between_the_fractions_is_a_warn(fake_env, monkeypatch):
    _fake(FAKE_NCCL_SCALE="0.85")
    _, res = _run("slow", monkeypatch)
    assert res.status == Status.WARN and res.action == Action.INSPECT and "under 90%" in res.summary


def test_a_node_floor_override_wins(fake_env, monkeypatch):
    _, res = _run("replay", monkeypatch, nvlink_floor_gbps=300.0)
    assert res.status == Status.FAIL and "300 GB/s floor" in res.summary
    assert res.details["runs"]["nvlink"]["floor_source"] == "[checks.nccl_selftest] nvlink_floor_gbps"


def test_no_floor_for_the_model_judges_the_rest(fake_env, monkeypatch):
    _, res = _run("replay", monkeypatch, gpu_model="NVIDIA RTX 6000 Ada")
    assert res.status == Status.OK
    assert res.details["runs"]["nvlink"]["floor_gbps"] is None
    assert "no floor for NVIDIA RTX 6000 Ada x8" in res.details["runs"]["nvlink"]["floor_source"]


def test_socket_without_require_ib_is_judged_by_bandwidth_only(fake_env, monkeypatch):
    _, res = _run("socket", monkeypatch, modes=("ib_loopback",), require_ib=False)
    assert "NET/Socket" not in res.summary and res.status == Status.FAIL  # 11.6 < 80 % of 18


def test_the_recorded_10gib_run_passes(fake_env, monkeypatch):
    _fake(FAKE_NCCL_FIXTURE=A100_10G)
    _, res = _run("replay", monkeypatch)
    assert res.status == Status.OK and res.details["runs"]["nvlink"]["busbw_gbps"] == 232.2


# --------------------------------------------------------------------------- the deadline


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.mark.timing
def test_a_hanging_runner_is_killed_at_the_deadline_with_its_process_group(fake_env, monkeypatch, timing: Timing):
    pidfile = fake_env / "pids"
    _fake(FAKE_NCCL_PIDFILE=str(pidfile))
    deadline = 2.0
    t0 = time.monotonic()
    obs, res = _run("hang", monkeypatch, timeout_s=deadline)
    took = time.monotonic() - t0
    assert took <= deadline + timing.slack(0.5), took
    assert res.status == Status.FAIL and res.action == Action.REBOOT and "hung" in res.summary
    assert obs.runs[0].timed_out and obs.runs[0].returncode is None
    pids = [int(p) for p in pidfile.read_text().split()]
    assert len(pids) == 2  # the double and its grandchild, one process group
    end = time.monotonic() + 30  # killed at the deadline: gone as soon as the kernel has run the kill
    while any(_alive(p) for p in pids) and time.monotonic() < end:
        time.sleep(0.02)
    assert not [p for p in pids if _alive(p)], "a process of the runner's group survived the deadline"


@pytest.mark.timing
def test_the_check_through_the_runner_stays_within_its_timeout(fake_env, monkeypatch, tmp_path, timing: Timing):
    _fake(FAKE_NCCL="hang")
    cfg = _config(tmp_path, modes=["nvlink", "ib_loopback"], timeout_s=2)
    t0 = time.monotonic()
    report = check_runner.run(cfg, only=("nccl_selftest",), node="n1")
    assert time.monotonic() - t0 <= 2.0 + timing.slack(0.5)
    res = report.results[0]
    assert res.status == Status.FAIL and res.summary.count("hung") == 2


# --------------------------------------------------------------------------- what the runner runs


def test_modes_set_their_environment_and_json_when_the_binary_has_it(fake_env, monkeypatch):
    monkeypatch.setenv("NCCL_P2P_DISABLE", "1")  # inherited: must not leak into nvlink mode
    _fake(FAKE_NCCL="replay")
    run = nccl_runner.run_mode("nvlink", _plan(), 8, 10.0)
    seen = json.loads((fake_env / "argv.json").read_text())
    assert seen["env"]["NCCL_DEBUG"] == "INFO" and seen["env"]["NCCL_DEBUG_SUBSYS"] == "INIT,NET"
    assert "NCCL_P2P_DISABLE" not in seen["env"] and "NCCL_NET" not in seen["env"]
    assert seen["argv"][:8] == ["-b", "8M", "-e", "1G", "-f", "2", "-c", "1"]
    assert seen["argv"][8:10] == ["-g", "8"] and seen["argv"][10] == "-J"
    assert run.json_output and run.perf is not None and run.perf.largest.oop_busbw_gbps == 231.72
    run = nccl_runner.run_mode(
        "ib_loopback", _plan(nccl_net_ib=True, min_bw_gbps=150, env=("NCCL_IB_HCA=mlx5_0",)), 8, 10.0
    )
    seen = json.loads((fake_env / "argv.json").read_text())["env"]
    assert seen["NCCL_P2P_DISABLE"] == "1" and seen["NCCL_SHM_DISABLE"] == "1" and seen["NCCL_NET"] == "IB"
    assert seen["NCCL_TESTS_MIN_BW"] == "150" and seen["NCCL_IB_HCA"] == "mlx5_0"
    assert run.transport is not None and run.transport.transport == "ib"


def test_no_json_for_a_binary_without_it_and_no_second_g(fake_env, monkeypatch):
    _fake(FAKE_NCCL="old")
    nccl_plan.json_cache.clear()
    run = nccl_runner.run_mode("nvlink", _plan(args=("-b", "1G", "-e", "1G", "-g", "8")), 8, 10.0)
    argv = json.loads((fake_env / "argv.json").read_text())["argv"]
    assert "-J" not in argv and argv.count("-g") == 1
    assert not run.json_output and run.perf is not None


def test_a_missing_binary_is_skipped_with_auto_and_unknown_when_asked_for(tmp_path, monkeypatch):
    monkeypatch.setattr(nccl_plan, "builtin_available", lambda backend: False)
    missing = str(tmp_path / "nope" / "all_reduce_perf")
    obs = nccl_runner.gather(_plan(all_reduce_perf=missing), 8, 5.0)
    res = _judge(obs)
    assert res.status == Status.SKIPPED and "no nccl-tests at" in res.summary
    obs = nccl_runner.gather(_plan(all_reduce_perf=missing, runner="nccl-tests"), 8, 5.0)
    res = _judge(obs)
    assert res.status == Status.UNKNOWN and res.action == Action.NONE and "no such executable" in res.summary


def test_no_gpu_is_skipped():
    res = _judge(nccl_runner.gather(_plan(), 0, 5.0))
    assert res.status == Status.SKIPPED and "no NVIDIA GPU" in res.summary


def test_one_gpu_is_not_judged_against_a_floor():
    run = NcclRun(
        mode="nvlink", runner="nccl-tests", gpus=1, returncode=0, output_bytes=10, perf=_perf_of(A100, ranks=1)
    )
    res = _judge(NcclObservation(runs=(run,)))
    assert res.status == Status.OK and "one GPU" in res.details["runs"]["nvlink"]["floor_note"]


def _perf_of(path: str, ranks=None):
    import dataclasses

    from nodehealth.nccl.parse import parse_perf

    perf = parse_perf(Path(path).read_text())
    return dataclasses.replace(perf, ranks=ranks) if ranks is not None else perf


def test_the_builtin_runner_runs_as_a_child_and_its_output_is_nccl_tests(monkeypatch):
    plan = nccl_runner.Plan(
        runner="builtin",
        builtin_backend="cpu",
        python=sys.executable,
        args=("-b", "4K", "-e", "64K", "-f", "4", "-n", "2", "-w", "1", "-c", "1"),
    )
    monkeypatch.setattr(nccl_runner, "choose_runner", lambda p: ("builtin", "", ""))
    obs = nccl_runner.gather(plan, 4, 20.0)
    run = obs.runs[0]
    assert run.returncode == 0, run.output_tail
    assert run.argv[1:6] == ("-I", "-m", "nodehealth.nccl.builtin", "--backend", "cpu")
    assert run.perf is not None and run.perf.ranks == 4 and run.perf.wrong == 0
    assert [r.size_bytes for r in run.perf.rows] == [4096, 16384, 65536]
    from nodehealth.nccl.parse import busbw

    row = run.perf.largest
    assert row.oop_busbw_gbps == pytest.approx(busbw(row.oop_algbw_gbps, 4, "all_reduce"), abs=0.02)


def test_the_builtin_runner_without_a_backend_says_so(monkeypatch):
    from nodehealth.nccl import builtin

    monkeypatch.setattr(builtin, "make_backend", lambda *a: (_ for _ in ()).throw(ImportError("no torch")))
    assert builtin.main(["-g", "2"]) == builtin.EXIT_NO_BACKEND == nccl_runner.EXIT_NO_BACKEND


# --------------------------------------------------------------------------- floors, settings, registry


def test_floors_have_sources_and_the_published_runs_pass_them():
    table = floors.default_floors()
    assert all(f.source and f.floor_gbps > 0 for f in table)
    a100 = floors.lookup(MODEL, 8, "nvlink")
    assert a100 is not None and a100.floor_gbps == 228.0
    assert floors.lookup("NVIDIA A100-SXM4-40GB", 8, "ib_loopback").floor_gbps == 18.0
    assert floors.lookup("NVIDIA H100 80GB HBM3", 8, "nvlink").floor_gbps == 460.0
    assert floors.lookup("NVIDIA H200", 8, "nvlink").floor_gbps == 431.0
    assert floors.lookup(MODEL, 4, "nvlink") is None and floors.lookup(None, 8, "nvlink") is None
    for path in (A100, A100_10G):  # published healthy runs: above the floor
        assert _perf_of(path).largest.oop_busbw_gbps >= a100.floor_gbps
    with pytest.raises(ValueError, match="floor\\[0\\]"):
        floors.parse('[[floor]]\nmodel = "X"\ngpus = 8\nmode = "sideways"\nfloor_gbps = 1\nsource = "s"\n')


def _config(tmp_path, **nccl):
    raw = {
        "paths": {"state_dir": str(tmp_path / "state")},
        "gpu": {"expected_count": 8},
        "checks": {
            "nccl_selftest": {
                "all_reduce_perf": FAKE,
                "gpus": 8,
                "gpu_model": MODEL,
                "env": [f"{k}={v}" for k, v in FAKE_VARS.items()],
                **nccl,
            }
        },
    }
    return resolve(raw, "<test>")


def test_settings_are_validated(tmp_path):
    with pytest.raises(ConfigError, match="NAME=value"):
        _config(tmp_path, env=["NOT AN ASSIGNMENT"])
    with pytest.raises(ConfigError, match="warn_fraction"):
        _config(tmp_path, warn_fraction=0.5, fail_fraction=0.8)
    with pytest.raises(ConfigError, match="absolute"):
        _config(tmp_path, all_reduce_perf="all_reduce_perf")
    with pytest.raises(ConfigError):
        _config(tmp_path, modes=["pcie"])


def test_registry_keeps_it_out_of_the_prolog_and_off_by_default():
    spec = BY_NAME["nccl_selftest"]
    assert spec.cost == "slow" and not spec.default_enabled
    assert "prolog" not in spec.phases and "daemon" not in spec.phases
    assert {"epilog", "manual"} <= spec.phases and spec.needs == ("nccl",)


# --------------------------------------------------------------------------- the command


def test_nccl_run_prints_the_verdict_and_never_calls_slurm(fake_env, tmp_path, capsys):
    from nodehealth.cli import main

    cfg = tmp_path / "nodehealth.toml"

    def write(outcome: str) -> None:
        env = ", ".join(json.dumps(f"{k}={v}") for k, v in {**FAKE_VARS, "FAKE_NCCL": outcome}.items())
        cfg.write_text(
            f'[paths]\nstate_dir = "{tmp_path}/state"\n[slurm]\nscontrol = "{tmp_path}/no-scontrol"\n'
            f'[checks.nccl_selftest]\nall_reduce_perf = "{FAKE}"\ngpus = 8\ngpu_model = "{MODEL}"\n'
            f"env = [{env}]\n"
        )

    write("replay")
    code = main(["nccl", "run", "--config", str(cfg), "--mode", "both", "--format", "json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["status"] == "OK" and set(out["details"]["runs"]) == {"nvlink", "ib_loopback"}
    write("wrong")
    code = main(["nccl", "run", "--config", str(cfg), "--mode", "nvlink", "--timeout", "10"])
    assert code == 1 and "wrong element" in capsys.readouterr().out
    assert not (tmp_path / "state").exists() or not any((tmp_path / "state").iterdir())
