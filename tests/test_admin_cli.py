"""The administrator's command line, run as a person runs it (the real program, its real output):
a wrong selection is a usage error naming what exists, ``check --as`` composes with ``--simulate``, and
``status`` has exit codes and words of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nodehealth.commands import status

ROOT = Path(__file__).resolve().parent.parent
SCEN = ROOT / "examples" / "scenarios"


def nodehealth(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = dict(os.environ, NO_COLOR="1", SLURMD_NODENAME="gpu042")
    full_env.pop("NODEHEALTH_CONFIG", None)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "nodehealth", *args], capture_output=True, text=True, env=full_env, check=False, cwd=ROOT
    )


# --------------------------------------------------------------------------- wrong selections


def test_a_gpu_index_the_node_lacks_is_a_usage_error_naming_the_gpus_there_are() -> None:
    scen = str(SCEN / "row-remap-pending.toml")  # 8 GPUs, the fault on GPU 1
    typo = nodehealth("check", "--simulate", scen, "-i", "9")
    assert typo.returncode == 2, typo.stdout
    assert "no GPU 9 on this node (NVML lists 8 GPU(s): 0-7" in typo.stderr
    assert typo.stdout == ""  # no verdict printed: a typo never reads as "OK"
    some = nodehealth("check", "--simulate", scen, "--gpu", "1,9", "--format", "json")
    assert some.returncode == 2 and "no GPU 9 on" in some.stderr and some.stdout == ""
    right = nodehealth("check", "--simulate", scen, "-i", "1", "-q")
    assert right.returncode == 1 and "gpu_remapped_rows" in right.stdout


def test_a_gpu_index_when_nvml_cannot_answer_is_never_ok() -> None:
    """No count to compare with: the nvml check says NVML did not answer, and the verdict is not OK."""
    proc = nodehealth("check", "--simulate", str(SCEN / "nvml-not-installed.toml"), "-i", "9", "-q")
    assert proc.returncode == 1, proc.stdout
    assert any(line.startswith("FAIL    nvml") for line in proc.stdout.splitlines())


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (
            ("--phase", "prolg"),
            "invalid choice: 'prolg' (choose from 'prolog', 'epilog', 'healthcheck', 'manual') (did you mean prolog?)",
        ),
        (("--as", "healthchek"), "(choose from 'prolog', 'epilog', 'healthcheck') (did you mean healthcheck?)"),
        (("--only", "gpu_eccc"), "unknown check(s) gpu_eccc (did you mean gpu_ecc?)"),
    ],
    ids=["phase", "face", "check"],
)
def test_an_unknown_name_is_a_usage_error_with_the_nearest_one(args: tuple[str, ...], words: str) -> None:
    proc = nodehealth("check", *args)
    assert proc.returncode == 2 and words in proc.stderr, proc.stderr
    assert proc.stdout == ""


def test_an_unknown_command_names_the_nearest_one() -> None:
    proc = nodehealth("stauts")
    assert proc.returncode == 2 and "(did you mean status?)" in proc.stderr


def test_a_face_by_hand_names_the_nearest_option() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", "import sys; from nodehealth.faces import epilog; sys.exit(epilog.main(['--dryrun']))"],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    assert proc.returncode == 2 and "unknown argument '--dryrun' (did you mean --dry-run?)" in proc.stderr
    assert proc.stdout == ""


def test_as_takes_the_jobs_gpus_not_a_gpu_selection() -> None:
    proc = nodehealth("check", "--as", "prolog", "-i", "3")
    assert proc.returncode == 2 and "no --only, --phase or -i/--gpu (the job's GPUs: --gpus)" in proc.stderr


# --------------------------------------------------------------------------- --as with --simulate


def test_check_as_a_face_runs_on_a_simulated_node(tmp_path: Path) -> None:
    cfg = tmp_path / "nodehealth.toml"
    cfg.write_text(f'[paths]\nstate_dir = "{tmp_path / "state"}"\npersistent_dir = "{tmp_path / "lib"}"\n')
    bad = nodehealth(
        "check", "--config", str(cfg), "--as", "prolog", "--simulate", str(SCEN / "row-remap-failure.toml")
    )
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert bad.stdout.splitlines()[0] == f"config: {cfg}"  # first, as a plain check prints it
    assert f"simulated: {SCEN / 'row-remap-failure.toml'}" in bad.stdout.splitlines()
    assert "checks run now on the simulated GPUs" in bad.stdout
    assert "prolog exit code would be 1" in bad.stdout and "nh:rowremap" in bad.stdout
    assert not (tmp_path / "state" / "slurm-state.json").exists()  # acted on nothing
    good = nodehealth(
        "check", "--config", str(cfg), "--as", "healthcheck", "--simulate", str(SCEN / "healthy-8x-h100.toml")
    )
    assert good.returncode == 0 and "healthcheck exit code would be 0" in good.stdout, good.stdout + good.stderr
    missing = nodehealth("check", "--config", str(cfg), "--as", "epilog", "--simulate", str(tmp_path / "none.toml"))
    assert missing.returncode == 2 and "no such scenario file" in missing.stderr and missing.stdout == ""


def test_a_scenario_path_from_the_source_tree_on_a_package_install_names_the_shipped_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """README's `--simulate examples/scenarios/X.toml` typed on a .deb install (no source tree): the
    error names the packages' copy of X, or their folder when X is not one of them."""
    from nodehealth.cli import main as cli_main
    from nodehealth.probes import source

    shipped = tmp_path / "share" / "scenarios"
    shipped.mkdir(parents=True)
    (shipped / "row-remap-pending.toml").write_bytes((SCEN / "row-remap-pending.toml").read_bytes())
    monkeypatch.setattr(source, "SHIPPED_SCENARIOS", str(shipped))
    monkeypatch.chdir(tmp_path)
    source.forget()
    assert cli_main(["check", "--simulate", "examples/scenarios/row-remap-pending.toml"]) == 2
    err = capsys.readouterr().err
    assert f"no such scenario file (the packages ship it: --simulate {shipped}/row-remap-pending.toml)" in err, err
    assert cli_main(["check", "--simulate", "examples/scenarios/no-such.toml"]) == 2
    assert f"no such scenario file (the packages' scenarios: {shipped}/*.toml)" in capsys.readouterr().err
    assert cli_main(["check", "--simulate", str(shipped / "row-remap-pending.toml"), "-q"]) == 1  # the hint works


# --------------------------------------------------------------------------- status


def test_status_before_any_daemon_says_so_and_exits_4(tmp_path: Path) -> None:
    cfg = tmp_path / "nodehealth.toml"
    cfg.write_text(f'[paths]\nstate_dir = "{tmp_path / "state"}"\npersistent_dir = "{tmp_path / "lib"}"\n')
    proc = nodehealth("status", "--config", str(cfg))
    assert proc.returncode == 4, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("node gpu042: cannot tell: no daemon verdict"), lines[0]
    assert "last face run: none yet" in lines
    assert not any(w in proc.stdout for w in ("none never", "-0 s", "or failing", "{'"))


def test_status_help_lists_its_exit_codes() -> None:
    proc = nodehealth("status", "--help")
    flat = " ".join(proc.stdout.split())
    assert proc.returncode == 0
    for code, words in status.EXIT_CODES:
        assert f"{int(code)} {words}" in flat


@pytest.mark.parametrize(
    ("seconds", "words"), [(None, "never"), (-0.3, "just now"), (0.4, "just now"), (5, "5 s ago"), (600, "10 min ago")]
)
def test_ages_in_words(seconds: float | None, words: str) -> None:
    assert status._age(seconds) == words


def test_the_breaker_hold_in_words() -> None:
    held = {
        "time": 0.0,
        "ours": 5,
        "total": 6,
        "share": 0.8333,
        "limit": 0.1,
        "reason": "nh:ecc GPU1 x",
        "phase": "prolog",
    }
    line = status._breaker(held)
    assert line.startswith("breaker: holding a drain back (held ")
    assert "in the prolog; 5 of 6 nodes drained by nodehealth (83%, the limit is 10%)): nh:ecc GPU1 x" in line
    assert "{" not in line


def test_the_headline_names_what_makes_the_exit_code() -> None:
    base = {"config": {"validated": True}, "daemon": {"verdict": "OK", "alive": True}, "drain": None}
    assert status.headline({**base, "exit_code": 0}) == "healthy"
    drained = {**base, "exit_code": 1, "drain": {"check": "gpu_ecc"}}
    assert status.headline(drained) == "drained by nodehealth (gpu_ecc)"
    failing = {**base, "exit_code": 1, "daemon": {"verdict": "FAIL"}}
    assert status.headline(failing) == "failing (the daemon's last verdict is FAIL)"
    bad = {**base, "exit_code": 4, "config": {"validated": False}}
    assert status.headline(bad) == "cannot tell: the config does not validate"
