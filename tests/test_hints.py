"""Every WARN/UNKNOWN/FAIL line says what to do and how the node comes back."""

from __future__ import annotations

import concurrent.futures
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from nodehealth import render
from nodehealth.hints import (
    ACTION_HINTS,
    BACK_REBOOT,
    CHECK_FAULTS,
    CONFIGURATION,
    FABRIC,
    FAULTS,
    HARDWARE,
    INSPECT_BY_FAULT,
    SOFTWARE,
    fault,
    hint,
)
from nodehealth.model import Action, CheckResult, Report, Status
from nodehealth.registry import CHECKS

ROOT = Path(__file__).resolve().parent.parent


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


def test_every_check_has_a_fault_class() -> None:
    assert set(CHECK_FAULTS) == {spec.name for spec in CHECKS}
    assert set(CHECK_FAULTS.values()) <= set(FAULTS) and set(INSPECT_BY_FAULT) == set(FAULTS)


# Words that send a person to the hardware (ACTION_HINTS[Action.INSPECT]).
HARDWARE_WORDS = ("inspect the hardware", "cabling", "seating", "RMA")


def _scenario(path: Path) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "nodehealth", "check", "--simulate", str(path), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=ROOT,
    )
    assert proc.returncode in (0, 1), (path.name, proc.stderr)
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


def _every_scenario() -> dict[str, dict[str, Any]]:
    files = sorted((ROOT / "examples" / "scenarios").glob("*.toml"))
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        return dict(zip((f.name for f in files), pool.map(_scenario, files)))


def test_no_software_or_configuration_finding_of_any_scenario_suggests_hardware_inspection() -> None:
    """The program's real output for every shipped scenario: a finding's hint starts with its class;
    only a hardware one may send a person to the hardware."""
    docs = _every_scenario()
    classes: dict[tuple[str, str], str] = {}
    for name, doc in docs.items():
        for entry in doc["checks"]:
            if entry["status"] in ("OK", "SKIPPED"):
                assert "hint" not in entry
                continue
            tip = entry["hint"]
            cls = tip.split(":", 1)[0]
            if cls in FAULTS:
                classes[(name, entry["name"])] = cls
            else:
                assert entry["status"] == "UNKNOWN", (name, entry)  # could not tell: no class
            if cls in (SOFTWARE, CONFIGURATION):
                assert not any(w in tip for w in HARDWARE_WORDS), (name, entry["name"], tip)
    # The scenarios whose cause is not the hardware, and one that is, as an administrator reads them.
    assert classes[("nvml-not-installed.toml", "nvml")] == SOFTWARE
    assert classes[("nvml-init-no-permission.toml", "nvml")] == CONFIGURATION
    assert classes[("ecc-disabled-by-operator.toml", "gpu_ecc")] == CONFIGURATION
    assert classes[("persistence-off.toml", "gpu_persistence")] == CONFIGURATION
    assert classes[("gb200-fabric-incorrect-configuration.toml", "gpu_fabric")] == FABRIC
    assert classes[("gpu-insufficient-power.toml", "nvml")] == HARDWARE
    assert classes[("row-remap-failure.toml", "gpu_remapped_rows")] == HARDWARE
    missing = next(c for c in docs["nvml-not-installed.toml"]["checks"] if c["name"] == "nvml")
    assert "ls /usr/lib*/libnvidia-ml.so.1" in missing["hint"] and "nvidia-smi" in missing["hint"]
    assert set(classes.values()) == set(FAULTS)  # every class is met by some shipped scenario


@pytest.mark.parametrize(
    ("error", "cls", "says"),
    [
        ("nvmlInit: NVML Shared Library Not Found", SOFTWARE, "libnvidia-ml.so.1"),
        ("nvmlInit: Driver Not Loaded", SOFTWARE, "modprobe nvidia"),
        ("nvmlInit: Insufficient Permissions", CONFIGURATION, "/dev/nvidia"),
        ("nvidia-ml-py 11.450.51 (x) is older than 12.535.77, the oldest this probe is tested with", SOFTWARE, "pip"),
        ("nvmlDeviceGetHandleByIndex: Unknown Error", HARDWARE, "cabling"),
    ],
    ids=["library-missing", "module-not-loaded", "permission", "old-wheel", "unknown-error"],
)
def test_nvml_errors_are_classed_by_nvmls_own_words(error: str, cls: str, says: str) -> None:
    res = CheckResult("nvml", Status.FAIL, f"NVML: {error}", Action.INSPECT, details={"error": error})
    assert fault(res) == cls
    tip = hint(res) or ""
    assert tip.startswith(f"{cls}: ") and says in tip


def test_an_unknown_names_no_class_unless_its_details_name_the_cause() -> None:
    plain = CheckResult("gpu_ecc", Status.UNKNOWN, "no NVML data: x")
    assert fault(plain) is None and (hint(plain) or "").startswith("look: ")
    old = CheckResult(
        "nvml", Status.UNKNOWN, "NVML not read", details={"error": "the oldest this probe is tested with"}
    )
    assert fault(old) == SOFTWARE
    assert fault(CheckResult("gpu_ecc", Status.OK, "fine")) is None


def test_a_finding_a_restart_fixes_is_software_whatever_the_check() -> None:
    """An application XID (13, 31, 43: action restart_app) is the job's software, not the GPU."""
    app = CheckResult("gpu_xid", Status.FAIL, "GPU 0: XID 13", Action.RESTART_APP, gpu=0)
    assert fault(app) == SOFTWARE and (hint(app) or "").startswith("software: stop the process")
    assert fault(CheckResult("gpu_xid", Status.FAIL, "GPU 0: XID 79", Action.REBOOT, gpu=0)) == HARDWARE
