"""The text report says one cause once: checks with the same status, summary, GPU and action are one
line naming them all (render.text), and the words for "NVML gave nothing before its deadline" are one
text with one number, whichever path (the runner's deadline, the snapshot cut off) reached the check."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from nodehealth import render
from nodehealth.model import Action, CheckResult, Report, Status

ROOT = Path(__file__).resolve().parent.parent


def _report(*results: CheckResult) -> Report:
    return Report(node="n1", phase="manual", results=tuple(results), duration_s=0.1, version="0", started_at=0.0)


def test_one_cause_is_one_line_naming_every_check() -> None:
    same = "no NVML data: nvml probe did not finish within 10 s"
    rep = _report(
        CheckResult("nvml", Status.FAIL, "NVML did not answer", action=Action.REBOOT),
        CheckResult("gpu_count", Status.UNKNOWN, same),
        CheckResult("gpu_ecc", Status.UNKNOWN, same),
        CheckResult("host_memory", Status.OK, "ok"),
        CheckResult("gpu_pcie", Status.UNKNOWN, same),
    )
    out = render.text(rep)
    assert out.count(same) == 1, out
    assert "3 checks" in out and "checks: gpu_count, gpu_ecc, gpu_pcie" in out
    lines = out.splitlines()
    assert lines.index(next(ln for ln in lines if same in ln)) < lines.index(
        next(ln for ln in lines if "host_memory" in ln)
    )
    verbose = render.text(rep, verbose=True)
    assert verbose.count(same) == 3, "verbose keeps one line per check"


def test_checks_skipped_for_one_reason_are_one_line_and_ok_lines_stay_apart() -> None:
    """A host with no GPU: every GPU check SKIPPED for the same reason is one line, not thirteen."""
    why = "does not apply: no GPU"
    rep = _report(
        CheckResult("gpu_count", Status.SKIPPED, why),
        CheckResult("gpu_ecc", Status.SKIPPED, why),
        CheckResult("host_memory", Status.OK, "ok"),
        CheckResult("host_mounts", Status.OK, "ok"),
        CheckResult("gpu_pcie", Status.SKIPPED, why),
        CheckResult("gpu_xid", Status.SKIPPED, "does not apply: nothing configured"),
    )
    out = render.text(rep)
    assert out.count(why) == 1 and "3 checks" in out and "checks: gpu_count, gpu_ecc, gpu_pcie" in out, out
    assert "gpu_xid" in out and out.count("host_") == 2, out
    assert render.text(rep, verbose=True).count(why) == 3


def test_different_gpus_or_statuses_are_not_grouped() -> None:
    rep = _report(
        CheckResult("gpu_ecc", Status.FAIL, "uncorrectable", gpu=0, action=Action.RESET_GPU),
        CheckResult("gpu_pcie", Status.FAIL, "uncorrectable", gpu=1, action=Action.RESET_GPU),
        CheckResult("gpu_nvlink", Status.WARN, "uncorrectable", gpu=1),
    )
    out = render.text(rep)
    assert "checks:" not in out and sum(": uncorrectable  [action" in ln for ln in out.splitlines()) == 3, out


def test_a_hung_nvml_says_its_cause_once_with_one_number(tmp_path: Path) -> None:
    (tmp_path / "sys").mkdir()
    cfg = tmp_path / "nh.toml"
    cfg.write_text(f'[paths]\nsysfs_root = "{tmp_path / "sys"}"\nstate_dir = "{tmp_path / "state"}"\n')
    scenario = ROOT / "examples" / "scenarios" / "hung-nvml-init.toml"
    proc = subprocess.run(
        [sys.executable, "-m", "nodehealth", "check", "--config", str(cfg), "--simulate", str(scenario)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    out = proc.stdout
    no_data = [ln for ln in out.splitlines() if "no NVML data" in ln]
    assert len(no_data) == 1, out
    assert len(set(re.findall(r"within ([\d.]+) s", out))) <= 1, out
