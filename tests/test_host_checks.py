"""Host checks as tables: observations in, status / action / summary out."""

from __future__ import annotations

from typing import Any, Optional

import pytest

from nodehealth.checks import host_infiniband, host_memory, host_mounts, host_shared_dir
from nodehealth.checks.base import Context
from nodehealth.model import Action, Status
from nodehealth.observations import (
    IbPort,
    MemoryObservation,
    MountObservation,
    Observations,
    ProbeError,
    SharedDirObservation,
)

GIB = 1 << 30


def ctx(name: str) -> Context:
    return Context(name=name, phase="manual", node="gpu001", expected_gpus=8)


# --------------------------------------------------------------------------- memory

MEM_OK = MemoryObservation(total_bytes=503 * GIB, available_bytes=480 * GIB)
MEM_DIMM_MISSING = MemoryObservation(total_bytes=440 * GIB, available_bytes=430 * GIB)
MEM_LOW = MemoryObservation(total_bytes=503 * GIB, available_bytes=8 * GIB)

MEMORY_CASES: list[tuple[str, Any, dict[str, Any], Status, Action, str]] = [
    ("healthy", MEM_OK, {"min_total_gib": 500, "min_available_gib": 16}, Status.OK, Action.NONE, "503.0 GiB physical"),
    (
        "dimm-missing",
        MEM_DIMM_MISSING,
        {"min_total_gib": 500},
        Status.FAIL,
        Action.INSPECT,
        "440.0 GiB physical memory, 500 GiB expected",
    ),
    (
        "low-available-gib",
        MEM_LOW,
        {"min_available_gib": 16},
        Status.FAIL,
        Action.NONE,
        "8.0 GiB available, below 16 GiB",
    ),
    (
        "low-available-pct",
        MEM_LOW,
        {"min_available_pct": 5},
        Status.FAIL,
        Action.NONE,
        "1.6% of memory available, below 5%",
    ),
    (
        "dimm-and-low-inspect-wins",
        MemoryObservation(440 * GIB, 4 * GIB),
        {"min_total_gib": 500, "min_available_gib": 16},
        Status.FAIL,
        Action.INSPECT,
        "500 GiB expected",
    ),
    ("no-threshold", MEM_LOW, {}, Status.SKIPPED, Action.NONE, "no memory threshold configured"),
    (
        "probe-error",
        ProbeError("memory", "error", "psutil exploded"),
        {"min_available_gib": 1},
        Status.UNKNOWN,
        Action.NONE,
        "psutil exploded",
    ),
    ("not-probed", None, {"min_available_gib": 1}, Status.UNKNOWN, Action.NONE, "not probed"),
]


@pytest.mark.parametrize(
    "obs,settings,status,action,summary", [c[1:] for c in MEMORY_CASES], ids=[c[0] for c in MEMORY_CASES]
)
def test_host_memory(obs: Any, settings: dict[str, Any], status: Status, action: Action, summary: str) -> None:
    res = host_memory.evaluate(Observations(memory=obs), host_memory.Settings(**settings), ctx("host_memory"))
    assert (res.status, res.action) == (status, action), res.summary
    assert summary in res.summary


def test_host_memory_details_in_gib() -> None:
    res = host_memory.evaluate(Observations(memory=MEM_OK), host_memory.Settings(min_total_gib=1), ctx("host_memory"))
    assert res.details["total_gib"] == 503.0
    assert res.details["available_gib"] == 480.0


# --------------------------------------------------------------------------- mounts

Spec = host_mounts.MountSpec
SCRATCH = MountObservation("/scratch", True, "lustre", "10.0.0.1@o2ib:/scratch", False, 1000 * GIB, 400 * GIB)
HOME = MountObservation("/home", True, "nfs4", "nas:/home", False, 100 * GIB, 50 * GIB)

MOUNT_CASES: list[tuple[str, Any, tuple[Any, ...], Status, str]] = [
    (
        "all-good",
        (SCRATCH, HOME),
        (Spec("/scratch", "lustre", True, 100), Spec("/home", "nfs4")),
        Status.OK,
        "2 mount(s) present",
    ),
    ("any-fstype", (HOME,), (Spec("/home"),), Status.OK, "/home (nfs4)"),
    ("trailing-slash-in-config", (HOME,), (Spec("/home/"),), Status.OK, "1 mount(s) present"),
    ("absent", (MountObservation("/scratch", False),), (Spec("/scratch"),), Status.FAIL, "/scratch: not mounted"),
    (
        "wrong-type",
        (MountObservation("/scratch", True, "ext4", "/dev/sda2", False, GIB, GIB),),
        (Spec("/scratch", "lustre"),),
        Status.FAIL,
        "/scratch: ext4 from /dev/sda2 mounted, lustre expected",
    ),
    (
        "read-only-must-write",
        (MountObservation("/home", True, "nfs4", "nas:/home", True, GIB, GIB),),
        (Spec("/home"),),
        Status.FAIL,
        "/home: mounted read-only",
    ),
    (
        "read-only-allowed",
        (MountObservation("/apps", True, "nfs4", "nas:/apps", True, GIB, GIB),),
        (Spec("/apps", writable=False),),
        Status.OK,
        "1 mount(s) present",
    ),
    (
        "low-free",
        (SCRATCH,),
        (Spec("/scratch", min_free_gib=500),),
        Status.FAIL,
        "/scratch: 400.0 GiB free, below 500 GiB",
    ),
    (
        "hung-statvfs",
        (
            MountObservation(
                "/scratch", True, "lustre", "x", False, error="statvfs did not answer within 5 s (hung mount?)"
            ),
        ),
        (Spec("/scratch", min_free_gib=1),),
        Status.FAIL,
        "/scratch: statvfs did not answer within 5 s",
    ),
    (
        "free-unknown",
        (MountObservation("/scratch", True, "lustre", "x", False),),
        (Spec("/scratch", min_free_gib=1),),
        Status.UNKNOWN,
        "free space unknown",
    ),
    ("relative-path-in-config", (), (Spec("scratch"),), Status.UNKNOWN, "is not absolute"),
    ("none-configured", (SCRATCH,), (), Status.SKIPPED, "no mounts configured"),
    (
        "probe-error",
        ProbeError("mounts", "unavailable", "/proc/self/mountinfo: No such file"),
        (Spec("/scratch"),),
        Status.UNKNOWN,
        "mountinfo",
    ),
    (
        "runner-timeout-is-fail",
        ProbeError("mounts", "timeout", "mounts probe did not finish within 5.2 s"),
        (Spec("/scratch"),),
        Status.FAIL,
        "mounts did not answer",
    ),
]


@pytest.mark.parametrize("obs,specs,status,summary", [c[1:] for c in MOUNT_CASES], ids=[c[0] for c in MOUNT_CASES])
def test_host_mounts(obs: Any, specs: tuple[Any, ...], status: Status, summary: str) -> None:
    res = host_mounts.evaluate(Observations(mounts=obs), host_mounts.Settings(mounts=specs), ctx("host_mounts"))
    assert res.status == status, res.summary
    assert summary in res.summary
    assert res.action == Action.NONE


def test_host_mounts_reports_every_problem_of_one_mount() -> None:
    obs = (MountObservation("/scratch", True, "xfs", "/dev/sdb", True, 10 * GIB, GIB),)
    res = host_mounts.evaluate(
        Observations(mounts=obs),
        host_mounts.Settings(mounts=(Spec("/scratch", "lustre", True, 5),)),
        ctx("host_mounts"),
    )
    assert res.status == Status.FAIL
    for part in ("xfs from /dev/sdb mounted, lustre expected", "mounted read-only", "1.0 GiB free"):
        assert part in res.summary


# --------------------------------------------------------------------------- shared directories

SHARED_CASES: list[tuple[str, Any, tuple[str, ...], Status, str]] = [
    (
        "round-trip-ok",
        (SharedDirObservation("/home/.nh", True, 0.012),),
        ("/home/.nh",),
        Status.OK,
        "1 shared dir(s): write, fsync, read, delete in 12 ms",
    ),
    (
        "hung",
        (SharedDirObservation("/lustre/.nh", False, 5.0, timed_out=True, error="did not answer"),),
        ("/lustre/.nh",),
        Status.FAIL,
        "/lustre/.nh: did not answer within 5.0 s",
    ),
    (
        "write-error",
        (SharedDirObservation("/home/.nh", False, 0.01, error="fsync: Input/output error"),),
        ("/home/.nh",),
        Status.FAIL,
        "/home/.nh: round trip failed: fsync: Input/output error",
    ),
    (
        "one-of-two-bad",
        (
            SharedDirObservation("/a", True, 0.01),
            SharedDirObservation("/b", False, 0.01, error="create: Permission denied"),
        ),
        ("/a", "/b"),
        Status.FAIL,
        "/b: round trip failed: create: Permission denied",
    ),
    (
        "runner-timeout-is-fail",
        ProbeError("shared_dirs", "timeout", "shared_dirs probe did not finish within 5.2 s"),
        ("/a",),
        Status.FAIL,
        "did not finish within 5.2 s",
    ),
    (
        "other-probe-error",
        ProbeError("shared_dirs", "error", "OSError: cannot fork"),
        ("/a",),
        Status.UNKNOWN,
        "cannot fork",
    ),
    ("none-configured", (), (), Status.SKIPPED, "no shared directory configured"),
]


@pytest.mark.parametrize("obs,paths,status,summary", [c[1:] for c in SHARED_CASES], ids=[c[0] for c in SHARED_CASES])
def test_host_shared_dir(obs: Any, paths: tuple[str, ...], status: Status, summary: str) -> None:
    res = host_shared_dir.evaluate(
        Observations(shared_dirs=obs), host_shared_dir.Settings(paths=paths), ctx("host_shared_dir")
    )
    assert res.status == status, res.summary
    assert summary in res.summary


def test_host_shared_dir_default_deadline_is_short() -> None:
    assert host_shared_dir.Settings().timeout_s == 5.0


# --------------------------------------------------------------------------- InfiniBand


def port(
    device: str = "mlx5_0",
    number: int = 1,
    state: Optional[str] = "ACTIVE",
    phys: Optional[str] = "LinkUp",
    rate: Optional[float] = 400.0,
    layer: Optional[str] = "InfiniBand",
    error: Optional[str] = None,
) -> IbPort:
    return IbPort(device, number, state, phys, rate, layer, error)


NDR = {"min_rate_gbps": 400.0}
IB_CASES: list[tuple[str, Any, dict[str, Any], Status, Action, str]] = [
    (
        "all-active",
        (port("mlx5_0"), port("mlx5_1")),
        {"min_ports": 2, **NDR},
        Status.OK,
        Action.NONE,
        "2 port(s) ACTIVE, LinkUp at 400 Gb/s",
    ),
    ("no-ports-not-required", (), {}, Status.SKIPPED, Action.NONE, "no InfiniBand port"),
    (
        "only-ethernet-ports",
        (port(layer="Ethernet", state="DOWN", phys="Disabled"),),
        {},
        Status.SKIPPED,
        Action.NONE,
        "1 other port(s) not checked",
    ),
    (
        "ethernet-filter",
        (port(layer="Ethernet", state="DOWN", phys="Disabled"),),
        {"link_layer": "Ethernet"},
        Status.FAIL,
        Action.INSPECT,
        "physical state Disabled",
    ),
    (
        "any-layer",
        (port(layer="Ethernet", rate=100.0), port("mlx5_1")),
        {"link_layer": "any"},
        Status.OK,
        Action.NONE,
        "2 port(s) ACTIVE, LinkUp at 100/400 Gb/s",
    ),
    (
        "no-ports-but-required",
        (),
        {"min_ports": 4},
        Status.FAIL,
        Action.INSPECT,
        "0 InfiniBand port(s) found, 4 expected",
    ),
    (
        "port-missing",
        (port("mlx5_0"),),
        {"min_ports": 2},
        Status.FAIL,
        Action.INSPECT,
        "1 InfiniBand port(s) found, 2 expected",
    ),
    (
        "phys-polling",
        (port(state="DOWN", phys="Polling", rate=10.0),),
        NDR,
        Status.FAIL,
        Action.INSPECT,
        "mlx5_0 port 1: physical state Polling, expected LinkUp",
    ),
    (
        "state-init-subnet-manager",
        (port(state="INIT"),),
        NDR,
        Status.FAIL,
        Action.NONE,
        "mlx5_0 port 1: state INIT, expected ACTIVE",
    ),
    (
        "rate-degraded",
        (port(rate=100.0),),
        NDR,
        Status.FAIL,
        Action.INSPECT,
        "mlx5_0 port 1: rate 100 Gb/s, below 400 Gb/s",
    ),
    ("rate-not-checked", (port(rate=25.0),), {}, Status.OK, Action.NONE, "1 port(s) ACTIVE"),
    (
        "malformed-value",
        (port(rate=None, error="/sys/class/infiniband/mlx5_0/ports/1/rate: malformed value 'fast'"),),
        NDR,
        Status.UNKNOWN,
        Action.NONE,
        "ports/1/rate: malformed value",
    ),
    (
        "device-filter",
        (port("mlx5_0", state="DOWN", phys="Disabled"), port("mlx5_1")),
        {"devices": ("mlx5_1",)},
        Status.OK,
        Action.NONE,
        "1 port(s) ACTIVE",
    ),
    (
        "listed-device-missing",
        (port("mlx5_0"),),
        {"devices": ("mlx5_0", "mlx5_3")},
        Status.FAIL,
        Action.INSPECT,
        "mlx5_3: no such RDMA device",
    ),
    ("probe-error", ProbeError("infiniband", "error", "boom"), {}, Status.UNKNOWN, Action.NONE, "boom"),
]


@pytest.mark.parametrize("obs,settings,status,action,summary", [c[1:] for c in IB_CASES], ids=[c[0] for c in IB_CASES])
def test_host_infiniband(obs: Any, settings: dict[str, Any], status: Status, action: Action, summary: str) -> None:
    res = host_infiniband.evaluate(
        Observations(infiniband=obs), host_infiniband.Settings(**settings), ctx("host_infiniband")
    )
    assert (res.status, res.action) == (status, action), res.summary
    assert summary in res.summary


def test_host_infiniband_details_name_each_port() -> None:
    res = host_infiniband.evaluate(
        Observations(infiniband=(port("mlx5_0", 1), port("mlx5_0", 2, rate=200.0))),
        host_infiniband.Settings(),
        ctx("host_infiniband"),
    )
    assert set(res.details["ports"]) == {"mlx5_0/1", "mlx5_0/2"}
    assert res.details["ports"]["mlx5_0/2"]["rate_gbps"] == 200.0
