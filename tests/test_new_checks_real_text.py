"""The new checks against published text: real InfiniBand counters and EDAC layouts turned into sysfs trees
(tests/fixtures/host/infiniband/README.md, tests/fixtures/host_errors/README.md), and gpu_throttle's job
window through the real prolog and epilog faces."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from nodehealth.checks import host_edac, host_infiniband
from nodehealth.checks.base import Context
from nodehealth.model import Status
from nodehealth.observations import Observations
from nodehealth.probes import host_errors, infiniband

FIXTURES = Path(__file__).parent / "fixtures"
IB = FIXTURES / "host" / "infiniband"
EDAC = FIXTURES / "host_errors" / "edac"
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
    from test_slurm_faces import Fake

    f = Fake(tmp_path, monkeypatch, "healthy.toml")
    monkeypatch.setenv("SLURM_JOB_GPUS", "0,1")
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    return f


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
