"""nodehealth preflight with local processes as ranks (no Slurm): the exchange, the judgement, cleanup."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Optional

import pytest
from helpers_preflight import start_rank

from nodehealth.preflight import exchange, hygiene, judge, local, ranks
from nodehealth.probes import host

ROOT = Path(__file__).resolve().parent.parent
SCEN = ROOT / "tests" / "fixtures" / "slurm"
sys.path.insert(0, str(ROOT / "bench"))
import preflight_scale  # noqa: E402


def _config(tmp: Path, node: str, scenario: Path) -> None:
    (tmp / f"nh-{node}.toml").write_text(f'[nvml]\nsimulate = "{scenario}"\n')


def _driver_535(tmp: Path) -> Path:
    text = (SCEN / "healthy.toml").read_text().replace('driver_version = "550.127.05"', 'driver_version = "535.104.05"')
    p = tmp / "driver-535.toml"
    p.write_text(text)
    return p


def _run(
    tmp: Path, shared: Path, n: int, scen: dict[int, Path], args: tuple[str, ...] = (), skip: Optional[int] = None
) -> tuple[dict[int, int], str]:
    procs = {}
    for r in range(n):
        node = f"n{r + 1}"
        _config(tmp, node, scen.get(r, SCEN / "healthy.toml"))
        if r == skip:
            continue
        job = ("77", "1", f"n[1-{n}]")
        procs[r] = start_rank(r, n, node, job, shared, tmp / "nh-%n.toml", args)
    outs = {r: p.communicate(timeout=60)[0] for r, p in procs.items()}
    return {r: p.returncode for r, p in procs.items()}, "".join(outs.values())


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    shared = tmp_path / "shared"
    shared.mkdir()
    return tmp_path, shared


def test_healthy_allocation_passes_and_leaves_nothing(dirs: tuple[Path, Path]) -> None:
    tmp, shared = dirs
    codes, out = _run(tmp, shared, 3, {})
    assert codes == {0: 0, 1: 0, 2: 0}, out
    assert "verdict: PASS (3 node(s)" in out
    assert list(shared.iterdir()) == []


def test_odd_driver_and_faulty_gpu_are_named(dirs: tuple[Path, Path]) -> None:
    tmp, shared = dirs
    codes, out = _run(tmp, shared, 3, {1: _driver_535(tmp), 2: SCEN / "gpu-missing.toml"})
    assert set(codes.values()) == {1}, out
    assert "FAIL n2: NVIDIA driver 535.104.05 (2 other node(s): 550.127.05)" in out
    assert any(line.startswith("FAIL n3: gpu_count FAIL") for line in out.splitlines()), out
    assert "verdict: FAIL (2 of 3: n2, n3)" in out
    assert list(shared.iterdir()) == []


def test_missing_rank_is_named_unreachable(dirs: tuple[Path, Path]) -> None:
    tmp, shared = dirs
    codes, out = _run(tmp, shared, 3, {}, args=("--timeout", "1.5"), skip=2)
    assert codes == {0: 1, 1: 1}, out
    assert "FAIL n3: no report in" in out and "n3 is unreachable; not seen by n1, n2 either" in out
    assert list(shared.iterdir()) == []


def test_missing_path_is_named(dirs: tuple[Path, Path]) -> None:
    tmp, shared = dirs
    codes, out = _run(tmp, shared, 2, {}, args=("--path", str(tmp / "nowhere")))
    assert codes == {0: 1, 1: 1}
    assert f"FAIL n[1-2]: {tmp / 'nowhere'} not visible (No such file or directory" in out


def test_killed_rank_leftovers_are_removed(tmp_path: Path) -> None:
    res = preflight_scale.run(4, str(tmp_path), timeout=2.0, kill=2)
    assert res["codes"][0] == 1 and res["codes"][2] != 0
    assert "FAIL node0002" in res["report"]
    assert res["left"] == []


def test_scale_50_ranks_ops_independent_of_n(tmp_path: Path) -> None:
    small = preflight_scale.run(3, str(tmp_path), timeout=30.0)
    big = preflight_scale.run(50, str(tmp_path), timeout=30.0)
    assert set(big["codes"].values()) == {0}, big["report"]
    assert big["left"] == [] and small["left"] == []
    # Every rank but 0: the pointer read, the directory opened, 2 atomic writes (create+rename each), 2 peer
    # reads, the verdict read, 2 unlinks.
    assert small["other_ops_max"] == big["other_ops_max"] == 11


# ---------------------------------------------------------------- pure parts


def test_ring_peers() -> None:
    assert exchange.peers(0, 1) == []
    assert exchange.peers(0, 2) == [1]
    assert exchange.peers(4, 5) == [0, 1]


def test_ranks_from_env_refuses_several_tasks_per_node() -> None:
    with pytest.raises(ranks.RankError, match="one task per node"):
        ranks.from_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_NNODES": "2"})
    with pytest.raises(ranks.RankError, match="not a Slurm task"):
        ranks.from_env({})
    r = ranks.from_env({"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "gpu[016-017]"})
    assert r.node == "gpu017" and r.nodelist == ("gpu016", "gpu017")


def test_consistency_majority_and_tie() -> None:
    reps: dict[int, Any] = {i: {"facts": {"driver": "550", "kernel": "6.1"}} for i in range(3)}
    reps[1]["facts"]["driver"] = "535"
    got = [f.line() for f in judge.consistency(reps, ["a", "b", "c"])]
    assert got == ["FAIL b: NVIDIA driver 535 (2 other node(s): 550)"]
    tie = judge.consistency({0: {"facts": {"kernel": "1"}}, 1: {"facts": {"kernel": "2"}}}, ["a", "b"])
    assert [f.severity for f in tie] == ["WARN", "WARN"] and "no majority" in tie[0].text


def test_node_local_storage() -> None:
    entries = host.parse_mountinfo(
        "1 0 8:1 / / rw - ext4 /dev/sda1 rw\n"
        "2 1 0:5 / /pfs rw - lustre 10.0.0.1@o2ib:/pfs rw\n"
        "3 1 0:6 / /dev/shm rw - tmpfs tmpfs rw\n"
    )
    assert local.locality("/pfs/run", local.containing_mount(entries, "/pfs/run")) is None
    shm = local.containing_mount(entries, "/dev/shm/x")
    assert local.locality("/dev/shm/x", shm) == "under /dev/shm (tmpfs at /dev/shm)"
    assert local.locality("/scratch", local.containing_mount(entries, "/scratch")) == "ext4 at /"


class _Res:
    def __init__(self, out: str, rc: int = 0) -> None:
        self.stdout, self.stderr, self.returncode, self.timed_out = out, "", rc, False


def test_hygiene_time_limit_and_drained_node() -> None:
    calls = []

    def execute(argv: list[str], timeout_s: float, env: Any = None) -> Any:
        calls.append(argv)
        if argv[1:3] == ["show", "job"]:
            return _Res("JobId=7 JobName=x TimeLimit=UNLIMITED StdOut=/tmp/slurm-7.out StdErr=/tmp/slurm-7.out")
        return _Res("NodeName=n1 State=IDLE Reason=x\nNodeName=n2 State=MIXED+DRAIN Reason=bad fan [root@now]\n")

    found, notes = hygiene.check({}, "/usr/bin/scontrol", "", "7", "n[1-2]", ["n1", "n2"], execute=execute)
    lines = [f.line() for f in found]
    assert len(calls) == 2
    assert any("no time limit (TimeLimit=UNLIMITED)" in x for x in lines)
    assert any(x.startswith("WARN job: the job's StdOut /tmp/slurm-7.out is on node-local storage") for x in lines)
    assert any(x.startswith("WARN n2: is draining in Slurm (bad fan)") for x in lines)
