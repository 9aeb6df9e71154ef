"""nodehealth preflight on a real multi-node Slurm (4 slurmd on this machine): each bad node named."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from multinode import MultiNode
from slurm_cluster import BIN, SCENARIOS, slurm_missing

pytestmark = pytest.mark.real


@pytest.fixture(scope="module")
def cluster() -> Any:
    why = slurm_missing() or (None if shutil.which("unshare") else "unshare missing")
    if why:
        pytest.skip(why)
    c = MultiNode(["n1", "n2", "n3", "n4"], private=["n4"]).start()
    yield c
    c.stop()


def _scenario(c: MultiNode, node: str, name: str, driver: str = "") -> None:
    text = (SCENARIOS / name).read_text()
    if driver:
        text = text.replace('driver_version = "550.127.05"', f'driver_version = "{driver}"')
    scen = c.root / f"scenario-{node}.toml"
    scen.write_text(text)
    (c.root / f"nh-{node}.toml").write_text(f'[nvml]\nsimulate = "{scen}"\n[slurm]\nconf = "{c.conf}"\n')


def _preflight(c: MultiNode, *srun: str, args: tuple[str, ...] = (), timeout: float = 60) -> Any:
    """``srun [srun options] nodehealth preflight --config nh-%n.toml --timeout 3 [args]``."""
    return c.run(
        "/usr/bin/srun",
        "--ntasks-per-node=1",
        "-D",
        str(c.shared),
        *srun,
        str(BIN / "nodehealth"),
        "preflight",
        "--config",
        str(c.root / "nh-%n.toml"),
        "--timeout",
        "3",
        *args,
        timeout=timeout,
    )


def test_healthy_allocation_passes(cluster: MultiNode) -> None:
    for n in ("n1", "n2", "n3", "n4"):
        _scenario(cluster, n, "healthy.toml")
    t0 = time.monotonic()
    res = _preflight(cluster, "-w", "n[1-3]")
    wall = time.monotonic() - t0
    assert res.returncode == 0, res.stdout + res.stderr
    assert "verdict: PASS (3 node(s)" in res.stdout
    print(f"healthy 3-node preflight through srun: {wall:.2f} s")  # the goal is <= 3 s (bench: docs/performance.md)
    assert os.listdir(cluster.shared) == []


def test_bad_nodes_are_named(cluster: MultiNode) -> None:
    _scenario(cluster, "n1", "healthy.toml")
    _scenario(cluster, "n2", "healthy.toml", driver="535.104.05")
    _scenario(cluster, "n3", "gpu-missing.toml")
    _scenario(cluster, "n4", "healthy.toml")
    res = _preflight(cluster, "-N4", "-l")
    out = res.stdout
    print(out)
    assert res.returncode != 0
    assert "FAIL n2: NVIDIA driver 535.104.05 (2 other node(s): 550.127.05)" in out
    assert any(line.startswith("0: FAIL n3: gpu_count FAIL") for line in out.splitlines()), out
    assert "0: FAIL n4: no report in" in out
    assert "3: FAIL n4: no verdict from the first node" in out and "tmpfs" in out
    assert "verdict: FAIL (3 of 4: n2, n3, n4)" in out
    assert os.listdir(cluster.shared) == []
    seen = cluster.run("/usr/bin/srun", "-w", "n4", "ls", "-A", str(cluster.shared))
    assert seen.returncode == 0 and seen.stdout.strip() == ""  # n4's private view is empty too


# ---- --nccl --across: one all-reduce over the step, the all_reduce_perf double as each node's rank

FAKE_NCCL = Path(__file__).resolve().parent / "fakes" / "all_reduce_perf"
A100 = Path(__file__).resolve().parent / "fixtures" / "nccl_selftest" / "gcm_single_node_8xA100.txt"


def _across_nodes(c: MultiNode, outcomes: dict[str, str], table_scale: float = 1.0) -> None:
    """n1..n3 healthy (NVML), each with the double as all_reduce_perf and its own outcome across."""
    for n, outcome in outcomes.items():
        _scenario(c, n, "healthy.toml")
        scale = f', "FAKE_NCCL_TABLE_SCALE={table_scale}"' if n == "n1" else ""
        with (c.root / f"nh-{n}.toml").open("a") as f:
            f.write(
                f'[checks.nccl_selftest]\nall_reduce_perf = "{FAKE_NCCL}"\nrunner = "nccl-tests"\ngpus = 8\n'
                f'gpu_model = "NVIDIA A100-SXM4-80GB"\n'
                f'env = ["FAKE_NCCL_FIXTURE={A100}", "FAKE_NCCL_ACROSS={outcome}"{scale}]\n'
            )


def _across(c: MultiNode, *more: str) -> Any:
    # srun --mpi=pmix needs the PMIx library, which Debian's Slurm 22.05 does not pull in; pmi2 is built in.
    args = ("--nccl", "--across", "--nccl-timeout", "4", *more)
    return _preflight(c, "--mpi=pmi2", "-w", "n[1-3]", args=args, timeout=90)


def _drained(c: MultiNode) -> list[str]:
    res = c.run("/usr/bin/sinfo", "-h", "-N", "-n", "n[1-3]", "-o", "%N %T")
    return [line for line in res.stdout.splitlines() if "drain" in line]


def test_across_three_healthy_nodes_pass(cluster: MultiNode) -> None:
    _across_nodes(cluster, {"n1": "replay", "n2": "replay", "n3": "replay"})
    res = _across(cluster, "--expect-ib", "--min-busbw", "150")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "all-reduce across 3 node(s): 210.988 GB/s bus bandwidth" in res.stdout
    assert "verdict: PASS (3 node(s)" in res.stdout
    assert os.listdir(cluster.shared) == []


def test_across_names_the_node_on_sockets(cluster: MultiNode) -> None:
    _across_nodes(cluster, {"n1": "replay", "n2": "socket", "n3": "replay"})
    res = _across(cluster, "--expect-ib", "--format", "json")
    assert res.returncode == 1, res.stdout + res.stderr
    doc = json.loads(res.stdout)
    assert doc["verdict"]["failed_nodes"] == ["n2"], doc["findings"]
    (f,) = [f for f in doc["findings"] if f["severity"] == "FAIL"]
    assert "went over TCP, not InfiniBand: n1->n2 via NET/Socket, n2->n3 via NET/Socket" in f["text"]
    assert doc["across"]["n2"]["transport"] == "socket" and doc["across"]["n1"]["transport"] == "ib"
    assert os.listdir(cluster.shared) == []


def test_across_names_the_node_of_the_slow_link(cluster: MultiNode) -> None:
    _across_nodes(cluster, {"n1": "replay", "n2": "replay", "n3": "nogdr"}, table_scale=0.5)
    res = _across(cluster, "--min-busbw", "150")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "FAIL n3: all-reduce across 3 node(s): 105.495 GB/s bus bandwidth, below 150; the slow link: n3" in (
        res.stdout
    )
    assert "WARN n3: its InfiniBand connections have no GPUDirect RDMA (n2->n3, n3->n1)" in res.stdout
    assert "verdict: FAIL (1 of 3: n3)" in res.stdout


@pytest.mark.parametrize("attack", ["hang", "flood", "hostile"])
def test_across_attacks_are_bounded_and_named(cluster: MultiNode, attack: str) -> None:
    _across_nodes(cluster, {"n1": "replay", "n2": attack, "n3": "replay"})
    t0 = time.monotonic()
    res = _across(cluster)
    wall = time.monotonic() - t0
    out = res.stdout
    assert wall < 3 + 4 + 4 + 10, wall  # timeout + nccl-timeout (the local self-test) + the part's own
    assert "\x1b" not in out and "Traceback" not in out + res.stderr, out
    if attack == "hostile":  # printing escapes, a forged verdict and 10,000 lines is not a fault
        assert res.returncode == 0 and "verdict: PASS (3 node(s)" in out, out
    else:
        assert res.returncode == 1 and "verdict: FAIL (1 of 3: n2)" in out, out
        why = "did not finish within 4.0 s" if attack == "hang" else "printed past the output cap"
        assert f"FAIL n2: its part of the all-reduce {why}" in out, out
    assert _drained(cluster) == []  # a pre-flight never drains for what the all-reduce saw
    assert os.listdir(cluster.shared) == []
