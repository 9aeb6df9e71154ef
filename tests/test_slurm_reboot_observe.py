"""Observe mode and the reboot loop against a real private Slurm (munge + slurmctld + slurmd).

Observe mode: nodehealth calls scontrol through a wrapper that logs every call, so "no update"
is what scontrol was asked, and sdiag says the same of slurmctld. The reboot loop: slurm.conf's
``RebootProgram`` is a script that only records the call (it must never reboot the host); the
boot is simulated by a new boot id under ``[paths] procfs_root``; slurmctld gives up waiting for
it after ``ResumeTimeout`` ("reboot timed out") and ``ReturnToService=2`` takes the node back as
slurmd answers, much as ``nextstate=RESUME`` does after a real boot.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from slurm_cluster import SlurmCluster, drained, logged_scontrol, requires_slurm, slurm_cluster, wait_for  # noqa: F401

pytestmark = [pytest.mark.real, requires_slurm()]


def doc(c: SlurmCluster, name: str) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads((c.state_dir / name).read_text())
        return data
    except (OSError, ValueError):
        return {}


def would(c: SlurmCluster) -> dict[str, int]:
    counts: dict[str, int] = doc(c, "slurm-observe.json").get("would") or {}
    return counts


def test_observe_mode_makes_no_update_while_faults_come_and_go(slurm_cluster, tmp_path: Path) -> None:  # noqa: F811
    wrapper, calls = logged_scontrol(tmp_path)
    c: SlurmCluster = slurm_cluster(
        scenario="remap-pending.toml",
        hc_interval=1,
        nodehealth={"clean_runs": 1, "slurm": {"mode": '"observe"', "scontrol": f'"{wrapper}"'}},
    )
    before = c.sdiag_counts()
    wait_for(lambda: would(c).get("drain", 0) >= 1, 30, "a would-be drain")
    job = c.sbatch("--gres=gpu:1", "--wrap", "true")  # prolog and epilog see the fault: exit 0, the job runs
    assert c.wait_job(job, ("COMPLETED", "FAILED", "CANCELLED"), 60)["JobState"] == "COMPLETED"
    c.use_scenario("healthy.toml")
    wait_for(lambda: would(c).get("resume", 0) >= 1, 30, "a would-be resume")
    c.use_scenario("remap-pending.toml")
    wait_for(lambda: would(c).get("drain", 0) >= 2, 30, "the second would-be drain")
    node = c.node()
    assert node["state"] in ("idle", "mixed", "allocated") and not node["reason"], node
    lines = calls.read_text().splitlines()
    assert lines and all(line.startswith("show node") for line in lines), lines  # reads only
    after = c.sdiag_counts()
    assert after.get("REQUEST_UPDATE_NODE", 0) == before.get("REQUEST_UPDATE_NODE", 0), (before, after)
    assert would(c).get("resume") == 1 and doc(c, "slurm-observe.json")["last"]["line"].startswith("would drain")
    assert "health_check failed" not in c.log("slurmd.log")  # the health check exits 0 in observe mode


def test_reboot_loop_reboots_twice_then_holds_for_a_person(slurm_cluster, tmp_path: Path) -> None:  # noqa: F811
    record = tmp_path / "reboots.log"
    program = tmp_path / "rebootprogram"
    program.write_text(f'#!/bin/sh\necho "reboot $*" >> {record}\n')  # records the call, reboots nothing
    program.chmod(0o755)
    c: SlurmCluster = slurm_cluster(
        scenario="gpu-missing.toml",
        hc_interval=1,
        nodehealth={
            "clean_runs": 1,
            "slurm": {"reboot": '"asap"', "reboot_max": 2},
            "slurm_conf": [f"RebootProgram={program}", "ResumeTimeout=5"],
        },
    )

    def reboots() -> int:
        return len(record.read_text().splitlines()) if record.exists() else 0

    for n in (1, 2):
        wait_for(lambda n=n: reboots() >= n, 120, f"reboot {n} run by slurmd")  # type: ignore[misc]
        c.set_boot_id(f"boot-{n + 1}")  # "rebooted": the fault is still there
        # slurmctld gives up waiting for the boot after ResumeTimeout (its background check runs every
        # 30 s) and takes the node back (ReturnToService=2): the health check drains it again.
    node = c.wait_node(lambda x: drained(x) and x["reason"].startswith("nh:inspect"), 120, "held for a person")
    assert node["reason"].startswith("nh:inspect gpu_count: 2 reboots in 24 h"), node
    runs = c.nh_state().get("last_run", 0)
    wait_for(lambda: c.nh_state().get("last_run", 0) > runs + 4, 30, "several health-check runs")
    assert reboots() == 2 and drained(c.node()) and c.node()["reason"].startswith("nh:inspect")
    assert c.nh_state()["drain"]["flapping"] is True  # never resumed by nodehealth
    counted = doc(c, "reboots.json")
    assert len(counted["checks"]["gpu_count"]) == 2 and "gpu_count" in counted["escalated"]
