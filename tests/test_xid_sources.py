"""Kernel-log sources: what the XID watch trusts in a live log (kernel-facility records only, by
default), what it opens as a recorded log (the record device or a regular file, never through a link,
never a FIFO), and how a recorded log is read (once per file and offset, whoever reads it)."""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from nodehealth.checks import gpu_xid
from nodehealth.checks.base import Context
from nodehealth.config import loader
from nodehealth.config.schema import Config
from nodehealth.model import Action, Status
from nodehealth.observations import Observations
from nodehealth.probes import PROBES, ProbeContext
from nodehealth.probes.kernel_log import KernelLogUnavailable, KmsgReader, kernel_facility
from nodehealth.probes.xid_store import XidStore, load_state

BOOT = "11111111-1111-4111-8111-111111111111"
BTIME = 1_700_000_000
XID_79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus."


def record(seq: int, message: str, pri: int = 4) -> str:
    """One /dev/kmsg record line; ``pri`` = 8 * facility + level (12: user facility, warning)."""
    return f"{pri},{seq},{seq * 1_000_000},-;{message}\n"


class Node:
    """A procfs root with a boot id and btime, a kernel log, state dirs, and a config naming them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.proc = root / "proc"
        (self.proc / "sys" / "kernel" / "random").mkdir(parents=True)
        (self.proc / "sys" / "kernel" / "random" / "boot_id").write_text(BOOT + "\n")
        (self.proc / "stat").write_text(f"btime {BTIME}\n")
        self.kmsg = root / "kmsg"
        self.kmsg.write_text("")

    def config(self, state: str, extra: str = "") -> Config:
        text = (
            f'[paths]\nstate_dir = "{self.root / state}"\nprocfs_root = "{self.proc}"\n'
            f'[checks.gpu_xid]\nkmsg_path = "{self.kmsg}"\n{extra}'
        )
        return loader.resolve(loader.parse_toml(text, "test.toml"), "test.toml")

    def check(self, cfg: Config) -> Any:
        """The gpu_xid check as a face runs it: the configured ``xid`` probe, then the verdict."""
        obs = PROBES["xid"].gather(ProbeContext(config=cfg, node="n"), 10.0)
        ctx = Context(name="gpu_xid", phase="healthcheck", node="n", expected_gpus="auto")
        return gpu_xid.evaluate(Observations(xid=obs), gpu_xid.Settings(), ctx)


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


# --------------------------------------------------------------------------- live sources: the facility


def test_a_user_facility_xid_record_drains_nothing_by_default(node: Node) -> None:
    """A record written to /dev/kmsg from user space (a forwarder, journald's ForwardToKMsg=) carries
    the user facility whatever it says: by default it is no event; `kernel_facility_only = false`
    counts it (and then it fails the node, as it did by default before)."""
    node.kmsg.write_text(record(1, "usb 1-1: new device") + record(2, XID_79, pri=12))
    res = node.check(node.config("state-default"))
    assert res.status == Status.OK and res.details["events_this_boot"] == 0, res
    res = node.check(node.config("state-all", "kernel_facility_only = false\n"))
    assert res.status == Status.FAIL and "XID 79" in res.summary and res.action == Action.REBOOT, res


def test_the_same_line_from_the_kernel_facility_is_an_event_by_default(node: Node) -> None:
    node.kmsg.write_text(record(1, XID_79, pri=4))
    res = node.check(node.config("state"))
    assert res.status == Status.FAIL and "XID 79" in res.summary, res


@pytest.mark.parametrize(
    ("value", "kernel"),
    [
        (None, True),
        (0, True),
        ("0", True),
        (b"0", True),
        (1, False),
        ("1", False),
        (b"3", False),
        ("", False),
    ],
    ids=["absent", "int-0", "text-0", "bytes-0", "int-user", "text-user", "bytes-daemon", "empty"],
)
def test_journal_entries_count_only_for_the_kernel_facility(value: Any, kernel: bool) -> None:
    """journald records every /dev/kmsg record as _TRANSPORT=kernel and adds SYSLOG_FACILITY only when
    it is not the kernel's: the journal source keeps the entries without one, or with 0."""
    assert kernel_facility(value) is kernel


# --------------------------------------------------------------------------- what is opened


def test_a_symlink_as_the_kernel_log_is_refused_not_followed(node: Node, tmp_path: Path) -> None:
    target = tmp_path / "other.log"
    target.write_text(XID_79 + "\n")
    link = tmp_path / "kern.log"
    link.symlink_to(target)
    with pytest.raises(KernelLogUnavailable, match="symbolic link"):
        list(KmsgReader(str(link)).lines())
    with pytest.raises(KernelLogUnavailable, match="symbolic link"):
        XidStore(str(tmp_path / "state"), str(node.proc), str(link)).sync()


def test_a_hard_link_as_the_kernel_log_is_refused(node: Node, tmp_path: Path) -> None:
    """A second name for a file may be another user's file: refused, as on any shared ground."""
    target = tmp_path / "other.log"
    target.write_text(XID_79 + "\n")
    os.link(target, tmp_path / "kern.log")
    with pytest.raises(KernelLogUnavailable, match="hard link"):
        XidStore(str(tmp_path / "state"), str(node.proc), str(tmp_path / "kern.log")).sync()


def test_a_fifo_as_the_kernel_log_is_refused_without_blocking(node: Node, tmp_path: Path) -> None:
    """Even with a writer holding it open (a reader would wait for its data), a FIFO is never read."""
    fifo = tmp_path / "kern.fifo"
    os.mkfifo(fifo)
    reader_fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # so that the writer's open does not wait
    writer_fd = os.open(fifo, os.O_WRONLY)
    try:
        os.write(writer_fd, (XID_79 + "\n").encode())
        done = threading.Event()
        errors: list[BaseException] = []

        def sync() -> None:
            try:
                XidStore(str(tmp_path / "state"), str(node.proc), str(fifo)).sync()
            except BaseException as exc:  # noqa: BLE001 - handed to the test
                errors.append(exc)
            done.set()

        threading.Thread(target=sync, daemon=True).start()
        assert done.wait(60), "sync blocked on a FIFO"
        assert len(errors) == 1 and isinstance(errors[0], KernelLogUnavailable) and "FIFO" in str(errors[0])
        assert os.read(reader_fd, 4096) == (XID_79 + "\n").encode()  # nothing was taken from it
    finally:
        os.close(writer_fd)
        os.close(reader_fd)


# --------------------------------------------------------------------------- a recorded log: read once

T = BTIME + 50_000.0  # when the XID of the recorded log happened (a whole second)


def dmesg_t(at: float, message: str) -> str:
    """A `dmesg -T` line (local time, as dmesg prints it)."""
    return time.strftime("[%a %b %e %H:%M:%S %Y] ", time.localtime(at)) + message + "\n"


def _xid_count(res: Any, xid: int) -> int:
    return sum(1 for e in res.details["events"] if e["xid"] == xid)


def test_a_recorded_log_read_by_many_readers_in_turn_gives_each_event_once(node: Node) -> None:
    """Twenty faces, each its own store reader, over one recorded log: one XID 79, never "x2"; a line
    appended later is one new event; the store records how far the file was read."""
    node.kmsg.write_text(dmesg_t(T - 60, "usb 1-1: new device") + dmesg_t(T, XID_79))
    cfg = node.config("state")
    for _ in range(20):
        res = node.check(cfg)
        assert res.status == Status.FAIL and "XID 79" in res.summary and " x" not in res.summary, res
        assert res.details["events_this_boot"] == 1 and _xid_count(res, 79) == 1, res.details
    with node.kmsg.open("a") as fh:
        fh.write(dmesg_t(T + 5, "NVRM: Xid (PCI:0000:3b:00): 48, pid=7, name=a.out, DBE"))
    for _ in range(5):
        res = node.check(cfg)
        assert (_xid_count(res, 79), _xid_count(res, 48)) == (1, 1), res.details
    state = json.loads((node.root / "state" / "xid-events.json").read_text())
    assert state["file"]["offset"] == node.kmsg.stat().st_size and state["file"]["ino"] == node.kmsg.stat().st_ino


def test_a_recorded_log_read_by_concurrent_readers_and_the_follower_gives_each_event_once(node: Node) -> None:
    """Sixteen readers at once (faces' syncs, each its own store) while the daemon's follower reads the
    same file: each line is one event, whoever got there first."""
    node.kmsg.write_text(dmesg_t(T, XID_79))
    state = str(node.root / "state")
    follower = XidStore(state, str(node.proc), str(node.kmsg))
    followed: list[int] = []
    stop = threading.Event()
    thread = threading.Thread(
        target=follower.follow,
        args=(stop,),
        kwargs={"on_event": lambda r: followed.append(r.event.xid), "poll_s": 0.01, "save_interval_s": 0.0},
    )
    thread.start()
    try:
        go = threading.Barrier(16)
        added: list[int] = []
        errors: list[BaseException] = []

        def face(i: int) -> None:
            try:
                go.wait(60)
                if i == 0:
                    with node.kmsg.open("a") as fh:
                        fh.write(dmesg_t(T + 5, "NVRM: Xid (PCI:0000:3b:00): 48, pid=7, name=a.out, DBE"))
                added.append(XidStore(state, str(node.proc), str(node.kmsg)).sync(time.monotonic() + 60).added)
            except BaseException as exc:  # noqa: BLE001 - handed to the test
                errors.append(exc)

        faces = [threading.Thread(target=face, args=(i,)) for i in range(16)]
        for t in faces:
            t.start()
        for t in faces:
            t.join(120)
        assert not errors, errors
        size = node.kmsg.stat().st_size
        deadline = time.monotonic() + 60  # the follower catches up with the appended line (or a face had it)
        while time.monotonic() < deadline:
            position = load_state(state)[0].file_position
            if position is not None and position.offset == size and sum(added) + len(followed) >= 2:
                break
            time.sleep(0.05)
    finally:
        stop.set()
        thread.join(60)
    assert not thread.is_alive()
    final = XidStore(state, str(node.proc), str(node.kmsg)).sync(time.monotonic() + 60)
    assert sorted(d["xid"] for d in final.state.events) == [48, 79], final.state.events
    assert sum(added) + len(followed) == 2, (added, followed)  # each event told once, by one reader


def test_cleared_events_of_a_recorded_log_do_not_come_back(node: Node) -> None:
    node.kmsg.write_text(dmesg_t(T, XID_79))
    state = str(node.root / "state")
    assert XidStore(state, str(node.proc), str(node.kmsg)).clear() == (1, 1)
    for _ in range(3):
        assert XidStore(state, str(node.proc), str(node.kmsg)).sync().state.events == []


def test_a_recorded_log_rewritten_in_place_is_read_again_from_its_beginning(node: Node) -> None:
    node.kmsg.write_text(dmesg_t(T, XID_79) + dmesg_t(T + 1, "eth0: link up"))
    state = str(node.root / "state")
    assert XidStore(state, str(node.proc), str(node.kmsg)).sync().added == 1
    # The same file (same inode), rewritten longer: its old position would land inside a new line.
    with node.kmsg.open("r+") as fh:
        fh.write(dmesg_t(T + 2, "NVRM: Xid (PCI:0000:5e:00): 48, pid=7, name=a.out, DBE") * 3)
    found = XidStore(state, str(node.proc), str(node.kmsg)).sync()
    assert sorted(d["xid"] for d in found.state.events) == [48, 48, 48, 79]


def test_a_last_line_without_its_newline_waits_for_it(node: Node) -> None:
    """A writer half way through a line: "Xid ...: 7" of "79" is not read as XID 7."""
    rest = "9, pid=1234, name=python3, GPU has fallen off the bus.\n"
    line = dmesg_t(T, XID_79)
    assert line.endswith(rest)
    node.kmsg.write_text(dmesg_t(T, "usb 1-1: new device") + line[: -len(rest)])
    state = str(node.root / "state")
    assert XidStore(state, str(node.proc), str(node.kmsg)).sync().added == 0
    with node.kmsg.open("a") as fh:
        fh.write(rest)
    found = XidStore(state, str(node.proc), str(node.kmsg)).sync()
    assert [d["xid"] for d in found.state.events] == [79]


# --------------------------------------------------------------------------- which job ran at the event's time


def _forensics(obs: Any, job: str, start: float, now: float) -> Any:
    from nodehealth.checks.job_forensics import job_forensics

    return job_forensics(job, None, None, None, obs, start, now, BOOT)


def test_an_xid_is_never_told_to_a_job_that_started_after_it(node: Node) -> None:
    """An XID at t in a recorded log, read by several readers while job 911 (started at t + 8 s)
    runs: its epilog reports no XID during the job; job 910, running at t, has it."""
    from nodehealth.statedir.ledger import JobEntry

    node.kmsg.write_text(dmesg_t(T, XID_79))
    state = str(node.root / "state")
    for later in (9.0, 12.0, 15.0):  # faces of job 911 (prolog, health checks) read the file
        XidStore(state, str(node.proc), str(node.kmsg), now=lambda later=later: T + later).sync()
    ledger = (
        JobEntry(job_id="910", start=T - 30, end=T + 2, user=None, gpus=None),
        JobEntry(job_id="911", start=T + 8, end=None, user=None, gpus=None),
    )
    obs = XidStore(state, str(node.proc), str(node.kmsg), now=lambda: T + 20).observation()
    obs = dataclasses.replace(obs, ledger=ledger)
    (rec,) = obs.records
    assert rec.at == T
    late = _forensics(obs, "911", T + 8, T + 20)
    assert late.status == Status.OK and "no XID" in late.summary, late
    running = _forensics(obs, "910", T - 30, T + 2)
    assert running.status == Status.FAIL and "XID 79 during the job" in running.summary, running


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("[Sun Feb 23 16:24:18 2025] " + XID_79, "ctime"),
        ("2025-02-23T16:24:18,123456+00:00 " + XID_79, 1740327858.123456),
        ("2025-02-23T16:24:18Z " + XID_79, 1740327858.0),
        ("[ 5123.456789] " + XID_79, BTIME + 5123.456789),
        ("4,9,5123456789,-;" + XID_79, BTIME + 5123.456789),
    ],
    ids=["dmesg-T", "iso-offset", "iso-z", "dmesg-uptime", "kmsg-record"],
)
def test_an_event_is_placed_at_its_own_lines_time(node: Node, line: str, expected: Any) -> None:
    node.kmsg.write_text(line + "\n")
    store = XidStore(str(node.root / "state"), str(node.proc), str(node.kmsg), now=lambda: T)
    (event,) = store.sync().state.events
    want = (
        time.mktime(time.strptime("Sun Feb 23 16:24:18 2025", "%a %b %d %H:%M:%S %Y"))
        if expected == "ctime"
        else expected
    )
    assert event["at"] == pytest.approx(want) and event["recorded_at"] == T
