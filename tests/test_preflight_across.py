"""preflight --across's pure parts: the NET channel lines of real NCCL logs, and rank 0's judgement."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from nodehealth.config import loader as C
from nodehealth.preflight import across, schema

REAL = Path(__file__).resolve().parent / "fixtures" / "real-world" / "nccl_debug"
ROOT = Path(__file__).resolve().parent.parent
NODES = ["n1", "n2", "n3"]


def test_net_pairs_from_real_logs() -> None:
    # NCCL 2.19+ "%d[%d]" with a rank prefix before the host (NVIDIA/nccl#1232)
    socket_log = across.net_pairs((REAL / "socket_nccl_1232_rank_prefix_shm.txt").read_text())
    assert socket_log["0->1"] == {"net": "Socket", "gdr": False}
    assert socket_log["2->1"] == {"net": "Socket", "gdr": False}
    assert "2->0" not in socket_log  # SHM inside the node is no NET pair
    # NCCL before 2.18: "%d[%lx]" (bus ids in hex), no "/0" after the channel (NVIDIA/nccl#834)
    busid = across.net_pairs((REAL / "ib_nccl_834_busid_format_gdrdma.txt").read_text())
    assert busid == {"11->0": {"net": "IB", "gdr": True}, "1->10": {"net": "IB", "gdr": True}}
    assert across.net_pairs((REAL / "ib_nccl_1657_net_ib_without_gdr.txt").read_text())
    assert all(
        not p["gdr"] for p in across.net_pairs((REAL / "ib_nccl_1657_net_ib_without_gdr.txt").read_text()).values()
    )


def test_net_pairs_are_bounded() -> None:
    text = "".join(f"h:1:1 [0] NCCL INFO Channel 00/0 : {i}[0] -> {i + 1}[0] [send] via NET/IB/0\n" for i in range(999))
    assert len(across.net_pairs(text)) == across.MAX_PAIRS


def test_launch_env_passes_the_mpi_place_and_nothing_else() -> None:
    env = {"PMIX_RANK": "1", "PMI_FD": "11", "SLURM_PROCID": "1", "LD_PRELOAD": "/tmp/x.so", "PATH": "/tmp"}
    assert across.launch_env(env) == {"PMIX_RANK": "1", "PMI_FD": "11", "SLURM_PROCID": "1"}


PMI = {"PMI_RANK": "1", "PMI_SIZE": "3", "PMI_JOBID": "42.0"}


def test_the_pmi2_socket_is_kept_open_with_its_variables() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        env = {**PMI, "PMI_FD": str(theirs.fileno())}
        assert across.launch_fds(env) == ((theirs.fileno(),), env, [])


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("abc", "not a descriptor number"),
        ("-4", "not a descriptor number"),
        (" 5", "not a descriptor number"),
        ("1", "fd 1 is not a descriptor number from 3 to 1023"),
        ("99999", "fd 99999 is not a descriptor number from 3 to 1023"),
    ],
)
def test_a_pmi_fd_that_is_no_small_number_above_stdio_is_not_passed(value: str, why: str) -> None:
    fds, env, notes = across.launch_fds({**PMI, "PMI_FD": value})
    assert fds == () and env == PMI  # the variable goes too: the child must not write PMI to another fd
    assert notes == [f"PMI_FD={value} not passed to all_reduce_perf: {why}"]


def test_a_pmi_fd_naming_a_regular_file_or_a_closed_fd_is_not_passed(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "f", os.O_CREAT | os.O_WRONLY, 0o600)
    try:
        fds, env, notes = across.launch_fds({**PMI, "PMI_FD": str(fd)})
        assert fds == () and "PMI_FD" not in env and notes[0].endswith(f"fd {fd} is not a socket (a regular file)")
    finally:
        os.close(fd)
    fds, env, notes = across.launch_fds({**PMI, "PMI_FD": str(fd)})
    assert fds == () and "PMI_FD" not in env and f"fd {fd} is not open" in notes[0]


def test_a_pmi_fd_without_its_rank_and_size_is_not_passed() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        fds, env, notes = across.launch_fds({"PMI_RANK": "1", "PMI_FD": str(theirs.fileno())})
        assert fds == () and env == {"PMI_RANK": "1"} and "no PMI_RANK and PMI_SIZE" in notes[0]
    assert across.launch_fds({"SLURM_PROCID": "1"}) == ((), {"SLURM_PROCID": "1"}, [])


def _mpi_double(tmp_path: Path) -> Path:
    """An all_reduce_perf that sends PMI2's first command to the descriptor of ``PMI_FD`` (MPICH's
    simple PMI2 client: ``cmd=init pmi_version=2 pmi_subversion=0``, length-prefixed)."""
    prog = tmp_path / "all_reduce_perf"
    prog.write_text(
        f"#!{sys.executable} -I\nimport os\nmsg = b'cmd=init;pmi_version=2;pmi_subversion=0;'\n"
        "os.write(int(os.environ['PMI_FD']), b'%-6d' % len(msg) + msg)\nprint('init sent')\n"
    )
    prog.chmod(0o755)
    return prog


def _cfg(prog: Path) -> Any:
    raw = {"checks": {"nccl_selftest": {"all_reduce_perf": str(prog), "runner": "nccl-tests", "gpus": 8}}}
    return C.resolve(raw, "<test>", host="n2", environ={})


def test_the_part_reaches_its_pmi2_server_through_the_passed_socket(tmp_path: Path) -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        environ = {**PMI, "PMI_FD": str(theirs.fileno()), "LD_PRELOAD": "/x.so"}
        part = across.run_part(_cfg(_mpi_double(tmp_path)), environ, 30, leader=False)
        assert part["returncode"] == 0 and part["notes"] == [], part
        ours.settimeout(10)
        assert ours.recv(256) == b"40    cmd=init;pmi_version=2;pmi_subversion=0;"


def test_a_part_whose_pmi_fd_was_not_passed_says_so_in_its_finding(tmp_path: Path) -> None:
    part = across.run_part(_cfg(_mpi_double(tmp_path)), {**PMI, "PMI_FD": "1"}, 30, leader=False)
    assert part["returncode"] == 1  # the double finds no PMI_FD: KeyError
    assert part["notes"] == ["PMI_FD=1 not passed to all_reduce_perf: fd 1 is not a descriptor number from 3 to 1023"]
    (line,) = _judge({0: _part(r=0), 1: dict(part, pairs={}, errors=["x"]), 2: _part(r=2)})
    assert line == "FAIL n2: its part of the all-reduce failed (exit 1) x: " + part["notes"][0]


def _part(net: str = "IB", gdr: bool = True, r: int = 0, **more: Any) -> dict[str, Any]:
    g = 8
    nxt = ((r + 1) % 3) * g
    part = {"gpus": g, "returncode": 0, "pairs": {f"{r * g + g - 1}->{nxt}": {"net": net, "gdr": gdr}}}
    if r == 0:
        part["perf"] = {"ranks": 24, "busbw_gbps": 200.0, "wrong": 0}
    part.update(more)
    return part


def _judge(parts: dict[int, dict[str, Any]], expect_ib: bool = True, floor: float = 0.0) -> list[str]:
    return [f.line() for f in across.judge(NODES, parts, expect_ib, floor)]


def test_healthy_ring_has_no_finding() -> None:
    assert _judge({r: _part(r=r) for r in range(3)}, floor=150) == []


def test_socket_names_the_node_fail_with_expect_ib_warn_without() -> None:
    parts = {0: _part(r=0), 1: _part("Socket", r=1), 2: _part(r=2)}
    (line,) = _judge(parts)
    assert line == "FAIL n2: the all-reduce across the allocation went over TCP, not InfiniBand: n2->n3 via NET/Socket"
    assert _judge(parts, expect_ib=False)[0].startswith("WARN n2:")


def test_one_process_per_node_world_is_not_one_communicator() -> None:
    parts = {r: _part(r=r) for r in range(3)}
    parts[0]["perf"]["ranks"] = 8  # each copy a world of its own (no MPI plugin): 8 ranks, not 24
    (line,) = _judge(parts)
    assert line.startswith("FAIL job: all_reduce_perf did not run as one communicator: 8 rank(s), not 24")
    parts[2]["notes"] = ["PMI_FD=abc not passed to all_reduce_perf: not a descriptor number"]
    (line,) = _judge(parts)
    assert line.endswith("is needed); n3: PMI_FD=abc not passed to all_reduce_perf: not a descriptor number")


def test_low_bandwidth_without_evidence_names_the_job() -> None:
    parts = {r: _part(r=r) for r in range(3)}
    (line,) = _judge(parts, floor=300)
    assert line == (
        "FAIL job: all-reduce across 3 node(s): 200 GB/s bus bandwidth, below 300; "
        "no node's log tells which link (run the pairs one by one)"
    )


def test_every_rank_timed_out_names_the_one_that_never_connected() -> None:
    parts = {r: _part(r=r, timed_out=True, timeout_s=4.0) for r in range(3)}
    parts[1]["pairs"] = {}
    (line,) = _judge(parts)
    assert line.startswith("FAIL n2: the all-reduce across the allocation did not finish by its deadline and")
    for p in parts.values():
        p["pairs"] = {}
    assert [x.split(":")[0] for x in _judge(parts)] == ["FAIL job"]


def test_a_missing_part_and_a_setup_error_are_named() -> None:
    lines = _judge({0: _part(r=0), 2: {"setup_error": "no such executable"}})
    assert "FAIL n2: no all-reduce result (the rank stopped or could not write it)" in lines
    assert "FAIL n3: all-reduce across the allocation not run: no such executable" in lines


@pytest.mark.parametrize(
    ("doc", "why"),
    [
        ([], "not a JSON object"),
        ({"rank": 2}, "holds rank 2"),
        ({"rank": 1, "pairs": []}, "pairs is not an object"),
        ({"rank": 1, "pairs": {"1->2": "x"}}, "pairs holds"),
        ({"rank": 1, "gpus": 10**6}, "gpus is out of range"),
        ({"rank": 1, "timed_out": "yes"}, "timed_out is not true or false"),
    ],
)
def test_a_forged_part_is_refused(doc: Any, why: str) -> None:
    with pytest.raises(schema.Invalid, match=why):
        schema.across_part(doc, 1)


def test_a_parts_text_is_printable() -> None:
    part = schema.across_part({"rank": 1, "errors": ["\x1b]0;owned\x07 NCCL WARN x"]}, 1)
    assert "\x1b" not in part["errors"][0]


@pytest.mark.parametrize(
    ("args", "why"),
    [(("--across",), "--across goes with --nccl"), (("--nccl", "--min-busbw", "5"), "--min-busbw")],
)
def test_across_options_need_their_partner(args: tuple[str, ...], why: str) -> None:
    env = dict(os.environ, SLURM_PROCID="0", SLURM_NTASKS="1", SLURMD_NODENAME="n1")
    res = subprocess.run(
        [sys.executable, "-m", "nodehealth", "preflight", *args], env=env, capture_output=True, text=True, cwd=ROOT
    )
    assert res.returncode == 2 and why in res.stderr, res.stderr


def test_the_verdict_starts_the_all_reduce_only_when_it_says_so() -> None:
    assert schema.verdict({"ok": True, "across": True}) == {"ok": True, "across": True}
    assert schema.verdict({"ok": True, "across": "yes"}) == {"ok": True}
