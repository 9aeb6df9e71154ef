"""Every WARN/UNKNOWN/FAIL line says what to do and how the node comes back."""

from __future__ import annotations

import json
from pathlib import Path

from nodehealth import render
from nodehealth.hints import ACTION_HINTS, BACK_REBOOT, hint
from nodehealth.model import Action, CheckResult, Report, Status
from nodehealth.registry import CHECKS


def test_every_action_has_a_hint() -> None:
    assert set(ACTION_HINTS) == set(Action)


def test_a_reset_names_the_command_for_that_gpu_and_the_way_back() -> None:
    tip = hint(CheckResult("gpu_remapped_rows", Status.FAIL, "GPU 1: row remap pending", Action.RESET_GPU, gpu=1))
    assert tip is not None and "nvidia-smi -r -i 1" in tip and "clean_runs" in tip
    assert BACK_REBOOT in (hint(CheckResult("gpu_fabric", Status.FAIL, "x", Action.REBOOT, gpu=0)) or "")
    assert hint(CheckResult("gpu_ecc", Status.OK, "fine")) is None


def test_warn_lines_show_their_action_and_hint_in_text_and_json() -> None:
    results = tuple(CheckResult(s.name, Status.OK, "fine") for s in CHECKS if s.name != "gpu_persistence")
    warn = CheckResult("gpu_persistence", Status.WARN, "GPU 0: persistence mode off", Action.NONE, gpu=0)
    report = Report("n1", "manual", results + (warn,), 0.1, "x", 0.0)
    text = render.text(report)
    line = next(ln for ln in text.splitlines() if ln.startswith("WARN"))
    assert "[action: none]" in line
    assert "nvidia-persistenced" in text.split(line, 1)[1].splitlines()[1]
    doc = json.loads(render.as_json(report))
    entry = next(c for c in doc["checks"] if c["name"] == "gpu_persistence")
    assert "nvidia-persistenced" in entry["hint"]
    assert all("hint" not in c for c in doc["checks"] if c["status"] == "OK")


def test_output_doc_describes_the_hint(tmp_path: Path) -> None:
    text = (Path(__file__).resolve().parent.parent / "docs" / "output.md").read_text(encoding="utf-8")
    assert "hint" in text


def test_ecc_switched_off_says_how_to_turn_it_on_not_to_inspect_hardware() -> None:
    """Current and pending ECC off (examples/scenarios/ecc-disabled-by-operator.toml), through the check."""
    from test_gpu_checks import eight

    from nodehealth.checks import gpu_ecc
    from nodehealth.checks.base import Context
    from nodehealth.observations import EccCounts

    obs = eight(2, ecc_enabled=False, ecc_pending_enabled=False)
    res = gpu_ecc.evaluate(obs, gpu_ecc.Settings(), Context("gpu_ecc", "manual", "n1", 8))
    assert (res.status, res.action, res.gpu) == (Status.FAIL, Action.INSPECT, 2)
    tip = hint(res) or ""
    assert "nvidia-smi -i 2 -e 1" in tip and "cabling" not in tip
    # Worn-out memory (lifetime uncorrectable errors) is still a hardware inspection.
    worn = gpu_ecc.evaluate(
        eight(3, ecc=EccCounts(0, 0, 0, 11)), gpu_ecc.Settings(), Context("gpu_ecc", "manual", "n1", 8)
    )
    assert worn.action == Action.INSPECT and "cabling" in (hint(worn) or "")
