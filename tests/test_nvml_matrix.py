"""The NVML probe across driver branches, through the real pynvml over the simulated driver.

Each case is a node written for one branch (the fake libnvidia-ml.so.1 of that branch has
exactly the symbols, struct versions and field ids that branch's nvml.h declares) and read by
whichever nvidia-ml-py this interpreter imports. ``make nvml-matrix`` runs this file (and the
scenario tests) again under the oldest wheel pyproject allows and under 12.570.86, the first
with the recovery-action field, so every case runs with every allowed wheel.
"""

from __future__ import annotations

import importlib.util
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import Timing
from nodehealth_sim import driver

from nodehealth import runner
from nodehealth.config.loader import resolve
from nodehealth.model import Action, Report, Status
from nodehealth.registry import CHECKS

NVML_PROBES = {"nvml", "pci_gpus", "slurm_node", "job", "node_jobs"}
GPU_CHECKS = tuple(spec.name for spec in CHECKS if "nvml" in spec.needs and set(spec.needs) <= NVML_PROBES)
# A released driver of each simulated branch.
DRIVERS = {
    470: "470.256.02",
    525: "525.147.05",
    535: "535.216.03",
    550: "550.127.05",
    570: "570.133.20",
    580: "580.65.06",
}
# An NVSwitch platform each branch supports (H100 needs 525 or later).
MODELS = {
    470: "A100-SXM4-80GB",
    525: "H100-SXM5-80GB",
    535: "H100-SXM5-80GB",
    550: "H100-SXM5-80GB",
    570: "H100-SXM5-80GB",
    580: "H100-SXM5-80GB",
}
# nvmlDeviceGetGpuFabricInfo first appears in nvml.h of CUDA 12.0 (driver 525).
FABRIC_FROM = 525
RECOVERY_FROM = 570


def _pynvml() -> str:
    spec = importlib.util.find_spec("pynvml")
    return str(spec.origin) if spec else "none"


def _node(branch: int, body: str, gpus: int = 8, model: str = "") -> str:
    return (
        f'[node]\ndriver_version = "{DRIVERS[branch]}"\ndriver_branch = {branch}\n\n'
        f'[defaults]\nmodel = "{model or MODELS[branch]}"\n' + body + "\n[[gpu]]\n" * gpus
    )


def _run(text: str, expected: int = 8, **nvml: Any) -> Report:
    tmp = Path(tempfile.mkdtemp(prefix="nh-matrix-"))
    (tmp / "node.toml").write_text(text, encoding="utf-8")
    cfg = resolve(
        {
            "nvml": {"simulate": str(tmp / "node.toml"), **nvml},
            "gpu": {"expected_count": expected},
            "paths": {"state_dir": str(tmp / "state")},
        },
        "<test>",
    )
    return runner.run(cfg, only=GPU_CHECKS, node="sim01")


def _by_name(report: Report) -> dict[str, Any]:
    return {r.name: r for r in report.results}


def _allowed_skips(branch: int) -> set[str]:
    skips = {"gpu_retired_pages"}  # Ampere and later: page retirement is N/A (row remapping instead)
    if branch < FABRIC_FROM:
        skips.add("gpu_fabric")
    if branch < RECOVERY_FROM:
        skips.add("gpu_recovery_action")
    return skips


@pytest.fixture(scope="module", autouse=True)
def _built() -> None:
    for branch in driver.BRANCHES:
        driver.library_path(branch)  # FakeDriverMissing says how to build it


@pytest.mark.parametrize("branch", driver.BRANCHES)
def test_healthy_node_of_every_branch_is_healthy(branch: int) -> None:
    report = _run(_node(branch, ""))
    results = _by_name(report)
    bad = {n: r.summary for n, r in results.items() if r.status not in (Status.OK, Status.SKIPPED)}
    assert not bad, (_pynvml(), bad)
    # What the branch can report is reported (OK), not skipped.
    skipped = {n for n, r in results.items() if r.status == Status.SKIPPED}
    assert skipped == _allowed_skips(branch), (_pynvml(), {n: results[n].summary for n in skipped})


@pytest.mark.parametrize("branch", [b for b in driver.BRANCHES if b >= FABRIC_FROM])
@pytest.mark.parametrize("state", ["not_started", "in_progress"])
def test_fabric_failure_is_seen_with_every_wheel(branch: int, state: str) -> None:
    res = _by_name(_run(_node(branch, f'fabric = {{ state = "{state}" }}\n')))["gpu_fabric"]
    assert res.status == Status.FAIL, (_pynvml(), res.summary)
    assert res.action == (Action.NONE if state == "in_progress" else Action.REBOOT)


@pytest.mark.parametrize("branch", driver.BRANCHES)
def test_an_unreachable_handle_is_a_fail(branch: int) -> None:
    text = _node(branch, "") + '\n[[faults.errors]]\ncall = "nvmlDeviceGetHandleByIndex"\ngpu = 2\nerror = "UNKNOWN"\n'
    res = _by_name(_run(text))["nvml"]
    assert (res.status, res.action, res.gpu) == (Status.FAIL, Action.REBOOT, 2), res.summary


@pytest.mark.parametrize("branch", driver.BRANCHES)
def test_pcie_cards_without_bridges_are_not_drained(branch: int) -> None:
    links = "nvlink = { links = 12, down = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11] }\n"
    report = _run(_node(branch, links + 'fabric = { state = "not_supported" }\n', model="A100-PCIE-80GB"))
    res = _by_name(report)["gpu_nvlink"]
    assert res.status == Status.SKIPPED, res.summary
    assert report.status != Status.FAIL, {r.name: r.summary for r in report.results if r.status == Status.FAIL}


@pytest.mark.timing
@pytest.mark.parametrize("branch", driver.BRANCHES)
def test_a_slow_driver_is_not_called_hung(branch: int, timing: Timing) -> None:
    t0 = time.monotonic()
    report = _run(_node(branch, "").replace("[defaults]", "call_delay_ms = 10\n\n[defaults]"))
    wall = time.monotonic() - t0
    results = _by_name(report)
    assert results["nvml"].status == Status.OK, results["nvml"].summary
    assert report.status != Status.FAIL
    # Before 525 every NVLink's state is a call of its own; from 525 one field-values call reads all.
    assert wall < timing.slack(8.0 if branch < 525 else 3.0), f"{wall:.2f} s"  # a quiet machine's bound, scaled


@pytest.mark.parametrize("branch", driver.BRANCHES)
def test_thermal_slowdown_is_seen_on_every_branch(branch: int) -> None:
    body = 'throttle_reasons = ["hw_thermal_slowdown"]\n'
    res = _by_name(_run(_node(branch, body)))["gpu_temperature"]
    assert res.status in (Status.WARN, Status.FAIL), res.summary
    assert "HW thermal slowdown" in res.summary


@pytest.mark.parametrize("branch", [b for b in driver.BRANCHES if b >= RECOVERY_FROM])
def test_recovery_action_is_read_with_every_wheel(branch: int) -> None:
    res = _by_name(_run(_node(branch, 'recovery_action = "node_reboot"\n')))["gpu_recovery_action"]
    assert (res.status, res.action) == (Status.FAIL, Action.REBOOT), (_pynvml(), res.summary)
