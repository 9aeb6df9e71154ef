"""The ``node_jobs`` probe's cgroup cache (probes/jobs.py): a process's cgroup is read once it
settled, then kept for that process only: a reused pid, a task still moving into its job's
cgroup, or one whose uid changed is read again; a pid gone is dropped.

A fake procfs tree under tmp_path and a fake clock: nothing of the host's is read.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from nodehealth.observations import NodeJobs
from nodehealth.probes import jobs

SYSTEM = "0::/system.slice/sshd.service\n"


def job_cgroup(job: int) -> str:
    return f"0::/system.slice/slurmstepd.scope/job_{job}/step_0/user/task_0\n"


class Node:
    """A procfs root with processes, a state dir with no ledger, and a clock moved by hand."""

    def __init__(self, tmp_path: Path) -> None:
        self.proc = tmp_path / "proc"
        self.proc.mkdir()
        self.state = tmp_path / "state"
        self.now = 1000.0
        self.reads: list[str] = []

    def spawn(self, pid: int, cgroup: str) -> None:
        """A process under ``pid``; one already there is replaced by a new one (a reused pid: the
        new directory exists before the old one goes, so it is another inode, as in procfs)."""
        new = self.proc / f".{pid}.new"
        new.mkdir()
        (new / "cgroup").write_text(cgroup)
        old = self.proc / str(pid)
        if old.exists():
            shutil.rmtree(old)
        new.rename(old)

    def move(self, pid: int, cgroup: str) -> None:
        """The same process, now in another cgroup (its /proc/<pid> inode unchanged)."""
        (self.proc / str(pid) / "cgroup").write_text(cgroup)

    def scan(self, after_s: float = 30.0) -> dict[int, str]:
        self.now += after_s
        got = jobs.gather(str(self.state), str(self.proc), clock=lambda: self.now)
        assert isinstance(got, NodeJobs)
        return dict(got.pid_jobs)


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Node:
    n = Node(tmp_path)
    real = jobs.files.read_bytes

    def counting(path: str, limit: int = 8192) -> Any:
        n.reads.append(os.path.basename(os.path.dirname(path)))
        return real(path, limit)

    monkeypatch.setattr(jobs.files, "read_bytes", counting)
    return n


def settle(node: Node) -> None:
    """Scans until every process present has been seen for SETTLE_S (its answer kept)."""
    node.scan()
    node.scan(jobs.SETTLE_S)


def test_a_settled_process_is_not_read_again(node: Node) -> None:
    node.spawn(100, SYSTEM)
    node.spawn(200, job_cgroup(42))
    settle(node)
    node.reads.clear()
    assert node.scan() == {200: "42"}
    assert node.scan() == {200: "42"}
    assert node.reads == []


def test_a_reused_pid_is_read_again(node: Node) -> None:
    """Pid 100 was a system process, kept as no job's; it is now a task of job 77 (a GPU process
    of a running job): a kept answer would call it a stray and drain a healthy node."""
    node.spawn(100, SYSTEM)
    settle(node)
    assert node.scan() == {}
    node.spawn(100, job_cgroup(77))
    assert node.scan() == {100: "77"}


def test_a_process_is_read_again_until_it_settled(node: Node) -> None:
    """A task seen before slurmstepd put it into its job's cgroup (same process, same inode)."""
    node.spawn(300, SYSTEM)
    assert node.scan() == {}
    node.move(300, job_cgroup(9))
    assert node.scan(jobs.SETTLE_S - 1) == {300: "9"}
    node.move(300, SYSTEM)
    assert node.scan(1) == {}  # SETTLE_S after the first sighting: this read is the one kept
    node.move(300, job_cgroup(9))
    assert node.scan() == {}


@pytest.mark.parametrize(
    "changed",
    [
        "st_uid",  # a Slurm task drops from root to the user after it joined its cgroup
        "st_ino",  # a new inode made within the old one's clock tick (procfs times are coarse)
        "st_ctime_ns",  # a new inode given a number another held (get_next_ino wraps)
    ],
)
def test_each_part_of_the_key_tells_another_process(node: Node, monkeypatch: pytest.MonkeyPatch, changed: str) -> None:
    node.spawn(400, SYSTEM)
    settle(node)
    real = os.stat

    class Other:
        def __init__(self, st: os.stat_result) -> None:
            self.st_ino, self.st_ctime_ns, self.st_uid = st.st_ino, st.st_ctime_ns, st.st_uid
            setattr(self, changed, getattr(st, changed) + 1000)

    def stat(path: Any, *args: Any, **kwargs: Any) -> Any:
        st = real(path, *args, **kwargs)
        return Other(st) if str(path).endswith("/400") else st

    node.move(400, job_cgroup(5))
    assert node.scan() == {}  # kept: the same key
    monkeypatch.setattr(jobs.os, "stat", stat)
    assert node.scan() == {400: "5"}


def test_a_pid_gone_is_dropped(node: Node) -> None:
    for pid in (100, 101, 102):
        node.spawn(pid, SYSTEM)
    settle(node)
    shutil.rmtree(node.proc / "101")
    node.scan()
    assert sorted(jobs._CACHE[str(node.proc)]) == [100, 102]
    other = node.proc.parent / "proc2"
    other.mkdir()
    jobs.gather(str(node.state), str(other))
    assert list(jobs._CACHE) == [str(other)]  # one procfs root kept, not one per root ever scanned
