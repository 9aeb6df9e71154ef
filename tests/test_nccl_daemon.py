"""The daemon's NCCL self-test schedule: it runs only on an idle node (no ledger job, no GPU process),
its result joins the rounds' reports and metrics, and a result a job started into is dropped."""

from __future__ import annotations

import io
import json
import sys
import time
from pathlib import Path

import pytest
from test_daemon_util import SCENARIOS, sample

from nodehealth.config import loader as config
from nodehealth.daemon import selftest
from nodehealth.model import CheckResult, Status
from nodehealth.observations import GpuObservation, GpuProcess, NvmlSnapshot, Observations
from nodehealth.statedir import ledger

ROOT = Path(__file__).resolve().parent.parent
FAKE = ROOT / "tests" / "fakes" / "all_reduce_perf"
A100 = ROOT / "tests" / "fixtures" / "nccl_selftest" / "gcm_single_node_8xA100.txt"


def _daemon(tmp_path: Path, scenario: str = "healthy-8x-h100", extra: str = ""):
    from nodehealth.daemon.core import Daemon
    from nodehealth.daemon.logs import Log

    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    kmsg = tmp_path / "kmsg"
    kmsg.touch()
    text = (
        f'node_name = "gpu001"\n[nvml]\nsimulate = "{SCENARIOS / (scenario + ".toml")}"\n'
        f'[paths]\nstate_dir = "{state}"\n[daemon]\nlisten = ""\nslurm_actions = false\nxid_follow = false\n'
        f'[checks.gpu_xid]\nkmsg_path = "{kmsg}"\n'
        f'[checks.nccl_selftest]\nall_reduce_perf = "{FAKE}"\ngpus = 8\n'
        f'gpu_model = "NVIDIA A100-SXM4-80GB"\ninterval_s = 3600\njitter_s = 0\ntimeout_s = 20\n'
        f"env = [{', '.join(json.dumps(f'{k}={v}') for k, v in FAKE_VARS.items())}]\n" + extra
    )
    path = tmp_path / "nodehealth.toml"
    path.write_text(text)
    cfg = config.load(str(path))
    d = Daemon(
        cfg,
        str(path),
        log=Log(stream=io.StringIO()),
        slurm=None,
        xid=None,
        notify=lambda s: True,
        use_default_hooks=False,
    )
    return d, cfg


# The double's controls reach it through the check's ``env`` (the runner inherits no environment).
FAKE_VARS: dict[str, str] = {}


@pytest.fixture
def fake(monkeypatch, tmp_path):
    record = tmp_path / "argv.json"
    monkeypatch.setattr(
        sys.modules[__name__],
        "FAKE_VARS",
        {"FAKE_NCCL_FIXTURE": str(A100), "FAKE_NCCL_ARGV": str(record), "FAKE_NCCL": "replay"},
    )
    return record


def _names(report) -> list[str]:
    return [r.name for r in report.results]


def test_an_idle_node_runs_the_self_test_and_every_round_carries_its_result(tmp_path, fake):
    d, cfg = _daemon(tmp_path)
    report = d.round()
    assert fake.exists(), "the self-test did not run on an idle node"
    res = {r.name: r for r in report.results}["nccl_selftest"]
    assert res.status == Status.OK and "231.72" in res.summary
    text = d.metrics.payload().decode()
    assert sample(text, "nodehealth_nccl_busbw_gbps", mode="nvlink") == 231.72
    assert sample(text, "nodehealth_nccl_floor_gbps", mode="nvlink") == 228.0
    assert sample(text, "nodehealth_nccl_transport_info", mode="nvlink", transport="p2p") == 1
    fake.unlink()
    report = d.round()  # not due again for an hour: not run, its result still in the report
    assert not fake.exists() and "nccl_selftest" in _names(report)


def test_a_running_job_in_the_ledger_keeps_it_from_running(tmp_path, fake):
    d, cfg = _daemon(tmp_path)
    ledger.append(
        cfg.paths.state_dir,
        {
            "v": 1,
            "event": "start",
            "job_id": "4242",
            "user": "alice",
            "gpus": [0],
            "node": "gpu001",
            "time": time.time() - 60,
            "boot_id": d.boot_id,
        },
        1 << 20,
    )
    report = d.round()
    assert not fake.exists(), "the self-test ran while job 4242 held the node"
    assert "nccl_selftest" not in _names(report)
    assert d.selftest.due()  # still due: it runs once the job has ended
    ledger.append(
        cfg.paths.state_dir,
        {"v": 1, "event": "end", "job_id": "4242", "time": time.time(), "boot_id": d.boot_id},
        1 << 20,
    )
    report = d.round()
    assert fake.exists() and "nccl_selftest" in _names(report)


def test_a_compute_process_on_a_gpu_keeps_it_from_running(tmp_path, fake):
    d, _ = _daemon(tmp_path, "stray-compute-process")
    report = d.round()
    assert not fake.exists(), "the self-test ran next to a GPU process"
    assert "nccl_selftest" not in _names(report)


def test_busy_reasons():
    idle = NvmlSnapshot("550", 12040, 2, (GpuObservation(0, processes=()), GpuObservation(1, processes=())), 0.1)
    assert selftest.busy_reason(idle, ()) == ""
    busy = NvmlSnapshot("550", 12040, 1, (GpuObservation(0, processes=(GpuProcess(7),)),), 0.1)
    assert "1 compute process" in selftest.busy_reason(busy, ())
    unknown = NvmlSnapshot("550", 12040, 1, (GpuObservation(0, processes=None),), 0.1)
    assert "could not be read" in selftest.busy_reason(unknown, ())
    cut = NvmlSnapshot("550", 12040, 2, (), 0.1, complete=False)
    assert "cut off" in selftest.busy_reason(cut, ())
    assert "no NVML snapshot" in selftest.busy_reason(None, ())
    assert "job 9" in selftest.busy_reason(idle, (ledger.JobEntry("9", 1.0, None, "u", None),))


def test_a_job_that_started_during_the_run_drops_the_result_and_keeps_it_due():
    now = [100.0]
    sched = selftest.Schedule(3600, 0, clock=lambda: now[0])
    obs = Observations(nvml=NvmlSnapshot("550", 12040, 1, (GpuObservation(0, processes=()),), 0.1))
    calls = iter([(), (ledger.JobEntry("77", 101.0, None, "u", None),)])
    res = CheckResult("nccl_selftest", Status.FAIL, "slow")
    got = selftest.maybe_run(sched, obs, lambda: next(calls), lambda: res)
    assert got.ran and got.result is None and "job 77 started" in got.why
    assert sched.due()
    got = selftest.maybe_run(sched, obs, lambda: (), lambda: res)
    assert got.result is res and not sched.due()
    now[0] += 3600
    assert sched.due()


def test_interval_zero_never_runs(tmp_path):
    sched = selftest.Schedule(0, 0)
    assert not sched.due()
    assert not selftest.maybe_run(sched, None, lambda: (), lambda: None).ran


def test_no_slurm_call_decides_idle(tmp_path, fake, monkeypatch):
    """Idle comes from the ledger and NVML: no Scontrol is made in a round that runs the self-test
    (the GPU count is configured, so the round itself needs no Slurm view either)."""
    d, cfg = _daemon(tmp_path, extra="[gpu]\nexpected_count = 8\n")
    called = []
    monkeypatch.setattr(
        "nodehealth.slurm.client.Scontrol.__init__",
        lambda *a, **k: called.append(a) or (_ for _ in ()).throw(AssertionError("slurm")),
    )
    d.round()
    assert fake.exists() and not called
    assert json.loads(fake.read_text())["env"]["NCCL_DEBUG"] == "INFO"
