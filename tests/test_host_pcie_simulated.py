"""Simulated GPUs are not judged by this host's sysfs: host_pcie_aer and host_infiniband.

This host's PCIe AER counters and InfiniBand ports are facts about its own GPUs and their NICs, not
about a scenario's: under ``[nvml] simulate`` with ``[paths] sysfs_root`` at this host's ``/sys`` (or a
path that resolves to it) both probes are "unavailable" (SKIPPED, said as a simulated run's), as
host_services' and host_dstate's are. A recorded sysfs tree configured as ``sysfs_root`` is read as
ever, so a test or a demo can feed one. host_edac (the host's DIMMs), host_memory and host_mounts are
the host's own facts and are read as before.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_host_errors import GPU, healthy_aer, pci_device
from test_host_probes import UP, _ib_port

from nodehealth import runner
from nodehealth.config import loader as C
from nodehealth.model import Status
from nodehealth.observations import ProbeError
from nodehealth.observations.host_errors import AerObservation
from nodehealth.probes import PROBES, ProbeContext

SCENARIO = Path(__file__).resolve().parent.parent / "examples" / "scenarios" / "healthy-8x-h100.toml"
AER_WHY = (
    "simulated GPUs: the host's PCIe AER counters are not theirs "
    "(set [paths] sysfs_root to a recorded sysfs tree to read one)"
)
IB_WHY = (
    "simulated GPUs: the host's InfiniBand ports are not their NICs "
    "(set [paths] sysfs_root to a recorded sysfs tree to read one)"
)


def _cfg(tmp_path: Path, sysfs_root: str = "", simulate: bool = True) -> Any:
    raw: dict[str, Any] = {"paths": {"state_dir": str(tmp_path / "state")}}
    if sysfs_root:
        raw["paths"]["sysfs_root"] = sysfs_root
    if simulate:
        raw["nvml"] = {"simulate": str(SCENARIO)}
    return C.resolve(raw, "<test>", host="gpu001", environ={})


def _gather(cfg: Any, probe: str) -> Any:
    obs = PROBES[probe].gather(ProbeContext(cfg, "gpu001", writes=False), 10.0)
    return obs.collect() if hasattr(obs, "collect") else obs


@pytest.mark.parametrize(("probe", "why"), [("pcie_aer", AER_WHY), ("infiniband", IB_WHY)])
def test_simulated_gpus_with_the_hosts_sysfs_are_unavailable(tmp_path: Path, probe: str, why: str) -> None:
    for root in ("", "/sys", "/sys/"):  # the default, and the same spelt out
        obs = _gather(_cfg(tmp_path, root), probe)
        assert isinstance(obs, ProbeError) and obs.kind == "unavailable" and obs.message == why, (root, obs)
    (tmp_path / "host").symlink_to("/sys")  # a path that is this host's sysfs all the same
    obs = _gather(_cfg(tmp_path, str(tmp_path / "host")), probe)
    assert isinstance(obs, ProbeError) and obs.message == why


@pytest.mark.parametrize("probe", ["pcie_aer", "infiniband"])
def test_real_gpus_read_the_hosts_sysfs(tmp_path: Path, probe: str) -> None:
    obs = _gather(_cfg(tmp_path, simulate=False), probe)  # what it finds is this host's: only the gate is judged
    assert not (isinstance(obs, ProbeError) and "simulated" in obs.message), obs


def test_simulated_gpus_read_a_recorded_sysfs_tree(tmp_path: Path) -> None:
    sys_root = tmp_path / "sys"
    pci_device(sys_root, GPU, "0x10de", "0x030200", aer=healthy_aer(Completion_Timeout=2))
    _ib_port(sys_root, "mlx5_0", 1, **UP)
    cfg = _cfg(tmp_path, str(sys_root))
    aer = _gather(cfg, "pcie_aer")
    assert isinstance(aer, AerObservation) and aer.devices[0].bus_id == GPU  # and the port above it
    assert aer.devices[0].fatal == 2
    ports = _gather(cfg, "infiniband")
    assert [(p.device, p.port) for p in ports] == [("mlx5_0", 1)]
    got = {r.name: r for r in runner.run(cfg, only=("host_pcie_aer", "host_infiniband"), node="gpu001").results}
    assert got["host_pcie_aer"].status == Status.WARN and "2 fatal" in got["host_pcie_aer"].summary
    assert got["host_infiniband"].status == Status.OK


def test_the_checks_say_does_not_apply_with_the_reason(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    got = {r.name: r for r in runner.run(cfg, only=("host_pcie_aer", "host_infiniband"), node="gpu001").results}
    assert (got["host_pcie_aer"].status, got["host_pcie_aer"].summary) == (Status.SKIPPED, f"does not apply: {AER_WHY}")
    assert (got["host_infiniband"].status, got["host_infiniband"].summary) == (
        Status.SKIPPED,
        f"does not apply: {IB_WHY}",
    )
