"""preflight --drain (the faces' drain sequence, refused cleanly without operator rights) and
--nccl --expect-ib (each node's self-test through the all_reduce_perf double), with local ranks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers_preflight import start_rank
from helpers_scontrol import write_fake_scontrol

ROOT = Path(__file__).resolve().parent.parent
SCEN = ROOT / "tests" / "fixtures" / "slurm"
FAKE_NCCL = ROOT / "tests" / "fakes" / "all_reduce_perf"
A100 = ROOT / "tests" / "fixtures" / "nccl_selftest" / "gcm_single_node_8xA100.txt"


def _setup(tmp: Path, scenarios: dict[str, Path], extra: str = "") -> Path:
    fake = write_fake_scontrol(tmp)
    (tmp / "nodes.json").write_text(json.dumps({n: ["ALLOCATED", None] for n in scenarios}))
    for node, scen in scenarios.items():
        (tmp / f"nh-{node}.toml").write_text(
            f'[nvml]\nsimulate = "{scen}"\n[paths]\nstate_dir = "{tmp}/state-{node}"\n'
            f'[slurm]\nscontrol = "{fake}"\ntimeout_s = 5\n{extra}'
        )
    shared = tmp / "shared"
    shared.mkdir()
    return shared


def _run(
    tmp: Path, shared: Path, nodes: list[str], args: tuple[str, ...], env_extra: dict[str, str]
) -> tuple[dict[int, int], str]:
    procs = {}
    n = len(nodes)
    for r, node in enumerate(nodes):
        job = ("88", "0", ",".join(nodes))
        procs[r] = start_rank(r, n, node, job, shared, tmp / "nh-%n.toml", args, env_extra)
    outs = {r: p.communicate(timeout=120)[0] for r, p in procs.items()}
    return {r: p.returncode for r, p in procs.items()}, "".join(outs.values())


def _updates(tmp: Path) -> list[list[str]]:
    p = tmp / "calls.jsonl"
    calls = [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []
    return [c for c in calls if c and c[0] == "update"]


def test_drain_drains_only_the_faulty_node_with_our_reason(tmp_path: Path) -> None:
    shared = _setup(tmp_path, {"n1": SCEN / "healthy.toml", "n2": SCEN / "remap-pending.toml"})
    codes, out = _run(tmp_path, shared, ["n1", "n2"], ("--drain",), {})
    assert set(codes.values()) == {1}, out
    (upd,) = _updates(tmp_path)
    assert upd[1] == "nodename=n2" and upd[2] == "state=drain", upd
    assert upd[3].startswith("reason=nh:rowremap GPU1 gpu_remapped_rows"), upd
    assert "drained" in out and not any(shared.iterdir())


def test_drain_without_operator_rights_is_refused_cleanly(tmp_path: Path) -> None:
    shared = _setup(tmp_path, {"n1": SCEN / "healthy.toml", "n2": SCEN / "remap-pending.toml"})
    (tmp_path / "refuse").write_text("")
    codes, out = _run(tmp_path, shared, ["n1", "n2"], ("--drain",), {})
    assert set(codes.values()) == {1}, out  # the verdict is the same: the allocation fails
    assert "not drained" in out and "Traceback" not in out, out
    assert json.loads((tmp_path / "nodes.json").read_text())["n2"] == ["ALLOCATED", None]


def test_no_drain_without_the_flag(tmp_path: Path) -> None:
    shared = _setup(tmp_path, {"n1": SCEN / "healthy.toml", "n2": SCEN / "remap-pending.toml"})
    codes, out = _run(tmp_path, shared, ["n1", "n2"], (), {})
    assert set(codes.values()) == {1} and _updates(tmp_path) == [], out


@pytest.mark.parametrize(("outcome", "ok"), [("replay", True), ("socket", False)])
def test_nccl_expect_ib_names_a_socket_path(tmp_path: Path, outcome: str, ok: bool) -> None:
    # The runner inherits nothing of the rank's environment: the double's controls are configured.
    extra = (
        f'[checks.nccl_selftest]\nall_reduce_perf = "{FAKE_NCCL}"\nrunner = "nccl-tests"\ngpus = 8\n'
        f'gpu_model = "NVIDIA A100-SXM4-80GB"\nenv = ["FAKE_NCCL_FIXTURE={A100}", "FAKE_NCCL={outcome}"]\n'
    )
    shared = _setup(tmp_path, {"n1": SCEN / "healthy.toml", "n2": SCEN / "healthy.toml"}, extra)
    codes, out = _run(tmp_path, shared, ["n1", "n2"], ("--nccl", "--expect-ib"), {})
    if ok:
        assert set(codes.values()) == {0}, out
    else:
        assert set(codes.values()) == {1}, out
        assert "NET/Socket" in out or "socket" in out.lower(), out
    assert not any(shared.iterdir())
