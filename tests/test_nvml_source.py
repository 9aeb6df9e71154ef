"""The NVML probe's source, injected (probes/source.py): the real driver unless ``[nvml] simulate``
names a scenario, then the simulator's (``nodehealth_sim``, imported by name); a simulated run says so
in one place, its report's header, and nowhere else (no flag, no metric)."""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from nodehealth.config import loader
from nodehealth.model import Report
from nodehealth.probes import ProbeSetupError, source

ROOT = Path(__file__).resolve().parent.parent
SCEN = ROOT / "examples" / "scenarios"
HEALTHY = SCEN / "healthy-8x-h100.toml"


def _cfg(tmp_path: Path, simulate: str = "") -> Any:
    (tmp_path / "sys").mkdir(exist_ok=True)
    path = tmp_path / "c.toml"
    path.write_text(f'[paths]\nsysfs_root = "{tmp_path / "sys"}"\nstate_dir = "{tmp_path / "state"}"\n')
    cfg = loader.load(str(path))
    return dataclasses.replace(cfg, nvml=dataclasses.replace(cfg.nvml, simulate=simulate))


def _check(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cfg = tmp_path / "cli.toml"
    (tmp_path / "sys").mkdir(exist_ok=True)
    cfg.write_text(f'[paths]\nsysfs_root = "{tmp_path / "sys"}"\nstate_dir = "{tmp_path / "state"}"\n')
    env = dict(os.environ, NO_COLOR="1", SLURMD_NODENAME="gpu042")
    env.pop("NODEHEALTH_CONFIG", None)
    return subprocess.run(
        [sys.executable, "-m", "nodehealth", "check", "--config", str(cfg), "--only", "nvml", *args],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        cwd=ROOT,
    )


# --------------------------------------------------------------------------- resolve


def test_no_scenario_is_the_real_driver_with_no_label(tmp_path: Path) -> None:
    got = source.resolve(_cfg(tmp_path))
    assert got is source.REAL and got.label == "" and got.pci_bus_ids is None
    assert source.label(_cfg(tmp_path)) == ""


def test_a_scenario_is_the_simulators_source_labelled_and_resolved_once(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, str(HEALTHY))
    got = source.resolve(cfg)
    assert isinstance(got, source.NvmlSource) and got.label == f"simulated: {HEALTHY}"
    assert got.pci_bus_ids is not None and len(got.pci_bus_ids) == 8
    assert source.resolve(cfg) is got  # parsed once per path


def test_without_the_simulator_a_scenario_says_what_to_install(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setitem(sys.modules, "nodehealth_sim", None)  # import nodehealth_sim raises ImportError
    source.forget()
    try:
        with pytest.raises(ProbeSetupError) as info:
            source.resolve(_cfg(tmp_path, str(tmp_path / "x.toml")))
        assert str(info.value) == (
            "--simulate needs the simulator: pip install nodehealth-sim (./sim in the source tree)"
        )
        assert source.label(_cfg(tmp_path, str(tmp_path / "x.toml"))).startswith(f"simulated: {tmp_path}")
    finally:
        source.forget()


@pytest.mark.parametrize(
    ("package_dir", "advice"),
    [
        ("/usr/lib/python3/dist-packages/nodehealth", "apt install nodehealth-sim"),
        ("/usr/lib/python3/dist-packages/nodehealth/", "apt install nodehealth-sim"),
        ("/opt/nh/.venv/lib/python3.11/site-packages/nodehealth", "pip install nodehealth-sim"),
        ("/usr/lib/python3.9/site-packages/nodehealth", "pip install nodehealth-sim"),
        ("/tmp/unpacked/usr/lib/python3/dist-packages/nodehealth", "pip install nodehealth-sim"),
    ],
    ids=["debian-package", "trailing-slash", "venv", "rpm", "not-the-installed-package"],
)
def test_the_advice_to_install_the_simulator_follows_how_nodehealth_was_installed(
    package_dir: str, advice: str
) -> None:
    """The Debian package's nodehealth is told of its sibling .deb: pip into the system Python is refused."""
    assert source.install_sim(package_dir).startswith(advice)


def test_a_bad_scenario_is_a_setup_error_with_the_simulators_words(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[[gpu]]\npower_w = nan\n")
    with pytest.raises(ProbeSetupError) as info:
        source.resolve(_cfg(tmp_path, str(bad)))
    assert str(bad) in str(info.value) and "power_w" in str(info.value)


# --------------------------------------------------------------------------- the report's header


def test_a_simulated_check_says_so_in_the_header_of_text_and_json(tmp_path: Path) -> None:
    text = _check(tmp_path, "--simulate", str(HEALTHY))
    assert text.returncode == 0, text.stdout + text.stderr
    lines = text.stdout.splitlines()
    header = lines.index(f"simulated: {HEALTHY}")  # the report's first line, before the checks
    assert lines[header + 1].startswith("OK      nvml"), lines
    assert not any("simulated" in ln for ln in lines[header + 1 :])  # and in no other line of the report
    doc = json.loads(_check(tmp_path, "--simulate", str(HEALTHY), "--format", "json").stdout)
    assert doc["source"] == f"simulated: {HEALTHY}"
    assert "simulated" not in json.dumps(doc["checks"])


def test_a_real_nvml_check_has_no_such_line(tmp_path: Path) -> None:
    text = _check(tmp_path)
    assert text.returncode in (0, 1), text.stdout + text.stderr
    assert not any(ln.startswith("simulated") for ln in text.stdout.splitlines()), text.stdout
    doc = json.loads(_check(tmp_path, "--format", "json").stdout)
    assert doc["source"] == ""


def test_a_report_without_a_source_reads_as_the_real_driver() -> None:
    old = {"node": "n1", "phase": "daemon", "duration_s": 0.1, "version": "0.1.0", "started_at": 1.0, "checks": []}
    assert Report.from_json(old).source == ""
    new = Report.from_json({**old, "source": "simulated: /x.toml"})
    assert new.source == "simulated: /x.toml" and Report.from_json(new.to_json()) == new


# --------------------------------------------------------------------------- the rules


def _product_files(root: Path) -> list[tuple[str, ast.AST]]:
    return [
        (p.relative_to(root).as_posix(), ast.parse(p.read_text(encoding="utf-8"))) for p in sorted(root.rglob("*.py"))
    ]


def _static_sim_imports(root: Path) -> list[str]:
    """Modules that import the simulator by a static import (``import nodehealth_sim``, ``from ...``)."""
    found = []
    for rel, tree in _product_files(root):
        for node in ast.walk(tree):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else ([node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            )
            if any(n == "nodehealth_sim" or n.startswith("nodehealth_sim.") for n in names):
                found.append(f"{rel}:{node.lineno}")
    return sorted(found)


def _simulated_flag(root: Path) -> list[str]:
    """Where a ``simulated`` flag is set or read (an attribute, a keyword, a dict key); the field's
    definition in observations.py is the one exception until it goes."""
    found = []
    for rel, tree in _product_files(root):
        for node in ast.walk(tree):
            if isinstance(node, ast.Dict):
                found += [
                    f"{rel}:{k.lineno}" for k in node.keys if isinstance(k, ast.Constant) and k.value == "simulated"
                ]
            elif (isinstance(node, ast.Attribute) and node.attr == "simulated") or (
                isinstance(node, ast.keyword) and node.arg == "simulated"
            ):
                found.append(f"{rel}:{node.lineno}")
    return sorted(found)


def test_the_product_imports_the_simulator_by_name_only() -> None:
    assert _static_sim_imports(ROOT / "nodehealth") == []


def test_no_simulated_flag_runs_through_the_product() -> None:
    assert _simulated_flag(ROOT / "nodehealth") == []


def test_the_rules_catch_what_they_forbid(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("import nodehealth_sim\nfrom nodehealth_sim.nvml import parse\n")
    (tmp_path / "b.py").write_text("import importlib\nimportlib.import_module('nodehealth_sim')\n")
    (tmp_path / "c.py").write_text("def f(snap, start):\n    start(simulated=True)\n    return snap.simulated\n")
    (tmp_path / "d.py").write_text("DETAILS = {'simulated': True}\nMODE = 'simulated'\n")  # a word is no flag
    assert _static_sim_imports(tmp_path) == ["a.py:1", "a.py:2"]
    assert _simulated_flag(tmp_path) == ["c.py:2", "c.py:3", "d.py:1"]
