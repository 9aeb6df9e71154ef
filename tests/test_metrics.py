"""Metrics: the family table, values and labels from simulated nodes, the golden exposition,
docs/metrics.md generated from the table, exposition valid for promtool, the textfile.

After an intended change to the table, ``pytest tests/test_metrics.py --update-golden``
rewrites tests/golden/metrics-exposition.txt and the tables of docs/metrics.md; review the diff.
"""

from __future__ import annotations

import gzip
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_daemon_util import ROOT, SCENARIOS, sample

from nodehealth import registry, runner
from nodehealth.config import loader as config
from nodehealth.metrics import NodeMetrics, SlurmView, budget, exposition, probe_timeouts, textfile_path, write_textfile
from nodehealth.metrics.families import BY_NAME, COUNTER, FAMILIES, GAUGE, GPU, INFO, Family, Series, new, one
from nodehealth.metrics.family import row
from nodehealth.metrics.renderers import GPU_VALUES

PROMTOOL = shutil.which("promtool")
GOLDEN = Path(__file__).resolve().parent / "golden" / "metrics-exposition.txt"
DOC = ROOT / "docs" / "metrics.md"


def _outcome(name: str, **over):
    cfg = config.resolve(
        {
            "nvml": {"simulate": str(SCENARIOS / f"{name}.toml")},
            "paths": {"state_dir": "/nonexistent/nodehealth-test"},
            **over,
        },
        "<test>",
    )
    return runner.execute(cfg, phase="daemon", node="gpu001")


def _nccl_result():
    """The nccl_selftest result of a replayed published 8x A100 run in both modes (the daemon's self-test)."""
    from nodehealth.checks import nccl_selftest
    from nodehealth.checks.base import Context
    from nodehealth.nccl.parse import parse_perf
    from nodehealth.nccl.results import TransportResult
    from nodehealth.observations import NcclObservation, NcclRun, Observations

    perf = parse_perf((ROOT / "tests" / "fixtures" / "nccl_selftest" / "gcm_single_node_8xA100.txt").read_text())
    runs = tuple(
        NcclRun(
            mode=mode,
            runner="nccl-tests",
            gpus=8,
            returncode=0,
            elapsed_s=4.5,
            output_bytes=2000,
            finished_at=1732912345.0,
            perf=perf,
            transport=TransportResult(transport, paths=(path,)),
        )
        for mode, transport, path in (("nvlink", "p2p", "P2P/CUMEM/read"), ("ib_loopback", "ib", "NET/IB"))
    )
    settings = nccl_selftest.Settings(gpu_model="NVIDIA A100-SXM4-80GB")
    ctx = Context(name="nccl_selftest", phase="daemon", node="gpu001", expected_gpus=8)
    return nccl_selftest.evaluate(Observations(nccl=NcclObservation(runs=runs)), settings, ctx)


def _with_ib(report):
    """``report`` with host_infiniband's result for a port that went down and back 3 times and whose
    symbol_error rose by 40 (its details carry both: the InfiniBand families' samples)."""
    import dataclasses

    from nodehealth.checks import host_infiniband
    from nodehealth.checks.base import Context
    from nodehealth.observations import IbPort, IbSample, Observations

    history = [IbSample(0.0, True, (("symbol_error", 0),))]
    for i in range(3):
        history += [IbSample(60.0 * i + 30, False, (("symbol_error", 0),)), IbSample(60.0 * i + 60, True, ())]
    history[-1] = IbSample(180.0, True, (("symbol_error", 40),))
    port = IbPort("mlx5_0", 1, "ACTIVE", "LinkUp", 400.0, "InfiniBand", None, history[-1].counters, tuple(history))
    settings = host_infiniband.Settings(error_increase_max=10)
    ctx = Context(name="host_infiniband", phase="daemon", node="gpu001", expected_gpus=8)
    res = host_infiniband.evaluate(Observations(infiniband=(port,)), settings, ctx)
    return dataclasses.replace(report, results=tuple(r for r in report.results if r.name != res.name) + (res,))


def _with_sxid(report):
    """``report`` with gpu_sxid's result for a fatal SXid on one NVSwitch (its details: the SXid family's samples)."""
    import dataclasses

    from nodehealth.checks import gpu_sxid
    from nodehealth.checks.base import Context
    from nodehealth.observations import Observations, XidObservation, XidRecord
    from nodehealth.xid.catalog import catalog_for, enrich
    from nodehealth.xid.parse import parse_line

    event = parse_line("nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up")
    assert event is not None
    x = XidObservation("b", (XidRecord(enrich(event, catalog_for()), "b", 1.0),), 2.0, "/dev/kmsg")
    ctx = Context(name="gpu_sxid", phase="daemon", node="gpu001", expected_gpus=8)
    res = gpu_sxid.evaluate(Observations(xid=x), gpu_sxid.Settings(), ctx)
    return dataclasses.replace(report, results=tuple(r for r in report.results if r.name != res.name) + (res,))


def _with_services(report):
    """``report`` with host_services' result for an NVSwitch node whose Fabric Manager failed (its details:
    the service family's sample)."""
    import dataclasses

    from nodehealth.checks import host_services
    from nodehealth.checks.base import Context
    from nodehealth.observations import Observations
    from nodehealth.observations.services import ServicesObservation, UnitState

    units = (
        UnitState(host_services.FABRICMANAGER, "loaded", "failed", "failed", "enabled", "exit-code"),
        UnitState(host_services.PERSISTENCED, "loaded", "active", "running", "enabled", "success"),
        UnitState(host_services.IMEX, "not-found", "inactive", "dead", "", "success"),
    )
    seen = ServicesObservation(8, 4, 0, True, units)
    ctx = Context(name="host_services", phase="daemon", node="gpu001", expected_gpus=8)
    res = host_services.evaluate(Observations(services=seen), host_services.Settings(), ctx)
    return dataclasses.replace(report, results=tuple(r for r in report.results if r.name != res.name) + (res,))


def _with_host_errors(report):
    """``report`` with host_pcie_aer's, host_edac's and host_dstate's results for a GPU with a fatal AER
    error, a controller with an uncorrected memory error and a stuck holder of a GPU (their families)."""
    import dataclasses

    from nodehealth.checks import host_dstate, host_edac, host_pcie_aer
    from nodehealth.checks.base import Context
    from nodehealth.observations import Observations
    from nodehealth.observations import host_errors as he

    seen = Observations(
        pcie_aer=he.AerObservation((he.AerDevice("0000:18:00.0", "gpu", 2, 0, 1),)),
        edac=he.EdacObservation((he.EdacController("mc0", 3, 1),)),
        dstate=he.DstateObservation((he.DstateProcess(4100, "python3", ("/dev/nvidia3",)),), 200),
    )
    results = []
    for check in (host_pcie_aer, host_edac, host_dstate):
        name = check.__name__.rsplit(".", 1)[1]
        ctx = Context(name=name, phase="daemon", node="gpu001", expected_gpus=8)
        results.append(check.evaluate(seen, check.Settings(), ctx))
    names = {r.name for r in results}
    return dataclasses.replace(report, results=tuple(r for r in report.results if r.name not in names) + tuple(results))


def _metrics(name: str = "healthy-8x-h100", detail: bool = False, ib: bool = False, **over) -> NodeMetrics:
    """A daemon's metrics after one round of ``name`` (with the NCCL self-test's last result, as the
    daemon carries it) and one call of every other update; ``detail``: every series of the table;
    ``ib``: with a flapping InfiniBand port (``_with_ib``) and a fatal NVSwitch SXid (``_with_sxid``)."""
    from nodehealth.daemon.selftest import merge

    out = _outcome(name, **over)
    m = NodeMetrics("gpu001", process=False, detail=detail)
    report = merge(out.report, _nccl_result())
    m.update_round(_with_host_errors(_with_services(_with_sxid(_with_ib(report)))) if ib else report, out.observations)
    m.count_xid("5", 79, "reboot")
    m.set_jobs({0: "4242"})
    m.set_slurm(
        SlurmView(
            drained=True,
            drained_by_nodehealth=True,
            breaker_open=False,
            last_action="drained",
            flapping=False,
            orphan_drain=False,
            observe_mode=True,
            would=(("drain", 2), ("resume", 1)),
            reboots_requested=1,
            reboot_escalated=False,
        )
    )
    m.set_xid_follower("alive")
    m.reloaded(True)
    m.set_config("/etc/nodehealth/nodehealth.toml", "none", "file")
    m.state_written(True)
    m.state_written(False)
    return m


def _text(name: str = "healthy-8x-h100", detail: bool = False, **over) -> str:
    return _metrics(name, detail, **over).payload().decode()


def _parse(text: str) -> dict[str, dict]:
    """Exposition text -> {family: {"help", "type", "samples": [(sample name, {label: value}, value)]}}."""
    fams: dict[str, dict] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, help_text = line[7:].partition(" ")
            current = fams.setdefault(name, {"help": help_text, "type": None, "samples": []})
        elif line.startswith("# TYPE "):
            name, _, typ = line[7:].partition(" ")
            assert current is not None and name in fams, line
            fams[name]["type"] = typ
        elif line and not line.startswith("#"):
            m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$", line)
            assert m, line
            labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
            assert current is not None, line
            current["samples"].append((m.group(1), labels, float(m.group(3))))
    return fams


# ----------------------------------------------------------------------------- the table


def test_table_rows_follow_the_naming_rules():
    names = [f.name for f in FAMILIES]
    assert len(names) == len(set(names)), "a family declared twice"
    for f in FAMILIES:
        assert re.fullmatch(r"nodehealth(_[a-z0-9]+)+", f.name), f.name
        assert f.type in (GAUGE, COUNTER, INFO), f
        assert f.name.endswith("_total") == (f.type == COUNTER), f"{f.name}: counters and only counters end in _total"
        assert f.name.endswith("_info") == (f.type == INFO), f"{f.name}: info families and only they end in _info"
        assert f.help and not f.help.endswith("."), f.name
        assert len(f.labels) == len(set(f.labels)) and all(re.fullmatch(r"[a-z_]+", x) for x in f.labels), f
        assert set(f.values) <= set(f.labels), f"{f.name}: values for a label it does not have"
        stem = f.base
        if f.unit:
            assert stem.endswith("_" + f.unit), f"{f.name}: unit {f.unit} but the name does not end in it"
        for unit in ("seconds", "celsius", "watts", "bytes", "ratio"):
            assert not stem.endswith("_" + unit) or f.unit == unit, f"{f.name}: name ends in {unit}, unit not set"


def test_series_takes_exactly_the_table_labels():
    fam = new("nodehealth_probe_timed_out")
    fam.add(["nvml"], True)
    assert fam.samples[0].labels == {"probe": "nvml"} and fam.samples[0].value == 1.0
    with pytest.raises(ValueError):
        fam.add(["nvml", "extra"], 1)
    with pytest.raises(KeyError):
        new("nodehealth_no_such_family")
    counter = one("nodehealth_rounds_total", 3)
    assert (counter.name, counter.samples[0].name, counter.samples[0].value) == (
        "nodehealth_rounds",
        "nodehealth_rounds_total",
        3.0,
    )


def test_the_gpu_value_readers_fill_per_gpu_families_of_the_table():
    for name, _ in GPU_VALUES:
        assert BY_NAME[name].labels == GPU, name


# ----------------------------------------------------------------------------- the page against the table


def test_every_rendered_family_is_the_table_row():
    for scenario in ("healthy-8x-h100", "v100-retired-pages-pending", "gpu-lost", "nvml-not-installed"):
        fams = _parse(_text(scenario))
        for name, fam in fams.items():
            row = BY_NAME.get(name)
            assert row is not None, f"{scenario}: {name} rendered but not in the table"
            assert fam["help"] == row.help, name
            assert fam["type"] == (GAUGE if row.type == INFO else row.type), name
            for sample_name, labels, _ in fam["samples"]:
                assert sample_name == name, (name, sample_name)
                assert tuple(sorted(labels)) == tuple(sorted(row.labels)), (name, labels)
                for label, allowed in row.values.items():
                    assert labels[label] in allowed, f"{name}: {label}={labels[label]!r} not in {allowed}"


def test_every_family_of_the_table_has_a_producer():
    """A rendering with every update made shows a sample of every family of the table (page
    retirement comes from a Volta node: Ampere and later report it N/A)."""
    fams: dict[str, dict] = {}
    for scenario in ("v100-retired-pages-pending", "healthy-8x-h100"):
        m = _metrics(scenario, detail=True, ib=True)
        m.round_started_now()
        for name, fam in _parse(m.payload().decode()).items():
            if fam.get("samples"):
                fams[name] = fam
    empty = sorted(f.name for f in FAMILIES if not fams.get(f.name, {}).get("samples"))
    assert not empty, f"families of the table without a sample (no producer?): {empty}"


def _golden_text() -> str:
    """Names, types, label names and HELP lines of the page with every series of the table
    (``detail``), without values, sorted by name."""
    m = _metrics(detail=True, ib=True)
    m.round_started_now()
    out = []
    for name, fam in sorted(_parse(m.payload().decode()).items()):
        out += [f"# HELP {name} {fam['help']}", f"# TYPE {name} {fam['type']}"]
        for labels in sorted({",".join(sorted(labels)) for _, labels, _ in fam["samples"]}):
            out.append(f"{name}{{{labels}}}" if labels else name)
    return "\n".join(out) + "\n"


def test_exposition_matches_golden(request):
    got = _golden_text()
    if request.config.getoption("--update-golden"):
        GOLDEN.write_text(got)
    assert got == GOLDEN.read_text(), (
        "the /metrics page changed (name, type, label or HELP); if intended: "
        "pytest tests/test_metrics.py --update-golden, and review the diff"
    )


# ----------------------------------------------------------------------------- docs/metrics.md

_BLOCK = re.compile(r"(<!-- families: (\w+) .*?-->\n)(.*?)(<!-- end families -->)", re.S)


def _doc_labels(f: Family) -> str:
    def one_label(label: str) -> str:
        values = f.values.get(label)
        return f"`{label}`" + (" (" + ", ".join(f"`{v}`" for v in values) + ")" if values else "")

    if f.labels[: len(GPU)] == GPU:
        return ", ".join(["*GPU*", *(one_label(x) for x in f.labels[len(GPU) :])])
    return ", ".join(one_label(x) for x in f.labels)


def _doc_table(section: str) -> str:
    rows = ["| metric | type | labels | meaning |", "|---|---|---|---|"]
    for f in FAMILIES:
        if f.section == section:
            meaning = f.help + (f"; {f.note}" if f.note else "")
            rows.append(f"| `{f.name}` | {f.type} | {_doc_labels(f)} | {meaning} |")
    return "\n".join(rows) + "\n"


def _generated_doc(text: str) -> str:
    return _BLOCK.sub(lambda m: m.group(1) + _doc_table(m.group(2)) + m.group(4), text)


def test_docs_tables_are_generated_from_the_table(request):
    text = DOC.read_text()
    sections = [m.group(2) for m in _BLOCK.finditer(text)]
    assert sorted(sections) == sorted({f.section for f in FAMILIES}), "one generated table per section"
    want = _generated_doc(text)
    if request.config.getoption("--update-golden"):
        DOC.write_text(want)
        text = want
    assert text == want, "docs/metrics.md is not what the table says: pytest tests/test_metrics.py --update-golden"


_BUDGET_BLOCK = re.compile(r"(<!-- series budget .*?-->\n)(.*?)(<!-- end series budget -->)", re.S)


def test_docs_series_budget_is_generated_from_the_table(request):
    text = DOC.read_text()
    assert _BUDGET_BLOCK.search(text), "docs/metrics.md has no series budget block"
    want = _BUDGET_BLOCK.sub(lambda m: m.group(1) + budget.doc_table() + m.group(3), text)
    if request.config.getoption("--update-golden"):
        DOC.write_text(want)
        text = want
    assert text == want, (
        "docs/metrics.md's series budget is not the table's: pytest tests/test_metrics.py --update-golden"
    )


def test_docs_name_no_family_the_table_lacks():
    named = set(re.findall(r"`(nodehealth_[a-z0-9_]+)", DOC.read_text()))
    assert named and not named - set(BY_NAME), sorted(named - set(BY_NAME))
    assert set(BY_NAME) <= named


# ----------------------------------------------------------------------------- values


def test_per_gpu_values_and_labels():
    text = _text(detail=True)
    lab = {
        "gpu": "3",
        "uuid": "GPU-00000003-5151-4e4f-8d48-000000000003",
        "pci_bus_id": "0000:5d:00.0",
        "model": "NVIDIA H100 80GB HBM3",
    }
    # The simulator's H100 SXM5 (nodehealth/sim/models.py, from nvidia-smi -q), GPU 3 of healthy-8x-h100.
    for name, value in (
        ("nodehealth_gpu_temperature_celsius", 33),
        ("nodehealth_gpu_temperature_slowdown_celsius", 89),
        ("nodehealth_gpu_power_watts", 72.02),
        ("nodehealth_gpu_power_limit_watts", 700),
        ("nodehealth_gpu_utilization_ratio", 0),
        ("nodehealth_gpu_memory_used_bytes", 0),
        ("nodehealth_gpu_memory_total_bytes", 81559 << 20),
        ("nodehealth_gpu_pcie_link_width", 16),
        ("nodehealth_gpu_pcie_link_width_max", 16),
        ("nodehealth_gpu_pcie_link_generation", 5),
        ("nodehealth_gpu_ecc_enabled", 1),
        ("nodehealth_gpu_persistence_mode_enabled", 1),
        ("nodehealth_gpu_fabric_state", 3),
        ("nodehealth_gpu_recovery_action", 0),
        ("nodehealth_gpu_processes", 0),
        ("nodehealth_gpu_lost", 0),
    ):
        assert sample(text, name, **lab) == value, name
    assert sample(text, "nodehealth_gpu_info", gpu="3", driver_version="570.133.20") == 1
    assert sample(text, "nodehealth_nvml_devices") == 8
    assert "nodehealth_nvml_simulated" not in text  # a simulated run says so in its report's header only
    assert sample(text, "nodehealth_gpu_ecc_errors_total", gpu="0", type="uncorrected", scope="volatile") == 0
    assert sample(text, "nodehealth_gpu_remapped_rows", gpu="0", cause="correctable") == 0
    assert sample(text, "nodehealth_gpu_row_remap_pending", gpu="0") == 0
    assert sample(text, "nodehealth_gpu_nvlink_up", gpu="0", link="17") == 1
    assert sample(text, "nodehealth_gpu_nvlink_link_errors_total", gpu="0", link="0", type="replay") == 0
    assert sample(text, "nodehealth_gpu_nvlink_errors_total", gpu="0") == 0
    assert sample(text, "nodehealth_gpu_throttle_reason_active", gpu="0", reason="gpu_idle") == 1
    assert sample(text, "nodehealth_gpu_throttle_reason_active", gpu="0", reason="hw_thermal_slowdown") == 0
    assert sample(text, "nodehealth_check_status", check="nvml") == 0
    assert sample(text, "nodehealth_node_status") == 0 and sample(text, "nodehealth_node_failing_checks") == 0
    assert sample(text, "nodehealth_xid_errors_total", gpu="5", xid="79", action="reboot") == 1
    assert sample(text, "nodehealth_xid_follower_up", state="alive") == 1
    assert sample(text, "nodehealth_gpu_job_info", gpu="0", job_id="4242") == 1
    assert sample(text, "nodehealth_slurm_node_drained_by_nodehealth") == 1
    assert sample(text, "nodehealth_slurm_breaker_open") == 0
    assert sample(text, "nodehealth_slurm_actions_total", action="drained") == 1
    assert sample(text, "nodehealth_config_reloads_total", result="ok") == 1
    assert sample(text, "nodehealth_config_reloads_total", result="error") == 0
    assert sample(text, "nodehealth_state_write_errors_total") == 1
    assert sample(text, "nodehealth_rounds_total") == 1
    assert sample(text, "nodehealth_build_info", node="gpu001", face="daemon") == 1


def test_check_duration_is_the_report_duration():
    out = _outcome("healthy-8x-h100")
    m = NodeMetrics("gpu001", process=False, detail=True)
    m.update_round(out.report, out.observations)
    text = m.payload().decode()
    for r in out.report.results:
        assert sample(text, "nodehealth_check_duration_seconds", check=r.name) == pytest.approx(r.duration_s)
    assert sample(text, "nodehealth_round_duration_seconds") == pytest.approx(out.report.duration_s)


def test_faults_show_in_the_metrics():
    remap = _text("row-remap-pending", detail=True)
    assert sample(remap, "nodehealth_gpu_row_remap_pending", gpu="1") == 1
    assert sample(remap, "nodehealth_gpu_row_remap_pending", gpu="0") == 0
    assert sample(remap, "nodehealth_gpu_remapped_rows", gpu="1", cause="uncorrectable") == 1
    assert sample(remap, "nodehealth_check_status", check="gpu_remapped_rows") == 4
    assert sample(remap, "nodehealth_node_status") == 4 and sample(remap, "nodehealth_node_failing_checks") == 1
    nvl = _text("nvlink-down", detail=True)  # GPU 3 links 5 and 11 down
    assert sample(nvl, "nodehealth_gpu_nvlink_up", gpu="3", link="5") == 0
    assert sample(nvl, "nodehealth_gpu_nvlink_up", gpu="3", link="11") == 0
    assert sample(nvl, "nodehealth_gpu_nvlink_up", gpu="3", link="4") == 1
    assert sample(nvl, "nodehealth_gpu_nvlink_up", gpu="2", link="5") == 1
    hot = _text("hot-gpu-thermal-slowdown", detail=True)  # GPU 2: hw and sw thermal slowdown
    for reason in ("hw_thermal_slowdown", "sw_thermal_slowdown"):
        assert sample(hot, "nodehealth_gpu_throttle_reason_active", gpu="2", reason=reason) == 1
        assert sample(hot, "nodehealth_gpu_throttle_reason_active", gpu="1", reason=reason) == 0
    assert sample(hot, "nodehealth_gpu_throttle_reason_active", gpu="2", reason="hw_slowdown") == 0
    assert sample(hot, "nodehealth_gpu_temperature_celsius", gpu="2") == 89
    pcie = _text("pcie-degraded", detail=True)  # GPU 7 at x8
    assert sample(pcie, "nodehealth_gpu_pcie_link_width", gpu="7") == 8
    assert sample(pcie, "nodehealth_gpu_pcie_link_width_max", gpu="7") == 16
    assert sample(pcie, "nodehealth_gpu_pcie_link_width", gpu="6") == 16
    v100 = _text("v100-retired-pages-pending", detail=True)  # GPU 1: 2 dbe pages, pending; no row remapping
    assert sample(v100, "nodehealth_gpu_retired_pages", gpu="1", cause="dbe") == 2
    assert sample(v100, "nodehealth_gpu_retired_pages_pending", gpu="1") == 1
    assert sample(v100, "nodehealth_gpu_retired_pages_pending", gpu="0") == 0
    assert sample(v100, "nodehealth_gpu_remapped_rows", gpu="1") is None  # unsupported: no sample, not 0


def test_hung_nvml_sets_the_probe_timeout_metric():
    checks = {s.name: {"timeout_s": 1.0} for s in registry.CHECKS if "nvml" in s.needs and "daemon" in s.phases}
    out = _outcome("hung-nvml-call", checks=checks)
    assert probe_timeouts(out.observations)["nvml"] is True
    m = NodeMetrics("gpu001", process=False)
    m.update_round(out.report, out.observations)
    text = m.payload().decode()
    assert sample(text, "nodehealth_probe_timed_out", probe="nvml") == 1
    assert sample(text, "nodehealth_probe_timeouts_total", probe="nvml") == 1
    # FAIL (hung) or UNKNOWN (slow: a busy machine can make the one hung call look slow); never OK
    assert sample(text, "nodehealth_check_status", check="nvml") in (3, 4)


def test_running_round_and_start_time_come_from_the_clock():
    now = [100.0]
    m = NodeMetrics("gpu001", process=False, clock=lambda: now[0])
    assert sample(m.payload().decode(), "nodehealth_round_running_seconds") == 0
    m.round_started_now()
    now[0] = 107.5
    text = m.payload().decode()
    assert sample(text, "nodehealth_round_running_seconds") == 7.5
    assert sample(text, "nodehealth_start_time_seconds") == 100
    m.state_written(True)
    assert sample(m.payload().decode(), "nodehealth_state_last_write_timestamp_seconds") == 107.5


def test_payload_cached_until_an_update():
    m = NodeMetrics("gpu001", process=False)
    first = m.payload()
    assert m._payload is not None
    m.count_xid("0", 48, "reset_gpu")
    assert m._payload is None and m.payload() != first


def test_gzip_payload_is_the_same_text_and_follows_updates():
    out = _outcome("healthy-8x-h100")
    m = NodeMetrics("gpu001", process=False)
    m.update_round(out.report, out.observations)
    zipped = m.payload_gzip()
    assert gzip.decompress(zipped) == m.payload()
    assert len(zipped) < len(m.payload()) / 4
    m.count_xid("0", 48, "reset_gpu")
    assert b'xid="48"' in gzip.decompress(m.payload_gzip())


def test_textfile_atomic_and_requires_the_directory(tmp_path):
    payload = _metrics().payload()
    path = write_textfile(str(tmp_path), "daemon", payload)
    assert path == textfile_path(str(tmp_path), "daemon") == str(tmp_path / "nodehealth-daemon.prom")
    assert open(path, "rb").read() == payload
    assert os.listdir(tmp_path) == ["nodehealth-daemon.prom"]  # no temp file left behind
    with pytest.raises(FileNotFoundError):
        write_textfile(str(tmp_path / "missing"), "daemon", payload)


@pytest.mark.real
@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (Debian package prometheus)")
@pytest.mark.parametrize(
    "scenario",
    [
        "healthy-8x-h100",
        "row-remap-pending",
        "nvlink-down",
        "gpu-lost",
        "volatile-uncorrectable-ecc",
        "cpu-node-no-gpu",
    ],
)
def test_promtool_check_metrics_on_rendered_scenarios(scenario):
    assert PROMTOOL is not None
    text = _text(scenario)
    res = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip() == "" and res.stderr.strip() == "", res.stdout + res.stderr


# ----------------------------------------------------------------------------- the series budget


def _series(text: str) -> int:
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


def _default_node_page(**over) -> bytes:
    """A default daemon's page after a round of a healthy simulated 8x H100 node with a job on every
    GPU, its Slurm hook's view, the follower, the config and a state write: what a scrape gets."""
    out = _outcome("healthy-8x-h100", **over)
    m = NodeMetrics("gpu001")  # with ProcessCollector, as the daemon has it
    m.update_round(out.report, out.observations)
    m.set_jobs({i: str(4000 + i) for i in range(8)})
    m.set_slurm(
        SlurmView(
            drained=False,
            drained_by_nodehealth=False,
            breaker_open=False,
            last_action="other",
            flapping=False,
            orphan_drain=False,
            observe_mode=False,
            reboots_requested=0,
            reboot_escalated=False,
        )
    )
    m.set_xid_follower("alive")
    m.set_config("/etc/nodehealth/nodehealth.toml", "none", "file")
    m.state_written(True)
    return m.payload()


def test_default_8_gpu_page_within_the_series_budget():
    page = _default_node_page()
    n, size = _series(page.decode()), len(page)
    assert n <= budget.BUDGET, f"a default 8-GPU node's page has {n} series (budget {budget.BUDGET}): docs/metrics.md"
    assert size <= budget.BUDGET_BYTES, f"a default 8-GPU node's page is {size} bytes (budget {budget.BUDGET_BYTES})"
    assert budget.count()[1] <= budget.BUDGET
    # The table's count for the node is what it renders, but for the active throttle reason of
    # each idle GPU (gpu_idle: quiet, not counted) and two that even out: the Slurm hook's last
    # action (an event) and the last reload's success (counted, absent before a reload).
    fams = _parse(page.decode())
    active = len(fams["nodehealth_gpu_throttle_reason_active"]["samples"])
    assert n == budget.count()[1] + active, (n, budget.count(), active)


def test_the_detail_page_stays_within_the_tables_count():
    out = _outcome("healthy-8x-h100")
    m = NodeMetrics("gpu001", detail=True)
    m.update_round(out.report, out.observations)
    page = m.payload().decode()
    links = {s[1]["link"] for s in _parse(page)["nodehealth_gpu_nvlink_up"]["samples"]}
    node = budget.Node(gpus=8, links=len(links), checks=len(out.report.results), probes=10)
    assert budget.count(node)[1] < _series(page) <= budget.count(node, detail=True)[1]


def test_an_8_gpu_page_is_a_seventh_of_the_detail_page():
    out = _outcome("healthy-8x-h100")
    pages = []
    for detail in (False, True):
        m = NodeMetrics("gpu001", process=False, detail=detail)
        m.update_round(out.report, out.observations)
        pages.append(m.payload().decode())
    assert _series(pages[1]) > 5 * _series(pages[0])
    assert sample(pages[0], "nodehealth_gpu_nvlink_up") is None  # every link up: none by default
    assert sample(pages[1], "nodehealth_gpu_nvlink_up", gpu="0", link="17") == 1
    assert sample(pages[0], "nodehealth_check_duration_seconds") is None
    assert sample(pages[0], "nodehealth_gpu_ecc_errors_total", gpu="0", scope="aggregate") is None
    assert sample(pages[0], "nodehealth_gpu_ecc_errors_total", gpu="0", type="uncorrected", scope="volatile") == 0


def test_the_default_page_shows_what_is_not_healthy():
    nvl = _text("nvlink-down")  # GPU 3 links 5 and 11 down
    assert sample(nvl, "nodehealth_gpu_nvlink_up", gpu="3", link="5") == 0
    assert sample(nvl, "nodehealth_gpu_nvlink_up", gpu="3", link="11") == 0
    assert sample(nvl, "nodehealth_gpu_nvlink_up", gpu="3", link="4") is None
    assert len(_parse(nvl)["nodehealth_gpu_nvlink_up"]["samples"]) == 2
    hot = _text("hot-gpu-thermal-slowdown")  # GPU 2: hw and sw thermal slowdown
    assert sample(hot, "nodehealth_gpu_throttle_reason_active", gpu="2", reason="hw_thermal_slowdown") == 1
    assert sample(hot, "nodehealth_gpu_throttle_reason_active", gpu="2", reason="hw_slowdown") is None
    remap = _text("row-remap-pending")
    assert sample(remap, "nodehealth_gpu_row_remap_pending", gpu="1") == 1
    assert sample(remap, "nodehealth_gpu_row_remap_pending", gpu="0") is None
    assert sample(remap, "nodehealth_gpu_remapped_rows", gpu="1", cause="uncorrectable") == 1
    assert "nodehealth_check_duration_seconds" not in remap  # a detail family: not even its HELP line


def test_nvlink_errors_fold_into_one_counter_per_gpu_and_show_the_links_that_count():
    from dataclasses import replace

    out = _outcome("healthy-8x-h100")
    snap = out.observations.nvml
    g0 = snap.gpus[0]
    links = (replace(g0.nvlinks[0], replay=3, crc_flit=4),) + tuple(g0.nvlinks[1:])
    snap = replace(snap, gpus=(replace(g0, nvlinks=links),) + tuple(snap.gpus[1:]))
    m = NodeMetrics("gpu001", process=False)
    m.update_round(out.report, replace(out.observations, nvml=snap))
    text = m.payload().decode()
    assert sample(text, "nodehealth_gpu_nvlink_errors_total", gpu="0") == 7
    assert sample(text, "nodehealth_gpu_nvlink_errors_total", gpu="1") == 0
    assert sample(text, "nodehealth_gpu_nvlink_link_errors_total", gpu="0", link="0", type="replay") == 3
    assert sample(text, "nodehealth_gpu_nvlink_link_errors_total", gpu="0", link="0", type="crc_flit") == 4
    assert len(_parse(text)["nodehealth_gpu_nvlink_link_errors_total"]["samples"]) == 2


@pytest.mark.parametrize(
    "kw, labels, value, shown",
    [
        ({}, {}, 0.0, True),
        ({"detail": True}, {}, 1.0, False),
        ({"quiet": 0.0}, {}, 0.0, False),
        ({"quiet": 0.0}, {}, 2.0, True),
        ({"default_values": {"scope": ("volatile",)}}, {"scope": "aggregate"}, 1.0, False),
        ({"default_values": {"scope": ("volatile",)}}, {"scope": "volatile"}, 1.0, True),
    ],
    ids=["plain", "detail", "quiet-healthy", "quiet-not", "default-values-out", "default-values-in"],
)
def test_what_the_default_page_publishes_of_a_row(kw, labels, value, shown):
    f = row("gpu", "nodehealth_x", GAUGE, tuple(labels), "x", **kw)
    assert f.published(labels, value, detail=False) is shown
    assert f.published(labels, value, detail=True) is True
    for detail, kept in ((False, shown), (True, True)):  # what Series.add keeps (it drops early)
        series = Series(f, detail)
        series.add(tuple(labels.values()), value)
        assert len(series.samples) == int(kept)


def test_detail_follows_the_setting():
    out = _outcome("healthy-8x-h100")
    m = NodeMetrics("gpu001", process=False)
    m.update_round(out.report, out.observations)
    assert b"nodehealth_check_duration_seconds" not in m.payload()
    m.set_detail(True)
    assert b"nodehealth_check_duration_seconds{" in m.payload()


# ----------------------------------------------------------------------------- a scrape is a write


def test_the_live_tail_is_cached_between_rounds():
    now = [1000.0]
    m = NodeMetrics("gpu001", monotonic=lambda: now[0])
    reads = []
    real = m.process.read
    m.process.read = lambda: (reads.append(1), real())[1]  # type: ignore[method-assign]
    first = m.payload()
    assert m.payload() is first and len(reads) == 1  # no /proc read, no rendering, not even a copy
    zipped = m.payload_gzip()
    tail_gz = m._tail_gz
    assert m.payload_gzip() is zipped and m._tail_gz is tail_gz  # the gzip of both parts kept
    assert gzip.decompress(zipped) == first
    now[0] += 6.0  # past PROCESS_EVERY_S: the process figures are read again
    m.payload()
    assert len(reads) == 2
    m.round_started_now()  # while a round runs, its running time is rendered per scrape
    assert b"nodehealth_round_running_seconds" in m.payload()
    m.set_config("/etc/nodehealth/nodehealth.toml", "syntax", "last_validated")
    assert sample(m.payload().decode(), "nodehealth_config_valid", error="syntax") == 0


# ----------------------------------------------------------------------------- our text format


def test_the_page_is_what_prometheus_client_writes():
    """exposition.render writes byte for byte what prometheus_client's generate_latest writes for the
    same families (the daemon no longer imports it), values and escapes included."""
    pc = pytest.importorskip("prometheus_client")
    from prometheus_client.core import Metric as PcMetric

    m = _metrics("v100-retired-pages-pending", detail=True)
    ours = list(m.families())
    odd = new("nodehealth_config_valid")
    odd.add(['/etc/a "b"\\c\nd', "none"], 1)
    ours += [odd, one("nodehealth_rounds_total", 12345678.0), one("nodehealth_round_duration_seconds", float("nan"))]
    ours += [one("nodehealth_start_time_seconds", float("inf")), one("nodehealth_nvml_devices", 1e-7)]

    class Registry:
        def collect(self):
            for f in ours:
                theirs = PcMetric(f.name, f.documentation, f.type, f.unit)
                for s in f.samples:
                    theirs.add_sample(s.name, s.labels, s.value)
                yield theirs

    assert exposition.render(ours) == pc.generate_latest(Registry())


def test_the_process_figures_are_prometheus_clients(tmp_path):
    pc = pytest.importorskip("prometheus_client")
    theirs = pc.CollectorRegistry()
    pc.ProcessCollector(registry=theirs)
    ours = {f.name for f in exposition.Process().families()}
    names = {s.name for fam in theirs.collect() for s in fam.samples}
    assert (
        {f"{n}_total" if n.endswith("cpu_seconds") else n for n in ours}
        == names
        == {
            "process_virtual_memory_bytes",
            "process_resident_memory_bytes",
            "process_start_time_seconds",
            "process_cpu_seconds_total",
            "process_open_fds",
            "process_max_fds",
        }
    )
    assert len(names) == budget.PROCESS_SERIES
    text = exposition.render(exposition.Process().families()).decode()
    assert sample(text, "process_resident_memory_bytes") > 1 << 20
    assert exposition.Process(proc=str(tmp_path)).families() == []  # no /proc: no process_* (as theirs)
    assert exposition.Process(proc=str(tmp_path)).text() == b""


def test_the_process_text_is_the_rendered_families(tmp_path):
    """What a scrape writes (``Process.text``, no families built) is byte for byte ``render`` of the
    families, on a /proc whose figures are fixed, and with one of its files unreadable."""
    (tmp_path / "stat").write_text("cpu  1 2 3\nbtime 1764000000\n")
    me = tmp_path / "self"
    (me / "fd").mkdir(parents=True)
    for n in range(7):
        (me / "fd" / str(n)).write_text("")
    fields = " ".join(str(n) for n in range(4, 53))  # field k (after the state, 3) holds k: utime 14, rss 24
    (me / "stat").write_text(f"4242 (nodehealth (x)) S {fields}\n")
    (me / "limits").write_text(
        "Limit                     Soft Limit           Hard Limit           Units\n"
        "Max open files            65536                524288               files\n"
    )
    proc = exposition.Process(proc=str(tmp_path))
    text = proc.text()
    assert text == exposition.render(proc.families())
    assert sample(text.decode(), "process_open_fds") == 7 and sample(text.decode(), "process_max_fds") == 65536
    assert sample(text.decode(), "process_cpu_seconds_total") == (14 + 15) / proc.ticks
    (me / "limits").unlink()
    assert proc.text() == exposition.render(proc.families()) and b"process_open_fds" not in proc.text()


def test_the_daemons_metrics_import_no_prometheus_client():
    code = (
        "import sys; import nodehealth.metrics, nodehealth.daemon.core; "
        "m = nodehealth.metrics.NodeMetrics('n'); m.payload(); m.payload_gzip(); "
        "print(sorted(x for x in sys.modules if x.split('.')[0] in ('prometheus_client', 'ssl', 'http', 'email')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(ROOT), check=True)
    assert out.stdout.strip() == "[]", out.stdout
