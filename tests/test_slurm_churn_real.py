"""Slurm under churn against a real private Slurm (munge + slurmctld + slurmd, health check every
second): a flapping fault gives K drains, the last held for a person; an admin's edit inside the
cache window is never resumed; a stray's drain lasts while NVML lists it, whatever its cgroup says;
a wiped state dir gives the orphan line. scontrol is called through a wrapper that logs each call."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from slurm_cluster import SCENARIOS, SlurmCluster, drained, logged_scontrol, requires_slurm, slurm_cluster, wait_for  # noqa: F401

pytestmark = [pytest.mark.real, requires_slurm()]


def calls(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def in_service(n: dict[str, str]) -> bool:
    return n["state"] in ("idle", "mixed", "allocated") and not n["reason"]


def runs_after(c: SlurmCluster, count: int) -> None:
    """Wait for ``count`` more health-check runs (their last_run in the state file)."""
    start = c.nh_state().get("last_run", 0)
    seen = [start]

    def more() -> bool:
        now = c.nh_state().get("last_run", 0)
        if now != seen[-1]:
            seen.append(now)
        return len(seen) > count

    wait_for(more, 60, f"{count} health-check runs")


def test_a_flapping_fault_gives_k_drains_then_one_held_for_a_person(slurm_cluster, tmp_path: Path) -> None:  # noqa: F811
    wrapper, log = logged_scontrol(tmp_path)
    c: SlurmCluster = slurm_cluster(
        scenario="remap-pending.toml",
        hc_interval=1,
        nodehealth={
            "clean_runs": 1,
            "slurm": {"scontrol": f'"{wrapper}"'},
            "resume": {"flap_drains": 3, "flap_window_s": 600},
        },
    )
    reasons = []
    for cycle in range(1, 4):
        node = c.wait_node(drained, 60, f"drain {cycle}")
        reasons.append(node["reason"])
        c.use_scenario("healthy.toml")
        if cycle < 3:
            c.wait_node(in_service, 60, f"resume {cycle}")
            c.use_scenario("remap-pending.toml")
    assert reasons[0].startswith("nh:rowremap GPU1 ") and reasons[1].startswith("nh:rowremap GPU1 ")
    assert reasons[2].startswith("nh:flap GPU1 gpu_remapped_rows: flapping: 3 drains in 10 min, resume by hand")
    runs_after(c, 6)  # clean runs well past the backoff's 4: never resumed
    node = c.node()
    assert drained(node) and node["reason"] == reasons[2], node
    state = c.nh_state()
    assert state["drain"]["flapping"] is True and state["clean_runs"] >= 4
    updates = [x for x in calls(log) if x.startswith("update")]
    assert sum("state=drain" in x for x in updates) == 3 and sum("state=resume" in x for x in updates) == 2, updates
    print(f"scontrol calls: {len(calls(log))} ({len(updates)} updates)", file=sys.stderr)


def drained_then_clean(make: Any, tmp_path: Path, clean_runs: int) -> tuple[SlurmCluster, Path, str]:
    """A node the health check (every second, scontrol logged) drained for a row remap, then one clean run
    (it reads the node: still our drain): the cluster, the scontrol log and our reason."""
    wrapper, log = logged_scontrol(tmp_path)
    c: SlurmCluster = make(
        scenario="remap-pending.toml",
        hc_interval=1,
        nodehealth={"clean_runs": clean_runs, "slurm": {"scontrol": f'"{wrapper}"'}},
    )
    ours = c.wait_node(drained, 60, "drained by the health check")["reason"]
    c.use_scenario("healthy.toml")
    wait_for(lambda: c.nh_state().get("clean_runs", 0) >= 1, 60, "clean run 1 (it reads the node)")
    return c, log, ours


def test_an_admin_edit_inside_the_cache_window_is_never_resumed(slurm_cluster, tmp_path: Path) -> None:  # noqa: F811
    c, log, ours = drained_then_clean(slurm_cluster, tmp_path, clean_runs=3)
    seen = c.nh_state()["slurm_node"]["time"]
    edited = f"{ours} -- investigating DO NOT RESUME"
    c.run("/usr/bin/scontrol", "update", f"nodename={c.host}", "state=drain", f"reason={edited}")
    # The edit lands well inside the 60 s a cached view used to be trusted for.
    wait_for(lambda: c.nh_state().get("clean_runs", 0) >= 5, 60, "clean runs past the resume")
    node = c.node()
    assert drained(node) and node["reason"] == edited, node
    state = c.nh_state()
    assert state["drain"] is None and "DO NOT RESUME" in (state["disowned"] or "")
    assert not any("state=resume" in x for x in calls(log)), calls(log)
    assert seen is not None


def test_a_fault_back_after_a_resume_by_hand_drains_again(slurm_cluster, tmp_path: Path) -> None:  # noqa: F811
    """Drained; the fault clears (a clean run reads the node: still our drain); a person resumes it by
    hand while our record stays; the fault comes back: the health check reads the node back and drains
    it again, rather than trusting the record ("already drained") for up to [slurm] reconcile_s."""
    c, log, ours = drained_then_clean(slurm_cluster, tmp_path, clean_runs=50)
    c.run("/usr/bin/scontrol", "update", f"nodename={c.host}", "state=resume")
    c.wait_node(in_service, 30, "resumed by hand")
    assert c.nh_state()["drain"] is not None  # our record stays
    c.use_scenario("remap-pending.toml")
    node = c.wait_node(drained, 60, "drained again after the fault came back")
    assert node["reason"].startswith("nh:rowremap GPU1 ") and node["reason"] != "", (node, ours)
    assert sum("state=drain" in x for x in calls(log)) == 2, calls(log)


def test_a_stray_in_its_jobs_cgroup_stays_drained_until_it_is_gone(slurm_cluster) -> None:  # noqa: F811
    c: SlurmCluster = slurm_cluster(scenario="healthy.toml", hc_interval=1, nodehealth={"clean_runs": 1})
    stray = c.root / "stray.toml"
    stray.write_text((SCENARIOS / "stray-process.toml").read_text())
    job = c.sbatch("--gres=gpu:1", "--wrap", f"cp {stray} {c.root}/.s.tmp && mv {c.root}/.s.tmp {c.scenario_file}")
    c.wait_job(job, ("COMPLETED", "FAILED", "CANCELLED"), 60)
    first = c.wait_node(drained, 60, "drained by the epilog")["reason"]
    assert first.startswith("nh:procs GPU0 ") and f"left by job {job}" in first
    # The process (pid 4242 of the simulated GPU 0) is still in the ended job's cgroup.
    cgroup = c.procfs / "4242" / "cgroup"
    cgroup.parent.mkdir(parents=True, exist_ok=True)
    cgroup.write_text(f"0::/system.slice/slurmstepd.scope/job_{job}/step_batch/user/task_0\n")
    runs_after(c, 5)
    node = c.node()
    assert drained(node) and node["reason"] == first, node
    assert c.nh_state()["clean_runs"] == 0
    c.use_scenario("healthy.toml")  # NVML lists no process any more
    c.wait_node(in_service, 60, "resumed once the process is gone")


def test_a_wiped_state_dir_gives_the_orphan_line_and_metric(slurm_cluster, tmp_path: Path) -> None:  # noqa: F811
    wrapper, log = logged_scontrol(tmp_path)
    c: SlurmCluster = slurm_cluster(
        scenario="remap-pending.toml",
        hc_interval=1,
        nodehealth={"clean_runs": 1, "slurm": {"scontrol": f'"{wrapper}"'}},
    )
    ours = c.wait_node(drained, 60, "drained by the health check")["reason"]
    c.use_scenario("healthy.toml")
    (c.persistent_dir / "slurm-state.json").unlink()  # the state lost while drained by us
    wait_for(lambda: c.nh_state().get("orphan") is not None, 60, "the orphan said")
    runs_after(c, 4)
    node = c.node()
    assert drained(node) and node["reason"] == ours, node
    assert not any("state=resume" in x for x in calls(log))
    env = dict(os.environ, NODEHEALTH_CONFIG=str(c.nh_config))
    out = subprocess.run(
        [sys.executable, "-m", "nodehealth", "status"], capture_output=True, text=True, env=env, timeout=60
    )
    (line,) = [x for x in out.stdout.splitlines() if "ORPHAN" in x]
    assert f"scontrol update nodename={c.host} state=resume" in line and out.returncode == 1, out.stdout
    from nodehealth.config.loader import load
    from nodehealth.daemon.hooks import slurm_view
    from nodehealth.metrics import NodeMetrics
    from nodehealth.slurm.act import Acted, ActOutcome

    m = NodeMetrics(c.host, process=False)
    m.set_slurm(slurm_view(Acted(ActOutcome.NONE), load(str(c.nh_config)).paths))
    assert "nodehealth_slurm_orphan_drain 1.0" in m.payload().decode()


def test_slurmd_logs_one_health_check_failure_per_drain(slurm_cluster) -> None:  # noqa: F811
    """Exit 1 on the run that drains, 0 while our drain holds the node for the same check: slurmd's
    "error: health_check failed: rc:1" once, not on every run (Slurm acts on none of them)."""
    c: SlurmCluster = slurm_cluster(scenario="remap-pending.toml", hc_interval=1, nodehealth={"clean_runs": 1})
    c.wait_node(drained, 60, "drained by the health check")
    runs_after(c, 6)
    assert drained(c.node())
    failed = [x for x in c.log("slurmd.log").splitlines() if "health_check failed" in x]
    assert len(failed) == 1, failed
