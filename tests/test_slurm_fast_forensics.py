"""Against a real private Slurm cluster: the prolog's fast path from a daemon-written verdict,
and the epilog's job forensics (an XID logged while the job runs drains the node, naming the job)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from slurm_cluster import SCENARIOS, SlurmCluster, drained, requires_slurm, slurm_cluster, wait_for  # noqa: F401

from nodehealth.statedir import verdict as daemon_state

pytestmark = [pytest.mark.real, requires_slurm()]
HUNG = Path(__file__).parent.parent / "examples" / "scenarios" / "hung-nvml-init.toml"


def daemon_round_state(c: SlurmCluster) -> None:
    """One daemon-phase round of the node's checks, handed off with the daemon's own writer."""
    from nodehealth import runner
    from nodehealth.config.loader import load_valid
    from nodehealth.probes import source

    source.forget()
    # load_valid records the config as this node's last validated one, as the daemon does at start.
    cfg, _ = load_valid(str(c.nh_config))
    report: dict[str, Any] = runner.run(cfg, phase="daemon", node=c.host).to_json()
    assert report["status"] in ("OK", "WARN"), report
    boot = c.boot_id.read_text().strip()
    daemon_state.write(  # as the daemon writes it: the JSON, then its marshal form (the fast path's)
        str(c.state_dir),
        daemon_state.encode(report, boot, time.time(), "alive", interval_s=30, round=1),
    )


def test_prolog_fast_path_from_a_daemon_verdict(slurm_cluster) -> None:  # noqa: F811
    c: SlurmCluster = slurm_cluster(scenario="healthy.toml", nodehealth={"check_timeout": 5})
    daemon_round_state(c)
    # From now on NVML would hang in nvmlInit: a prolog that touched it would cost 5 s and drain.
    tmp = c.root / ".hung.tmp"
    tmp.write_text(HUNG.read_text())
    tmp.replace(c.scenario_file)
    job = c.sbatch("--gres=gpu:2", "--wrap", "echo ran")
    # A cold-path prolog would hit the hung NVML, fail the nvml check, exit 1 and have the job
    # requeued and held; the fast path lets it run to the end. Wait for either outcome (no
    # wall-clock assertion: job start on a busy 2-core machine takes seconds either way).
    got: dict[str, str] = {}

    def settled() -> bool:
        nonlocal got
        got = c.job(job)
        return got.get("JobState") == "COMPLETED" or int(got.get("Restarts", "0") or 0) > 0

    wait_for(settled, 60, f"job {job} completed or requeued")
    assert got.get("JobState") == "COMPLETED" and got.get("Restarts") == "0", got
    assert "prolog failed" not in c.log("slurmd.log")
    assert "fast path not taken" not in c.log("slurmd.log")
    wait_for(lambda: any(r["event"] == "start" and r["job_id"] == job for r in c.ledger()), 10, "ledger start")
    rec = next(r for r in c.ledger() if r["job_id"] == job)
    assert rec["gpus"] == [0, 1]


def test_epilog_drains_for_an_xid_during_the_job_naming_it(slurm_cluster) -> None:  # noqa: F811
    c: SlurmCluster = slurm_cluster(scenario="healthy.toml")
    log = c.root / "kern.log"
    log.write_text("")
    with c.nh_config.open("a") as f:  # the XID watch reads a recorded kernel log instead of /dev/kmsg
        f.write(f'[checks.gpu_xid]\nkmsg_path = "{log}"\n')
    # While the job runs, GPU 0 (0000:18:00.0) falls off the bus.
    line = "NVRM: Xid (PCI:0000:18:00): 79, pid=0, GPU has fallen off the bus."
    job = c.sbatch("--gres=gpu:1", "--wrap", f"sleep 1; echo '{line}' >> {log}; sleep 1")
    info = c.wait_job(job, ("COMPLETED", "FAILED", "CANCELLED"), 30)
    assert info["JobState"] == "COMPLETED", info
    node = c.wait_node(drained, 30, "drained by the epilog")
    assert node["reason"].startswith(f"nh:xid79 GPU0 job_forensics: job {job}: GPU 0: XID 79 during the job"), node
    record = c.drain_record()
    assert record["phase"] == "epilog" and record["job_id"] == job
    assert not (c.state_dir / "jobs" / f"{job}.json").exists()  # the baseline was consumed


def test_a_killed_daemons_verdict_sends_the_next_prolog_cold(slurm_cluster) -> None:  # noqa: F811
    """A verdict written by a daemon process that has since died is not trusted, however young."""
    import subprocess
    import sys

    c: SlurmCluster = slurm_cluster(scenario="healthy.toml", nodehealth={"check_timeout": 5})
    daemon_round_state(c)  # a fresh verdict, written by this (live) process
    env = c.face_env(job_id="501", gpus="0")
    res = subprocess.run([c.wrapper("nodehealth-prolog")], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "fast path" in res.stderr and "not taken" not in res.stderr, res.stderr
    # The same verdict, as written by a daemon that was then killed.
    path = daemon_state.path_in(str(c.state_dir))
    code = (
        "import sys, json; from nodehealth.statedir import verdict as v; raw = json.load(open(sys.argv[1])); "
        "print(v.encode(raw['report'], raw['boot_id'], raw['written_at'], 'alive', interval_s=30, round=2), "
        "end='')"
    )
    dead = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, check=True).stdout
    daemon_state.write(str(c.state_dir), dead)
    env = c.face_env(job_id="502", gpus="0")
    res = subprocess.run([c.wrapper("nodehealth-prolog")], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "fast path not taken" in res.stderr and "no longer running" in res.stderr, res.stderr
