"""Metrics: names, labels and values from simulated nodes; exposition valid for promtool; textfile."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from test_daemon_util import GPU_CHECKS, SCENARIOS, sample

from nodehealth import runner
from nodehealth.config import loader as config
from nodehealth.metrics import NodeMetrics, SlurmView, face_textfile, probe_timeouts, textfile_path

PROMTOOL = shutil.which("promtool")


def _outcome(name: str, **over):
    cfg = config.resolve({"nvml": {"simulate": str(SCENARIOS / f"{name}.toml")},
                          "paths": {"state_dir": "/nonexistent/nodehealth-test"}, **over}, "<test>")
    return runner.execute(cfg, phase="daemon", node="gpu001")


def _text(name: str = "healthy-8x-h100", **over) -> str:
    out = _outcome(name, **over)
    m = NodeMetrics("gpu001", process=False)
    m.update_round(out.report, out.observations)
    m.count_xid("5", 79, "reboot")
    m.set_jobs({0: "4242"})
    m.set_slurm(SlurmView(drained=True, drained_by_nodehealth=True, breaker_open=False, last_action="drained"))
    return m.payload().decode()


def test_every_family_is_named_by_the_convention_and_documented():
    text = _text()
    names = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")}
    assert all(n.startswith("nodehealth_") for n in names), names
    doc = (SCENARIOS.parent.parent / "docs" / "metrics.md").read_text()
    missing = sorted(n for n in names if f"`{n}`" not in doc and f"`{n}_total`" not in doc)
    assert not missing, f"not in docs/metrics.md: {missing}"


def test_per_gpu_values_and_labels():
    text = _text()
    lab = {"gpu": "3", "pci_bus_id": "0000:5d:00.0", "model": "NVIDIA H100 80GB HBM3"}
    for name in ("nodehealth_gpu_temperature_celsius", "nodehealth_gpu_power_watts", "nodehealth_gpu_utilization_ratio",
                 "nodehealth_gpu_memory_used_bytes", "nodehealth_gpu_memory_total_bytes",
                 "nodehealth_gpu_pcie_link_width", "nodehealth_gpu_pcie_link_generation"):
        assert sample(text, name, **lab) is not None, name
    assert 'uuid="GPU-' in text
    assert sample(text, "nodehealth_gpu_ecc_errors_total", gpu="0", type="uncorrected", scope="volatile") == 0
    assert sample(text, "nodehealth_gpu_remapped_rows", gpu="0", cause="correctable") is not None
    assert sample(text, "nodehealth_gpu_row_remap_pending", gpu="0") == 0
    assert sample(text, "nodehealth_gpu_nvlink_up", gpu="0", link="0") == 1
    assert sample(text, "nodehealth_gpu_nvlink_errors_total", gpu="0", link="0", type="replay") is not None
    assert sample(text, "nodehealth_gpu_throttle_reason_active", gpu="0", reason="hw_thermal_slowdown") == 0
    assert sample(text, "nodehealth_check_status", check="nvml") == 0
    assert sample(text, "nodehealth_check_duration_seconds", check="nvml") is not None
    assert sample(text, "nodehealth_xid_errors_total", gpu="5", xid="79", action="reboot") == 1
    assert sample(text, "nodehealth_gpu_job_info", gpu="0", job_id="4242") == 1
    assert sample(text, "nodehealth_slurm_node_drained_by_nodehealth") == 1
    assert sample(text, "nodehealth_slurm_breaker_open") == 0
    assert sample(text, "nodehealth_rounds_total") == 1


def test_faults_show_in_the_metrics():
    assert sample(_text("row-remap-pending"), "nodehealth_gpu_row_remap_pending", gpu="1") == 1
    assert sample(_text("row-remap-pending"), "nodehealth_check_status", check="gpu_remapped_rows") == 4
    assert sample(_text("nvlink-down"), "nodehealth_gpu_nvlink_up", link="0") is not None
    hot = _text("hot-gpu-thermal-slowdown")
    assert any(sample(hot, "nodehealth_gpu_throttle_reason_active", gpu=str(g), reason=r) == 1
               for g in range(8) for r in ("hw_thermal_slowdown", "sw_thermal_slowdown", "hw_slowdown"))
    pcie = _text("pcie-degraded")
    assert any((sample(pcie, "nodehealth_gpu_pcie_link_width", gpu=str(g)) or 16) < 16 for g in range(8))


def test_hung_nvml_sets_the_probe_timeout_metric():
    checks = {n: {"timeout_s": 1.0} for n in GPU_CHECKS}
    out = _outcome("hung-nvml-call", checks=checks)
    assert probe_timeouts(out.observations)["nvml"] is True
    m = NodeMetrics("gpu001", process=False)
    m.update_round(out.report, out.observations)
    text = m.payload().decode()
    assert sample(text, "nodehealth_probe_timed_out", probe="nvml") == 1
    assert sample(text, "nodehealth_probe_timeouts_total", probe="nvml") == 1
    assert sample(text, "nodehealth_check_status", check="nvml") == 4


def test_payload_cached_until_an_update():
    m = NodeMetrics("gpu001", process=False)
    first = m.payload()
    assert m._payload is not None
    m.count_xid("0", 48, "reset_gpu")
    assert m._payload is None and m.payload() != first


def test_gzip_payload_is_the_same_text_and_follows_updates():
    import gzip

    out = _outcome("healthy-8x-h100")
    m = NodeMetrics("gpu001", process=False)
    m.update_round(out.report, out.observations)
    zipped = m.payload_gzip()
    assert gzip.decompress(zipped) == m.payload()
    assert len(zipped) < len(m.payload()) / 4
    m.count_xid("0", 48, "reset_gpu")
    assert b'xid="48"' in gzip.decompress(m.payload_gzip())


def test_textfile_atomic_and_requires_the_directory(tmp_path):
    out = _outcome("healthy-8x-h100")
    path = face_textfile(str(tmp_path), "prolog", "gpu001", out.report, out.observations)
    assert path == textfile_path(str(tmp_path), "prolog")
    body = open(path).read()
    assert 'face="prolog"' in body and "nodehealth_gpu_temperature_celsius" in body
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")]  # no temp file left behind
    with pytest.raises(FileNotFoundError):
        face_textfile(str(tmp_path / "missing"), "prolog", "gpu001", out.report, out.observations)


@pytest.mark.real
@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (Debian package prometheus)")
@pytest.mark.parametrize("scenario", ["healthy-8x-h100", "row-remap-pending", "nvlink-down", "gpu-lost",
                                      "volatile-uncorrectable-ecc", "cpu-node-no-gpu"])
def test_promtool_check_metrics_on_rendered_scenarios(scenario, tmp_path):
    text = _text(scenario)
    res = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip() == "" and res.stderr.strip() == "", res.stdout + res.stderr
