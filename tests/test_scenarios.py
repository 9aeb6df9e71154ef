"""Every shipped scenario, through the real path (config -> runner -> forked NVML probe -> checks).

The table says, per scenario, the verdict that matters (check, status, action, GPU, a piece of
the summary) and every other check that may be not-OK, with its status: any other check must
be OK. A new file in examples/scenarios/ without a row here fails ``test_every_scenario_has_a_row``.
"""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

import pytest
from conftest import Timing
from nodehealth_sim import nvml as simnvml

from nodehealth import cli, runner
from nodehealth.config.loader import resolve
from nodehealth.model import Action, Report, Status
from nodehealth.registry import CHECKS

SCENARIOS = Path(__file__).resolve().parent.parent / "examples" / "scenarios"
NVML_PROBES = {"nvml", "pci_gpus", "slurm_node", "job", "node_jobs"}  # node_jobs: an empty state dir
# The checks that judge only the (simulated) GPUs; host and kernel-log checks would judge this machine.
GPU_CHECKS = tuple(spec.name for spec in CHECKS if "nvml" in spec.needs and set(spec.needs) <= NVML_PROBES)
OK, SKIPPED, WARN, UNKNOWN, FAIL = Status.OK, Status.SKIPPED, Status.WARN, Status.UNKNOWN, Status.FAIL
HANG_TIMEOUT_S = 1.0


@dataclass(frozen=True)
class Row:
    file: str
    check: str
    status: Status
    action: Action = Action.NONE
    gpu: Optional[int] = None
    summary_has: str = ""
    others: dict[str, Status] = field(default_factory=dict)  # other checks allowed to be not OK
    phase: str = "manual"
    expected_count: Union[int, str] = 8
    hangs: bool = False
    timeout_s: Optional[float] = None  # the GPU checks' timeout_s (the NVML read's budget)
    max_wall_s: float = 2.0


def _all_but(check: str, status: Status) -> dict[str, Status]:
    return {name: status for name in GPU_CHECKS if name != check}


ROWS = [
    Row("healthy-8x-h100.toml", "nvml", OK, summary_has="8 GPU(s)"),
    Row("one-gpu-missing.toml", "gpu_count", FAIL, Action.REBOOT, None, "0000:ab:00.0"),
    Row("hot-gpu-thermal-slowdown.toml", "gpu_temperature", FAIL, Action.INSPECT, 2, "HW thermal slowdown"),
    Row(
        "power-limit-lowered.toml",
        "gpu_throttle",
        WARN,
        Action.INSPECT,
        5,
        "power limit 450 W, below its default 700 W",
    ),
    Row("volatile-uncorrectable-ecc.toml", "gpu_ecc", FAIL, Action.RESET_GPU, 6, "2 volatile uncorrectable"),
    Row("row-remap-pending.toml", "gpu_remapped_rows", FAIL, Action.RESET_GPU, 1, "pending"),
    Row("row-remap-failure.toml", "gpu_remapped_rows", FAIL, Action.INSPECT, 4, "failed"),
    Row("nvlink-down.toml", "gpu_nvlink", FAIL, Action.RESET_GPU, 3, "NVLink 5,11 inactive"),
    Row("pcie-degraded.toml", "gpu_pcie", FAIL, Action.INSPECT, 7, "x8, capable of x16"),
    Row("recovery-action-reboot.toml", "gpu_recovery_action", FAIL, Action.REBOOT, 5, "node reboot"),
    Row("hung-nvml-call.toml", "nvml", FAIL, Action.REBOOT, 4, "did not return within", hangs=True),
    Row(
        "hung-nvml-init.toml",
        "nvml",
        FAIL,
        Action.REBOOT,
        None,
        "did not return within",
        others=_all_but("nvml", UNKNOWN),
        hangs=True,
    ),
    Row(
        "nvml-not-installed.toml", "nvml", FAIL, Action.INSPECT, None, "not available", others=_all_but("nvml", UNKNOWN)
    ),
    Row("gpu-lost.toml", "nvml", FAIL, Action.REBOOT, 3, "GPU is lost"),
    Row("fabric-not-registered.toml", "gpu_fabric", FAIL, Action.REBOOT, 0, "not started"),
    Row("stray-compute-process.toml", "gpu_processes", FAIL, Action.RESTART_APP, 4, "pid 48213", phase="prolog"),
    # Outside the idle phases a process that no running job owns (no ledger job on GPU 4, not in a
    # Slurm job's cgroup) is a stray: a fault, so a drain for it lasts while it lives.
    Row(
        "stray-compute-process.toml", "gpu_processes", FAIL, Action.RESTART_APP, 4, "of no running job", phase="manual"
    ),
    Row("persistence-off.toml", "gpu_persistence", WARN, Action.NONE, 0, "persistence mode off"),
    Row(
        "a100-pcie-no-nvlink.toml",
        "gpu_nvlink",
        SKIPPED,
        summary_has="no NVLink bridges fitted",
        others={"gpu_fabric": SKIPPED},
    ),
    Row(
        "h100-nvl-bridge-link-down.toml",
        "gpu_nvlink",
        FAIL,
        Action.RESET_GPU,
        3,
        "NVLink 4,5 inactive",
        others={"gpu_fabric": SKIPPED},
        expected_count=4,
    ),
    Row("healthy-8x-a100-driver-470.toml", "nvml", OK, summary_has="8 GPU(s)", others={"gpu_fabric": SKIPPED}),
    Row("gpu-handle-unreachable.toml", "nvml", FAIL, Action.REBOOT, 3, "unable to determine the device handle"),
    Row("gpu-insufficient-power.toml", "nvml", FAIL, Action.INSPECT, 6, "Insufficient External Power"),
    # Slow, not hung: a 2 s budget with 1.5 s to open each GPU reads two GPUs, names the rest.
    Row(
        "persistence-off-slow-init.toml",
        "gpu_persistence",
        WARN,
        Action.NONE,
        0,
        "persistence mode off",
        others={"nvml": UNKNOWN},
        timeout_s=2.0,
        max_wall_s=2.6,
    ),
    Row("slow-driver-10ms.toml", "nvml", OK, summary_has="8 GPU(s)", max_wall_s=3.0),
    Row("thermal-slowdown-driver-525.toml", "gpu_temperature", FAIL, Action.INSPECT, 2, "HW thermal slowdown"),
    Row("hbm-hot-sw-thermal.toml", "gpu_temperature", WARN, Action.INSPECT, 5, "memory (HBM)"),
    Row(
        "nvml-init-no-permission.toml",
        "nvml",
        FAIL,
        Action.INSPECT,
        None,
        "refused access",
        others=_all_but("nvml", UNKNOWN),
    ),
    Row("recovery-action-field-error.toml", "gpu_recovery_action", UNKNOWN, Action.NONE, 4, "field 230"),
    Row("recovery-action-drain-p2p.toml", "gpu_recovery_action", FAIL, Action.RESTART_APP, 2, "peer-to-peer"),
    Row("vmd-domain-gpu-missing.toml", "gpu_count", FAIL, Action.REBOOT, None, "10000:e2:00.0", expected_count="auto"),
    Row("fabric-in-progress-after-boot.toml", "gpu_fabric", FAIL, Action.NONE, 0, "in progress"),
    Row("gb200-fabric-unhealthy.toml", "gpu_fabric", FAIL, Action.REBOOT, 1, "fabric unhealthy", expected_count=4),
    Row("mig-enabled.toml", "gpu_remapped_rows", SKIPPED, summary_has="not supported"),
    Row(
        "v100-retired-pages-pending.toml",
        "gpu_retired_pages",
        FAIL,
        Action.RESET_GPU,
        1,
        "pending",
        others={"gpu_remapped_rows": SKIPPED, "gpu_fabric": SKIPPED},
    ),
    # An SXM/NVSwitch board has no optional bridge: every link down is a fault, not "no bridge".
    Row("hgx-h100-all-nvlinks-down.toml", "gpu_nvlink", FAIL, Action.REBOOT, 0, "every NVLink of every GPU inactive"),
    # A 9 s nvmlInit without persistence mode is slow, not hung (the read's budget here 20 s).
    Row(
        "persistence-off-slow-nvml-init.toml",
        "gpu_persistence",
        WARN,
        Action.NONE,
        0,
        "persistence mode off",
        timeout_s=20.0,
        max_wall_s=18.0,
    ),
    Row(
        "gb200-driver-570-route-unhealthy.toml",
        "gpu_fabric",
        FAIL,
        Action.REBOOT,
        1,
        "route unhealthy",
        expected_count=4,
    ),
    Row(
        "gb200-fabric-incorrect-configuration.toml",
        "gpu_fabric",
        FAIL,
        Action.INSPECT,
        2,
        "incorrect configuration: insufficient NVLinks",
        expected_count=4,
    ),
    Row("ecc-disabled-by-operator.toml", "gpu_ecc", FAIL, Action.INSPECT, 2, "ECC disabled"),
    Row(
        "nvml-return-code-13x.toml",
        "gpu_recovery_action",
        UNKNOWN,
        Action.NONE,
        5,
        "reset type not supported (NVML return 30)",
    ),
    # The node-wide checks answered (NVML counted 8 GPUs, gave the driver version); the per-GPU ones
    # could read nothing and say so (UNKNOWN "not read"), never "does not apply".
    Row(
        "every-gpu-handle-unknown.toml",
        "nvml",
        FAIL,
        Action.REBOOT,
        0,
        "unable to determine the device handle",
        others={n: UNKNOWN for n in GPU_CHECKS if n not in ("nvml", "gpu_count", "gpu_driver")},
    ),
    Row(
        "cpu-node-no-gpu.toml",
        "nvml",
        SKIPPED,
        summary_has="no GPU expected",
        others=_all_but("nvml", SKIPPED),
        expected_count="auto",
    ),
    Row(
        "cpu-node-no-gpu.toml",
        "nvml",
        FAIL,
        Action.INSPECT,
        None,
        "GPUs are expected",
        others=_all_but("nvml", UNKNOWN),
        expected_count=8,
    ),
]


def _id(row: Row) -> str:
    extra = f"-{row.phase}" if row.phase != "manual" else ""
    extra += f"-expect-{row.expected_count}" if row.file.startswith("cpu-node") else ""
    return f"{row.file[:-5]}{extra}"


def _config(row: Row) -> Any:
    # A state dir of its own: the ledger there holds no running job (the host's is not read).
    raw: dict[str, Any] = {
        "nvml": {"simulate": str(SCENARIOS / row.file)},
        "gpu": {"expected_count": row.expected_count},
        "paths": {"state_dir": tempfile.mkdtemp(prefix="nh-scenario-")},
    }
    if row.hangs:
        raw["nvml"].update(call_timeout_s=HANG_TIMEOUT_S, init_timeout_s=HANG_TIMEOUT_S)
    if row.timeout_s is not None:
        raw["checks"] = {name: {"timeout_s": row.timeout_s} for name in GPU_CHECKS}
    return resolve(raw, "<test>")


def _others(row: Row) -> dict[str, Status]:
    """The row's other not-OK checks, plus the checks the scenario's hardware cannot answer,
    read from the scenario itself: no recovery-action field before driver 570 (NVML_FI_MAX in
    the CUDA 12.8 nvml.h), page retirement N/A (Ampere and later), no fabric (not NVSwitch)."""
    others = dict(row.others)
    scenario = simnvml.parse(str(SCENARIOS / row.file))
    gpus = scenario.visible
    if scenario.nvml != "ok" or not gpus:
        return others
    absent = {
        "gpu_recovery_action": scenario.branch < 570,
        "gpu_retired_pages": all("nvmlDeviceGetRetiredPages" in g.unsupported for g in gpus),
        "gpu_fabric": all(g.values["fabric"].get("state") == "not_supported" or scenario.branch < 525 for g in gpus),
    }
    for check, gone in absent.items():
        if gone and check != row.check:
            others.setdefault(check, SKIPPED)
    return others


def _by_name(report: Report) -> dict[str, Any]:
    return {r.name: r for r in report.results}


def test_every_scenario_has_a_row() -> None:
    assert {"nvml", "gpu_count", "gpu_remapped_rows", "gpu_processes"} <= set(GPU_CHECKS)
    shipped = {p.name for p in SCENARIOS.glob("*.toml")}
    assert shipped == {row.file for row in ROWS}


@pytest.mark.parametrize("path", sorted(SCENARIOS.glob("*.toml")), ids=lambda p: p.stem)
def test_scenario_file_says_what_it_models_and_expects(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert text.startswith("# "), "a scenario starts with a comment saying what it models"
    header = text.split("\n[", 1)[0]
    assert "# Expected" in header, "and the verdict it expects"


@pytest.mark.timing
@pytest.mark.parametrize("row", ROWS, ids=_id)
def test_scenario_verdict(row: Row, timing: Timing) -> None:
    cfg = _config(row)
    t0 = time.monotonic()
    report = runner.run(cfg, phase=row.phase, only=GPU_CHECKS, node="sim01")
    wall = time.monotonic() - t0
    results = _by_name(report)
    assert set(results) == set(GPU_CHECKS)
    res = results[row.check]
    assert (res.status, res.action, res.gpu) == (row.status, row.action, row.gpu), res.summary
    assert row.summary_has in res.summary
    not_ok = {name: r.status for name, r in results.items() if name != row.check and r.status != OK}
    assert not_ok == _others(row), {n: results[n].summary for n in not_ok}
    if row.status == FAIL:
        assert report.status == FAIL
    if row.hangs:
        assert wall <= HANG_TIMEOUT_S + timing.slack(0.5), f"verdict took {wall:.2f} s"
        assert res.details["stalled_call"] in ("nvmlDeviceGetFieldValues", "nvmlInit")
    else:
        assert wall < timing.slack(row.max_wall_s), f"took {wall:.2f} s"


def test_hung_call_names_the_gpu_and_call_and_keeps_what_was_read() -> None:
    row = next(r for r in ROWS if r.file == "hung-nvml-call.toml")
    report = runner.run(_config(row), phase="prolog", only=GPU_CHECKS, node="sim01")
    res = _by_name(report)["nvml"]
    assert res.summary == f"GPU 4: nvmlDeviceGetFieldValues did not return within {HANG_TIMEOUT_S:g} s (hung)"
    assert res.details["gpus_read"] == 4
    # GPUs 0-3 answered before GPU 4 hung and are judged; the stall itself is the nvml check's FAIL.
    assert _by_name(report)["gpu_temperature"].details["gpus_judged"] == [0, 1, 2, 3]


def test_checks_whose_gpus_could_not_be_read_say_so() -> None:
    row = next(r for r in ROWS if r.file == "every-gpu-handle-unknown.toml")
    results = _by_name(runner.run(_config(row), only=GPU_CHECKS, node="sim01"))
    for name in _others(row):
        assert results[name].summary.startswith("not read: NVML failed"), (name, results[name].summary)
        assert "does not apply" not in results[name].summary


def test_gpu_count_auto_uses_the_simulated_pci_bus() -> None:
    """With expected_count = "auto" and no Slurm, the PCI bus (which still has GPU 5) sets 8."""
    row = Row("one-gpu-missing.toml", "gpu_count", FAIL, expected_count="auto")
    res = _by_name(runner.run(_config(row), only=GPU_CHECKS, node="sim01"))["gpu_count"]
    assert (res.status, res.action) == (FAIL, Action.REBOOT)
    assert res.details["expected"] == 8
    assert res.details["expected_from"] == "pci (scenario)"
    assert res.details["missing_pci"] == ["0000:ab:00.0"]


# --------------------------------------------------------------------------- the CLI


EXIT = {OK: 0, SKIPPED: 0, WARN: 0, UNKNOWN: 0, FAIL: 1}
CLI_ROWS = [r for r in ROWS if not r.hangs and r.expected_count == 8 and r.timeout_s is None and r.max_wall_s <= 2.0]


@pytest.mark.parametrize("row", CLI_ROWS, ids=_id)
def test_cli_json_verdict(
    row: Row, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``nodehealth check --simulate FILE --format json`` gives the same verdict and exit code."""
    monkeypatch.delenv("NODEHEALTH_CONFIG", raising=False)
    conf = tmp_path / "nodehealth.toml"
    conf.write_text("[gpu]\nexpected_count = 8\n", encoding="utf-8")
    code = cli.main(
        [
            "check",
            "--config",
            str(conf),
            "--simulate",
            str(SCENARIOS / row.file),
            "--phase",
            row.phase,
            "--format",
            "json",
            "--only",
            *GPU_CHECKS,
        ]
    )
    out = json.loads(capsys.readouterr().out)
    worst = max([row.status, *_others(row).values()])
    assert code == EXIT[worst]
    assert out["status"] == ("OK" if worst == SKIPPED else worst.name)  # not applicable is fine
    entry = next(c for c in out["checks"] if c["name"] == row.check)
    assert (entry["status"], entry["action"], entry["gpu"]) == (row.status.name, row.action.value, row.gpu)


def test_config_simulate_is_relative_to_the_config_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("NODEHEALTH_CONFIG", raising=False)
    (tmp_path / "sim").mkdir()
    (tmp_path / "sim" / "node.toml").write_text(
        (SCENARIOS / "pcie-degraded.toml").read_text(encoding="utf-8"), encoding="utf-8"
    )
    conf = tmp_path / "nodehealth.toml"
    conf.write_text('[gpu]\nexpected_count = 8\n[nvml]\nsimulate = "sim/node.toml"\n', encoding="utf-8")
    monkeypatch.chdir("/")
    code = cli.main(["check", "--config", str(conf), "--only", "gpu_pcie", "--format", "json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 1
    assert out["checks"][0]["gpu"] == 7
