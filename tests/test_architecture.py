"""The design's hard lines, checked on the source (DESIGN.md, "Rules that keep this picture true")."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from nodehealth.registry import CHECKS

PKG = Path(__file__).resolve().parent.parent / "nodehealth"
OS_MODULES = {"pynvml", "subprocess", "psutil"}
IMPURE = OS_MODULES | {"os", "io", "pathlib", "shutil", "socket", "select", "signal", "threading", "time"}


def imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def sources(under: Path) -> list[Path]:
    return sorted(p for p in under.rglob("*.py"))


@pytest.mark.parametrize("path", [p for p in sources(PKG) if not {"probes", "platform"} & set(p.parts)],
                         ids=lambda p: str(p.relative_to(PKG)))
def test_only_probes_touch_hardware_and_the_os(path):
    assert not imports(path) & OS_MODULES


@pytest.mark.parametrize("path", sources(PKG / "checks"), ids=lambda p: p.name)
def test_checks_are_pure(path):
    tree = ast.parse(path.read_text())
    os_uses = {n.attr for n in ast.walk(tree)
               if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "os"}
    assert os_uses <= {"path"}, f"os.{os_uses - {'path'}} in a check"  # os.path is string work
    assert not imports(path) & (IMPURE - {"os"})
    calls = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert "open" not in calls


def test_every_check_module_is_registered_once():
    modules = {p.stem for p in (PKG / "checks").glob("*.py")} - {"__init__", "base"}
    registered = [spec.module.__name__.rsplit(".", 1)[1] for spec in CHECKS]
    assert sorted(registered) == sorted(set(registered)), "a module registered twice"
    assert modules == set(registered)
    assert [s.name for s in CHECKS] == list(dict.fromkeys(s.name for s in CHECKS))


def test_every_check_needs_only_known_probes():
    from nodehealth.observations import Observations
    from nodehealth.probes import PROBES

    fields = set(Observations.__dataclass_fields__)
    for spec in CHECKS:
        for probe in spec.needs:
            assert probe in PROBES and probe in fields, (spec.name, probe)
