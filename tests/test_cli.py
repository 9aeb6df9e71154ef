"""The CLI: text and JSON output (golden files), exit codes, colour, usage errors.

Regenerate the golden files after an intended output change with
``pytest tests/test_cli.py --update-golden`` and review the diff.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nodehealth import __version__
from nodehealth.cli import main

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden"
SCEN = ROOT / "examples" / "scenarios"


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = dict(os.environ, NO_COLOR="1", SLURMD_NODENAME="gpu042")
    full_env.pop("NODEHEALTH_CONFIG", None)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "nodehealth", *args], capture_output=True, text=True, env=full_env, check=False, cwd=ROOT
    )


def normalise(report: dict) -> dict:
    report = dict(report)
    report["duration_s"] = report["started_at"] = 0
    report["version"] = "X"
    report["source"] = report["source"].replace(str(ROOT), "<repo>")
    for check in report["checks"]:
        check["duration_s"] = 0
        for key in ("elapsed_s",):
            check["details"].pop(key, None)
        check["summary"] = check["summary"].split(", answered in")[0]
    return report


GOLDEN_CASES = ["healthy-8x-h100", "row-remap-pending", "one-gpu-missing", "nvml-not-installed"]


@pytest.mark.parametrize("name", GOLDEN_CASES)
def test_json_report_matches_golden(name, tmp_path, request):
    cfg = tmp_path / "golden.toml"
    (tmp_path / "sys").mkdir()  # no InfiniBand, no PCI: the report must not depend on this machine
    cfg.write_text(f'[paths]\nsysfs_root = "{tmp_path / "sys"}"\nstate_dir = "{tmp_path / "state"}"\n')
    proc = run_cli("check", "--config", str(cfg), "--simulate", str(SCEN / f"{name}.toml"), "--format", "json")
    assert proc.returncode in (0, 1), proc.stderr
    got = normalise(json.loads(proc.stdout))
    path = GOLDEN / f"{name}.json"
    if request.config.getoption("--update-golden"):
        path.write_text(json.dumps(got, indent=2) + "\n")
    assert got == json.loads(path.read_text())


def test_json_schema_keys():
    proc = run_cli("check", "--simulate", str(SCEN / "healthy-8x-h100.toml"), "--format", "json")
    report = json.loads(proc.stdout)
    assert {"node", "status", "duration_s", "version", "checks"} <= set(report)
    assert report["node"] == "gpu042"
    assert report["version"] == __version__
    for check in report["checks"]:
        assert set(check) == {"name", "status", "summary", "action", "gpu", "details", "duration_s"}


def test_text_output_one_line_per_check_and_a_verdict():
    proc = run_cli("check", "--simulate", str(SCEN / "row-remap-pending.toml"))
    assert proc.returncode == 1
    lines = proc.stdout.strip().splitlines()
    failing = [ln for ln in lines if ln.startswith("FAIL")]
    assert len(failing) == 1 and "gpu_remapped_rows" in failing[0] and "reset_gpu" in failing[0]
    assert lines[-1].startswith("gpu042: FAIL: gpu_remapped_rows")
    assert "\033[" not in proc.stdout


def test_exit_codes():
    assert run_cli("check", "--simulate", str(SCEN / "healthy-8x-h100.toml")).returncode == 0
    assert run_cli("check", "--simulate", str(SCEN / "persistence-off.toml")).returncode == 0  # WARN only
    assert run_cli("check", "--simulate", str(SCEN / "volatile-uncorrectable-ecc.toml")).returncode == 1
    assert run_cli("check", "--bogus").returncode == 2
    assert run_cli("check", "--config", "/nonexistent.toml").returncode == 2


def test_unknown_policy_fail_turns_unknown_into_exit_1(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('[policy]\nunknown = "fail"\n')
    # One GPU answers "no permission" on the ECC counters: UNKNOWN, not a node fault.
    scen = tmp_path / "s.toml"
    scen.write_text(
        '[[gpu]]\n[[faults.errors]]\ncall = "nvmlDeviceGetTotalEccErrors"\ngpu = 0\nerror = "NO_PERMISSION"\n'
    )
    lenient = run_cli("check", "--simulate", str(scen))
    strict = run_cli("check", "--config", str(cfg), "--simulate", str(scen))
    assert "UNKNOWN gpu_ecc" in lenient.stdout
    assert (lenient.returncode, strict.returncode) == (0, 1)


class _Tty:
    def isatty(self) -> bool:
        return True


def test_color_on_a_terminal_unless_no_color(monkeypatch, capsys):
    from nodehealth.commands import check, common

    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    assert common.use_color(_Tty()) is True
    monkeypatch.setenv("NO_COLOR", "1")
    assert common.use_color(_Tty()) is False
    monkeypatch.setattr(check, "use_color", lambda stream: True)
    main(["check", "--simulate", str(SCEN / "healthy-8x-h100.toml")])
    assert "\033[32mOK" in capsys.readouterr().out


def test_only_selects_checks_and_rejects_unknown_names():
    proc = run_cli("check", "--simulate", str(SCEN / "healthy-8x-h100.toml"), "--only", "gpu_ecc", "gpu_pcie")
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("config: ")  # which file the run used
    assert lines[1] == f"simulated: {SCEN / 'healthy-8x-h100.toml'}"  # the report's header: where the GPUs are
    names = [ln.split()[1] for ln in lines[2:-1]]
    assert names == ["gpu_ecc", "gpu_pcie"]
    bad = run_cli("check", "--only", "gpu_nope")
    assert bad.returncode == 2 and "gpu_nope" in bad.stderr and "Traceback" not in bad.stderr


def test_bad_scenario_is_one_line_exit_2(tmp_path):
    scen = tmp_path / "bad.toml"
    scen.write_text("[[gpu]]\ntemprature_c = 40\n")
    proc = run_cli("check", "--simulate", str(scen))
    assert proc.returncode == 2
    assert str(scen) in proc.stderr and "gpu[0].temprature_c" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_list_checks_and_version():
    proc = run_cli("list-checks")
    assert proc.returncode == 0 and "gpu_remapped_rows" in proc.stdout and "epilog" in proc.stdout
    table = json.loads(run_cli("list-checks", "--format", "json").stdout)
    assert {r["cost"] for r in table} >= {"cheap"} and any(r["uses"] for r in table)
    assert all(r["timeout_s"] > 0 and r["needs"] for r in table)
    lines = run_cli("--version").stdout.strip().splitlines()
    assert lines[0].startswith(f"nodehealth {__version__}")
    assert lines[1].startswith("nvidia-ml-py ") and lines[2].startswith("NVIDIA driver: ")  # not reachable here


def test_internal_error_is_exit_3(monkeypatch, capsys):
    from nodehealth import runner

    def explode(*a, **k):
        raise RuntimeError("bug")

    monkeypatch.setattr(runner, "execute", explode)
    assert main(["check", "--simulate", str(SCEN / "healthy-8x-h100.toml")]) == 3
    assert "internal error: RuntimeError: bug" in capsys.readouterr().err


def test_gpu_selection_quiet_and_verbose():
    scen = str(SCEN / "fabric-not-registered.toml")
    proc = run_cli("check", "--simulate", scen, "-i", "2,3", "-q")
    lines = proc.stdout.strip().splitlines()
    assert lines[0] == f"simulated: {scen}"  # even with -q: a simulated verdict never passes for a real one
    assert proc.returncode == 1 and lines[1].startswith("FAIL    gpu_fabric") and "GPU 2-3:" in lines[1]
    assert not any(ln.startswith(("OK", "SKIPPED", "config:")) for ln in lines)  # -q: only what is not OK
    ok = run_cli("check", "--simulate", str(SCEN / "row-remap-pending.toml"), "--gpu", "0,2")  # the fault is GPU 1
    assert ok.returncode == 0, ok.stdout
    verbose = run_cli("check", "--simulate", str(SCEN / "healthy-8x-h100.toml"), "--only", "nvml", "-v")
    assert f"simulated: {SCEN / 'healthy-8x-h100.toml'}" in verbose.stdout.splitlines()  # the header says so
    assert run_cli("check", "-i", "two").returncode == 2


@pytest.mark.parametrize("columns", [None, "100", "0", "-3", "wide"], ids=["unset", "100", "zero", "negative", "text"])
def test_help_is_as_wide_as_argparse_makes_it(monkeypatch: pytest.MonkeyPatch, columns: str | None) -> None:
    """The parser's formatter reads the width as ``shutil.get_terminal_size`` does, without importing it."""
    import argparse

    from nodehealth.cli import build_parser

    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    parser = build_parser(["check"])
    assert parser._get_formatter()._width == argparse.HelpFormatter(prog="nodehealth")._width  # type: ignore[attr-defined]


def test_parsing_a_command_line_imports_no_shutil() -> None:
    code = "import sys, nodehealth.cli as c; c.build_parser(['check']).format_help(); print('shutil' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    assert out.stdout.strip() == "False"


def test_every_command_has_a_description_for_its_help_and_man_page():
    """``nodehealth X --help`` (and the man page made from it) says what X does, not only its usage line."""
    import argparse

    from nodehealth.cli import build_parser

    def walk(parser: argparse.ArgumentParser, path: str) -> list[str]:
        bare = [] if parser.description else [path]
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    bare += walk(sub, f"{path} {name}")
        return bare

    assert walk(build_parser(), "nodehealth") == []
