"""Real Prometheus: promtool on the rules, and a server started here scraping a live daemon."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from test_daemon_util import ROOT, free_port, start, stop, wait_for, write_config

PROMTOOL = shutil.which("promtool")
PROMETHEUS = shutil.which("prometheus")
RULES = ROOT / "deploy" / "prometheus" / "nodehealth-rules.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "tests" / "nodehealth-rules.test.yml"
SCRAPE = ROOT / "deploy" / "prometheus" / "scrape.yml"
ALERT = re.compile(r"^\s*- alert: (\w+)\s*$", re.M)

needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (Debian package prometheus)")


@pytest.mark.real
@needs_promtool
def test_promtool_check_rules():
    res = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout


@pytest.mark.real
@needs_promtool
def test_promtool_test_rules():
    res = subprocess.run([PROMTOOL, "test", "rules", str(RULE_TESTS)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.real
@needs_promtool
def test_promtool_check_config():
    """The scrape config as shipped, with the rule file it names (promtool resolves it beside the config)."""
    res = subprocess.run([PROMTOOL, "check", "config", str(SCRAPE)], capture_output=True, text=True)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert f"SUCCESS: {SCRAPE} is valid prometheus config file syntax" in out, out
    assert "SUCCESS: 1 rule files found" in out and f"SUCCESS: {len(_alerts())} rules found" in out, out


def _alerts() -> list[str]:
    return ALERT.findall(RULES.read_text())


def _rule_tests_with(tmp: Path, rules: str) -> subprocess.CompletedProcess[str]:
    """``promtool test rules`` on a copy of the rule tests run against ``rules`` (the tests' ../ layout kept)."""
    (tmp / "tests").mkdir(exist_ok=True)
    (tmp / RULES.name).write_text(rules)
    tests = tmp / "tests" / RULE_TESTS.name
    tests.write_text(RULE_TESTS.read_text())
    return subprocess.run([PROMTOOL, "test", "rules", str(tests)], capture_output=True, text=True)


@pytest.mark.real
@needs_promtool
def test_every_alert_has_a_unit_test(tmp_path: Path):
    """Renaming any one alert makes the rule tests fail on that alert: each is expected to fire somewhere."""
    text = RULES.read_text()
    alerts = _alerts()
    assert len(alerts) == len(set(alerts)) > 0, alerts
    res = _rule_tests_with(tmp_path, text)
    assert res.returncode == 0, res.stdout + res.stderr
    untested = []
    for name in alerts:
        renamed, n = re.subn(rf"^(\s*- alert: ){name}\s*$", rf"\g<1>{name}Renamed", text, flags=re.M)
        assert n == 1, name
        res = _rule_tests_with(tmp_path, renamed)
        if res.returncode == 0 or f"alertname: {name}," not in res.stdout + res.stderr:
            untested.append(name)
    assert not untested, f"no rule test expects these alerts to fire: {untested}"


def _query(port: int, expr: str) -> list[dict]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=5) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return body["data"]["result"]


@pytest.mark.real
@pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not installed (Debian package prometheus)")
def test_real_prometheus_scrapes_the_daemon(tmp_path: Path):
    dport, pport = free_port(), free_port()
    daemon = start(write_config(tmp_path, "row-remap-pending", dport))
    conf = tmp_path / "prometheus.yml"
    conf.write_text(f"""
global: {{scrape_interval: 1s, evaluation_interval: 1s}}
rule_files: ["{RULES}"]
scrape_configs:
  - job_name: nodehealth
    static_configs: [{{targets: ["127.0.0.1:{dport}"]}}]
""")
    prom = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={conf}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{pport}",
            "--log.level=warn",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(f"http://127.0.0.1:{dport}/metrics")
        wait_for(f"http://127.0.0.1:{pport}/-/ready", timeout=30)
        end = time.monotonic() + 30
        result: list[dict] = []
        while time.monotonic() < end:
            result = _query(pport, 'nodehealth_gpu_row_remap_pending{gpu="1"}')
            if result:
                break
            time.sleep(0.5)
        assert result and result[0]["value"][1] == "1", result
        m = result[0]["metric"]
        assert m["job"] == "nodehealth" and m["pci_bus_id"] and m["uuid"] and m["model"]
        assert _query(pport, 'up{job="nodehealth"}')[0]["value"][1] == "1"
        for expr in (
            "nodehealth_gpu_temperature_celsius",
            "nodehealth_gpu_utilization_ratio",
            "nodehealth_gpu_memory_used_bytes",
            "nodehealth_gpu_power_watts",
            'nodehealth_check_status{check="gpu_remapped_rows"} == 4',
            "nodehealth_rounds_total",
            "nodehealth_gpu_ecc_errors_total",
            "nodehealth_gpu_nvlink_errors_total",
            "nodehealth_xid_follower_up",
        ):
            assert _query(pport, expr), expr
        assert len(_query(pport, "nodehealth_gpu_temperature_celsius")) == 8
        # The rules load in the server and the failing check turns into an alert (pending, for: 2m).
        end = time.monotonic() + 15
        alerts: list[dict] = []
        while time.monotonic() < end and not alerts:
            alerts = _query(pport, 'ALERTS{alertname="NodehealthGpuRowRemap"}')
            time.sleep(0.5)
        assert alerts, "NodehealthGpuRowRemap not raised"
    finally:
        prom.terminate()
        try:
            prom.wait(timeout=10)
        except subprocess.TimeoutExpired:
            prom.kill()
        stop(daemon)
