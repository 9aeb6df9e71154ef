"""The faces run by hand: --help, --version, --dry-run change nothing; check --as decides as the face.

A logging fake ``scontrol`` (tests/test_slurm_faces.py's) records every call; the state dir is
listed before and after. The same inputs through the real face (no arguments, as Slurm runs it)
do call scontrol and write state: the guards are what keeps the by-hand runs quiet.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_slurm_faces import Fake

from nodehealth.cli import main as cli_main
from nodehealth.commands.check import check_names
from nodehealth.commands.common import UsageError
from nodehealth.faces import prolog, table
from nodehealth.model import Finding, Status, fold, group_messages

FACES = {face.name: importlib.import_module(face.module) for face in table.FACES}


def _files(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()} if d.exists() else {}


@pytest.mark.parametrize("face", sorted(FACES))
@pytest.mark.parametrize(
    "argv", [["--help"], ["-h"], ["--version"], ["--dry-run"], ["--bogus"], ["--config"], ["--dry-run", "--bogus"]]
)
def test_a_face_run_by_hand_acts_on_nothing(
    face: str, argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    f = Fake(tmp_path, monkeypatch, scenario="remap-pending.toml")  # a fault: the real face would drain
    before = _files(tmp_path / "state")
    code = FACES[face].main(argv)
    out, err = capsys.readouterr()
    assert f.calls() == [], "a by-hand run made a Slurm call"
    assert _files(tmp_path / "state") == before, "a by-hand run wrote state"
    if argv[0] in ("--help", "-h"):
        assert code == 0 and f"nodehealth-{face}" in out and "--dry-run" in out
    elif argv == ["--version"]:
        assert code == 0 and out.startswith(f"nodehealth-{face} ") and "nvidia-ml-py" in out
    elif argv == ["--dry-run"]:
        assert code == 1 and "would: drain the node" in out and "gpu_remapped_rows" in out
        assert "nothing was changed" in out
    else:
        assert code == 2 and "nothing was done" in err


def test_the_same_face_without_arguments_does_act(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the test above guards against is real: Slurm's run of the face drains and writes state."""
    f = Fake(tmp_path, monkeypatch, scenario="remap-pending.toml")
    assert prolog.main() == 1
    assert f.updates() and _files(tmp_path / "state")


@pytest.mark.parametrize("scenario", ["healthy.toml", "remap-pending.toml", "gpu-missing.toml", "stray-process.toml"])
@pytest.mark.parametrize("face", sorted(FACES))
def test_check_as_face_agrees_with_the_face(
    scenario: str, face: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    Fake(tmp_path, monkeypatch, scenario=scenario)
    code = cli_main(["check", "--as", face, "--job", "7", "--gpus", "0,1", "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert doc["as"]["exit_code"] == code
    verdict = doc["status"]
    real = FACES[face].main()  # as Slurm runs it, same config, job and GPUs (the Fake's environment)
    assert real == code, (face, scenario, verdict, doc["as"]["decision"])


def test_check_as_prolog_says_where_the_expected_count_came_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    Fake(tmp_path, monkeypatch, scenario="gpu-missing.toml")
    code = cli_main(["check", "--as", "prolog"])
    out = capsys.readouterr().out
    assert code == 1
    assert "expected GPUs: " in out and "config:" in out


def test_faces_installed_scripts_take_arguments(tmp_path: Path) -> None:
    """The console script passes argv; a bad argument is exit 2 before any config is read."""
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from nodehealth.faces.prolog import cli; "
            "sys.argv = ['nodehealth-prolog', '--nope']; raise SystemExit(cli())",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        env=dict(os.environ, NODEHEALTH_CONFIG="/nope"),
        check=False,
    )
    assert proc.returncode == 2 and "unknown argument '--nope'" in proc.stderr


# --------------------------------------------------------------------------- grouped findings


def test_one_finding_on_several_gpus_is_one_line() -> None:
    msgs = [f"GPU {i}: fabric registration not started" for i in range(8)]
    assert group_messages(msgs) == ["GPU 0-7: fabric registration not started"]
    assert group_messages(["GPU 0: a", "GPU 2: b", "GPU 1: a", "GPU 3: a", "node: c"]) == [
        "GPU 0-1,3: a",
        "GPU 2: b",
        "node: c",
    ]


def test_fold_lists_the_most_severe_first_and_groups() -> None:
    res = fold(
        "x",
        [
            Finding(Status.WARN, "GPU 0: warm", gpu=0),
            Finding(Status.FAIL, "GPU 1: hot", gpu=1),
            Finding(Status.FAIL, "GPU 2: hot", gpu=2),
            Finding(Status.WARN, "GPU 3: warm", gpu=3),
        ],
        "ok",
    )
    assert res.summary == "GPU 1-2: hot; GPU 0,3: warm" and res.gpu == 1


# --------------------------------------------------------------------------- --only


def test_only_takes_commas_repeats_and_suggests() -> None:
    assert check_names([["gpu_ecc,gpu_pcie"], ["nvml"]]) == ("gpu_ecc", "gpu_pcie", "nvml")
    with pytest.raises(UsageError, match="did you mean gpu_fabric"):
        check_names([["gpu_fabrc"]])
