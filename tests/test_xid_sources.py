"""Kernel-log sources: what the XID watch trusts in a live log (kernel-facility records only, by
default), what it opens as a recorded log (the record device or a regular file, never through a link,
never a FIFO), and how a recorded log is read (once per file and offset, whoever reads it)."""

from __future__ import annotations

import os
import threading
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
from nodehealth.xid.kmsg import KernelLogUnavailable, KmsgReader, kernel_facility
from nodehealth.xid.store import XidStore

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
        text = (f'[paths]\nstate_dir = "{self.root / state}"\nprocfs_root = "{self.proc}"\n'
                f'[checks.gpu_xid]\nkmsg_path = "{self.kmsg}"\n{extra}')
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


@pytest.mark.parametrize(("value", "kernel"), [
    (None, True), (0, True), ("0", True), (b"0", True), (1, False), ("1", False), (b"3", False), ("", False),
], ids=["absent", "int-0", "text-0", "bytes-0", "int-user", "text-user", "bytes-daemon", "empty"])
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
