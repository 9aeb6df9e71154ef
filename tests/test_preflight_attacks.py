"""Attacks on pre-flight's shared directory: another user's names there never move a file of the victim's,
never change a healthy node's verdict, never block a rank, and are named with their owner.

The ranks are local processes (tests/test_preflight.py's harness) of one user (root); the attacker is
uid 65534, whose names are planted with os.chown in a 1777 shared directory, as a user would make them.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
from test_preflight import _run

from nodehealth.platform import ground
from nodehealth.preflight import exchange, ranks, schema

NOBODY = 65534
OLD_NAME = ".nodehealth-preflight-77-1"  # the exchange directory's name before it was random
POINTER = ".nodehealth-preflight-77-1.name"


@pytest.fixture
def ground_(tmp_path: Path) -> tuple[Path, Path, Path]:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    victim = tmp_path / "home-victim"
    victim.mkdir(mode=0o700)
    for name, text in (
        ("r0.json", "victim's r0\n"),
        ("notes.txt", "thesis\n"),
        (".bashrc", "alias x=y\n"),
        ("verdict.json", "{}\n"),
        (".tmp-0-1", "t\n"),
    ):
        (victim / name).write_text(text)
    (victim / "sub").mkdir()
    (victim / "sub" / "data").write_text("d\n")
    return tmp_path, shared, victim


def _tree(d: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(d)): (p.read_bytes() if p.is_file() and not p.is_symlink() else b"<dir/link>")
        for p in sorted(d.rglob("*"))
    }


def _plant(path: Path) -> None:
    os.chown(path, NOBODY, NOBODY, follow_symlinks=False)


def test_a_symlink_at_the_old_exchange_name_leaves_every_victim_file(ground_: tuple[Path, Path, Path]) -> None:
    tmp, shared, victim = ground_
    before = _tree(victim)
    (shared / OLD_NAME).symlink_to(victim)
    _plant(shared / OLD_NAME)
    codes, out = _run(tmp, shared, 3, {})
    assert codes == {0: 0, 1: 0, 2: 0}, out
    assert "verdict: PASS (3 node(s)" in out
    assert _tree(victim) == before  # every file, the sub-directory too
    assert sorted(p.name for p in shared.iterdir()) == [OLD_NAME]


def test_a_planted_0777_directory_of_forged_reports_changes_no_verdict(ground_: tuple[Path, Path, Path]) -> None:
    tmp, shared, _ = ground_
    planted = shared / OLD_NAME
    planted.mkdir()
    planted.chmod(0o777)
    forged = {"rank": 1, "node": "n2\x1b[2J\x1b]0;owned\x07", "facts": {"driver": "1.0", "gpu_model": "H" * 5000}}
    for r in range(3):
        (planted / f"r{r}.json").write_text(json.dumps({**forged, "rank": r, "facts": {"driver": f"9{r}.0"}}))
        (planted / f"p{r}.json").write_text(json.dumps({"rank": r, "peers": {}}))
        _plant(planted / f"r{r}.json")
    (planted / "verdict.json").write_text(json.dumps({"ok": False, "failed_nodes": ["n2"]}))
    _plant(planted)
    before = _tree(planted)
    codes, out = _run(tmp, shared, 3, {})
    assert codes == {0: 0, 1: 0, 2: 0}, out
    assert "verdict: PASS (3 node(s)" in out and "no majority" not in out
    assert "\x1b" not in out and "H" * 200 not in out
    assert _tree(planted) == before  # nothing read from it, nothing of the victim's left in it, nothing removed


def test_the_pointer_planted_by_another_user_is_refused_naming_its_owner(ground_: tuple[Path, Path, Path]) -> None:
    tmp, shared, _ = ground_
    theirs = shared / "theirs"
    theirs.mkdir()
    theirs.chmod(0o777)
    _plant(theirs)
    (shared / POINTER).write_text(json.dumps({"dir": ".nodehealth-preflight-77-1-" + "0" * 32, "key": ""}))
    _plant(shared / POINTER)
    codes, out = _run(tmp, shared, 3, {})
    assert codes == {0: 2, 1: 2, 2: 2}, out
    assert out.count("is not this user's") == 3 and "uid 65534 (nobody)" in out, out
    assert "no node was judged" in out
    assert "verdict:" not in out and "FAIL n" not in out, out  # a finding about the directory, no node judged
    assert list(theirs.iterdir()) == []  # the victim's reports are not left in the attacker's directory
    assert sorted(p.name for p in shared.iterdir()) == [POINTER, "theirs"]


def test_a_fifo_planted_as_the_pointer_blocks_no_rank(ground_: tuple[Path, Path, Path]) -> None:
    tmp, shared, _ = ground_
    os.mkfifo(shared / POINTER)
    _plant(shared / POINTER)
    codes, out = _run(tmp, shared, 3, {}, args=("--timeout", "3"))
    assert codes == {0: 2, 1: 2, 2: 2}, out
    assert "is a FIFO, not a regular file, owned by uid 65534 (nobody)" in out, out
    assert "did not finish by its deadline" not in out  # the run ended on its own, not by the watchdog


def test_a_hard_link_to_a_victim_file_as_the_pointer_is_refused(ground_: tuple[Path, Path, Path]) -> None:
    tmp, shared, victim = ground_
    secret = victim / "notes.txt"  # root's: a reader that trusted the owner alone would take it
    os.link(secret, shared / POINTER)
    codes, out = _run(tmp, shared, 2, {}, args=("--timeout", "1"))
    assert codes == {0: 2, 1: 2}, out
    assert "with 2 names (a hard link)" in out and "has 2 names (a hard link" in out, out
    assert secret.read_text() == "thesis\n" and (shared / POINTER).exists()  # refused, and not removed


# ---------------------------------------------------------------- one rank's side, in process


def _rank(r: int, n: int) -> ranks.Rank:
    return ranks.from_env({"SLURM_PROCID": str(r), "SLURM_NTASKS": str(n), "SLURM_JOB_ID": "5", "SLURM_STEP_ID": "0"})


def test_fifos_as_report_names_are_refused_without_blocking(tmp_path: Path) -> None:
    ex = exchange.Exchange(str(tmp_path), _rank(0, 3))
    ex.open_shared()
    ex.create()
    assert ex.name is not None
    for name in ("r1.json", "p1.json", "r2.json"):
        os.mkfifo(tmp_path / ex.name / name)
    got: list[exchange.Gathered] = []
    done = threading.Event()
    threading.Thread(target=lambda: (got.append(ex.gather(time.monotonic() + 0.2)), done.set()), daemon=True).start()
    if not done.wait(120):
        for name in ("r1.json", "p1.json", "r2.json"):  # release the reader before failing
            os.close(os.open(tmp_path / ex.name / name, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("gather blocked on a FIFO")
    assert got[0].reports == {} and "is a FIFO" in got[0].unreadable[1] and "is a FIFO" in got[0].unreadable[2]
    ex.close(time.monotonic())
    ex.release()
    assert sorted(os.listdir(tmp_path)) == []  # the FIFOs had names a rank makes: removed by name


def test_a_pointer_naming_another_users_directory_is_refused(tmp_path: Path) -> None:
    leader = exchange.Exchange(str(tmp_path), _rank(0, 2))
    leader.open_shared()
    leader.create()
    assert leader.name is not None
    os.chown(tmp_path / leader.name, NOBODY, NOBODY)  # swapped for someone else's after the pointer went out
    other = exchange.Exchange(str(tmp_path), _rank(1, 2))
    other.open_shared()
    with pytest.raises(exchange.Taken, match=r"owned by uid 65534 \(nobody\)"):
        other.join(time.monotonic() + 60)
    other.release()
    leader.release()


def test_a_pointer_holding_a_path_is_refused(tmp_path: Path) -> None:
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    doc = {"dir": "../../home/victim", "key": ""}
    ground.create_new(fd, ".nodehealth-preflight-5-0.name", json.dumps(doc).encode())
    os.close(fd)
    other = exchange.Exchange(str(tmp_path), _rank(1, 2))
    other.open_shared()
    with pytest.raises(exchange.Taken, match="holds no exchange directory's name"):
        other.join(time.monotonic() + 60)
    other.release()


def test_a_missing_pointer_is_waited_for_only_until_the_deadline(tmp_path: Path) -> None:
    other = exchange.Exchange(
        str(tmp_path), _rank(1, 2), clock=iter([0.0, 0.5, 1.0, 99.0, 99.0]).__next__, sleep=lambda s: None
    )
    other.open_shared()
    assert other.join(2.0) is False
    other.release()


def test_reports_are_bounded_typed_and_printable() -> None:
    doc = {
        "rank": 1,
        "node": "n2\x1b[2J" + "x" * 500,
        "facts": {"gpu_model": "\u202eH" + "H" * 5000, "driver": 550},
        "health": {"results": [{"name": "gpu\x1b]0;t\x07", "summary": "s" * 5000, "fails": True}]},
        "extra": [[[[[[[[[["deep"]]]]]]]]]],
        "n": float("inf"),
    }
    got = schema.report(doc, 1)
    assert got["node"].startswith("n2\\x1b[2J") and len(got["node"]) <= schema.MAX_NAME
    assert got["facts"]["gpu_model"].startswith("\\u202eH") and len(got["facts"]["gpu_model"]) <= schema.MAX_NAME
    assert got["health"]["results"][0]["name"] == "gpu\\x1b]0;t\\x07"
    assert len(got["health"]["results"][0]["summary"]) == schema.MAX_TEXT and got["n"] is None
    assert "deep" not in json.dumps(got)
    for bad, why in (
        ([], "not a JSON object"),
        ({"rank": 2}, "holds rank 2"),
        ({"rank": True}, "rank is not"),
        ({"rank": 1, "facts": {"driver": {"x": 1}}}, "facts.driver"),
        ({"rank": 1, "paths": [{"path": 3}]}, "paths holds"),
        ({"rank": 1, "health": {"results": ["x"]}}, "health.results"),
        ({"rank": 1, "nccl": {"runs": [{"paths": [1]}]}}, "nccl.runs"),
    ):
        with pytest.raises(schema.Invalid, match=why):
            schema.report(bad, 1)
    assert schema.verdict({"ok": "yes"}) is None and schema.verdict({"ok": False, "x": 1}) == {"ok": False}
