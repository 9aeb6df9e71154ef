"""The XID watch: kmsg reader and follower, position across restarts, the per-boot event store,
reboot awareness, `nodehealth xid clear`, job attribution, and the real /dev/kmsg end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from nodehealth.checks import gpu_xid
from nodehealth.checks.base import Context
from nodehealth.cli import main
from nodehealth.model import Action, Status
from nodehealth.observations import GpuObservation, NvmlSnapshot, ProbeError, XidObservation, XidRecord
from nodehealth.probes.kernel_log import KernelLogUnavailable, KmsgReader
from nodehealth.probes.process_job import job_from_cgroup, job_from_environ, live_job
from nodehealth.probes.xid_store import StoreState, XidStore, boot_id, gather, load_state, save_state, store_path
from nodehealth.statedir import ledger
from nodehealth.xid.parse import ScanStats, scan

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "real-world"
NO_XID_LOG = FIXTURES / "xid_logs" / "hf_m4logs_jeanzay_dmesg_T_no_xid.log"

BOOT_A = "11111111-1111-4111-8111-111111111111"
BOOT_B = "22222222-2222-4222-8222-222222222222"
BTIME = 1_700_000_000

# Real published lines (see tests/fixtures/real-world/xid_lines.jsonl for their sources).
XID_119 = (
    "NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, name=nvidia-smi, Timeout after 6s of waiting for "
    "RPC response from GPU4 GSP! Expected function 103 (GSP_RM_ALLOC) (0x2081 0x4)."
)
XID_145 = (
    "NVRM: Xid (PCI:0018:01:00): 145, pid=876767, name=ray::WorkerDict, RLW_RXPIPE Nonfatal XC0 i0 "
    "Link 13 (0x0409a0c2 0x00000008 0x00000001 0x00000000 0x00100000 0x00000004)"
)
XID_63 = "NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu to activate."
XID_79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus."
XID_64 = "NVRM: Xid (PCI:0000:90:1c): 64, pid=77, name=x, Row Remapper failure"
XID_13 = "NVRM: Xid (PCI:0000:3b:00): 13, pid=4242, name=train.py, Graphics Exception: ESR 0x50"


def record(seq: int, message: str, usec: int = 0, pri: int = 4) -> str:
    """One /dev/kmsg record line."""
    return f"{pri},{seq},{usec or seq * 1_000_000},-;{message}\n"


class Node:
    """A fake node: procfs root with a boot id and btime, a kmsg file, a state dir."""

    def __init__(self, root: Path) -> None:
        self.proc = root / "proc"
        (self.proc / "sys" / "kernel" / "random").mkdir(parents=True)
        (self.proc / "stat").write_text(f"cpu 1 2 3\nbtime {BTIME}\n")
        self.kmsg = root / "kmsg"
        self.kmsg.write_text("")
        self.state = root / "state"
        self.boot(BOOT_A)

    def boot(self, boot: str, records: str = "") -> None:
        (self.proc / "sys" / "kernel" / "random" / "boot_id").write_text(boot + "\n")
        self.kmsg.write_text(records)

    def log(self, text: str) -> None:
        with open(self.kmsg, "a") as fh:
            fh.write(text)

    def store(self, **kw: object) -> XidStore:
        return XidStore(str(self.state), str(self.proc), str(self.kmsg), now=lambda: BTIME + 10_000.0, **kw)  # type: ignore[arg-type]


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


def _xids(store: XidStore) -> list[tuple[int, str, bool]]:
    obs = store.observation(store.sync())
    return [(r.event.xid, r.boot_id, r.current_boot) for r in obs.records]


def _check(obs: object, nvml: object = None, **settings: object) -> object:
    ctx = Context(name="gpu_xid", phase="manual", node="n", expected_gpus="auto")
    from nodehealth.observations import Observations

    return gpu_xid.evaluate(
        Observations(xid=obs, nvml=nvml),  # type: ignore[arg-type]
        gpu_xid.Settings(**settings),
        ctx,
    )  # type: ignore[arg-type]


# --------------------------------------------------------------------------- reader


def test_reader_skips_records_at_or_below_the_position_with_their_continuations(node: Node) -> None:
    node.log(
        record(1, "usb 1-1: new device")
        + " SUBSYSTEM=usb\n"
        + record(2, XID_79)
        + " DEVICE=+pci:0000:3b:00.0\n"
        + record(3, "eth0: link up")
    )
    reader = KmsgReader(str(node.kmsg), after_seq=1)
    lines = list(reader.lines())
    assert lines == [
        record(2, XID_79).rstrip("\n").encode(),
        b" DEVICE=+pci:0000:3b:00.0",
        record(3, "eth0: link up").rstrip("\n").encode(),
    ]
    assert reader.last_seq == 3 and reader.complete


def test_reader_kernel_facility_filter_is_a_setting(node: Node) -> None:
    node.log(record(1, XID_79, pri=4) + record(2, XID_119, pri=12))  # 12 = user facility, as /dev/kmsg writes
    assert len(list(KmsgReader(str(node.kmsg), kernel_only=False).lines())) == 2
    kernel = [record(1, XID_79).rstrip("\n").encode()]
    assert list(KmsgReader(str(node.kmsg), kernel_only=True).lines()) == kernel
    assert list(KmsgReader(str(node.kmsg)).lines()) == kernel  # the default


def test_reader_names_path_and_reason_when_the_log_is_missing(tmp_path: Path) -> None:
    with pytest.raises(KernelLogUnavailable, match=r"cannot read .*nope: No such file"):
        list(KmsgReader(str(tmp_path / "nope")).lines())


def test_reader_read_error_names_the_reason(tmp_path: Path) -> None:
    with pytest.raises(KernelLogUnavailable, match="is a directory, not the kernel log device"):
        list(KmsgReader(str(tmp_path)).lines())


def test_reader_backlog_of_a_file_of_records_feeds_the_parser(tmp_path: Path) -> None:
    records = tmp_path / "kmsg"
    records.write_bytes(
        b"6,1,0,-;Linux version 6.1.0\n"
        b"4,2,94571234,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.\n"
        b" SUBSYSTEM=pci\n"
    )
    reader = KmsgReader(str(records))
    events = list(scan(reader.lines()))
    assert [(e.seq, e.xid, e.pci) for e in events] == [(2, 79, "0000:3b:00")]
    assert reader.complete and reader.last_seq == 2


def _kmsg_readable() -> bool:
    try:
        with open("/dev/kmsg", "rb", buffering=0) as fh:
            fh.read(64 * 1024)
    except OSError:
        return False
    return True


@pytest.mark.real
@pytest.mark.skipif(not _kmsg_readable(), reason="needs a readable /dev/kmsg (root or CAP_SYSLOG)")
def test_reader_reads_the_real_kmsg_backlog() -> None:
    reader = KmsgReader("/dev/kmsg")
    stats = ScanStats()
    lines = list(reader.lines())
    list(scan(lines, stats))
    assert lines, "the kernel log since boot is never empty"
    assert reader.complete and reader.last_seq is not None
    assert stats.lines == len(lines)
    assert stats.skipped == 0


def test_boot_id_from_injectable_procfs(node: Node) -> None:
    assert boot_id(str(node.proc)) == BOOT_A
    with pytest.raises(KernelLogUnavailable, match="boot id"):
        boot_id(str(node.proc / "missing"))


# --------------------------------------------------------------------------- position across restarts


def test_same_boot_restart_does_not_report_again(node: Node) -> None:
    node.log(record(1, "eth0: up") + record(2, XID_79) + record(3, "x"))
    first = node.store().sync()
    assert first.added == 1 and first.state.kmsg_seq == 3
    again = node.store().sync()  # a new process: the position comes from the state dir
    assert again.added == 0
    node.log(record(4, XID_119))
    third = node.store().sync()
    assert third.added == 1
    assert [x for x, _, _ in _xids(node.store())] == [79, 119]
    saved = json.loads(Path(store_path(str(node.state))).read_text())
    assert (saved["boot_id"], saved["kmsg_seq"]) == (BOOT_A, 4)


def test_new_boot_starts_fresh_and_reads_from_the_first_record(node: Node) -> None:
    node.log(record(1, "a") + record(2, "b") + record(3, XID_79) + record(4, "c") + record(5, "d"))
    assert node.store().sync().added == 1
    # New boot: sequence numbers start again; seq 2 is below the old position but new.
    node.boot(BOOT_B, record(1, "boot") + record(2, XID_13))
    result = node.store().sync()
    assert result.added == 1 and result.state.boot_id == BOOT_B and result.state.kmsg_seq == 2
    assert any("reboot cleared 1" in n for n in result.notes)
    assert _xids(node.store()) == [(13, BOOT_B, True)]


def test_reboot_clears_reboot_and_reset_class_but_not_inspect_class(node: Node) -> None:
    node.log(record(1, XID_79) + record(2, XID_119) + record(3, XID_64) + record(4, XID_13) + record(5, XID_63))
    assert node.store().sync().added == 5
    node.boot(BOOT_B, record(1, "hello"))
    kept = _xids(node.store())
    assert kept == [(64, BOOT_A, False)], "only the inspect-class XID 64 survives the reboot"
    res = _check(node.store().observation(node.store().sync()))
    assert res.status == Status.FAIL and res.action == Action.INSPECT  # type: ignore[attr-defined]
    assert "earlier boot" in res.summary and "xid clear" in res.summary  # type: ignore[attr-defined]


def test_concurrent_readers_share_the_position(node: Node) -> None:
    """Events another reader already stored (position past them) are not added twice."""
    from nodehealth.probes.xid_store import add_events, catalog_for
    from nodehealth.xid.parse import parse_line

    node.log(record(1, XID_79) + record(2, XID_119))
    assert node.store().sync().added == 2
    state = load_state(str(node.state))[0]
    late = [parse_line(record(2, XID_119)), parse_line(record(3, XID_64))]
    added = add_events(state, [(e, None, 0.0) for e in late if e is not None], catalog_for(()))
    assert added == 1 and [e["xid"] for e in state.events] == [79, 119, 64]


# --------------------------------------------------------------------------- the store


def test_store_is_bounded_keeping_drain_events(node: Node) -> None:
    node.log("".join(record(i, XID_13) for i in range(1, 40)) + record(40, XID_79))
    res = node.store(max_events=10).sync()
    state = res.state
    assert len(state.events) == 10 and state.dropped == 30
    assert state.events[-1]["xid"] == 79


def test_corrupt_store_starts_again_with_a_note(node: Node) -> None:
    node.state.mkdir()
    Path(store_path(str(node.state))).write_text("{not json")
    node.log(record(1, XID_79))
    res = node.store().sync()
    assert res.added == 1 and any("not valid JSON" in n for n in res.notes)


def test_store_write_is_atomic_and_leaves_no_temp_files(node: Node) -> None:
    node.state.mkdir()
    save_state(str(node.state), StoreState(boot_id=BOOT_A, kmsg_seq=7))
    assert sorted(p.name for p in node.state.iterdir()) == ["xid-events.json"]
    assert load_state(str(node.state))[0].kmsg_seq == 7


def test_7000_line_log_without_xid_gives_zero_events_through_the_store(node: Node) -> None:
    lines = NO_XID_LOG.read_text(encoding="utf-8", errors="replace").splitlines()
    assert len(lines) >= 7000
    # As kmsg records (the message after the dmesg -T stamp) ...
    node.log("".join(record(i + 1, line.split("] ", 1)[-1]) for i, line in enumerate(lines)))
    res = node.store().sync()
    assert res.added == 0 and res.state.events == [] and res.state.kmsg_seq == len(lines)
    assert _check(node.store().observation(res)).status == Status.OK  # type: ignore[attr-defined]
    # ... and as the text file itself.
    plain = XidStore(str(node.state / "plain"), str(node.proc), str(NO_XID_LOG))
    assert plain.sync().added == 0


def test_severity_override_applies_to_stored_events(node: Node) -> None:
    node.log(record(1, XID_63))
    assert _check(node.store().observation(node.store().sync())).status == Status.WARN  # type: ignore[attr-defined]
    res = _check(node.store(overrides=("63=drain",)).observation(node.store().sync()))
    assert res.status == Status.FAIL  # type: ignore[attr-defined]


def test_deadline_is_honoured(node: Node) -> None:
    node.log("".join(record(i, "x") for i in range(1, 1000)))
    res = node.store().sync(deadline=time.monotonic() - 1)
    assert not res.complete
    check = _check(node.store().observation(res))
    assert check.status == Status.UNKNOWN and "not fully read" in check.summary  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- the probe


def test_probe_unreadable_kmsg_is_unknown_naming_the_reason(node: Node, tmp_path: Path) -> None:
    obs = gather(str(node.state), str(node.proc), str(tmp_path / "no-kmsg"), (), 1000, False, 2.0)
    assert isinstance(obs, XidObservation) and not obs.complete
    res = _check(obs)
    assert res.status == Status.UNKNOWN and "no-kmsg" in res.summary  # type: ignore[attr-defined]


def test_probe_keeps_failing_from_the_store_when_kmsg_becomes_unreadable(node: Node, tmp_path: Path) -> None:
    node.log(record(1, XID_79))
    gather(str(node.state), str(node.proc), str(node.kmsg), (), 1000, False, 2.0)
    obs = gather(str(node.state), str(node.proc), str(tmp_path / "gone"), (), 1000, False, 2.0)
    res = _check(obs)
    assert res.status == Status.FAIL and res.action == Action.REBOOT  # type: ignore[attr-defined]
    assert "gone" in res.summary  # type: ignore[attr-defined]


def test_probe_bad_override_is_a_probe_error(node: Node) -> None:
    obs = gather(str(node.state), str(node.proc), str(node.kmsg), ("63:drain",), 1000, False, 2.0)
    assert isinstance(obs, ProbeError) and "63:drain" in obs.message


def test_probe_as_non_root_is_unknown_naming_the_reason_not_a_crash(tmp_path: Path) -> None:
    """A real permission failure: a process that is not root opens a kernel log it may not read.

    As root, a forked child drops to nobody and opens a root-only file (root itself reads
    anything); as any other user, the test process opens a file it has no read permission on.
    """
    state = tmp_path / "state"
    state.mkdir()
    os.chmod(state, 0o777)
    os.chmod(tmp_path, 0o755)
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(record(1, XID_79))
    if os.geteuid() != 0:
        os.chmod(kmsg, 0o000)
        o = gather(str(state), "/proc", str(kmsg), (), 1000, False, 3.0)
        reason = o.message if isinstance(o, ProbeError) else o.notes[0]
        assert f"cannot read {kmsg}: Permission denied (reading the kernel log needs root or CAP_SYSLOG)" in reason
        assert _check(o).status == Status.UNKNOWN  # type: ignore[attr-defined]
        return
    os.chmod(kmsg, 0o600)
    # Fork and drop to nobody in the child: no interpreter has to be executable by nobody
    # (a pyenv or venv under /root is not).
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(rfd)
            os.setgid(65534)
            os.setuid(65534)
            o = gather(str(state), "/proc", str(kmsg), (), 1000, False, 3.0)
            os.write(wfd, json.dumps([type(o).__name__, getattr(o, "message", None) or o.notes[0]]).encode())
        finally:
            os._exit(0)
    os.close(wfd)
    with os.fdopen(rfd, "rb") as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    assert data, "the child running as nobody answered nothing"
    kind, reason = json.loads(data)
    # An XidObservation with the reason when the state dir is reachable, else a ProbeError:
    # either way the check says UNKNOWN with this text.
    assert kind in ("XidObservation", "ProbeError")
    assert f"cannot read {kmsg}: Permission denied (reading the kernel log needs root or CAP_SYSLOG)" in reason


# --------------------------------------------------------------------------- follower


def test_follower_reports_new_records_and_resumes_after_restart(node: Node) -> None:
    node.log(record(1, XID_79))
    seen: list[int] = []
    stop = threading.Event()
    t = threading.Thread(
        target=node.store().follow,
        args=(stop,),
        kwargs={"on_event": lambda r: seen.append(r.event.xid), "poll_s": 0.02},
    )
    t.start()
    _wait(lambda: seen == [79])
    node.log(record(2, "eth0: up") + record(3, XID_119))
    _wait(lambda: seen == [79, 119])
    stop.set()
    t.join(5)
    assert not t.is_alive(), "the follower stops promptly"
    assert load_state(str(node.state))[0].kmsg_seq == 3

    # Restart on the same boot: old records are not reported again, new ones are.
    node.log(record(4, XID_64))
    seen2: list[int] = []
    stop2 = threading.Event()
    t2 = threading.Thread(
        target=node.store().follow,
        args=(stop2,),
        kwargs={"on_event": lambda r: seen2.append(r.event.xid), "poll_s": 0.02},
    )
    t2.start()
    _wait(lambda: seen2 == [64])
    time.sleep(0.1)
    stop2.set()
    t2.join(5)
    assert seen2 == [64]


def test_follower_refuses_a_fifo_without_waiting_for_a_writer(node: Node, tmp_path: Path) -> None:
    """A FIFO is neither the kernel's record device nor a recorded log: refused, never read (a
    planted FIFO would otherwise feed the store whatever its writer likes)."""
    fifo = tmp_path / "kmsg.fifo"
    os.mkfifo(fifo)
    store = XidStore(str(node.state), str(node.proc), str(fifo))
    with pytest.raises(KernelLogUnavailable, match="is a FIFO"):
        store.follow(threading.Event(), poll_s=0.02)
    with pytest.raises(KernelLogUnavailable, match="is a FIFO"):
        store.sync()


def _wait(cond: object, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():  # type: ignore[operator]
            return
        time.sleep(0.01)
    raise AssertionError("condition not met in time")


# --------------------------------------------------------------------------- xid clear


def _config(tmp_path: Path, node: Node, extra: str = "") -> str:
    cfg = tmp_path / "nodehealth.toml"
    cfg.write_text(
        f'[paths]\nstate_dir = "{node.state}"\nprocfs_root = "{node.proc}"\n'
        f'[checks.gpu_xid]\nkmsg_path = "{node.kmsg}"\n{extra}'
    )
    return str(cfg)


def test_xid_clear_forgets_events_and_they_do_not_come_back(
    node: Node, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node.log(record(1, XID_79) + record(2, XID_13))
    node.store().sync()
    node.log(record(3, XID_64))  # not read yet: clear reads it first, then forgets it too
    cfg = _config(tmp_path, node)
    assert main(["xid", "clear", "--config", cfg]) == 0
    assert "cleared 3 XID event(s), 2 of them drain-class" in capsys.readouterr().out
    state = load_state(str(node.state))[0]
    assert state.events == [] and state.kmsg_seq == 3 and state.last_clear is not None
    assert _check(node.store().observation(node.store().sync())).status == Status.OK  # type: ignore[attr-defined]
    assert main(["xid", "clear", "--config", cfg]) == 0
    assert "cleared 0 XID event(s)" in capsys.readouterr().out


def test_xid_clear_with_state_dir_option(node: Node, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    node.log(record(1, XID_79))
    other = tmp_path / "other"
    store = XidStore(str(other), str(node.proc), str(node.kmsg))
    store.sync()
    cfg = _config(tmp_path, node)
    assert main(["xid", "clear", "--config", cfg, "--state-dir", str(other)]) == 0
    assert "cleared 1 XID event(s), 1 of them drain-class" in capsys.readouterr().out


def test_check_through_the_runner_fails_then_clear_passes(
    node: Node, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node.log(record(1, XID_119))
    cfg = _config(tmp_path, node, extra="")
    Path(cfg).write_text(Path(cfg).read_text().replace("[paths]", "[gpu]\nexpected_count = 0\n[paths]"))
    assert main(["check", "--config", cfg, "--only", "gpu_xid", "--format", "json"]) == 1
    report = json.loads(capsys.readouterr().out)
    (result,) = report["checks"]
    assert result["status"] == "FAIL" and result["action"] == "reset_gpu"
    assert result["details"]["events"][0]["xid"] == 119
    assert main(["xid", "clear", "--config", cfg]) == 0
    capsys.readouterr()
    assert main(["check", "--config", cfg, "--only", "gpu_xid"]) == 0


# --------------------------------------------------------------------------- attribution


def test_job_from_cgroup_v1_and_v2_paths() -> None:
    v2 = "0::/system.slice/slurmstepd.scope/job_81234/step_0/user/task_0\n"
    v1 = (
        "12:pids:/slurm/uid_1000/job_5512/step_batch/task_0\n"
        "4:devices:/slurm/uid_1000/job_5512/step_batch\n1:name=systemd:/user.slice\n"
    )
    assert job_from_cgroup(v2) == "81234"
    assert job_from_cgroup(v1) == "5512"
    assert job_from_cgroup("0::/user.slice/user-1000.slice/session-3.scope\n") is None
    assert job_from_cgroup("0::/job_array_thing\n") is None


def test_job_from_environ() -> None:
    assert job_from_environ(b"PATH=/bin\0SLURM_JOB_ID=99\0SLURM_JOBID=98\0") == "99"
    assert job_from_environ(b"SLURM_JOBID=98\0") == "98"
    assert job_from_environ(b"SLURM_JOB_ID=abc\0") is None
    assert job_from_environ(b"") is None


def _uptime() -> float:
    with open("/proc/uptime") as fh:
        return float(fh.read().split()[0])


def test_attribution_from_a_live_process(tmp_path: Path) -> None:
    """A real child with SLURM_JOB_ID in its environment, found through the real /proc."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)"], env={**os.environ, "SLURM_JOB_ID": "424242"}
    )
    try:
        time.sleep(0.2)
        assert live_job(child.pid) == "424242"
        # An event logged before the process started: that pid was someone else then.
        assert live_job(child.pid, event_uptime_s=1.0) is None
        kmsg = tmp_path / "kmsg"
        usec = int((_uptime() + 1) * 1_000_000)
        kmsg.write_text(
            record(
                1,
                f"NVRM: Xid (PCI:0000:3b:00): 13, pid={child.pid}, name=python3, Graphics Exception: ESR 0x50",
                usec=usec,
            )
        )
        store = XidStore(str(tmp_path / "state"), "/proc", str(kmsg))
        (rec,) = store.observation(store.sync()).records
        assert rec.event.job_id == "424242" and rec.event.pid == child.pid
    finally:
        child.kill()
        child.wait()
    # The process is gone: the job id recorded while it lived stays in the store.
    (rec,) = store.observation(store.sync()).records
    assert rec.event.job_id == "424242"


def _ledger(state: Path, *records: ledger.JobRecord) -> None:
    state.mkdir(parents=True, exist_ok=True)
    with open(state / ledger.FILE_NAME, "a") as fh:
        for r in records:
            fh.write(r.line())


def test_attribution_from_the_ledger_by_gpu_and_time(node: Node) -> None:
    t0 = BTIME + 1000.0
    _ledger(
        node.state,
        ledger.JobRecord("start", "100", t0, user="alice", gpus=(0, 1)),
        ledger.JobRecord("start", "200", t0 + 10, user="bob", gpus=(2, 3)),
        ledger.JobRecord("end", "100", t0 + 500),
        ledger.JobRecord("start", "300", t0 + 600, user="carol", gpus=(0, 1)),
    )
    with open(node.state / ledger.FILE_NAME, "a") as fh:
        fh.write("garbage line\n")
    entries = ledger.entries(ledger.read(str(node.state)))
    assert {e.job_id: (e.start, e.end, e.gpus) for e in entries} == {
        "100": (t0, t0 + 500, (0, 1)),
        "200": (t0 + 10, None, (2, 3)),
        "300": (t0 + 600, None, (0, 1)),
    }
    assert ledger.holder(entries, 1, t0 + 100) == "100"
    assert ledger.holder(entries, 3, t0 + 100) == "200"
    assert ledger.holder(entries, 1, t0 + 510) == "100", "just after its end, nobody else on the GPU"
    assert ledger.holder(entries, 1, t0 + 700) == "300"
    assert ledger.holder(entries, 5, t0 + 100) is None
    assert ledger.holder(entries, None, t0 + 100) is None, "two jobs on the node: not guessed"
    assert ledger.holder(entries, 1, None) is None

    # Through the store and the check: the pid is long gone, the GPU comes from NVML.
    node.log(record(1, XID_119.replace("0000:9b:00", "0000:3b:00"), usec=120 * 1_000_000 + 1000 * 1_000_000))
    snap = NvmlSnapshot(
        "550.54",
        12040,
        2,
        (
            GpuObservation(index=0, uuid="GPU-aaaa", pci_bus_id="00000000:1A:00.0"),
            GpuObservation(index=1, uuid="GPU-bbbb", pci_bus_id="00000000:3B:00.0"),
        ),
        0.01,
    )
    obs = node.store().observation(node.store().sync())
    res = _check(obs, nvml=snap)
    assert res.status == Status.FAIL and res.gpu == 1  # type: ignore[attr-defined]
    (event,) = res.details["events"]  # type: ignore[attr-defined]
    assert (event["gpu"], event["gpu_uuid"], event["job_id"]) == (1, "GPU-bbbb", "100")
    assert "GPU 1 (0000:3b:00)" in res.summary and "job 100" in res.summary  # type: ignore[attr-defined]


def test_ledger_entries_pair_start_and_end_and_restart() -> None:
    records = [
        ledger.JobRecord("start", "7", 10.0, gpus=(0,)),
        ledger.JobRecord("end", "7", 20.0),
        ledger.JobRecord("end", "8", 30.0),
    ]
    (entry,) = ledger.entries(records)
    assert (entry.job_id, entry.start, entry.end, entry.gpus) == ("7", 10.0, 20.0, (0,))
    requeued = [*records, ledger.JobRecord("start", "7", 40.0, gpus=(1,))]
    (entry,) = ledger.entries(requeued)
    assert (entry.start, entry.end, entry.gpus) == (40.0, None, (1,))


def test_xid_scan_fills_gpu_from_nvml(tmp_path: Path, scenario: object, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "dmesg.txt"
    log.write_text("[ 94.5] NVRM: Xid (PCI:0000:2a:00): 48, pid=9, name=a.out, An uncorrectable double bit error\n")
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[nvml]\nsimulate = "{scenario("healthy-8x-h100")}"\n')  # type: ignore[operator]
    assert main(["xid", "scan", "--from", str(log), "--config", str(cfg), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["gpu"] == 1 and data["gpu_uuid"]
    assert main(["xid", "scan", "--from", str(log), "--config", str(cfg), "--no-nvml", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["gpu"] is None


# --------------------------------------------------------------------------- the real /dev/kmsg


# Writing into the host's kernel log outlives the test (every kmsg reader on the host sees the line
# until a reboot), so it happens only where the host is throwaway and says so: .ci/run sets this.
KMSG_WRITE_ENV = "NODEHEALTH_TEST_WRITE_KMSG"
# A line no real node prints: a PCI domain no platform has (ffff), a process named for the test.
XID_145_TEST = (
    "NVRM: Xid (PCI:ffff:ff:1f): 145, pid=1, name=nodehealth-test, RLW_RXPIPE Nonfatal XC0 i0 "
    "Link 13 (0x0409a0c2 0x00000008 0x00000001 0x00000000 0x00100000 0x00000004)"
)


def _kmsg_writable() -> bool:
    return os.environ.get(KMSG_WRITE_ENV) == "1" and os.geteuid() == 0 and os.access("/dev/kmsg", os.R_OK | os.W_OK)


@pytest.mark.real
@pytest.mark.skipif(
    not _kmsg_writable(),
    reason=f"writes a line into the host's /dev/kmsg: needs root and "
    f"{KMSG_WRITE_ENV}=1 (set by .ci/run on throwaway machines only)",
)
def test_follower_picks_up_a_real_xid_line_written_to_dev_kmsg(tmp_path: Path) -> None:
    # XID 145 Nonfatal: warning class, so the line left in this boot's log drains nothing; its PCI
    # address and process name are the test's, so no reader can take it for a real GPU's.
    # A line written from user space carries the user facility: only a store that also counts
    # those (kernel_facility_only = false) takes it; the default store never does (below).
    store = XidStore(str(tmp_path / "state"), "/proc", "/dev/kmsg", kernel_only=False)
    store.sync()  # this boot's backlog, whatever earlier runs left in it
    seen: list[XidRecord] = []
    stop = threading.Event()
    t = threading.Thread(target=store.follow, args=(stop,), kwargs={"on_event": seen.append, "poll_s": 0.05})
    t.start()
    try:
        time.sleep(0.2)
        with open("/dev/kmsg", "w") as fh:
            fh.write(f"<4>{XID_145_TEST}\n")
        _wait(lambda: any(r.event.xid == 145 for r in seen))
    finally:
        stop.set()
        t.join(5)
    assert not t.is_alive()
    (rec,) = [r for r in seen if r.event.xid == 145]
    assert rec.event.pci == "ffff:ff:1f" and rec.event.seq is not None and rec.event.uptime_s is not None
    assert rec.event.process == "nodehealth-test" and rec.boot_id == boot_id()
    # The store has it, and reading again (a restart on the same boot) does not report it twice.
    assert store.sync().added == 0
    res = _check(store.observation(store.sync()))
    assert res.status == Status.WARN and "XID 145" in res.summary  # type: ignore[attr-defined]
    default = XidStore(str(tmp_path / "default-state"), "/proc", "/dev/kmsg")
    assert not [d for d in default.sync().state.events if d["pci"] == "ffff:ff:1f"]
