"""deploy/grafana/nodehealth-dashboard.json: every query names families of the metrics table, parses as
PromQL (promtool, each expression as a recording rule), and the panels neither share an id nor overlap."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from nodehealth.metrics.families import BY_NAME

DASHBOARD = Path(__file__).resolve().parent.parent / "deploy" / "grafana" / "nodehealth-dashboard.json"
PROMTOOL = shutil.which("promtool")
# Names PromQL or Prometheus itself provides, not the table.
NOT_OURS = {"up", "ALERTS"}


def panels() -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = json.loads(DASHBOARD.read_text())["panels"]
    return found


def exprs() -> list[tuple[str, str]]:
    return [(f"{p['id']}{t['refId']}", t["expr"]) for p in panels() for t in p.get("targets", [])]


def _concrete(expr: str) -> str:
    """Grafana's variables replaced by what they stand for in one query."""
    return (
        expr.replace("$__rate_interval", "2m")
        .replace("$__interval", "1m")
        .replace("$__range", "6h")
        .replace("$instance", "gpu001")
    )


def test_every_query_names_families_of_the_table() -> None:
    unknown = set()
    for _, expr in exprs():
        for name in re.findall(r"\b(nodehealth_[a-z0-9_]+)", expr):
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            if name not in BY_NAME and base not in BY_NAME:
                unknown.add(name)
    assert not unknown, sorted(unknown)


def test_the_roll_out_panels_show_observe_mode_and_the_reboot_loop() -> None:
    text = " ".join(e for _, e in exprs())
    for family in (
        "nodehealth_slurm_would_total",
        "nodehealth_slurm_observe_mode",
        "nodehealth_slurm_reboots_requested",
        "nodehealth_slurm_reboot_escalated",
    ):
        assert family in text, family


def test_panel_ids_are_unique_and_panels_do_not_overlap() -> None:
    ps = panels()
    ids = [p["id"] for p in ps]
    assert len(ids) == len(set(ids)), ids
    cells: dict[tuple[int, int], int] = {}
    for p in ps:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"panel {p['id']} overlaps panel {cells[(x, y)]}"
                cells[(x, y)] = p["id"]


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (Debian package prometheus)")
def test_every_query_is_promql(tmp_path: Path) -> None:
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [{"record": f"dashboard:q{ref}", "expr": _concrete(e)} for ref, e in exprs()],
            }
        ]
    }
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(json.dumps(rules))  # JSON is YAML
    res = subprocess.run([str(PROMTOOL), "check", "rules", str(path)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
