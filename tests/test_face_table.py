"""The one table of faces (``nodehealth.faces.table``): pyproject.toml and the RPM spec are static files, so
this test is how they derive from it; the faces' own surfaces (``check --as``, ``--help``, the module's
``cli``/``main``) read it. A new face is its module and its row; the console-script lines are what this
test then demands."""

from __future__ import annotations

import importlib
import re
import sys
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


def pyproject_scripts() -> dict[str, str]:
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    scripts: dict[str, str] = doc["project"]["scripts"]
    return scripts


def spec_scripts(text: str) -> tuple[dict[str, str], set[str]]:
    """The RPM spec's console scripts: the ``for entry in NAME=MODULE:FN ...`` loop that writes them, and
    the ``%{_bindir}/NAME`` lines of ``%files``."""
    loop = re.search(r"^for entry in (.*?); do$", text.replace("\\\n", " "), re.M)
    assert loop, "the spec's loop over its console scripts is gone"
    entries = dict(word.split("=", 1) for word in loop.group(1).split())
    files = text.split("\n%files", 1)[1]
    return entries, set(re.findall(r"^%\{_bindir\}/(\S+)$", files, re.M))


def test_pyproject_installs_exactly_the_table() -> None:
    assert table.disagreements(pyproject_scripts(), "pyproject.toml [project.scripts]") == []


def test_the_rpm_spec_installs_exactly_the_table() -> None:
    entries, files = spec_scripts((ROOT / "packaging" / "rpm" / "nodehealth.spec").read_text(encoding="utf-8"))
    assert table.disagreements(entries, "nodehealth.spec") == []
    assert files == set(table.scripts()), "the spec's %files lists other programs than it writes"


def test_a_new_row_without_its_console_script_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a new face costs beyond its module: its row, then the script lines this test asks for."""
    new = table.Face("ward", "nodehealth.faces.ward", "healthcheck", "nodehealth-ward", "ward", "Prolog=", "x")
    monkeypatch.setattr(table, "FACES", (*table.FACES, new))
    got = table.disagreements(pyproject_scripts(), "pyproject.toml")
    assert got == ["pyproject.toml: missing nodehealth-ward = 'nodehealth.faces.ward:cli'"]
    entries, _ = spec_scripts((ROOT / "packaging" / "rpm" / "nodehealth.spec").read_text(encoding="utf-8"))
    assert table.disagreements(entries, "spec") == ["spec: missing nodehealth-ward = 'nodehealth.faces.ward:cli'"]


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
