"""PCIe AER, EDAC and D-state holders: the parsers on the kernel's published text, the probes on fake
sysfs/procfs trees in tmp_path (never the host's), their refusals, and the three checks' verdicts."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from test_daemon_util import sample

from nodehealth import runner
from nodehealth.checks import host_dstate, host_edac, host_pcie_aer
from nodehealth.checks.base import Context
from nodehealth.config import loader as C
from nodehealth.metrics.node import NodeMetrics
from nodehealth.model import Action, Status
from nodehealth.observations import Observations, ProbeError
from nodehealth.observations.host_errors import (
    AerDevice,
    AerObservation,
    DstateObservation,
    DstateProcess,
    EdacController,
    EdacObservation,
)
from nodehealth.probes import host_errors as he

FIX = Path(__file__).parent / "fixtures" / "host_errors"
GPU, NIC, BRIDGE = "0000:18:00.0", "0000:19:00.0", "0000:17:00.0"


def ctx(name: str) -> Context:
    return Context(name=name, phase="manual", node="gpu001", expected_gpus="auto")


def fixture(name: str, **changes: int) -> str:
    text = (FIX / name).read_text()
    for key, value in changes.items():
        label = key.replace("_", " ")
        text = text.replace(f"\n{label} 0\n", f"\n{label} {value}\n")
    return text


# --------------------------------------------------------------------------- AER parser


def test_parse_aer_reads_the_kernel_documentation_samples() -> None:
    assert he.parse_aer(fixture("aer_dev_correctable"), "TOTAL_ERR_COR") == (
        2,
        {
            "Receiver Error": 2,
            "Bad TLP": 0,
            "Bad DLLP": 0,
            "RELAY_NUM Rollover": 0,
            "Replay Timer Timeout": 0,
            "Advisory Non-Fatal": 0,
            "Corrected Internal Error": 0,
            "Header Log Overflow": 0,
        },
    )
    total, named = he.parse_aer(fixture("aer_dev_fatal"), "TOTAL_ERR_FATAL")
    assert total == 0 and len(named) == 17 and named["Surprise Down Error"] == 0
    assert he.parse_aer(fixture("aer_dev_nonfatal"), "TOTAL_ERR_NONFATAL")[0] == 0


@pytest.mark.parametrize(
    "text",
    [
        "Receiver Error two\nTOTAL_ERR_COR 2\n",
        "Receiver Error 2\n",  # no total: never read as 0
        "Receiver Error 2\nReceiver Error 3\nTOTAL_ERR_COR 5\n",
        "Receiver Error 99999999999999999999\nTOTAL_ERR_COR 1\n",  # 20 digits
        "Receiver Error -1\nTOTAL_ERR_COR 1\n",
        "\x1b[31m 1\nTOTAL_ERR_COR 1\n",
        "TOTAL_ERR_COR 1 2\n",
    ],
    ids=["word-count", "no-total", "twice", "huge", "negative", "escape", "two-numbers"],
)
def test_parse_aer_refuses_text_without_the_kernels_shape(text: str) -> None:
    with pytest.raises(he.Malformed):
        he.parse_aer(text, "TOTAL_ERR_COR")


@pytest.mark.parametrize(
    "vendor, klass, kind",
    [
        ("0x10de", "0x030200", "gpu"),
        ("0x10de", "0x030000", "gpu"),
        ("0x10de", "0x068000", "nvswitch"),
        ("0x15b3", "0x020700", "nic"),
        ("0x14e4", "0x020000", "nic"),
        ("0x10de", "0x040300", None),  # a GPU's audio function
        ("0x8086", "0x060400", None),  # a bridge: read only as the port above a watched device
    ],
)
def test_device_kind(vendor: str, klass: str, kind: Any) -> None:
    assert he.device_kind(vendor + "\n", klass + "\n") == kind


# --------------------------------------------------------------------------- AER probe on a fake sysfs


def pci_device(
    sys_root: Path, bdf: str, vendor: str, klass: str, parent: str = BRIDGE, aer: dict[str, str] | None = None
) -> Path:
    """A device under devices/pci0000:00/<parent>/<bdf>, linked from bus/pci/devices as the kernel does."""
    bridge = sys_root / "devices" / "pci0000:00" / parent
    where = bridge / bdf
    where.mkdir(parents=True, exist_ok=True)
    (where / "vendor").write_text(vendor + "\n")
    (where / "class").write_text(klass + "\n")
    for name, text in (aer or {}).items():
        (where / name).write_text(text)
    bus = sys_root / "bus" / "pci" / "devices"
    bus.mkdir(parents=True, exist_ok=True)
    (bus / bdf).symlink_to(os.path.relpath(where, bus))
    return where


def healthy_aer(**fatal: int) -> dict[str, str]:
    return {
        "aer_dev_correctable": fixture("aer_dev_correctable"),
        "aer_dev_fatal": fixture("aer_dev_fatal", **fatal).replace(
            "TOTAL_ERR_FATAL 0", f"TOTAL_ERR_FATAL {sum(fatal.values())}"
        ),
        "aer_dev_nonfatal": fixture("aer_dev_nonfatal"),
    }


def judge_aer(obs: Any, **settings: Any) -> Any:
    return host_pcie_aer.evaluate(Observations(pcie_aer=obs), host_pcie_aer.Settings(**settings), ctx("host_pcie_aer"))


def test_aer_probe_reads_gpu_nic_and_the_port_above(tmp_path: Path) -> None:
    sys_root = tmp_path / "sys"
    pci_device(sys_root, GPU, "0x10de", "0x030200", aer=healthy_aer(Surprise_Down_Error=1))
    pci_device(sys_root, NIC, "0x15b3", "0x020700", aer=healthy_aer())
    bridge = sys_root / "devices" / "pci0000:00" / BRIDGE
    for name, text in healthy_aer().items():
        (bridge / name).write_text(text)
    pci_device(sys_root, "0000:00:1f.0", "0x8086", "0x060100", parent="0000:00:00.0")  # not watched
    obs = he.pcie_aer(str(sys_root), 10.0)
    assert isinstance(obs, AerObservation) and obs.complete
    got = {d.bus_id: d for d in obs.devices}
    assert set(got) == {GPU, NIC, BRIDGE}
    assert (got[GPU].kind, got[GPU].fatal, got[GPU].correctable, got[GPU].nonfatal) == ("gpu", 1, 2, 0)
    assert ("fatal: Surprise Down Error", 1) in got[GPU].by_error
    assert got[BRIDGE].kind == f"upstream of {GPU}" and got[BRIDGE].fatal == 0
    res = judge_aer(obs)
    assert res.status == Status.WARN and res.action == Action.INSPECT
    assert res.summary == f"{GPU} (gpu): 1 fatal PCIe error(s) since boot (fatal: Surprise Down Error 1)"
    assert judge_aer(obs, uncorrectable_status="fail").status == Status.FAIL
    assert judge_aer(obs, fatal_warn=0).status == Status.OK  # correctable not judged by default
    assert judge_aer(obs, fatal_warn=0, correctable_warn=2).status == Status.WARN


def test_aer_probe_healthy_node_is_ok_and_without_aer_files_skipped(tmp_path: Path) -> None:
    sys_root = tmp_path / "sys"
    pci_device(sys_root, GPU, "0x10de", "0x030200", aer=healthy_aer())
    res = judge_aer(he.pcie_aer(str(sys_root), 10.0))
    assert res.status == Status.OK and "no uncorrectable error" in res.summary
    other = tmp_path / "old"
    pci_device(other, GPU, "0x10de", "0x030200")
    res = judge_aer(he.pcie_aer(str(other), 10.0))
    assert res.status == Status.SKIPPED and "no AER counters" in res.summary
    empty = tmp_path / "empty"
    (empty / "bus" / "pci" / "devices").mkdir(parents=True)
    assert judge_aer(he.pcie_aer(str(empty), 10.0)).status == Status.SKIPPED


def test_aer_probe_without_a_pci_tree_does_not_apply_and_a_failed_read_is_unknown(tmp_path: Path) -> None:
    obs = he.pcie_aer(str(tmp_path), 10.0)
    assert obs == AerObservation(())
    assert judge_aer(obs).status == Status.SKIPPED
    (tmp_path / "bus" / "pci").mkdir(parents=True)
    (tmp_path / "bus" / "pci" / "devices").write_text("not a directory")
    obs = he.pcie_aer(str(tmp_path), 10.0)
    assert isinstance(obs, ProbeError) and obs.kind == "error"
    assert judge_aer(obs).status == Status.UNKNOWN
    assert judge_aer(ProbeError("pcie_aer", "unavailable", "x")).status == Status.SKIPPED


@pytest.mark.parametrize("attack", ["symlink", "fifo", "huge", "garbage", "directory"])
def test_aer_probe_refuses_a_hostile_attribute_without_blocking(tmp_path: Path, attack: str) -> None:
    sys_root = tmp_path / "sys"
    files = healthy_aer()
    del files["aer_dev_fatal"]
    where = pci_device(sys_root, GPU, "0x10de", "0x030200", aer=files)
    target = where / "aer_dev_fatal"
    if attack == "symlink":
        (tmp_path / "elsewhere").write_text(fixture("aer_dev_fatal"))
        target.symlink_to(tmp_path / "elsewhere")
    elif attack == "fifo":
        os.mkfifo(target)  # no writer: a blocking open would hang here
    elif attack == "huge":
        target.write_text(fixture("aer_dev_fatal") * 1000)
    elif attack == "garbage":
        target.write_text("Surprise Down Error lots\nTOTAL_ERR_FATAL 0\n")
    else:
        target.mkdir()
    obs = he.pcie_aer(str(sys_root), 10.0)
    assert isinstance(obs, AerObservation)
    (dev,) = [d for d in obs.devices if d.bus_id == GPU]
    assert dev.fatal is None and dev.error is not None and str(target) in dev.error
    res = judge_aer(obs)
    assert res.status == Status.UNKNOWN and str(target) in res.summary


def test_aer_probe_refuses_a_device_link_out_of_the_devices_tree(tmp_path: Path) -> None:
    sys_root = tmp_path / "sys"
    outside = tmp_path / "outside" / GPU
    outside.mkdir(parents=True)
    (outside / "vendor").write_text("0x10de\n")
    (outside / "class").write_text("0x030200\n")
    for name, text in healthy_aer().items():
        (outside / name).write_text(text)
    bus = sys_root / "bus" / "pci" / "devices"
    bus.mkdir(parents=True)
    (sys_root / "devices").mkdir()
    (bus / GPU).symlink_to(outside)
    obs = he.pcie_aer(str(sys_root), 10.0)
    assert isinstance(obs, AerObservation)
    (dev,) = obs.devices
    assert dev.fatal is None and dev.error is not None and "resolves outside" in dev.error
    assert judge_aer(obs).status == Status.UNKNOWN


def test_aer_probe_past_its_deadline_keeps_what_it_read_and_says_so(tmp_path: Path) -> None:
    sys_root = tmp_path / "sys"
    pci_device(sys_root, GPU, "0x10de", "0x030200", aer=healthy_aer())
    obs = he.pcie_aer(str(sys_root), -1.0)  # the deadline already past
    assert isinstance(obs, AerObservation) and not obs.complete
    assert judge_aer(obs).status == Status.UNKNOWN


@pytest.mark.parametrize(
    "obs, status",
    [
        (AerObservation((AerDevice(GPU, "gpu", 5, 0, 0),)), Status.OK),
        (AerObservation((AerDevice(GPU, "gpu", 0, 1, 0),)), Status.WARN),
        (AerObservation((AerDevice(GPU, "gpu"),)), Status.SKIPPED),
        (AerObservation(()), Status.SKIPPED),
        (AerObservation((), complete=False), Status.UNKNOWN),
        (None, Status.UNKNOWN),
    ],
    ids=["correctable-only", "nonfatal", "no-counters", "no-device", "cut-off", "not-probed"],
)
def test_host_pcie_aer_table(obs: Any, status: Status) -> None:
    assert judge_aer(obs).status == status


# --------------------------------------------------------------------------- EDAC


def mc(
    sys_root: Path, name: str, ce: str = "0", ue: str = "0", dimms: dict[str, tuple[str, str, str]] | None = None
) -> Path:
    where = sys_root / "devices" / "system" / "edac" / "mc" / name
    where.mkdir(parents=True)
    for attr, value in (("ce_count", ce), ("ue_count", ue), ("ce_noinfo_count", "0"), ("ue_noinfo_count", "0")):
        (where / attr).write_text(value + "\n")
    for dimm, (label, d_ce, d_ue) in (dimms or {}).items():
        (where / dimm).mkdir()
        (where / dimm / "dimm_label").write_text(label + "\n")
        (where / dimm / "dimm_ce_count").write_text(d_ce + "\n")
        (where / dimm / "dimm_ue_count").write_text(d_ue + "\n")
    return where


def judge_edac(obs: Any, **settings: Any) -> Any:
    return host_edac.evaluate(Observations(edac=obs), host_edac.Settings(**settings), ctx("host_edac"))


def test_edac_probe_names_the_dimm_of_an_uncorrected_error(tmp_path: Path) -> None:
    sys_root = tmp_path / "sys"
    mc(sys_root, "mc0", ce="3", dimms={"dimm0": ("CPU_SrcID#0_MC#0_Chan#0_DIMM#0", "3", "0")})
    mc(sys_root, "mc1", ue="1", dimms={"dimm3": ("CPU_SrcID#1_MC#0_Chan#1_DIMM#0", "0", "1"), "dimm4": ("x", "0", "0")})
    obs = he.edac(str(sys_root))
    assert obs.loaded and [c.name for c in obs.controllers] == ["mc0", "mc1"]
    assert obs.controllers[0].ce == 3 and obs.controllers[1].dimms == (("dimm3 CPU_SrcID#1_MC#0_Chan#1_DIMM#0", 0, 1),)
    res = judge_edac(obs)
    assert res.status == Status.WARN and res.action == Action.INSPECT
    assert (
        res.summary == "mc1: 1 uncorrected memory error(s) since boot; dimm3 CPU_SrcID#1_MC#0_Chan#1_DIMM#0: 0 CE, 1 UE"
    )
    assert judge_edac(obs, ue_status="fail").status == Status.FAIL
    assert judge_edac(obs, ue_warn=0).status == Status.OK
    assert judge_edac(obs, ue_warn=0, ce_warn=3).status == Status.WARN


def test_edac_without_a_driver_is_skipped_and_a_bad_counter_unknown(tmp_path: Path) -> None:
    obs = he.edac(str(tmp_path))
    assert not obs.loaded and judge_edac(obs).status == Status.SKIPPED
    sys_root = tmp_path / "sys"
    where = mc(sys_root, "mc0", ce="many")
    (where / "ue_count").unlink()
    os.mkfifo(where / "ue_count")
    res = judge_edac(he.edac(str(sys_root)))
    assert res.status == Status.UNKNOWN and "ce_count" in res.summary and "ue_count" in res.summary


def test_host_edac_healthy_is_ok() -> None:
    obs = EdacObservation((EdacController("mc0", 12, 0),))
    res = judge_edac(obs)
    assert res.status == Status.OK and res.summary == "1 memory controller(s): no uncorrected error, 12 corrected"
    assert judge_edac(None).status == Status.UNKNOWN
    assert judge_edac(ProbeError("edac", "error", "x")).status == Status.UNKNOWN


# --------------------------------------------------------------------------- D state


def stat_line(pid: int, comm: str, state: str, start: int = 4242) -> str:
    """proc(5): pid (comm) state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt cmajflt utime
    stime cutime cstime priority nice num_threads itrealvalue starttime ..."""
    rest = ["1", str(pid), str(pid), "0", "-1", "4194560"] + ["0"] * 12 + [str(start), "1000", "10"]
    return f"{pid} ({comm}) {state} " + " ".join(rest) + "\n"


def proc_entry(proc: Path, pid: int, comm: str, state: str, fds: dict[int, str]) -> None:
    where = proc / str(pid)
    (where / "fd").mkdir(parents=True)
    (where / "stat").write_text(stat_line(pid, comm, state))
    for fd, target in fds.items():
        (where / "fd" / str(fd)).symlink_to(target)


def test_parse_stat_takes_the_name_up_to_the_last_parenthesis() -> None:
    assert he.parse_stat(stat_line(7, "a) D (b", "S")) == ("a) D (b", "S", 4242)
    assert he.parse_stat(stat_line(7, "python3", "D")) == ("python3", "D", 4242)
    assert he.parse_stat("7 (x D\n") is None
    assert he.parse_stat("7 (x) D 1 2\n") is None


def judge_dstate(obs: Any, **settings: Any) -> Any:
    return host_dstate.evaluate(Observations(dstate=obs), host_dstate.Settings(**settings), ctx("host_dstate"))


def test_dstate_probe_finds_a_stuck_holder_of_a_gpu(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    proc_entry(proc, 4100, "python3", "D", {0: "/dev/null", 5: "/dev/nvidia3", 6: "/dev/nvidiactl"})
    proc_entry(proc, 4101, "rsync", "D", {3: "/scratch/file"})  # D state, no GPU
    proc_entry(proc, 4102, "python3", "S", {5: "/dev/nvidia0"})  # holds a GPU, not stuck
    (proc / "self").mkdir()
    obs = he.start_dstate(str(proc), 30.0, 0.0).collect()
    assert isinstance(obs, DstateObservation) and obs.complete and obs.scanned == 3
    assert obs.processes == (DstateProcess(4100, "python3", ("/dev/nvidia3", "/dev/nvidiactl")),)
    res = judge_dstate(obs)
    assert res.status == Status.WARN and res.action == Action.REBOOT
    assert res.summary.startswith("pid 4100 (python3) in D state holding /dev/nvidia3, /dev/nvidiactl")
    assert judge_dstate(obs, status="fail").status == Status.FAIL


def test_dstate_probe_keeps_only_a_process_still_stuck_at_the_second_look(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc = tmp_path / "proc"
    proc_entry(proc, 10, "woke", "D", {1: "/dev/nvidia0"})
    proc_entry(proc, 11, "reused", "D", {1: "/dev/nvidia1"})
    proc_entry(proc, 12, "stuck", "D", {1: "/dev/nvidia2"})
    naps: list[float] = []

    def between_looks(seconds: float) -> None:  # what happens during the wait, without waiting
        naps.append(seconds)
        (proc / "10" / "stat").write_text(stat_line(10, "woke", "R"))
        (proc / "11" / "stat").write_text(stat_line(11, "reused", "D", start=9999))

    monkeypatch.setattr(he.time, "sleep", between_looks)
    held, scanned, finished = he.scan_dstate(str(proc), 1.0, 30.0)
    assert naps == [1.0] and finished and scanned == 3
    assert held == ((12, "stuck", ("/dev/nvidia2",)),)


def test_dstate_probe_abandons_a_hung_scan_at_its_deadline(tmp_path: Path) -> None:
    def hangs(procfs_root: str, confirm_s: float, budget_s: float) -> Any:
        time.sleep(3600)  # a /proc read stuck behind a D-state process

    began = time.monotonic()
    obs = he.start_dstate(str(tmp_path), 0.5, 0.0, scan=hangs).collect()
    assert time.monotonic() - began < 60  # bounded by the deadline, not by the scan
    assert isinstance(obs, DstateObservation) and not obs.complete
    res = judge_dstate(obs)
    assert res.status == Status.UNKNOWN and "did not answer within 0.5 s" in res.summary


def test_dstate_scan_refuses_a_fifo_for_a_stat_file(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "77" / "fd").mkdir(parents=True)
    os.mkfifo(proc / "77" / "stat")
    obs = he.start_dstate(str(proc), 30.0, 0.0).collect()
    assert isinstance(obs, DstateObservation) and obs.complete and obs.processes == () and obs.scanned == 1


def test_host_dstate_healthy_is_ok_and_not_probed_unknown() -> None:
    res = judge_dstate(DstateObservation((), 120))
    assert res.status == Status.OK and res.summary == "120 process(es): none in D state holding a GPU"
    assert judge_dstate(None).status == Status.UNKNOWN


# --------------------------------------------------------------------------- through the runner


def test_runner_gathers_the_three_probes_from_the_configured_roots(tmp_path: Path) -> None:
    sys_root, proc = tmp_path / "sys", tmp_path / "proc"
    pci_device(sys_root, GPU, "0x10de", "0x030200", aer=healthy_aer(Completion_Timeout=2))
    mc(sys_root, "mc0", ue="1")
    proc_entry(proc, 4100, "python3", "D", {5: "/dev/nvidia3"})
    raw = {
        "paths": {"sysfs_root": str(sys_root), "procfs_root": str(proc)},
        "checks": {"host_dstate": {"confirm_s": 0}, "host_edac": {"ue_status": "fail"}},
    }
    cfg = C.resolve(raw, "<test>", host="gpu001", environ={})
    report = runner.run(cfg, only=("host_pcie_aer", "host_edac", "host_dstate"), node="gpu001")
    got = {r.name: r for r in report.results}
    assert got["host_pcie_aer"].status == Status.WARN and "2 fatal" in got["host_pcie_aer"].summary
    assert got["host_edac"].status == Status.FAIL
    assert got["host_dstate"].status == Status.WARN and "pid 4100" in got["host_dstate"].summary
    m = NodeMetrics("gpu001", process=False)
    m.update_round(report, None)
    page = m.payload().decode()
    assert sample(page, "nodehealth_pcie_aer_errors_total", **{"device": GPU, "kind": "gpu", "class": "fatal"}) == 2
    assert (
        sample(page, "nodehealth_pcie_aer_errors_total", **{"device": GPU, "kind": "gpu", "class": "correctable"}) == 2
    )
    assert (
        sample(page, "nodehealth_pcie_aer_errors_total", **{"device": GPU, "kind": "gpu", "class": "nonfatal"}) is None
    )
    assert sample(page, "nodehealth_edac_errors_total", controller="mc0", type="uncorrected") == 1
    assert sample(page, "nodehealth_edac_errors_total", controller="mc0", type="corrected") is None  # 0: quiet
    assert sample(page, "nodehealth_dstate_gpu_holders") == 1


def test_simulated_gpus_are_held_by_no_process_of_this_host(tmp_path: Path) -> None:
    from nodehealth.probes import PROBES, ProbeContext

    scenario = Path(__file__).parent.parent / "examples" / "scenarios" / "healthy-8x-h100.toml"
    raw = {"paths": {"procfs_root": str(tmp_path)}, "nvml": {"simulate": str(scenario)}}
    cfg = C.resolve(raw, "<test>", host="gpu001", environ={})
    obs = PROBES["dstate"].gather(ProbeContext(cfg, "gpu001"), 5.0)
    assert isinstance(obs, ProbeError) and obs.kind == "unavailable"
    assert judge_dstate(obs).status == Status.SKIPPED
