"""The simulator as its own distribution (nodehealth-sim, ``sim/``; docs/simulation.md, docs/validation.md).

The product imports no simulator code: no ``import nodehealth_sim`` anywhere in ``nodehealth/``, and the
package is named (``importlib.import_module``) only where the contract allows it (the NVML source and the
validation kit's replay), with a rule that fails when broken. The simulator's ``nvml_source`` keeps the
contract with ``nodehealth.probes.source``; its build step writes the version script the Makefile's awk wrote
and says what to install without a compiler; ``validate-nvml`` without the simulator writes the record and
says how to replay it, and ``nodehealth-sim replay DIR`` completes that record as an in-place replay does.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nodehealth_sim
import pytest
from nodehealth_sim import cli as sim_cli
from nodehealth_sim import driver, fakenvml_build

import nodehealth
from nodehealth import cli
from nodehealth.validation import elf, kit

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "nodehealth"
SIM = ROOT / "sim"
SCENARIOS = ROOT / "examples" / "scenarios"
# The only product modules that may name the simulator's package, and only through importlib.
MAY_NAME_THE_SIMULATOR = {"probes/source.py", "validation/kit.py"}


def simulator_imports(pkg_dir: Path, allowed: set[str]) -> list[str]:
    """Every import of ``nodehealth_sim`` in ``pkg_dir`` that the rule forbids, as ``path:line what``: any
    ``import``/``from`` statement, and ``importlib.import_module``/``__import__`` of it outside ``allowed``."""
    found = []
    for path in sorted(pkg_dir.rglob("*.py")):
        rel = path.relative_to(pkg_dir).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
                how = "imports"
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
                how = "imports"
            elif (
                isinstance(node, ast.Call)
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
                and (
                    (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                    or (isinstance(node.func, ast.Name) and node.func.id in ("import_module", "__import__"))
                )
            ):
                if rel in allowed:
                    continue
                names = [node.args[0].value]
                how = "names"
            for name in names:
                if name == "nodehealth_sim" or name.startswith("nodehealth_sim."):
                    found.append(f"{pkg_dir.name}/{rel}:{node.lineno} {how} {name}")
    return found


def test_the_product_imports_no_simulator_code():
    assert simulator_imports(PKG, MAY_NAME_THE_SIMULATOR) == []
    assert not (PKG / "sim").exists()


def test_the_simulator_import_rule_can_fail(tmp_path):
    pkg = tmp_path / "nodehealth"
    (pkg / "probes").mkdir(parents=True)
    (pkg / "probes" / "source.py").write_text("import importlib\nimportlib.import_module('nodehealth_sim')\n")
    (pkg / "checks.py").write_text("import os\n\ndef f():\n    from nodehealth_sim import nvml\n")
    (pkg / "kit.py").write_text("import importlib\nimportlib.import_module('nodehealth_sim.validation')\n")
    assert simulator_imports(pkg, {"probes/source.py"}) == [
        "nodehealth/checks.py:4 imports nodehealth_sim",
        "nodehealth/kit.py:2 names nodehealth_sim.validation",
    ]


def test_the_simulator_has_the_products_version_and_pins_it():
    assert nodehealth_sim.__version__ == nodehealth.__version__
    setup = (SIM / "setup.py").read_text()
    assert 'f"nodehealth=={VERSION}"' in setup
    floor = re.search(r'"(nvidia-ml-py>=[^"]+)"', (ROOT / "pyproject.toml").read_text()).group(1)  # type: ignore[union-attr]
    assert f'NVML_PY = "{floor}"' in setup


def test_nvml_source_keeps_the_contract():
    from nodehealth.probes.source import NvmlSource

    path = str(SCENARIOS / "row-remap-pending.toml")
    source = nodehealth_sim.nvml_source(path)
    assert isinstance(source, NvmlSource)
    assert source.label == f"simulated: {path}"
    assert source.pci_bus_ids and all(re.match(r"^[0-9a-f]{4}:[0-9a-f]{2}:00\.0$", b) for b in source.pci_bus_ids)
    assert callable(source.loader)


def test_nvml_source_refuses_a_bad_scenario_naming_file_and_key(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[[gpu]]\ntemperature = 3\n")
    with pytest.raises(nodehealth_sim.ScenarioError, match=r"bad\.toml: gpu\[0\]\.temperature"):
        nodehealth_sim.nvml_source(str(bad))
    with pytest.raises(nodehealth_sim.ScenarioError, match="no such scenario file"):
        nodehealth_sim.nvml_source(str(tmp_path / "none.toml"))


def test_a_missing_library_is_a_scenario_error_saying_how_to_build_it(tmp_path, monkeypatch):
    monkeypatch.setattr(driver, "BUILD_DIR", tmp_path / "no-build")
    with pytest.raises(nodehealth_sim.ScenarioError, match=r"not built .*pip install \./sim"):
        nodehealth_sim.nvml_source(str(SCENARIOS / "healthy-8x-h100.toml"))


# --------------------------------------------------------------------------- the build at install time


TABLE = "# a comment\nsymbol\t535\t550\nnvmlInit_v2\t1\t1\nnvmlNew\t0\t1\nnvmlOld\t1\t0\n"


def test_the_version_script_exports_exactly_the_branch_column():
    expected = "{\n  global:\n    nvmlInit_v2;\n    nvmlNew;\n  local: *;\n};\n"
    assert fakenvml_build.version_script(TABLE, 550) == expected
    assert "nvmlOld;" in fakenvml_build.version_script(TABLE, 535)
    with pytest.raises(fakenvml_build.BuildError, match="no column 470"):
        fakenvml_build.version_script(TABLE, 470)


def test_the_committed_table_has_every_simulated_branch():
    table = (driver.BUILD_DIR.parent / "symbols.tsv").read_text()
    for branch in driver.BRANCHES:
        assert "nvmlInit_v2;" in fakenvml_build.version_script(table, branch)


def test_without_a_compiler_the_build_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.raises(fakenvml_build.BuildError, match=r"needs a C compiler.*apt-get install gcc"):
        fakenvml_build.build(tmp_path / "out", branches=(550,))
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler here")
def test_one_branch_builds_with_its_symbols_and_a_second_build_compiles_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv("CC", raising=False)
    (lib,) = fakenvml_build.build(tmp_path, branches=(535,))
    assert lib == tmp_path / "535" / "libnvidia-ml.so.1"
    table = (driver.BUILD_DIR.parent / "symbols.tsv").read_text()
    expected = re.findall(r"^    (\w+);$", fakenvml_build.version_script(table, 535), re.M)
    assert elf.exported(str(lib), "nvml") == sorted(expected)
    before = lib.stat().st_mtime_ns
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))  # found stale, it would need the compiler
    monkeypatch.setattr(fakenvml_build, "compiler", lambda: ["false"])
    fakenvml_build.build(tmp_path, branches=(535,))
    assert lib.stat().st_mtime_ns == before


# --------------------------------------------------------------------------- validate-nvml without the simulator


def test_validate_nvml_without_the_simulator_writes_the_record_and_says_how_to_replay(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(kit, "SIM_REPLAY", "nodehealth_sim_absent.replay")  # as on a node without nodehealth-sim
    out = tmp_path / "record"
    assert (
        cli.main(
            [
                "validate-nvml",
                "--out",
                str(out),
                "--simulate",
                str(SCENARIOS / "healthy-8x-h100.toml"),
                "--timeout",
                "30",
            ]
        )
        == 0
    )
    said = capsys.readouterr().out
    assert f"nodehealth-sim replay {out}" in said and "pip install nodehealth-sim" in said
    for name in ("calls.jsonl", "symbols.json", "report.json", "report.md"):
        assert (out / name).is_file(), name
    assert not (out / "scenario.toml").exists() and not (out / "replay").exists()
    doc = json.loads((out / "report.json").read_text())
    assert doc["replay"]["skipped"] and "Not replayed here" in (out / "report.md").read_text()

    # Elsewhere, where the simulator is installed: the record made whole, as an in-place replay makes it.
    assert sim_cli.main(["replay", str(out)]) == 0
    doc = json.loads((out / "report.json").read_text())
    assert doc["replay"]["differences"] == [] and doc["replay"]["replayed_calls"] == doc["timing"]["total_calls"]
    assert doc["symbols"]["status"] == "compared" and "scenario.toml" in doc["files"]
    assert (
        nodehealth_sim.nvml_source(str(out / "scenario.toml")).pci_bus_ids
        == nodehealth_sim.nvml_source(str(SCENARIOS / "healthy-8x-h100.toml")).pci_bus_ids
    )
    assert "same function sequence: yes" in (out / "report.md").read_text()


def test_simulate_without_the_simulator_is_a_usage_error_saying_what_to_install(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(kit, "SIM_PACKAGE", "nodehealth_sim_absent")
    assert (
        cli.main(["validate-nvml", "--out", str(tmp_path / "o"), "--simulate", str(SCENARIOS / "healthy-8x-h100.toml")])
        == 2
    )
    assert "--simulate needs the simulator: pip install nodehealth-sim" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_replay_refuses_a_directory_that_holds_no_record(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert sim_cli.main(["replay", str(tmp_path / "empty")]) == 2
    assert "not a validate-nvml record" in capsys.readouterr().err


def test_the_sim_command_is_installed_and_runs():
    exe = Path(sys.executable).with_name("nodehealth-sim")
    assert exe.is_file(), "nodehealth-sim is not installed in this venv (make fakenvml)"
    proc = subprocess.run(
        [str(exe), "replay", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if not k.startswith("PYTHON")},
    )
    assert proc.returncode == 0 and "validate-nvml" in proc.stdout
