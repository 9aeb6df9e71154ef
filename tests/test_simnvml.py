"""Scenario files: bad ones, and what a good one means when the probe reads it through the
real pynvml over the simulated driver.

Every bad file is one ``ScenarioError`` naming the file and the key, and on the command line
one line on stderr, exit 2, no traceback.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from nodehealth_sim import nvml as simnvml

from nodehealth import cli
from nodehealth.observations import NvmlSnapshot, ProbeError
from nodehealth.probes import nvml

ONE_GPU = "[[gpu]]\n"

# (id, file text, the key the error must name)
BAD = [
    # unknown key, at every level
    ("unknown-top-level-table", '[nodes]\ndriver_version = "1"\n', "nodes"),
    ("unknown-node-key", '[node]\ndriver = "550"\n', "node.driver"),
    ("unknown-defaults-key", "[defaults]\ntemp_c = 30\n", "defaults.temp_c"),
    ("unknown-gpu-key", "[[gpu]]\ntemperature = 30\n", "gpu[0].temperature"),
    ("unknown-key-second-gpu", "[[gpu]]\n[[gpu]]\nmisssing = true\n", "gpu[1].misssing"),
    ("unknown-nested-ecc-key", "[[gpu]]\necc = { volatile = 1 }\n", "gpu[0].ecc.volatile"),
    ("unknown-nested-pcie-key", "[[gpu]]\npcie = { lanes = 8 }\n", "gpu[0].pcie.lanes"),
    ("unknown-nested-defaults-key", "[defaults]\nremapped_rows = { pend = true }\n", "defaults.remapped_rows.pend"),
    (
        "unknown-nvlink-error-key",
        "[[gpu]]\nnvlink = { errors = [{ link = 1, crc = 5 }] }\n",
        "gpu[0].nvlink.errors[0].crc",
    ),
    ("unknown-process-key", "[[gpu]]\nprocesses = [{ pid = 1, memory = 2 }]\n", "gpu[0].processes[0].memory"),
    ("unknown-faults-key", ONE_GPU + '[faults]\nnvml_state = "ok"\n', "faults.nvml_state"),
    (
        "unknown-faults-error-key",
        ONE_GPU + '[[faults.errors]]\ncall = "nvmlDeviceGetName"\nerror = "UNKNOWN"\ngpus = 0\n',
        "faults.errors[0].gpus",
    ),
    (
        "unknown-faults-hang-key",
        ONE_GPU + '[[faults.hangs]]\ncall = "nvmlInit"\nseconds = 5\n',
        "faults.hangs[0].seconds",
    ),
    # wrong type
    ("string-for-int", '[[gpu]]\ntemperature_c = "hot"\n', "gpu[0].temperature_c"),
    ("bool-for-int", "[[gpu]]\ntemperature_c = true\n", "gpu[0].temperature_c"),
    ("float-for-int", "[[gpu]]\nmemory_used_mib = 1.5\n", "gpu[0].memory_used_mib"),
    ("int-for-bool", "[[gpu]]\necc_enabled = 1\n", "gpu[0].ecc_enabled"),
    ("string-for-float", '[[gpu]]\npower_w = "700W"\n', "gpu[0].power_w"),
    ("negative-count", "[[gpu]]\necc = { volatile_uncorrected = -1 }\n", "gpu[0].ecc.volatile_uncorrected"),
    ("int-for-array", "[[gpu]]\nnvlink = { down = 3 }\n", "gpu[0].nvlink.down"),
    ("string-in-int-array", '[[gpu]]\nnvlink = { down = ["3"] }\n', "gpu[0].nvlink.down[0]"),
    ("table-for-string", "[[gpu]]\nname = { x = 1 }\n", "gpu[0].name"),
    ("int-for-driver-version", "[node]\ndriver_version = 550\n", "node.driver_version"),
    ("string-for-cuda-version", '[node]\ncuda_driver_version = "12.4"\n', "node.cuda_driver_version"),
    ("node-not-a-table", "node = 3\n", "node"),
    ("gpu-not-array-of-tables", "gpu = 8\n", "gpu"),
    ("faults-errors-not-tables", ONE_GPU + '[faults]\nerrors = ["nvmlInit"]\n', "faults.errors"),
    ("fault-gpu-negative", ONE_GPU + '[[faults.hangs]]\ncall = "nvmlInit"\ngpu = -1\n', "faults.hangs[0].gpu"),
    # unknown names
    (
        "unknown-error-name",
        ONE_GPU + '[[faults.errors]]\ncall = "nvmlDeviceGetTemperature"\nerror = "GPU_LOST"\n',
        "faults.errors[0].error",
    ),
    (
        "missing-error-name",
        ONE_GPU + '[[faults.errors]]\ncall = "nvmlDeviceGetTemperature"\n',
        "faults.errors[0].error",
    ),
    ("unknown-throttle-reason", '[[gpu]]\nthrottle_reasons = ["thermal"]\n', "gpu[0].throttle_reasons"),
    ("unknown-throttle-reason-in-defaults", '[defaults]\nthrottle_reasons = ["hot"]\n[[gpu]]\n', "throttle_reasons"),
    ("unknown-recovery-action", '[[gpu]]\nrecovery_action = "reboot"\n', "gpu[0].recovery_action"),
    ("unknown-fabric-state", '[[gpu]]\nfabric = { state = "done" }\n', "gpu[0].fabric.state"),
    ("unknown-nvml-state", ONE_GPU + '[faults]\nnvml = "missing"\n', "faults.nvml"),
    ("hang-on-unknown-call", ONE_GPU + '[[faults.hangs]]\ncall = "nvmlDeviceGetRemapedRows"\n', "faults.hangs[0].call"),
    (
        "error-on-non-nvml-call",
        ONE_GPU + '[[faults.errors]]\ncall = "getTemperature"\nerror = "UNKNOWN"\n',
        "faults.errors[0].call",
    ),
    ("unsupported-unknown-call", '[[gpu]]\nunsupported = ["nvmlDeviceGetNvlinkState"]\n', "gpu[0].unsupported"),
    ("process-without-pid", "[[gpu]]\nprocesses = [{ used_memory_mib = 2 }]\n", "gpu[0].processes[0].pid"),
    ("nvlink-error-without-link", "[[gpu]]\nnvlink = { errors = [{ replay = 2 }] }\n", "gpu[0].nvlink.errors[0].link"),
    # PCI addresses
    (
        "duplicate-pci-bus-id",
        '[[gpu]]\npci_bus_id = "0000:18:00.0"\n[[gpu]]\npci_bus_id = "0000:18:00.0"\n',
        "gpu[1].pci_bus_id",
    ),
    (
        "duplicate-pci-bus-id-other-case",
        '[[gpu]]\npci_bus_id = "0000:AB:00.0"\n[[gpu]]\n[[gpu]]\npci_bus_id = "0000:ab:00.0"\n',
        "gpu[2].pci_bus_id",
    ),
    ("pci-bus-id-without-domain", '[[gpu]]\npci_bus_id = "18:00.0"\n', "gpu[0].pci_bus_id"),
    # not TOML
    ("invalid-toml", '[[gpu]\nname = "x"\n', "invalid TOML"),
    ("invalid-toml-duplicate-key", '[node]\ndriver_version = "1"\ndriver_version = "2"\n', "invalid TOML"),
]


def _write(tmp_path: Path, text: str, name: str = "bad.toml") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


@pytest.mark.parametrize(("text", "key"), [(t, k) for _, t, k in BAD], ids=[i for i, _, _ in BAD])
def test_bad_scenario_names_file_and_key(tmp_path: Path, text: str, key: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(simnvml.ScenarioError) as info:
        simnvml.parse(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ")
    assert key in message
    assert "\n" not in message


def test_missing_file(tmp_path: Path) -> None:
    path = str(tmp_path / "nope.toml")
    with pytest.raises(simnvml.ScenarioError, match="nope.toml: no such scenario file"):
        simnvml.parse(path)


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(simnvml.ScenarioError, match="cannot read"):
        simnvml.parse(str(tmp_path))  # a directory


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'[[gpu]]\nname = "caf\xe9"\n')
    with pytest.raises(simnvml.ScenarioError, match="latin1.toml: cannot read"):
        simnvml.parse(str(path))


# --------------------------------------------------------------------------- the CLI


@pytest.mark.parametrize(
    ("text", "key"),
    [
        (t, k)
        for i, t, k in BAD
        if i
        in (
            "unknown-nested-ecc-key",
            "bool-for-int",
            "unknown-error-name",
            "unknown-throttle-reason",
            "duplicate-pci-bus-id",
            "invalid-toml",
        )
    ]
    + [(None, "no such scenario file")],
    ids=[
        "unknown-key",
        "wrong-type",
        "unknown-error",
        "unknown-throttle",
        "duplicate-bus",
        "invalid-toml",
        "missing-file",
    ],
)
def test_cli_bad_scenario_is_one_line_exit_2(
    tmp_path: Path, text: Any, key: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NODEHEALTH_CONFIG", raising=False)
    path = _write(tmp_path, text) if text is not None else str(tmp_path / "missing.toml")
    code = cli.main(["check", "--config", _write(tmp_path, "", "empty.toml"), "--simulate", path])
    out, err = capsys.readouterr()
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and err.endswith("\n")
    assert path in err and key in err
    assert "Traceback" not in err


def test_cli_bad_scenario_from_config_names_the_scenario_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("NODEHEALTH_CONFIG", raising=False)
    _write(tmp_path, '[[gpu]]\nrecovery_action = "reboot"\n', "node.toml")
    conf = _write(tmp_path, '[nvml]\nsimulate = "node.toml"\n', "nodehealth.toml")
    code = cli.main(["check", "--config", conf])
    err = capsys.readouterr().err
    assert code == 2
    assert f"{tmp_path / 'node.toml'}: gpu[0].recovery_action" in err


def test_cli_bad_scenario_real_process_no_traceback(tmp_path: Path) -> None:
    """The installed entry point, in its own process: one stderr line, exit 2."""
    path = _write(tmp_path, '[[gpu]]\nnvlink = { down = ["5"] }\n')
    conf = _write(tmp_path, "", "empty.toml")
    proc = subprocess.run(
        [sys.executable, "-m", "nodehealth", "check", "--config", conf, "--simulate", path],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert path in proc.stderr and "gpu[0].nvlink.down[0]" in proc.stderr
    assert "Traceback" not in proc.stderr


# --------------------------------------------------------------------------- what a scenario means


def _read(tmp_path: Path, text: str, **limits: float) -> NvmlSnapshot:
    """The probe's snapshot of the scenario: pynvml over the simulated driver, in the child."""
    sc = simnvml.parse(_write(tmp_path, text, "s.toml"))
    snap = nvml.start(simnvml.loader(sc), timeout_s=limits.pop("timeout_s", 10.0), **limits).collect()
    assert isinstance(snap, NvmlSnapshot), snap
    return snap


def _err(gpu: Any, field: str) -> Any:
    return next((e for e in gpu.errors if e.field == field), None)


def test_defaults_are_a_published_h100_and_nested_tables_merge_key_by_key(tmp_path: Path) -> None:
    snap = _read(
        tmp_path, "[defaults]\npcie = { gen = 4 }\n[[gpu]]\npcie = { width = 8 }\nnvlink = { down = [2] }\n[[gpu]]\n"
    )
    g0, g1 = snap.gpus
    assert g0.name == "NVIDIA H100 80GB HBM3"
    assert (g0.slowdown_c, g0.shutdown_c, g0.mem_max_c) == (89, 92, 95)  # models.py, from nvidia-smi -q
    # width from the GPU, gen from [defaults], the maxima from the model
    assert (g0.pcie_width, g0.pcie_max_width, g0.pcie_gen, g0.pcie_max_gen) == (8, 16, 4, 5)
    assert g0.nvlinks is not None and len(g0.nvlinks) == 18
    assert [link.link for link in g0.nvlinks if not link.active] == [2]
    assert g1.pcie_width == 16
    # Hopper: page retirement is N/A (row remapping instead): not a zero, not reported at all.
    assert g0.retired_pages_sbe is None and g0.remapped_rows is not None


def test_missing_gpu_is_on_the_pci_bus_but_not_in_nvml(tmp_path: Path) -> None:
    text = "".join(
        f'[[gpu]]\npci_bus_id = "0000:{b}:00.0"\n' + ("missing = true\n" if b == "2a" else "")
        for b in ("18", "2a", "3a")
    )
    scenario = simnvml.parse(_write(tmp_path, text, "m.toml"))
    assert scenario.pci_bus_ids == ("0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0")
    snap = _read(tmp_path, text)
    assert snap.device_count == 2
    # NVML renumbers: the GPU after the missing one is index 1
    assert [g.pci_bus_id for g in snap.gpus] == ["0000:18:00.0", "0000:3a:00.0"]


def test_default_pci_bus_ids_and_uuids_are_distinct(tmp_path: Path) -> None:
    scenario = simnvml.parse(_write(tmp_path, ONE_GPU * 8))
    assert len(set(scenario.pci_bus_ids)) == 8
    assert len({g.values["uuid"] for g in scenario.gpus}) == 8


@pytest.mark.parametrize(
    ("state", "kind"),
    [
        ("library_not_found", "unavailable"),
        ("driver_not_loaded", "unavailable"),
        ("init_error", "error"),
        ("no_permission", "permission"),
    ],
)
def test_nvml_states_fail_init(tmp_path: Path, state: str, kind: str) -> None:
    sc = simnvml.parse(_write(tmp_path, ONE_GPU + f'[faults]\nnvml = "{state}"\n'))
    res = nvml.start(simnvml.loader(sc), timeout_s=5.0).collect()
    assert isinstance(res, ProbeError) and res.kind == kind, res


def test_error_fault_hits_only_its_gpu_and_call(tmp_path: Path) -> None:
    snap = _read(
        tmp_path,
        ONE_GPU * 2 + '[[faults.errors]]\ncall = "nvmlDeviceGetPowerUsage"\ngpu = 1\nerror = "NO_PERMISSION"\n',
    )
    g0, g1 = snap.gpus
    assert g0.power_w is not None and _err(g0, "power") is None
    assert g1.power_w is None and _err(g1, "power").kind == "no_permission"
    assert g1.temperature_c is not None


def test_gpu_is_lost_marks_the_gpu_lost(tmp_path: Path) -> None:
    snap = _read(
        tmp_path, ONE_GPU * 2 + '[[faults.errors]]\ncall = "nvmlDeviceGetTemperature"\ngpu = 1\nerror = "GPU_IS_LOST"\n'
    )
    assert [g.lost for g in snap.gpus] == [False, True]


def test_error_fault_without_gpu_hits_every_gpu(tmp_path: Path) -> None:
    snap = _read(
        tmp_path, ONE_GPU * 2 + '[[faults.errors]]\ncall = "nvmlDeviceGetPowerUsage"\nerror = "NO_PERMISSION"\n'
    )
    assert all(_err(g, "power") is not None for g in snap.gpus)


def test_unsupported_removes_the_data_for_call_and_fields(tmp_path: Path) -> None:
    snap = _read(tmp_path, '[[gpu]]\nunsupported = ["nvmlDeviceGetRemappedRows", "nvmlDeviceGetPowerUsage"]\n')
    gpu = snap.gpus[0]
    assert gpu.remapped_rows is None and gpu.power_w is None and not gpu.errors


def test_a_field_call_fault_applies_to_the_field_values_call(tmp_path: Path) -> None:
    snap = _read(tmp_path, ONE_GPU + '[[faults.errors]]\ncall = "nvmlDeviceGetRemappedRows"\nerror = "UNKNOWN"\n')
    gpu = snap.gpus[0]
    assert gpu.remapped_rows is None and _err(gpu, "remapped_rows").kind == "unknown"


def test_hang_fault_hangs_its_gpu_only(tmp_path: Path) -> None:
    snap = _read(
        tmp_path, ONE_GPU * 2 + '[[faults.hangs]]\ncall = "nvmlDeviceGetEccMode"\ngpu = 1\n', call_timeout_s=0.5
    )
    assert not snap.complete and snap.stop == "hung"
    assert [g.index for g in snap.gpus] == [0]
    assert (snap.stalled_gpu, snap.stalled_call) == (1, "nvmlDeviceGetEccMode")


def test_values_and_units(tmp_path: Path) -> None:
    snap = _read(
        tmp_path,
        '[node]\ndriver_version = "570.133.20"\n[[gpu]]\npower_w = 512.5\n'
        'memory_used_mib = 1024\nthrottle_reasons = ["sw_power_cap", "hw_slowdown"]\n'
        'recovery_action = "drain_and_reset"\n'
        "nvlink = { replay = 7, errors = [{ link = 2, replay = 99 }] }\n"
        'fabric = { state = "in_progress", status = 3 }\n'
        "remapped_rows = { correctable = 2, pending = true }\n",
    )
    gpu = snap.gpus[0]
    assert gpu.power_w == 512.5  # milliwatts through NVML, watts in the observation
    assert gpu.memory_used_bytes == 1024 << 20
    assert gpu.throttle_reasons == 0x4 | 0x8
    assert gpu.recovery_action == 4
    assert gpu.nvlinks is not None and gpu.nvlinks[0].replay == 7 and gpu.nvlinks[2].replay == 99
    assert (gpu.fabric_state, gpu.fabric_status) == (2, "NVML error 3 (not_supported)")
    assert gpu.remapped_rows is not None and (gpu.remapped_rows.correctable, gpu.remapped_rows.pending) == (2, True)


def test_every_shipped_scenario_loads() -> None:
    for path in (Path(__file__).resolve().parent.parent / "examples" / "scenarios").glob("*.toml"):
        simnvml.parse(str(path))
