"""Man pages and shell completion come from the argument parsers themselves."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from nodehealth.cli import COMMANDS, build_parser, main
from nodehealth.faces.args import handle
from nodehealth.faces.table import NAMES

ROOT = Path(__file__).resolve().parent.parent


def _subcommands() -> list[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return sorted(sub.choices)  # type: ignore[attr-defined]


def test_bash_completion_knows_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["completion", "bash"]) == 0
    out = capsys.readouterr().out
    assert len(_subcommands()) == len(COMMANDS)
    for name in _subcommands():
        assert name in out, name
    assert "--as" in out and "--format" in out


def test_man_pages_are_generated_for_the_cli_and_every_face(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen-man.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    page = (tmp_path / "nodehealth.8").read_text().replace("\\-", "-")
    for name in _subcommands():
        assert name in page, name
    for face in NAMES:
        text = (tmp_path / f"nodehealth-{face}.8").read_text().replace("\\-", "-")
        assert "--dry-run" in text and "--version" in text and "--config" in text


@pytest.mark.parametrize("face", NAMES)
def test_every_option_a_face_page_documents_is_one_the_face_takes(
    face: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "nh.toml"
    monkeypatch.setenv("NODEHEALTH_CONFIG", str(cfg))  # --config sets it for the process: restored after
    cfg.write_text(f'[paths]\nstate_dir = "{tmp_path}/state"\n[gpu]\nexpected_count = 0\n', encoding="utf-8")
    assert handle(face, ["--version"]) == 0
    assert handle(face, ["--help"]) == 0
    assert handle(face, ["--dry-run", "--config", str(cfg)]) in (0, 1)
    assert handle(face, ["--nonsense"]) == 2
