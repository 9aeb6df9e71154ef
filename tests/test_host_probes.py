"""Host probes against fixture procfs/sysfs trees, real round trips and real hangs (a FIFO)."""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import Timing

from nodehealth import runner
from nodehealth.config import loader as C
from nodehealth.model import Status
from nodehealth.observations import IbPort, MountObservation, ProbeError, SharedDirObservation
from nodehealth.platform import child
from nodehealth.probes import PROBES, Probe, ProbeContext, host

SLACK_S = 0.5  # a hang must be answered within its deadline plus this (quiet machine; timing.slack scales it)

# --------------------------------------------------------------------------- the killable child


def test_child_returns_the_value() -> None:
    out = child.wait_all([child.start(lambda: (1, "two"))], 5.0)[0]
    assert (out.ok, out.value, out.timed_out) == (True, (1, "two"), False)


def test_child_reports_the_exception() -> None:
    def fail() -> None:
        raise OSError(errno.ESTALE, os.strerror(errno.ESTALE))

    out = child.wait_all([child.start(fail)], 5.0)[0]
    assert (out.ok, out.timed_out) == (False, False)
    assert out.value == os.strerror(errno.ESTALE)


@pytest.mark.timing
def test_child_that_blocks_is_abandoned_at_the_deadline(tmp_path: Path, timing: Timing) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    out = child.wait_all([child.start(lambda: open(fifo).read())], 0.5)[0]  # no writer: open() blocks for ever
    took = time.monotonic() - t0
    assert out.timed_out and not out.ok
    assert "did not answer within 0.5 s" in out.value
    assert 0.5 <= took < 0.5 + timing.slack(SLACK_S)


@pytest.mark.timing
def test_children_run_in_parallel_under_one_deadline(tmp_path: Path, timing: Timing) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    outs = child.wait_all(
        [child.start(lambda: open(fifo).read()), child.start(lambda: 42), child.start(lambda: open(fifo).read())], 0.5
    )
    assert time.monotonic() - t0 < 0.5 + timing.slack(SLACK_S)
    assert [o.timed_out for o in outs] == [True, False, True]
    assert outs[1].value == 42


# --------------------------------------------------------------------------- mountinfo

# Lines in the kernel's mountinfo format (proc(5)) for an ext4 root, an NFS and a Lustre client,
# with the escapes the kernel writes (\040 space, \134 backslash), a mount point mounted over
# twice, and a garbage line.
MOUNTINFO = (Path(__file__).parent / "fixtures" / "host" / "mountinfo").read_text()


def test_parse_mountinfo_reads_type_source_and_options() -> None:
    entries = {e.mount_point: e for e in host.parse_mountinfo(MOUNTINFO)}
    assert entries["/home"] == host.MountEntry("/home", "nfs4", "nas01:/export/home", False)
    lustre = entries["/lustre/scratch"]  # two optional fields before the separator
    assert (lustre.fstype, lustre.source) == ("lustre", "10.1.0.1@o2ib:10.1.0.2@o2ib:/scratch")
    assert entries["/apps"].read_only  # read-only mount
    assert entries["/data"].read_only  # read-only super block (e.g. remounted ro after errors)
    assert not entries["/"].read_only


def test_parse_mountinfo_decodes_octal_escapes() -> None:
    entry = host.find_mount(host.parse_mountinfo(MOUNTINFO), "/mnt/my disk")
    assert entry is not None
    assert entry.source == "/dev/mapper/vg\\x"


def test_the_last_mount_on_a_mount_point_wins() -> None:
    entry = host.find_mount(host.parse_mountinfo(MOUNTINFO), "/tmp/")
    assert entry is not None and entry.fstype == "xfs"


def test_parse_this_machines_mountinfo() -> None:
    with open("/proc/self/mountinfo") as fh:
        entries = host.parse_mountinfo(fh.read())
    root = host.find_mount(entries, "/")
    assert root is not None and root.fstype and root.source


def test_parse_mountinfo_skips_malformed_lines() -> None:
    assert host.parse_mountinfo("garbage\n1 2 3\n") == []


def _procfs(tmp_path: Path, mountinfo: str) -> str:
    root = tmp_path / "proc"
    (root / "self").mkdir(parents=True)
    (root / "self" / "mountinfo").write_text(mountinfo)
    return str(root)


def test_mounts_probe_reads_mountinfo_and_statvfs(tmp_path: Path) -> None:
    real = tmp_path / "scratch"
    real.mkdir()
    procfs = _procfs(tmp_path, MOUNTINFO + f"200 22 0:60 / {real} rw - lustre 10.1.0.1@o2ib:/s rw\n")
    found = host.mounts([str(real), "/nowhere"], 5.0, procfs_root=procfs)
    assert isinstance(found, tuple)
    scratch, nowhere = found
    st = os.statvfs(real)
    assert scratch.present and scratch.fstype == "lustre" and scratch.read_only is False
    assert scratch.total_bytes == st.f_blocks * st.f_frsize
    assert scratch.free_bytes is not None and scratch.free_bytes > 0
    assert scratch.error is None
    assert nowhere == MountObservation("/nowhere", present=False)


@pytest.mark.timing
def test_mounts_probe_hung_statvfs_is_an_error_not_a_hang(tmp_path: Path, timing: Timing) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)

    def hung_statvfs(path: str) -> Any:
        open(fifo).read()  # blocks like statvfs on a dead NFS server
        return os.statvfs(path)

    procfs = _procfs(tmp_path, MOUNTINFO)
    t0 = time.monotonic()
    found = host.mounts(["/home", "/apps"], 0.5, procfs_root=procfs, statvfs=hung_statvfs)
    assert time.monotonic() - t0 < 0.5 + timing.slack(SLACK_S)
    assert isinstance(found, tuple)
    assert [m.error for m in found] == ["statvfs did not answer within 0.5 s (hung mount?)"] * 2
    assert found[0].fstype == "nfs4" and found[0].free_bytes is None


def test_mounts_probe_statvfs_failure(tmp_path: Path) -> None:
    def stale(path: str) -> Any:
        raise OSError(errno.ESTALE, os.strerror(errno.ESTALE), path)

    found = host.mounts(["/home"], 5.0, procfs_root=_procfs(tmp_path, MOUNTINFO), statvfs=stale)
    assert isinstance(found, tuple)
    assert found[0].error == f"statvfs failed: {os.strerror(errno.ESTALE)}"


def test_mounts_probe_without_mountinfo(tmp_path: Path) -> None:
    found = host.mounts(["/home"], 5.0, procfs_root=str(tmp_path / "no-proc"))
    assert isinstance(found, ProbeError) and found.kind == "unavailable"
    assert "mountinfo" in found.message


def test_mounts_probe_with_nothing_configured_forks_nothing(tmp_path: Path) -> None:
    pending = host.start_mounts([], 5.0, procfs_root=str(tmp_path / "no-proc"))
    assert pending.children == {}
    assert pending.collect() == ()


# --------------------------------------------------------------------------- shared directories


def test_round_trip_in_a_real_directory(tmp_path: Path) -> None:
    (trip,) = host.shared_dirs([str(tmp_path)], 5.0)
    assert (trip.path, trip.ok, trip.timed_out, trip.error) == (str(tmp_path), True, False, None)
    assert list(tmp_path.iterdir()) == []  # the file was deleted


def test_round_trip_file_names_are_unique() -> None:
    a, b = host.round_trip_name(), host.round_trip_name()
    assert a != b
    assert a.startswith(host.ROUND_TRIP_PREFIX) and f"-{os.getpid()}-" in a


def test_round_trip_in_a_missing_directory(tmp_path: Path) -> None:
    (trip,) = host.shared_dirs([str(tmp_path / "gone")], 5.0)
    assert not trip.ok and not trip.timed_out
    assert trip.error == f"create: {os.strerror(errno.ENOENT)}"


def test_round_trip_never_writes_through_a_symlink(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    (tmp_path / "link").symlink_to(victim)
    (trip,) = host.shared_dirs([str(tmp_path)], 5.0, name_for=lambda _p: "link")
    assert not trip.ok and trip.error is not None and trip.error.startswith("create:")
    assert victim.read_text() == "keep me"


@pytest.mark.timing
def test_hung_shared_dir_times_out_within_the_deadline(tmp_path: Path, timing: Timing) -> None:
    hung = tmp_path / "hung"
    hung.mkdir()
    os.mkfifo(hung / "stuck")  # opening it for writing blocks: no reader will ever come
    healthy = tmp_path / "healthy"
    healthy.mkdir()
    t0 = time.monotonic()
    trips = host.shared_dirs(
        [str(hung), str(healthy)], 1.0, name_for=lambda p: "stuck" if p == str(hung) else host.round_trip_name()
    )
    took = time.monotonic() - t0
    assert took < 1.0 + timing.slack(SLACK_S)
    assert trips[0] == SharedDirObservation(
        str(hung), ok=False, elapsed_s=trips[0].elapsed_s, timed_out=True, error="did not answer within 1 s"
    )
    assert trips[0].elapsed_s >= 1.0
    assert trips[1].ok and not trips[1].timed_out


# --------------------------------------------------------------------------- InfiniBand


@pytest.mark.parametrize(
    "text,expected",
    [
        ("4: ACTIVE\n", "ACTIVE"),
        ("1: DOWN\n", "DOWN"),
        ("2: INIT\n", "INIT"),
        ("3: ARMED\n", "ARMED"),
        ("5: ACTIVE_DEFER\n", "ACTIVE_DEFER"),
        ("ACTIVE\n", None),
        ("4:\n", None),
        ("4: ACTIVE now\n", None),
        ("", None),
    ],
    ids=lambda v: repr(v),
)
def test_parse_state(text: str, expected: Any) -> None:
    assert host.parse_state(text) == expected


@pytest.mark.parametrize(
    "text,expected",
    [
        ("5: LinkUp\n", "LinkUp"),
        ("2: Polling\n", "Polling"),
        ("3: Disabled\n", "Disabled"),
        ("7: Phy Test\n", "Phy Test"),
        ("0: <unknown>\n", "<unknown>"),
        ("LinkUp\n", None),
        ("5: \n", None),
    ],
    ids=lambda v: repr(v),
)
def test_parse_phys_state(text: str, expected: Any) -> None:
    assert host.parse_phys_state(text) == expected


@pytest.mark.parametrize(
    "text,expected",
    [
        ("400 Gb/sec (4X NDR)\n", 400.0),
        ("100 Gb/sec (4X EDR)\n", 100.0),
        ("25 Gb/sec (1X EDR)\n", 25.0),
        ("2.5 Gb/sec (1X SDR)\n", 2.5),
        ("200 Gb/sec (2X NDR)\n", 200.0),
        ("10 Gb/sec (4X)\n", 10.0),
        ("56 Gb/sec (4X FDR)\n", 56.0),
        ("fast\n", None),
        ("400 Mb/sec (4X NDR)\n", None),
        ("400 Gb/sec\n", None),
        ("", None),
    ],
    ids=lambda v: repr(v),
)
def test_parse_rate(text: str, expected: Any) -> None:
    assert host.parse_rate(text) == expected


def _ib_port(root: Path, device: str, port: int, **files: str) -> None:
    d = root / "class" / "infiniband" / device / "ports" / str(port)
    d.mkdir(parents=True)
    for name, text in files.items():
        (d / name).write_text(text + "\n")


UP = {"state": "4: ACTIVE", "phys_state": "5: LinkUp", "rate": "400 Gb/sec (4X NDR)", "link_layer": "InfiniBand"}


def test_infiniband_ports_in_every_state(tmp_path: Path) -> None:
    _ib_port(tmp_path, "mlx5_0", 1, **UP)
    _ib_port(
        tmp_path, "mlx5_1", 1, **{**UP, "state": "1: DOWN", "phys_state": "2: Polling", "rate": "10 Gb/sec (4X SDR)"}
    )
    _ib_port(tmp_path, "mlx5_2", 1, **{**UP, "state": "2: INIT"})
    _ib_port(tmp_path, "mlx5_2", 2, **{**UP, "state": "3: ARMED", "rate": "100 Gb/sec (4X EDR)"})
    _ib_port(
        tmp_path,
        "mlx5_3",
        1,
        **{**UP, "phys_state": "3: Disabled", "link_layer": "Ethernet", "rate": "25 Gb/sec (1X EDR)"},
    )
    (tmp_path / "class" / "infiniband" / "mlx5_0" / "ports" / "README").mkdir()  # not a port
    ports = host.infiniband(str(tmp_path))
    assert ports == (
        IbPort("mlx5_0", 1, "ACTIVE", "LinkUp", 400.0, "InfiniBand"),
        IbPort("mlx5_1", 1, "DOWN", "Polling", 10.0, "InfiniBand"),
        IbPort("mlx5_2", 1, "INIT", "LinkUp", 400.0, "InfiniBand"),
        IbPort("mlx5_2", 2, "ARMED", "LinkUp", 100.0, "InfiniBand"),
        IbPort("mlx5_3", 1, "ACTIVE", "Disabled", 25.0, "Ethernet"),
    )


def test_infiniband_ports_sort_numerically(tmp_path: Path) -> None:
    for n in (10, 2, 1):
        _ib_port(tmp_path, "hfi1_0", n, **UP)
    assert [p.port for p in host.infiniband(str(tmp_path))] == [1, 2, 10]


def test_infiniband_malformed_and_missing_values_name_the_file(tmp_path: Path) -> None:
    _ib_port(tmp_path, "mlx5_0", 1, state="4: ACTIVE", phys_state="LinkUp", rate="fast")
    (p,) = host.infiniband(str(tmp_path))
    where = tmp_path / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    assert (p.state, p.phys_state, p.rate_gbps, p.link_layer) == ("ACTIVE", None, None, None)
    assert p.error is not None
    assert f"{where / 'phys_state'}: malformed value 'LinkUp'" in p.error
    assert f"{where / 'rate'}: malformed value 'fast'" in p.error
    assert f"{where / 'link_layer'}: {os.strerror(errno.ENOENT)}" in p.error


def test_no_infiniband_class_means_no_ports(tmp_path: Path) -> None:
    assert host.infiniband(str(tmp_path)) == ()


# --------------------------------------------------------------------------- through the runner


def _config(tmp_path: Path, checks: dict[str, Any]) -> C.Config:
    raw = {"paths": {"sysfs_root": str(tmp_path / "sys"), "procfs_root": str(tmp_path / "proc")}, "checks": checks}
    return C.resolve(raw, "<test>", host="gpu001", environ={})


def test_runner_gathers_host_probes(tmp_path: Path) -> None:
    _ib_port(tmp_path / "sys", "mlx5_0", 1, **{**UP, "rate": "200 Gb/sec (4X HDR)"})
    shared = tmp_path / "shared"
    shared.mkdir()
    _procfs(tmp_path, MOUNTINFO + f"200 22 0:60 / {shared} rw - nfs4 nas:/shared rw\n")
    cfg = _config(
        tmp_path,
        {
            "host_memory": {"min_total_gib": 1 << 19},  # nobody has 512 TiB
            "host_mounts": {
                "mounts": [{"path": str(shared), "fstype": "nfs4"}, {"path": "/lustre/scratch", "fstype": "nfs4"}]
            },
            "host_shared_dir": {"paths": [str(shared)]},
            "host_infiniband": {"min_ports": 1, "min_rate_gbps": 400},
        },
    )
    report = runner.run(cfg, only=("host_memory", "host_mounts", "host_shared_dir", "host_infiniband"), node="gpu001")
    got = {r.name: r for r in report.results}
    assert got["host_memory"].status == Status.FAIL and "expected" in got["host_memory"].summary
    assert got["host_mounts"].status == Status.FAIL
    assert got["host_mounts"].summary.startswith(
        "/lustre/scratch: lustre from 10.1.0.1@o2ib:10.1.0.2@o2ib:/scratch mounted, nfs4 expected"
    )
    assert str(shared) not in got["host_mounts"].summary
    assert got["host_shared_dir"].status == Status.OK
    assert got["host_infiniband"].status == Status.FAIL
    assert "rate 200 Gb/s, below 400 Gb/s" in got["host_infiniband"].summary


def test_runner_with_nothing_configured_skips_mounts_and_shared_dirs(tmp_path: Path) -> None:
    report = runner.run(
        _config(tmp_path, {}), only=("host_mounts", "host_shared_dir", "host_infiniband"), node="gpu001"
    )
    assert [r.status for r in report.results] == [Status.SKIPPED] * 3


@pytest.mark.timing
def test_runner_verdict_on_a_hung_shared_dir_arrives_in_time(tmp_path: Path, timing: Timing) -> None:
    hung = tmp_path / "hung"
    hung.mkdir()
    os.mkfifo(hung / "stuck")

    def gather(ctx: ProbeContext, timeout_s: float) -> Any:
        paths = ctx.config.checks["host_shared_dir"].paths  # type: ignore[attr-defined]
        return host.start_shared_dirs(paths, timeout_s, name_for=lambda _p: "stuck")

    probes = {**PROBES, "shared_dirs": Probe("shared_dirs", gather, forks=True)}
    cfg = _config(tmp_path, {"host_shared_dir": {"paths": [str(hung)], "timeout_s": 1.0}})
    t0 = time.monotonic()
    report = runner.run(cfg, only=("host_shared_dir",), probes=probes, node="gpu001")
    assert time.monotonic() - t0 < 1.0 + timing.slack(SLACK_S)
    (res,) = report.results
    assert res.status == Status.FAIL
    assert res.summary.startswith(f"{hung}: did not answer within 1.0 s")
