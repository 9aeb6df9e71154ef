"""The man pages as generated for the packages: every section a page needs, the exit codes of the
program's own enum, the state files of statedir/layout.py, and nodehealth.toml(5) with every key of
the config schema at its default."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from nodehealth.commands.options import ExitCode
from nodehealth.config import lean
from nodehealth.config.schema import Config
from nodehealth.faces.table import FACES
from nodehealth.registry import CHECKS
from nodehealth.statedir import layout

ROOT = Path(__file__).resolve().parent.parent
SECTIONS = ("NAME", "SYNOPSIS", "DESCRIPTION", "OPTIONS", "EXIT STATUS", "ENVIRONMENT", "FILES", "EXAMPLES")
MAN = shutil.which("man")


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    out = tmp_path_factory.mktemp("man")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen-man.py"), str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    subprocess.run(
        [sys.executable, str(ROOT / "packaging" / "manpage-whatis.py"), *map(str, out.glob("*.8"))], check=True
    )
    return {p.name: p.read_text(encoding="utf-8") for p in out.iterdir()}


def _plain(roff: str) -> str:
    return re.sub(r"\\f[BIRP]|\\&", "", roff).replace("\\-", "-").replace("\\e", "\\")


def _sections(page: str) -> list[str]:
    return [m.strip('"') for m in re.findall(r"^\.SH (.+)$", page, re.M)]


def test_every_page_has_the_sections_an_administrator_looks_for(pages: dict[str, str]) -> None:
    names = ["nodehealth.8"] + [f"{row.script}.8" for row in FACES]
    assert sorted(pages) == sorted(names + ["nodehealth.toml.5"])
    for name in names:
        found = _sections(pages[name])
        at = [next(i for i, s in enumerate(found) if s == want or s.startswith(want + " ")) for want in SECTIONS]
        assert at == sorted(at), (name, found)  # each there, in the usual order
        assert "SEE ALSO" in found, name


def _section(page: str, title: str) -> str:
    return _plain(page.split(f'.SH "{title}"', 1)[1].split("\n.SH ", 1)[0])


def test_exit_status_is_the_programs_own_enum(pages: dict[str, str]) -> None:
    codes = re.findall(r"^\.TP\n(\d+)$", _section(pages["nodehealth.8"], "EXIT STATUS"), re.M)
    assert codes == [str(int(c)) for c in ExitCode]
    for row in FACES:
        assert re.findall(r"^\.TP\n(\d+)$", _section(pages[f"{row.script}.8"], "EXIT STATUS"), re.M) == ["0", "1", "2"]


def _state_file_names() -> set[str]:
    return {
        v
        for k, v in vars(layout).items()
        if k.isupper() and isinstance(v, str) and re.fullmatch(r"[\w-]+\.(json|jsonl)", v)
    }


def test_files_names_every_state_file_in_its_directory(pages: dict[str, str]) -> None:
    files = _section(pages["nodehealth.8"], "FILES")
    run, kept = lean.documented(lean.default("paths.state_dir")), lean.documented(lean.default("paths.persistent_dir"))
    assert lean.DEFAULT_PATH in files
    names = _state_file_names()
    assert {layout.DAEMON_STATE, layout.COUNTERS, layout.LEDGER, layout.SLURM_STATE} <= names
    for name in names:
        folder = kept if name in layout.PERSISTENT else run
        assert f"{folder}/{name}\n" in files, name


def _keys(obj: Any, table: str = "") -> list[tuple[str, str, Any]]:
    out = []
    for f in dataclasses.fields(obj):
        if f.name in ("source", "checks"):
            continue
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            out += _keys(value, f"{table}.{f.name}" if table else f.name)
        else:
            out.append((table, f.name, value))
    return out


def test_the_config_page_lists_every_key_at_its_default_and_every_check(pages: dict[str, str]) -> None:
    page = pages["nodehealth.toml.5"]
    text = _plain(page)
    assert re.search(r"^\.TH NODEHEALTH\.TOML \"5\"", page, re.M)
    assert "nodehealth.toml - the configuration file of nodehealth" in text
    tables = text.split("\n.SS ")
    for table, key, value in _keys(Config()):
        where = next((t for t in tables if t.startswith(f"[{table}]\n")), tables[0]) if table else tables[0]
        shown = lean.documented(value)
        want = f'"{shown}"' if isinstance(shown, str) else str(shown).lower() if isinstance(shown, bool) else str(shown)
        assert f".TP\n{key} = {want}\n" in where, (table, key, want)
    for spec in CHECKS:
        assert f"\n.SS [checks.{spec.name}]\n" in text, spec.name


@pytest.mark.skipif(MAN is None, reason="man not installed (Debian package man-db)")
def test_man_renders_every_page_without_a_warning(pages: dict[str, str], tmp_path: Path) -> None:
    assert MAN is not None
    for name, page in pages.items():
        path = tmp_path / name
        path.write_text(page, encoding="utf-8")
        proc = subprocess.run(
            [MAN, "--warnings", "-E", "UTF-8", "-l", "-Tutf8", "-Z", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
            env={"LC_ALL": "C.UTF-8", "MANWIDTH": "80", "PATH": "/usr/bin:/bin"},
        )
        assert proc.returncode == 0 and not proc.stderr.strip(), (name, proc.stderr)
