"""Slurm under churn on the private multi-node Slurm (3 slurmd, each in its own UTS namespace, the
health check every 2 s on every node, each node its own nodehealth state and simulated GPUs):
a fault that comes and goes on n2 gives 3 drains, the third held for a person, while n1 and n3
are never touched; an administrator's edit of n3's reason inside the cache window is never
resumed. Every scontrol call goes through a wrapper that logs it with the node that made it."""

from __future__ import annotations

import json
import re
import shutil
from typing import Any

import pytest
from multinode import MultiNode
from slurm_cluster import BIN, SCENARIOS, slurm_missing, wait_for

pytestmark = pytest.mark.real
NODES = ("n1", "n2", "n3")


@pytest.fixture
def cluster() -> Any:
    why = slurm_missing() or (None if shutil.which("unshare") else "unshare missing")
    if why:
        pytest.skip(why)
    c = MultiNode(NODES)
    r = c.root
    hc, scontrol = r / "hc.sh", r / "scontrol"
    # A health check that outlives its slurmd must not run once the directory is gone (a config that
    # is missing means the built-in defaults: the host's own state dirs).
    hc.write_text(
        f"#!/bin/sh\nNODEHEALTH_CONFIG={r}/nh-$(hostname).toml\nexport NODEHEALTH_CONFIG\n"
        f'[ -f "$NODEHEALTH_CONFIG" ] || exit 0\nexec {BIN / "nodehealth-healthcheck"}\n'
    )
    scontrol.write_text(f'#!/bin/sh\necho "$(hostname) $*" >> {r}/scontrol-calls.log\nexec /usr/bin/scontrol "$@"\n')
    for p in (hc, scontrol):
        p.chmod(0o755)
    boot = r / "proc" / "sys" / "kernel" / "random" / "boot_id"
    boot.parent.mkdir(parents=True)
    boot.write_text("boot-1\n")
    for n in NODES:
        use(c, n, "healthy.toml")
        (r / f"nh-{n}.toml").write_text(
            "\n".join(
                [
                    f'node_name = "{n}"',
                    "[gpu]",
                    "expected_count = 8",
                    "[nvml]",
                    f'simulate = "{r}/scenario-{n}.toml"',
                    "[paths]",
                    f'state_dir = "{r}/state-{n}"',
                    f'procfs_root = "{r}/proc"',
                    "[slurm]",
                    f'scontrol = "{scontrol}"',
                    "timeout_s = 2",
                    f'conf = "{c.conf}"',
                    "[resume]",
                    "clean_runs = 1",
                    "flap_drains = 3",
                    "flap_window_s = 600",
                ]
            )
            + "\n"
        )
    c.extra = [f"HealthCheckProgram={hc}", "HealthCheckInterval=2", "HealthCheckNodeState=ANY"]
    c.start()
    yield c
    off = r / ".hc.tmp"
    off.write_text("#!/bin/sh\nexit 0\n")
    off.chmod(0o755)
    off.replace(hc)  # no health check starts from now on
    c.stop()


def use(c: MultiNode, node: str, scenario: str) -> None:
    tmp = c.root / f".scenario-{node}.tmp"
    tmp.write_text((SCENARIOS / scenario).read_text())
    tmp.replace(c.root / f"scenario-{node}.toml")


def show(c: MultiNode, node: str) -> tuple[str, str]:
    line = c.run("/usr/bin/scontrol", "show", "node", "-o", node).stdout
    state = re.search(r"\bState=(\S+)", line)
    reason = re.search(r" Reason=(.*?)(?: \[[^\]]*\])?$", line.strip())
    return (state.group(1) if state else ""), (reason.group(1) if reason else "")


def drained(c: MultiNode, node: str) -> bool:
    return "DRAIN" in show(c, node)[0]


def in_service(c: MultiNode, node: str) -> bool:
    state, reason = show(c, node)
    return "DRAIN" not in state and not reason


def state(c: MultiNode, node: str) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads((c.root / f"state-{node}" / "slurm-state.json").read_text())
        return data
    except (OSError, ValueError):
        return {}


def calls(c: MultiNode) -> list[str]:
    p = c.root / "scontrol-calls.log"
    return p.read_text().splitlines() if p.exists() else []


def wait(c: MultiNode, pred: Any, what: str) -> None:
    """A generous deadline (3 nodes' health checks share 2 busy cores); what n2 looked like if it passes."""
    try:
        wait_for(pred, 180, what)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}: n2 {show(c, 'n2')} {state(c, 'n2')} {calls(c)[-6:]}") from None


def runs_after(c: MultiNode, node: str, count: int) -> None:
    seen = [state(c, node).get("last_run", 0)]

    def more() -> bool:
        now = state(c, node).get("last_run", 0)
        if now != seen[-1]:
            seen.append(now)
        return len(seen) > count

    wait_for(more, 180, f"{count} health-check runs on {node}")


def test_flapping_on_one_node_and_an_admin_edit_on_another(cluster: MultiNode) -> None:
    c = cluster
    wait(c, lambda: all(state(c, n).get("last_run") for n in NODES), "a health check on every node")
    # n3: drained by us, one clean run reads it, then a person edits the reason at once.
    use(c, "n3", "remap-pending.toml")
    wait(c, lambda: drained(c, "n3"), "n3 drained")
    ours = show(c, "n3")[1]
    cfg = c.root / "nh-n3.toml"
    cfg.write_text(cfg.read_text().replace("clean_runs = 1", "clean_runs = 3"))
    use(c, "n3", "healthy.toml")
    wait(c, lambda: state(c, "n3").get("clean_runs", 0) >= 1, "n3's clean run 1")
    edited = f"{ours} -- investigating DO NOT RESUME"
    assert c.run("/usr/bin/scontrol", "update", "nodename=n3", "state=drain", f"reason={edited}").returncode == 0
    # n2: the fault comes and goes.
    reasons = []
    for cycle in (1, 2, 3):
        use(c, "n2", "remap-pending.toml")
        wait(c, lambda: drained(c, "n2"), f"n2 drain {cycle}")
        reasons.append(show(c, "n2")[1])
        use(c, "n2", "healthy.toml")
        if cycle < 3:
            wait(c, lambda: in_service(c, "n2"), f"n2 resume {cycle}")
    assert reasons[2].startswith("nh:flap GPU1 gpu_remapped_rows: flapping: 3 drains in 10 min"), reasons
    runs_after(c, "n2", 6)
    assert show(c, "n2")[1] == reasons[2] and drained(c, "n2")
    assert state(c, "n3").get("clean_runs", 0) >= 3 and show(c, "n3")[1] == edited and drained(c, "n3")
    assert in_service(c, "n1")
    log = calls(c)
    updates = [x for x in log if " update " in f" {x.split(' ', 1)[1]} " or x.split(" ", 2)[1] == "update"]
    by = {n: [x for x in updates if x.startswith(n + " ")] for n in NODES}
    assert by["n1"] == [] and sum("state=drain" in x for x in by["n2"]) == 3, by
    assert sum("state=resume" in x for x in by["n2"]) == 2 and not any("state=resume" in x for x in by["n3"]), by
    print(
        f"scontrol calls by node: { {n: sum(x.startswith(n + ' ') for x in log) for n in NODES} }; "
        f"updates: { {n: len(by[n]) for n in NODES} }"
    )
