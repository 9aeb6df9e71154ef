"""The new checks against published text: real InfiniBand counters and EDAC layouts turned into sysfs trees
(tests/fixtures/host/infiniband/README.md, tests/fixtures/host_errors/README.md), gpu_throttle's job
window through the real prolog and epilog faces, and published D-state processes, AER counters and
systemctl show output (tests/fixtures/real-world/host_errors/README.md, .../host_services/README.md)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from nodehealth.checks import host_dstate, host_edac, host_infiniband, host_pcie_aer
from nodehealth.checks.base import Context
from nodehealth.model import Action, Status
from nodehealth.observations import Observations
from nodehealth.observations.host_errors import AerObservation, DstateObservation, DstateProcess
from nodehealth.probes import host_errors, infiniband, services

FIXTURES = Path(__file__).parent / "fixtures"
IB = FIXTURES / "host" / "infiniband"
EDAC = FIXTURES / "host_errors" / "edac"
REAL_HOST = FIXTURES / "real-world" / "host_errors"
REAL_SERVICES = FIXTURES / "real-world" / "host_services"
# drivers/infiniband/core/sysfs.c: state_show, phys_state_show, rate_show, link_layer_show.
UP = {"state": "4: ACTIVE", "phys_state": "5: LinkUp", "rate": "400 Gb/sec (4X NDR)"}


def ctx(name: str) -> Context:
    return Context(name=name, phase="manual", node="gpu001", expected_gpus=8)


def ib_port(sysfs: Path, device: str, link_layer: str, counters: dict[str, str]) -> Path:
    where = sysfs / "class" / "infiniband" / device / "ports" / "1"
    (where / "counters").mkdir(parents=True)
    for name, text in {**UP, "link_layer": link_layer}.items():
        (where / name).write_text(text + "\n")
    for name, text in counters.items():
        (where / "counters" / name).write_text(text + "\n")
    return where


def gpud_943_counters() -> dict[str, str]:
    """``=== ./name ===`` then the file's text (gpud PR #943's listing of mlx5_1 port 1)."""
    text = (IB / "gpud_943_mlx5_1_port1_counters.txt").read_text()
    return dict(re.findall(r"^=== \./(\w+) ===\n(.*)$", text, re.M))


def grep_lines(name: str) -> dict[str, str]:
    """``path:value`` lines (``grep`` over several files), the published paths as keys."""
    lines = (IB / name).read_text().splitlines()
    return dict(line.rsplit(":", 1) for line in lines if line.startswith("/sys/"))


def collect(sysfs: Path, state: Path, now: float) -> Any:
    pending = infiniband.start(str(sysfs), str(state), 30.0)
    pending.clock = lambda: now
    return pending.collect()


def judge_ib(ports: Any, **settings: Any) -> Any:
    return host_infiniband.evaluate(Observations(infiniband=ports), host_infiniband.Settings(**settings), ctx("ib"))


# --------------------------------------------------------------------------- InfiniBand counters


def test_the_published_mlx5_counters_read_as_the_kernel_wrote_them(tmp_path: Path) -> None:
    published = gpud_943_counters()
    assert published["link_downed"] == "255" and published["port_xmit_discards"] == "65535"
    ib_port(tmp_path, "mlx5_1", "InfiniBand", published)
    (port,) = infiniband.read_ports(str(tmp_path))
    assert port.error is None
    assert dict(port.counters) == {name: int(published[name]) for name in infiniband.COUNTERS}


def test_counters_a_real_hca_left_saturated_are_named_once_judged(tmp_path: Path) -> None:
    """gpud #943's port: link_downed 255, port_xmit_discards 65535 and excessive_buffer_overrun_errors 15,
    each at its IBA width. Two rounds that see the same values: no increase, but the check says the
    judged ones count no more."""
    sysfs, state = tmp_path / "sys", tmp_path / "state"
    ib_port(sysfs, "mlx5_1", "InfiniBand", gpud_943_counters())
    collect(sysfs, state, 1000.0)
    ports = collect(sysfs, state, 1600.0)
    assert judge_ib(ports).status is Status.OK  # the defaults judge no counter, and a still link_downed no flap
    assert judge_ib(ports).details["ports"]["mlx5_1/1"]["flaps"] == 0
    res = judge_ib(ports, error_increase_max=1)
    assert res.status is Status.WARN
    assert "excessive_buffer_overrun_errors saturated at 15" in res.summary
    assert "port_xmit_discards" not in res.summary  # not among the default error_counters
    wide = judge_ib(ports, error_increase_max=1, error_counters=("port_xmit_discards",))
    assert wide.status is Status.WARN and "port_xmit_discards saturated at 65535" in wide.summary


def test_a_device_without_a_pma_has_no_counters_not_an_error(tmp_path: Path) -> None:
    """The kernel's show_pma_counter writes "N/A (no PMA)" for a device with no performance-management
    agent (node_exporter #966, an i40iw iWARP port): those counters do not exist; the port is judged."""
    published = grep_lines("node_exporter_966_i40iw_no_pma.txt")
    assert set(published.values()) == {"N/A (no PMA)"}
    counters = {path.rsplit("/", 1)[1]: value for path, value in published.items()}
    ib_port(tmp_path, "i40iw0", "Ethernet", counters)
    (port,) = infiniband.read_ports(str(tmp_path))
    assert (port.counters, port.error) == ((), None)
    res = judge_ib((port,), link_layer="Ethernet")
    assert res.status is Status.OK, res.summary
    # A site that asks for a threshold on it is told the port has none of the counters.
    asked = judge_ib((port,), link_layer="Ethernet", error_increase_max=10)
    assert asked.status is Status.UNKNOWN and "none of error_counters" in asked.summary


def test_text_that_only_resembles_no_pma_is_still_malformed(tmp_path: Path) -> None:
    ib_port(tmp_path, "mlx5_0", "InfiniBand", {"symbol_error": "N/A (no PMA) 7", "link_downed": "0"})
    (port,) = infiniband.read_ports(str(tmp_path))
    assert port.counters == (("link_downed", 0),)
    assert port.error is not None and "symbol_error: malformed value" in port.error


# --------------------------------------------------------------------------- EDAC layouts


def edac_tree(sys_root: Path, lines: dict[str, str]) -> None:
    for path, value in lines.items():
        where = sys_root / path[len("/sys/") :]
        where.parent.mkdir(parents=True, exist_ok=True)
        where.write_text(value + "\n")


def judge_edac(obs: Any, **settings: Any) -> Any:
    return host_edac.evaluate(Observations(edac=obs), host_edac.Settings(**settings), ctx("host_edac"))


def test_a_corrected_error_on_a_rank_is_placed_on_that_rank(tmp_path: Path) -> None:
    """grondo/edac-utils #15: chip-select based controllers have rank<M>/ directories, not dimm<M>/; the
    error on mc0/rank4 that edac-util missed. The controllers' own ce_count/ue_count (the kernel writes
    them beside the ranks; the published grep did not show them) are the ranks' sums."""
    text = (EDAC / "edac_utils_15_rank_dimm_ce_count.txt").read_text().splitlines()
    ranks = dict(line.rsplit(":", 1) for line in text if line.startswith("/sys/"))
    edac_tree(tmp_path, ranks)
    for mc in sorted({p.split("/")[6] for p in ranks}):
        total = sum(int(v) for p, v in ranks.items() if p.split("/")[6] == mc)
        edac_tree(tmp_path, {f"/sys/devices/system/edac/mc/{mc}/ce_count": str(total)})
        edac_tree(tmp_path, {f"/sys/devices/system/edac/mc/{mc}/ue_count": "0"})
    obs = host_errors.edac(str(tmp_path))
    assert [c.name for c in obs.controllers] == ["mc0", "mc1", "mc2", "mc3"]
    assert obs.controllers[0].dimms == (("rank4", 1, 0),) and all(not c.dimms for c in obs.controllers[1:])
    assert all(c.error is None for c in obs.controllers)
    ok = judge_edac(obs)
    assert ok.status is Status.OK and ok.summary == "4 memory controller(s): no uncorrected error, 1 corrected"
    warn = judge_edac(obs, ce_warn=1)
    assert (
        warn.status is Status.WARN and warn.summary == "mc0: 1 corrected memory error(s) since boot; rank4: 1 CE, 0 UE"
    )


def test_the_older_csrow_layout_gives_the_controllers_counts(tmp_path: Path) -> None:
    """netdata #1508 (server B): mc0/{ce,ue}_count beside csrow<N>/{ce,ue}_count."""
    lines = (EDAC / "netdata_1508_csrow_counts.txt").read_text().splitlines()
    edac_tree(tmp_path, dict(zip(lines[::2], lines[1::2])))
    obs = host_errors.edac(str(tmp_path))
    (mc0,) = obs.controllers
    assert (mc0.name, mc0.ce, mc0.ue, mc0.dimms, mc0.error) == ("mc0", 0, 0, (), None)
    assert judge_edac(obs).status is Status.OK


# --------------------------------------------------------------------------- gpu_throttle per job


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    from test_slurm_faces import job_fake

    return job_fake(tmp_path, monkeypatch)


def throttled(f: Any, gpu_line: str, counters: str) -> None:
    from nodehealth.probes import source

    text = f.scenario.read_text()
    assert text.count(gpu_line) == 1
    f.scenario.write_text(text.replace(gpu_line, f"{gpu_line}throttle_time_ns = {{ {counters} }}\n"))
    source.forget()


def test_the_epilog_judges_throttling_over_the_jobs_own_window(fake: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """The prolog records the job's GPUs' counters; the job ran ten minutes (its baseline's time moved back,
    no sleep); GPU 0 spent five of them thermally throttled: the epilog WARNs over job 42, and drains nothing.
    GPU 2 (not the job's) throttled as long, and is not the job's to report."""
    from nodehealth.faces import epilog, prolog

    assert prolog.main() == 0
    baseline = fake.d / "state" / "jobs" / "42.json"
    rec = json.loads(baseline.read_text())
    assert rec["gpus"]["0"]["throttle_thermal_ns"] == 0
    rec["time"] -= 600
    baseline.write_text(json.dumps(rec))
    throttled(fake, '[[gpu]]  # GPU 0\npci_bus_id = "0000:18:00.0"\n', "thermal = 300_000_000_000")
    throttled(fake, '[[gpu]]  # GPU 2\npci_bus_id = "0000:3a:00.0"\n', "thermal = 300_000_000_000")
    assert epilog.main() == 0
    err = capsys.readouterr().err
    line = next(ln for ln in err.splitlines() if "gpu_throttle" in ln)
    assert re.search(r"WARN gpu_throttle: GPU 0: thermal throttling \d+% of job 42 \(\d+ s\)$", line), line
    assert "GPU 2" not in err
    assert fake.calls() == []  # WARN-only by default: no drain


# --------------------------------------------------------------------------- D state: published ps output

# ps aux: USER PID %CPU %MEM VSZ RSS TTY STAT START TIME COMMAND...
_PS_AUX = re.compile(r"^\S+\s+(\d+)(?:\s+\S+){5}\s+(\S+)\s+\S+\s+\S+\s+(\S+)")
TASK_COMM_LEN = 16  # include/linux/sched.h: the kernel keeps 15 characters of the name and a NUL


def ps_aux_rows(name: str) -> list[tuple[int, str, str]]:
    """(pid, STAT, the program's path) of each process line of a published ``ps aux``."""
    rows = []
    for line in (REAL_HOST / name).read_text().splitlines():
        m = _PS_AUX.match(line)
        if m and not line.startswith("ps "):
            rows.append((int(m.group(1)), m.group(2), m.group(3)))
    return rows


def proc_stat(pid: int, comm: str, state: str) -> str:
    """proc(5)'s layout: pid (comm) state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt cmajflt
    utime stime cutime cstime priority nice num_threads itrealvalue starttime vsize rss."""
    return f"{pid} ({comm}) {state} 1 {pid} {pid} 0 -1 4194560 " + "0 " * 12 + "4242 1000 10\n"


def test_the_published_d_state_nvidia_processes_are_named_as_the_kernel_names_them(tmp_path: Path) -> None:
    """nvidia-docker #377 (an Azure K80 VM after a restart): nvidia-smi, nvidia-persistenced and
    nvidia-docker-plugin in D state, as ``ps aux`` printed them. Each becomes the /proc/<pid>/stat the kernel
    writes for it: its pid, the state letter that leads ps's STAT (``Ds``, ``Dsl``: the rest are ps's
    session and thread flags, not /proc's state), and the program's file name cut to 15 characters. ps shows
    no descriptors: each is given /dev/nvidiactl here (the test's, not the published text's)."""
    rows = ps_aux_rows("nvidia_docker_377_ps_aux_dstate.txt")
    assert [(pid, stat) for pid, stat, _ in rows] == [(935, "D"), (953, "Ds"), (1368, "Dsl")]
    proc = tmp_path / "proc"
    for pid, stat, program in rows:
        where = proc / str(pid)
        (where / "fd").mkdir(parents=True)
        comm = os.path.basename(program)[: TASK_COMM_LEN - 1]
        (where / "stat").write_text(proc_stat(pid, comm, stat[0]))
        (where / "fd" / "3").symlink_to("/dev/nvidiactl")
    obs = host_errors.start_dstate(str(proc), 30.0, 0.0).collect()
    assert isinstance(obs, DstateObservation) and obs.complete and obs.scanned == 3
    assert obs.processes == (
        DstateProcess(935, "nvidia-smi", ("/dev/nvidiactl",)),
        DstateProcess(953, "nvidia-persiste", ("/dev/nvidiactl",)),
        DstateProcess(1368, "nvidia-docker-p", ("/dev/nvidiactl",)),
    )
    res = host_dstate.evaluate(Observations(dstate=obs), host_dstate.Settings(), ctx("host_dstate"))
    assert res.status is Status.WARN and res.action is Action.REBOOT
    assert res.summary.startswith("pid 935 (nvidia-smi) in D state holding /dev/nvidiactl: cannot be killed")
    assert res.details["pids"] == [935, 953, 1368]


def test_a_stat_line_cut_short_is_not_read_as_a_process() -> None:
    """moby #15204: strace showed the first 32 bytes of a java process's /proc/<pid>/stat (226 read): the
    name and the D are there, the start time (field 22) is not; the parser refuses it rather than guess."""
    text = (REAL_HOST / "moby_15204_strace_proc_stat_read.txt").read_text()
    (shown,) = re.findall(r'^read\(6, "(\d+ \(.*?)"\.\.\., 1024\) = 226$', text, re.M)
    assert shown == "20262 (java) D 20258 20258 20258"
    assert host_errors.parse_stat(shown) is None
    assert host_errors.parse_stat(proc_stat(20262, "java", "D")) == ("java", "D", 4242)


# --------------------------------------------------------------------------- AER: published counters


def pcicrawler_correctable() -> list[tuple[str, str]]:
    """The ``aer_dev_correctable`` object pcicrawler printed (opencomputeproject/ocp-diag-pcicrawler #8): one
    key per line of the kernel's file, in the file's order."""
    text = (REAL_HOST / "pcicrawler_8_dell_root_port_aer.txt").read_text()
    block = text.split('"aer_dev_correctable": {', 1)[1].split("}", 1)[0]
    return re.findall(r'^\s+"(\w+)": (\d+),?$', block, re.M)


def test_the_published_correctable_counts_of_a_root_port_are_judged_at_the_gpu_below_it(tmp_path: Path) -> None:
    """A Dell root port (8086:1901) with 3 BadTLP since boot, as pcicrawler read its aer_dev_correctable
    (the test writes each key back as the kernel's ``<name> <count>`` line). The kernel counts an endpoint's
    link errors at its link partner too; the GPU placed below that port here (with no AER files of its own)
    is the test's: the published port had no device present."""
    pairs = pcicrawler_correctable()
    assert pairs[0] == ("RxErr", "0") and pairs[1] == ("BadTLP", "3") and pairs[-1] == ("TOTAL_ERR_COR", "3")
    text = "".join(f"{name} {count}\n" for name, count in pairs)
    total, named = host_errors.parse_aer(text, "TOTAL_ERR_COR")
    assert total == 3 and named["BadTLP"] == 3 and sum(named.values()) == 3 and len(named) == 8
    sys_root = tmp_path / "sys"
    port = sys_root / "devices" / "pci0000:00" / "0000:00:01.0"
    gpu = port / "0000:01:00.0"
    for where, vendor, klass in ((port, "0x8086", "0x060400"), (gpu, "0x10de", "0x030200")):
        where.mkdir(parents=True, exist_ok=True)
        (where / "vendor").write_text(vendor + "\n")
        (where / "class").write_text(klass + "\n")
        bus = sys_root / "bus" / "pci" / "devices"
        bus.mkdir(parents=True, exist_ok=True)
        (bus / where.name).symlink_to(os.path.relpath(where, bus))
    (port / "aer_dev_correctable").write_text(text)
    obs = host_errors.pcie_aer(str(sys_root), 10.0)
    assert isinstance(obs, AerObservation) and obs.complete
    got = {d.bus_id: d for d in obs.devices}
    assert set(got) == {"0000:00:01.0", "0000:01:00.0"}
    up = got["0000:00:01.0"]
    assert (up.kind, up.correctable, up.nonfatal, up.fatal) == ("upstream of 0000:01:00.0", 3, None, None)
    assert up.by_error == (("correctable: BadTLP", 3),) and up.error is None

    def judge(**settings: Any) -> Any:
        return host_pcie_aer.evaluate(
            Observations(pcie_aer=obs), host_pcie_aer.Settings(**settings), ctx("host_pcie_aer")
        )

    ok = judge()  # correctable errors are not judged by default
    assert ok.status is Status.OK and ok.summary == "1 device(s) with AER counters: no uncorrectable error"
    warn = judge(correctable_warn=3)
    assert warn.status is Status.WARN and warn.action is Action.INSPECT
    assert warn.summary == "0000:00:01.0 (upstream of 0000:01:00.0): 3 correctable PCIe error(s) since boot"
    assert judge(correctable_warn=4).status is Status.OK


# --------------------------------------------------------------------------- systemctl show: published output


def test_published_show_output_without_loadstate_is_no_answer() -> None:
    """inspec #356: ``systemctl show --all corosync | grep -e UnitFileState -e ActiveState`` on CentOS 7.1
    (before and after ``systemctl enable``). Real Key=Value lines, but without LoadState the parser cannot
    tell a unit that does not exist from one that does: it says so instead of answering."""
    text = (REAL_SERVICES / "inspec_356_corosync_show_grep.txt").read_text()
    runs = [chunk.split("\n[root@", 1)[0] for chunk in text.split("| grep -e UnitFileState -e ActiveState\n")[1:]]
    assert runs == ["ActiveState=active\nUnitFileState=disabled", "ActiveState=active\nUnitFileState=enabled\n"]
    for run in runs:
        why = services.parse_show(run, ["corosync.service"])
        assert why == "systemctl show: no LoadState/ActiveState for corosync.service"
    # Two units asked, one answered: a count mismatch, not a guess at which one it was.
    assert services.parse_show(runs[0], ["corosync.service", "pacemaker.service"]) == (
        "systemctl show answered 1 unit(s) for the 2 asked"
    )


def test_published_show_of_nvidia_persistenced_with_only_loadstate_is_no_answer() -> None:
    """openSUSE/supportutils #182: ``systemctl show nvidia-persistenced.service -p LoadState`` on a host
    where the unit is not installed printed ``LoadState=not-found``. The probe asks for ActiveState too;
    an answer without it is not taken as the unit's state."""
    lines = (REAL_SERVICES / "supportutils_182_nvidia_persistenced_loadstate.txt").read_text().splitlines()
    assert lines[0] == "# systemctl show nvidia-persistenced.service -p LoadState"
    answer = "\n".join(lines[1:]) + "\n"
    assert answer == "LoadState=not-found\n"
    why = services.parse_show(answer, ["nvidia-persistenced.service"])
    assert why == "systemctl show: no LoadState/ActiveState for nvidia-persistenced.service"
