"""The one table of faces (``nodehealth.faces.table``): the console scripts derive from it (pyproject.toml
declares them dynamic and setup.py reads the table; the RPM spec runs the table for its list), and the
faces' own surfaces (``check --as``, ``--help``, the module's ``cli``/``main``) read it. A new face is its
module and its row: a wheel built from the tree installs its script with no other line to add."""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from nodehealth.cli import build_parser
from nodehealth.faces import table
from nodehealth.faces.args import handle
from nodehealth.registry import PHASES

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.9, 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent


SYSTEM_PYTHON = "/usr/bin/python3"  # Debian's, with the setuptools (66) and wheel the .deb is built with


def table_scripts(tree: Path = ROOT) -> dict[str, str]:
    """What ``python3 nodehealth/faces/table.py`` prints (the RPM spec's list), run by path with ``-I``: it
    imports nothing of the package (the spec runs it before anything is installed)."""
    proc = subprocess.run(
        [sys.executable, "-I", str(tree / "nodehealth" / "faces" / "table.py")],
        capture_output=True,
        text=True,
        check=False,
        cwd="/",
    )
    assert proc.returncode == 0, proc.stderr
    return dict(line.split("=", 1) for line in proc.stdout.splitlines())


def build_wheel(tree: Path, out: Path) -> Path:
    """A wheel of ``tree`` (pyproject.toml, setup.py, README.md, nodehealth/) built offline by Debian's
    setuptools as the .deb's pybuild does (the same licence edit as packaging/debian/rules)."""
    src = out / "src"
    shutil.copytree(tree / "nodehealth", src / "nodehealth", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("setup.py", "README.md"):
        shutil.copyfile(tree / name if (tree / name).exists() else ROOT / name, src / name)
    text = (tree / "pyproject.toml").read_text(encoding="utf-8")
    text = text.replace('license = "Apache-2.0"', 'license = { text = "Apache-2.0" }')
    (src / "pyproject.toml").write_text(text.replace('"setuptools>=77"', '"setuptools>=61"'), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PIP", "VIRTUAL_ENV"))}
    env["PATH"] = "/usr/sbin:/usr/bin:/sbin:/bin"
    proc = subprocess.run(
        [SYSTEM_PYTHON, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out / "dist"), "."],
        capture_output=True,
        text=True,
        cwd=src,
        env=env,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (wheel,) = (out / "dist").glob("nodehealth-*.whl")
    return wheel


def wheel_scripts(wheel: Path) -> dict[str, str]:
    """The console scripts a wheel installs: its ``entry_points.txt``."""
    with zipfile.ZipFile(wheel) as z:
        (name,) = [n for n in z.namelist() if n.endswith(".dist-info/entry_points.txt")]
        text = z.read(name).decode()
    section = text.split("[console_scripts]", 1)[1].split("\n[", 1)[0]
    return dict((k.strip(), v.strip()) for k, _, v in (line.partition("=") for line in section.splitlines()) if v)


needs_system_setuptools = pytest.mark.skipif(
    subprocess.run([SYSTEM_PYTHON, "-c", "import setuptools, wheel"], capture_output=True, check=False).returncode != 0,
    reason="Debian's python3-setuptools and python3-wheel (make system-deps)",
)


def test_pyproject_takes_its_scripts_from_the_table() -> None:
    """No static list to drift: ``scripts`` is dynamic, and setup.py gives exactly the table's."""
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "scripts" not in doc["project"] and "scripts" in doc["project"]["dynamic"]
    assert "faces/table.py" in (ROOT / "setup.py").read_text(encoding="utf-8")


@needs_system_setuptools
def test_a_wheel_built_from_the_tree_installs_exactly_the_table(tmp_path: Path) -> None:
    assert table.disagreements(wheel_scripts(build_wheel(ROOT, tmp_path)), "the wheel") == []


def test_the_rpm_spec_installs_exactly_the_table() -> None:
    """The spec's loop runs the table by path for its list; ``%files`` takes every script it wrote."""
    text = (ROOT / "packaging" / "rpm" / "nodehealth.spec").read_text(encoding="utf-8")
    assert re.search(r"^for entry in \$\(%\{nodehealth_python\} nodehealth/faces/table\.py\); do$", text, re.M)
    files = text.split("\n%files", 1)[1]
    assert set(re.findall(r"^%\{_bindir\}/(\S+)$", files, re.M)) == {"nodehealth", "nodehealth-*"}
    assert table.disagreements(table_scripts(), "python3 nodehealth/faces/table.py") == []
    assert all(name == "nodehealth" or name.startswith("nodehealth-") for name in table.scripts())  # the glob


def test_a_new_row_is_a_new_script_with_no_other_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a new face costs beyond its module: its row, and ``scripts()`` (what setup.py and the spec read)
    has its script."""
    new = table.Face("ward", "nodehealth.faces.ward", "healthcheck", "nodehealth-ward", "ward", "Prolog=", "x")
    monkeypatch.setattr(table, "FACES", (*table.FACES, new))
    assert table.scripts()["nodehealth-ward"] == "nodehealth.faces.ward:cli"


def test_a_script_no_row_declares_and_a_wrong_target_are_named() -> None:
    declared = dict(table.scripts(), **{"nodehealth-extra": "x:cli", "nodehealth-prolog": "nodehealth.faces.x:cli"})
    got = table.disagreements(declared, "p")
    assert "p: nodehealth-extra is in no row of nodehealth.faces.table" in got
    assert "p: nodehealth-prolog = 'nodehealth.faces.x:cli', the table says 'nodehealth.faces.prolog:cli'" in got
    assert len(got) == 2


@pytest.mark.parametrize("face", table.FACES, ids=table.NAMES)
def test_each_row_is_a_face(face: table.Face, capsys: pytest.CaptureFixture[str]) -> None:
    module = importlib.import_module(face.module)
    assert callable(module.cli) and callable(module.main)
    assert face.phase in PHASES
    assert face.script == f"nodehealth-{face.name}" and face.started_by.endswith("=")
    assert handle(face.name, ["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: {face.script} ") and face.started_by in out and face.does in out


def test_check_as_and_phase_offer_the_table() -> None:
    check = build_parser()._subparsers._group_actions[0].choices["check"]  # type: ignore[union-attr]
    by_dest = {a.dest: a for a in check._actions}
    assert tuple(by_dest["as_face"].choices) == table.NAMES
    assert set(by_dest["phase"].choices) == {f.phase for f in table.FACES} | {"manual"}
