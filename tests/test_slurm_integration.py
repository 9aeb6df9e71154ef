"""nodehealth's Slurm faces against a real private Slurm cluster (munge + slurmctld + slurmd).

Each test starts its own cluster from Debian's packages in a temp dir (tests/slurm_cluster.py)
with simulated GPUs behind the installed ``nodehealth-prolog``/``-epilog``/``-healthcheck``.
Skipped when Slurm is not installed (a skip of a ``real`` test fails the suite under CI).
"""

from __future__ import annotations

import subprocess
import time

import pytest
from conftest import Timing
from slurm_cluster import SCENARIOS, SlurmCluster, drained, requires_slurm, slurm_cluster, wait_for  # noqa: F401

pytestmark = [pytest.mark.real, requires_slurm()]

NODE_INFO_RPCS = ("REQUEST_NODE_INFO", "REQUEST_NODE_INFO_SINGLE", "REQUEST_UPDATE_NODE")


def ours(node: dict[str, str]) -> bool:
    return node["reason"].startswith("nh:")


def test_healthy_node_runs_the_job_without_calling_slurmctld(slurm_cluster) -> None:  # noqa: F811
    c: SlurmCluster = slurm_cluster(scenario="healthy.toml")
    before = c.sdiag_counts()
    job = c.sbatch("--gres=gpu:2", "--wrap", "echo CVD=$CUDA_VISIBLE_DEVICES")
    info = c.wait_job(job, ("COMPLETED", "FAILED", "CANCELLED"), 30)
    after = c.sdiag_counts()
    assert info["JobState"] == "COMPLETED", info
    assert "CVD=0,1" in (c.root / "out" / f"slurm-{job}.out").read_text()
    node = c.node()
    assert node["state"] == "idle", node
    # A passing prolog and epilog make no Slurm call (sdiag counts node RPCs cluster-wide).
    for rpc in NODE_INFO_RPCS:
        assert after.get(rpc, 0) == before.get(rpc, 0), (rpc, before, after)
    # The job ledger has the job's start and end with its GPUs.
    wait_for(lambda: any(r["event"] == "end" and r["job_id"] == job for r in c.ledger()), 10, "ledger end record")
    recs = [r for r in c.ledger() if r["job_id"] == job]
    assert [r["event"] for r in recs] == ["start", "end"]
    assert recs[0]["gpus"] == [0, 1] and recs[0]["user"] == "root" and recs[0]["node"] == c.host
    assert recs[0]["time"] <= recs[1]["time"]


def test_faulty_gpu_drains_with_our_reason_and_requeues(slurm_cluster) -> None:  # noqa: F811
    c: SlurmCluster = slurm_cluster(scenario="remap-pending.toml")
    job = c.sbatch("--gres=gpu:2", "--wrap", "hostname")
    node = c.wait_node(drained, 30, "drained")
    assert node["reason"].startswith("nh:rowremap GPU1 gpu_remapped_rows: GPU 1: row remap pending"), node
    held = ("PENDING", "launch_failed_requeued_held")
    wait_for(lambda: (c.job(job).get("JobState"), c.job(job).get("Reason")) == held, 20, "job requeued and held")
    info = c.job(job)
    assert info["Restarts"] == "1" and info["JobState"] == "PENDING", info
    # sinfo -R shows our reason (what an administrator sees).
    sinfo = c.run("/usr/bin/sinfo", "-R", "-h", "-o", "%E|%N").stdout
    assert "nh:rowremap GPU1 gpu_remapped_rows" in sinfo
    state = c.nh_state()
    assert state["drain"]["check"] == "gpu_remapped_rows" and state["drain"]["phase"] == "prolog"
    assert state["drain"]["job_id"] == job


def test_admin_drain_is_never_overwritten_nor_resumed(slurm_cluster) -> None:  # noqa: F811
    c: SlurmCluster = slurm_cluster(scenario="healthy.toml", hc_interval=1, nodehealth={"clean_runs": 2})
    c.run("/usr/bin/scontrol", "update", f"nodename={c.host}", "state=drain", "reason=admin: replacing PSU")
    start_runs = c.nh_state().get("clean_runs", 0)
    # Healthy: several clean health-check runs, more than [resume] clean_runs.
    wait_for(lambda: c.nh_state().get("clean_runs", 0) >= start_runs + 4, 30, "4 clean health-check runs")
    node = c.node()
    assert node["state"] in ("drained", "draining"), node
    assert node["reason"] == "admin: replacing PSU"
    # A faulty GPU under an admin drain: still not overwritten.
    c.use_scenario("remap-pending.toml")
    wait_for(lambda: c.nh_state().get("last_status") == "FAIL", 20, "a failing health-check run")
    time.sleep(1.5)
    node = c.node()
    assert node["reason"] == "admin: replacing PSU", node
    assert node["state"] in ("drained", "draining")


def test_our_drain_resumes_after_n_clean_health_checks(slurm_cluster) -> None:  # noqa: F811
    c: SlurmCluster = slurm_cluster(scenario="remap-pending.toml", hc_interval=1, nodehealth={"clean_runs": 3})
    node = c.wait_node(lambda n: n["state"] in ("drained", "draining") and ours(n), 30, "drained by nodehealth")
    assert node["reason"].startswith("nh:rowremap GPU1 gpu_remapped_rows")
    c.use_scenario("healthy.toml")
    seen: list[tuple[int, str]] = []

    def resumed() -> bool:
        st, n = c.nh_state(), c.node()
        seen.append((st.get("clean_runs", 0), n["state"]))
        return n["state"] in ("idle", "mixed", "allocated")

    wait_for(resumed, 40, "resume", every=0.2)
    # Never resumed before three clean runs in a row.
    assert all(runs >= 3 for runs, state in seen if state in ("idle", "mixed", "allocated")), seen
    assert any(state in ("drained", "draining") and runs >= 1 for runs, state in seen), seen
    assert c.node()["reason"] == ""
    c.drain_forgotten()  # fails (times out) while the record stays
    # And the node takes jobs again.
    job = c.sbatch("--wrap", "true")
    assert c.wait_job(job, ("COMPLETED", "FAILED", "CANCELLED"), 30)["JobState"] == "COMPLETED"


def test_reboot_class_drain_waits_for_a_new_boot_id(slurm_cluster) -> None:  # noqa: F811
    c: SlurmCluster = slurm_cluster(scenario="gpu-missing.toml", hc_interval=1, nodehealth={"clean_runs": 1})
    node = c.wait_node(lambda n: n["state"] in ("drained", "draining") and ours(n), 30, "drained by nodehealth")
    assert node["reason"].startswith("nh:gpucount gpu_count: 7 of 8 GPUs"), node
    assert c.drain_record()["action"] == "reboot"
    c.use_scenario("healthy.toml")
    wait_for(lambda: c.nh_state().get("clean_runs", 0) >= 3, 30, "3 clean runs")
    assert c.node()["state"] in ("drained", "draining")  # same boot: stays drained
    c.set_boot_id("boot-2")  # "rebooted"
    c.wait_node(lambda n: n["state"] == "idle", 30, "resumed after the boot id changed")


def test_epilog_catches_a_stray_gpu_process(slurm_cluster) -> None:  # noqa: F811
    c: SlurmCluster = slurm_cluster(scenario="healthy.toml")
    stray = c.root / "stray.toml"
    stray.write_text((SCENARIOS / "stray-process.toml").read_text())
    # The job leaves a process on its GPU 0: the simulated node changes while the job runs.
    job = c.sbatch("--gres=gpu:1", "--wrap", f"cp {stray} {c.root}/.s.tmp && mv {c.root}/.s.tmp {c.scenario_file}")
    info = c.wait_job(job, ("COMPLETED", "FAILED", "CANCELLED"), 30)
    assert info["JobState"] == "COMPLETED", info  # the job itself is not blamed
    node = c.wait_node(drained, 30, "drained by the epilog")
    assert node["reason"].startswith("nh:procs GPU0 gpu_processes: GPU 0: 1 compute process"), node
    assert c.drain_record()["phase"] == "epilog"


def test_stray_process_on_another_jobs_gpu_is_not_this_jobs_fault(slurm_cluster) -> None:  # noqa: F811
    c: SlurmCluster = slurm_cluster(scenario="stray-process.toml")  # a process on GPU 0 ...
    env = c.face_env(job_id="77", gpus="2,3")  # ... while this job got GPUs 2 and 3
    res = subprocess.run([c.wrapper("nodehealth-prolog")], env=env, capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    env = c.face_env(job_id="78", gpus="0")
    res = subprocess.run([c.wrapper("nodehealth-prolog")], env=env, capture_output=True, text=True, timeout=30)
    assert res.returncode == 1, res.stderr


def run_face(c: SlurmCluster, face: str, env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run ``face`` once for ``env``'s job; also the seconds from the start the face recorded itself to its exit.

    The start is the face's own clock: the time of the job's ``start`` record it appends to the job
    ledger once its configuration is loaded. Python's start-up and imports before it, which a loaded
    machine stretches, are not counted: the bound is on the face's work, not on the machine.
    """
    res = subprocess.run([c.wrapper(face)], env=env, capture_output=True, text=True, timeout=60)
    ended = time.time()
    starts = [r["time"] for r in c.ledger() if r["event"] == "start" and r["job_id"] == env["SLURM_JOB_ID"]]
    assert len(starts) == 1, (starts, res.stderr)
    return res, ended - starts[0]


@pytest.mark.timing
def test_prolog_keeps_its_budget_when_slurmctld_is_down(slurm_cluster, timing: Timing) -> None:  # noqa: F811
    # 2 s on a quiet machine, more on a loaded one (the budget counts from the process's start, so a
    # slow start-up eats it); scontrol's own deadline (2.5 times that) is longer: the budget must cut it.
    budget = min(timing.slack(2.0), 20.0)
    c: SlurmCluster = slurm_cluster(
        scenario="remap-pending.toml",
        nodehealth={"prolog_budget": budget, "slurm_timeout": 2.5 * budget, "check_timeout": budget / 2},
    )
    c.stop_daemon("slurmctld")
    res, elapsed = run_face(c, "nodehealth-prolog", c.face_env(job_id="141"))
    assert res.returncode == 1, res.stderr
    assert elapsed <= budget + timing.slack(0.5), (elapsed, res.stderr)
    assert "slurmctld did not answer" in res.stderr
    # A healthy node does not need slurmctld at all.
    c.use_scenario("healthy.toml")
    res, elapsed = run_face(c, "nodehealth-prolog", c.face_env(job_id="142"))
    assert res.returncode == 0, res.stderr
    assert elapsed < min(timing.slack(1.5), budget), (elapsed, res.stderr)  # a call would wait out the budget


def test_breaker_holds_when_most_nodes_are_already_drained_by_us(slurm_cluster) -> None:  # noqa: F811
    c: SlurmCluster = slurm_cluster(scenario="remap-pending.toml", ghosts=9)
    c.run(
        "/usr/bin/scontrol",
        "update",
        "nodename=ghost[1-9]",
        "state=drain",
        "reason=nodehealth: gpu_count: 7 of 8 GPUs visible",
    )
    assert c.node("ghost5")["reason"].startswith("nodehealth:")
    job = c.sbatch("--gres=gpu:1", "--wrap", "true")
    info = c.wait_job(job, ("COMPLETED", "FAILED", "CANCELLED"), 30)
    assert info["JobState"] == "COMPLETED", info  # the breaker let the job run
    node = c.node()
    assert node["state"] == "idle" and node["reason"] == "", node
    held = c.nh_state()["breaker_held"]
    assert held["ours"] == 9 and held["total"] == 10 and held["reason"].startswith("nh:rowremap GPU1 gpu_remapped_rows")
    assert "drain-storm breaker HOLDING" in c.log("slurmd.log")


def test_stray_process_drain_lasts_while_it_lives_then_resumes(slurm_cluster) -> None:  # noqa: F811
    """The epilog drains for a process its job left behind; the health check keeps the drain (and its
    first reason, naming the job) while the process lives, and resumes once it is gone."""
    c: SlurmCluster = slurm_cluster(scenario="healthy.toml", hc_interval=1, nodehealth={"clean_runs": 2})
    stray = c.root / "stray.toml"
    stray.write_text((SCENARIOS / "stray-process.toml").read_text())
    job = c.sbatch("--gres=gpu:1", "--wrap", f"cp {stray} {c.root}/.s.tmp && mv {c.root}/.s.tmp {c.scenario_file}")
    c.wait_job(job, ("COMPLETED", "FAILED", "CANCELLED"), 30)
    node = c.wait_node(drained, 30, "drained by the epilog")
    first = node["reason"]
    assert first.startswith("nh:procs GPU0 gpu_processes: GPU 0: 1 compute process") and f"left by job {job}" in first
    # Health checks every second: the process is still there, so the drain and its reason stay.
    runs = c.nh_state().get("last_run", 0)
    wait_for(lambda: c.nh_state().get("last_run", 0) > runs + 4, 30, "several health-check runs")
    node = c.node()
    assert drained(node) and node["reason"] == first, node
    state = c.nh_state()
    assert state["clean_runs"] == 0 and state["drain"]["job_id"] == job and state["drain"]["phase"] == "epilog"
    # The process ends: after [resume] clean_runs clean runs the node is back.
    c.use_scenario("healthy.toml")
    c.wait_node(lambda n: n["state"] in ("idle", "mixed", "allocated") and not n["reason"], 30, "resumed")
    c.drain_forgotten()  # fails (times out) while the record stays


def test_an_edited_reason_is_a_persons(slurm_cluster) -> None:  # noqa: F811
    """A reason that starts like ours but was edited is never overwritten and never resumed."""
    c: SlurmCluster = slurm_cluster(scenario="remap-pending.toml", hc_interval=1, nodehealth={"clean_runs": 1})
    node = c.wait_node(drained, 30, "drained by the health check")
    ours = node["reason"]
    assert ours.startswith("nh:rowremap GPU1 gpu_remapped_rows"), node
    edited = ours + " -- investigating, DO NOT RESUME"
    c.run("/usr/bin/scontrol", "update", f"nodename={c.host}", "state=drain", f"reason={edited}")
    c.use_scenario("healthy.toml")
    runs = c.nh_state().get("last_run", 0)
    wait_for(lambda: c.nh_state().get("last_run", 0) > runs + 4, 30, "several clean health-check runs")
    node = c.node()
    assert drained(node) and node["reason"] == edited, node
    # Faulty again: still not overwritten.
    c.use_scenario("remap-pending.toml")
    runs = c.nh_state().get("last_run", 0)
    wait_for(lambda: c.nh_state().get("last_run", 0) > runs + 3, 30, "failing health-check runs")
    assert c.node()["reason"] == edited
    state = c.nh_state()
    assert state["drain"] is None and "DO NOT RESUME" in state["disowned"]  # logged once, then left alone


def test_a_healthy_node_makes_no_slurm_call_from_the_health_check(slurm_cluster) -> None:  # noqa: F811
    """Steady state: health checks every second on a healthy node, no slurmctld call after the first
    view is cached ([slurm] reconcile_s is an hour)."""
    c: SlurmCluster = slurm_cluster(scenario="healthy.toml", hc_interval=1)
    wait_for(lambda: c.nh_state().get("slurm_node") is not None, 30, "the first health check's view")
    before = c.sdiag_counts()
    runs = c.nh_state().get("last_run", 0)
    wait_for(lambda: c.nh_state().get("last_run", 0) > runs + 5, 30, "five more health-check runs")
    after = c.sdiag_counts()
    node_info = after.get("REQUEST_NODE_INFO", 0) - before.get("REQUEST_NODE_INFO", 0)
    updates = after.get("REQUEST_UPDATE_NODE", 0) - before.get("REQUEST_UPDATE_NODE", 0)
    assert (node_info, updates) == (0, 0), (before, after)
