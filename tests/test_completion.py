"""Shell completion as a person meets it: the generated bash, zsh and fish scripts run in the shells
themselves, completing subcommands, options, check names for --only and scenario files for --simulate;
each face's script (nodehealth-prolog, ...) its own options and files for --config; and the packages
install all of them, one file per command and shell."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nodehealth.cli import build_parser, main
from nodehealth.commands.completion import SCENARIO_DIR, face_script, script, tree
from nodehealth.faces import table
from nodehealth.faces.args import OPTION_TABLE, handle
from nodehealth.registry import CHECKS

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "examples" / "scenarios"
CHECK_NAMES = sorted(spec.name for spec in CHECKS)
FISH, ZSH = shutil.which("fish"), shutil.which("zsh")


def _script(shell: str, tmp: Path) -> Path:
    parser = build_parser()
    path = tmp / f"completion.{shell}"
    path.write_text(script(parser, shell), encoding="utf-8")
    return path


@pytest.fixture()
def cwd(tmp_path: Path) -> Path:
    """A directory holding two scenarios and a file that is not one."""
    here = tmp_path / "here"
    here.mkdir()
    for name in ("hung-nvml-call.toml", "hung-nvml-init.toml"):
        shutil.copy(SCENARIOS / name, here / name)
    (here / "hung-notes.txt").write_text("not a scenario\n", encoding="utf-8")
    return here


def bash_complete(completion: Path, cwd: Path, *words: str) -> list[str]:
    """What bash's programmable completion offers for the command line ``words`` (the last one being
    completed; the first the command), through the function the script registers for that command."""
    prog = (
        f'source {completion}; COMP_WORDS=("$@"); COMP_CWORD=$(( $# - 1 )); '
        "fn=$(complete -p \"$1\" | sed 's/.*-F \\([^ ]*\\).*/\\1/'); $fn; printf '%s\\n' \"${COMPREPLY[@]}\""
    )
    proc = subprocess.run(["bash", "-c", prog, "_", *words], capture_output=True, text=True, timeout=60, cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    return sorted(w for w in proc.stdout.splitlines() if w)


def test_bash_completes_subcommands_options_check_names_and_scenarios(tmp_path: Path, cwd: Path) -> None:
    sh = _script("bash", tmp_path)
    commands = sorted(c.path[-1] for c in tree(build_parser()).subs)
    assert bash_complete(sh, cwd, "nodehealth", "") == commands
    assert bash_complete(sh, cwd, "nodehealth", "x") == ["xid"]
    assert bash_complete(sh, cwd, "nodehealth", "xid", "") == ["clear", "explain", "scan", "watch"]
    assert bash_complete(sh, cwd, "nodehealth", "check", "--fo") == ["--format"]
    assert bash_complete(sh, cwd, "nodehealth", "check", "--format", "") == ["json", "text"]
    # Check names from the registry, after --only, after a name already given, and after a comma.
    assert bash_complete(sh, cwd, "nodehealth", "check", "--only", "") == CHECK_NAMES
    assert bash_complete(sh, cwd, "nodehealth", "check", "--only", "gpu_e") == ["gpu_ecc"]
    assert bash_complete(sh, cwd, "nodehealth", "check", "--only", "gpu_ecc", "gpu_x") == ["gpu_xid"]
    assert bash_complete(sh, cwd, "nodehealth", "check", "--only", "gpu_ecc,host_me") == ["gpu_ecc,host_memory"]
    assert bash_complete(sh, cwd, "nodehealth", "check", "--only", "gpu_ecc", "--fo") == ["--format"]
    # Scenario files: the .toml ones, not the notes beside them.
    hung = bash_complete(sh, cwd, "nodehealth", "check", "--simulate", "hung")
    assert hung == ["hung-nvml-call.toml", "hung-nvml-init.toml"]
    assert bash_complete(sh, cwd, "nodehealth", "daemon", "--simulate", "hung-nvml-c") == ["hung-nvml-call.toml"]
    # A value that has nothing to offer offers nothing (no option names as a GPU list).
    assert bash_complete(sh, cwd, "nodehealth", "check", "--gpu", "") == []


def test_every_subcommand_and_option_of_the_parser_is_in_every_script(tmp_path: Path) -> None:
    root = tree(build_parser())
    for shell in ("bash", "zsh", "fish"):
        text = _script(shell, tmp_path).read_text(encoding="utf-8")
        for cmd in root.walk():
            assert all(sub.path[-1] in text for sub in cmd.subs), (shell, cmd.key)
            for opt in cmd.opts:
                for flag in opt.flags:
                    want = (
                        flag if shell != "fish" else (f"-l {flag[2:]}" if flag.startswith("--") else f"-s {flag[1:]}")
                    )
                    assert want in text, (shell, cmd.key, flag)
        assert " ".join(CHECK_NAMES[:0]) in text and all(name in text for name in CHECK_NAMES), shell
    assert SCENARIO_DIR in _script("bash", tmp_path).read_text(encoding="utf-8")


def fish_complete(completion: Path, cwd: Path, line: str) -> list[str]:
    assert FISH is not None
    proc = subprocess.run(
        [FISH, "--no-config", "-c", f"source {completion}; complete -C {line!r}"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
    )
    assert proc.returncode == 0 and not proc.stderr, proc.stderr
    return sorted(ln.split("\t")[0] for ln in proc.stdout.splitlines() if ln)


@pytest.mark.real
@pytest.mark.skipif(FISH is None, reason="fish not installed (Debian package fish)")
def test_fish_completes_subcommands_options_check_names_and_scenarios(tmp_path: Path, cwd: Path) -> None:
    fish = _script("fish", tmp_path)
    assert "check" in fish_complete(fish, cwd, "nodehealth ") and "xid" in fish_complete(fish, cwd, "nodehealth ")
    assert fish_complete(fish, cwd, "nodehealth xid ") == ["clear", "explain", "scan", "watch"]
    assert fish_complete(fish, cwd, "nodehealth check --only gpu_e") == ["gpu_ecc"]
    assert fish_complete(fish, cwd, "nodehealth check --only gpu_ecc gpu_x") == ["gpu_xid"]
    assert fish_complete(fish, cwd, "nodehealth check --only ") == CHECK_NAMES
    assert fish_complete(fish, cwd, "nodehealth check --format ") == ["json", "text"]
    assert fish_complete(fish, cwd, "nodehealth check --simulate hung") == [
        "hung-nvml-call.toml",
        "hung-nvml-init.toml",
    ]
    assert fish_complete(fish, cwd, "nodehealth check --fo") == ["--format"]


@pytest.mark.real
@pytest.mark.skipif(ZSH is None, reason="zsh not installed (Debian package zsh)")
def test_zsh_loads_the_script_and_offers_what_bash_offers(tmp_path: Path, cwd: Path) -> None:
    """zsh filters the candidates against the word itself; the candidates are the context's."""
    assert ZSH is not None
    zsh = _script("zsh", tmp_path)
    assert zsh.read_text(encoding="utf-8").startswith("#compdef nodehealth\n")
    prog = (
        f"autoload -U compinit && compinit -u -d {tmp_path}/zcompdump; source {zsh}; "
        't() { emulate -L sh; setopt kshglob noshglob braceexpand; COMP_WORDS=("$@"); COMP_CWORD=$(( $# - 1 )); '
        '_nodehealth; print -r -l -- "${COMPREPLY[@]}"; print -r -- ---; }; '
        "t nodehealth check --only ''; t nodehealth xid ''"
    )
    proc = subprocess.run([ZSH, "-f", "-c", prog], capture_output=True, text=True, timeout=60, cwd=cwd)
    assert proc.returncode == 0 and not proc.stderr, proc.stderr
    only, xid, _ = proc.stdout.split("---\n")
    assert sorted(only.split()) == CHECK_NAMES and sorted(xid.split()) == ["clear", "explain", "scan", "watch"]


def test_the_packages_install_every_completion_file_the_generator_writes(tmp_path: Path) -> None:
    gen = ROOT / "scripts" / "gen-completion.py"
    proc = subprocess.run(
        [sys.executable, str(gen), str(tmp_path / "out")], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    files = sorted(str(p.relative_to(tmp_path / "out")) for p in (tmp_path / "out").rglob("*") if p.is_file())
    commands = sorted(table.scripts())  # nodehealth and every face's script, from the table of faces
    assert len(commands) == 1 + len(table.FACES)
    want = [f"bash/{c}" for c in commands] + [f"fish/{c}.fish" for c in commands] + [f"zsh/_{c}" for c in commands]
    assert files == sorted(want)
    for command in commands:  # each file completes the command its name says
        assert f"complete -F _{command.replace('-', '_')} {command}\n" in (tmp_path / "out/bash" / command).read_text()
        assert (tmp_path / "out/zsh" / f"_{command}").read_text().startswith(f"#compdef {command}\n")
        assert f"complete -c {command} " in (tmp_path / "out/fish" / f"{command}.fish").read_text()
    install = (ROOT / "packaging" / "debian" / "nodehealth.install").read_text(encoding="utf-8")
    rules = (ROOT / "packaging" / "debian" / "rules").read_text(encoding="utf-8")
    rpm = (ROOT / "packaging" / "rpm" / "nodehealth.spec").read_text(encoding="utf-8")
    assert "scripts/gen-completion.py debian/completions" in rules and "scripts/gen-completion.py completions" in rpm
    where = {
        "bash": ("usr/share/bash-completion/completions/", "%{_datadir}/bash-completion/completions/"),
        "zsh": ("usr/share/zsh/vendor-completions/", "%{_datadir}/zsh/site-functions/"),
        "fish": ("usr/share/fish/vendor_completions.d/", "%{_datadir}/fish/vendor_completions.d/"),
    }
    files_section = rpm.split("%files", 1)[1]
    for shell, (deb, rpm_dir) in where.items():
        assert f"debian/completions/{shell}/* {deb}\n" in install, shell  # the directory whole: every command
        assert f"install -m 0644 completions/{shell}/* %{{buildroot}}{rpm_dir}\n" in rpm, shell
        name = {"bash": "nodehealth*", "zsh": "_nodehealth*", "fish": "nodehealth*.fish"}[shell]
        assert f"{rpm_dir}{name}\n" in files_section, shell


# --------------------------------------------------------------------------- each face's own script


FACE_FLAGS = sorted(f for flags, _, _ in OPTION_TABLE for f in flags)


@pytest.mark.parametrize("face", table.NAMES)
def test_bash_completes_a_faces_own_script(face: str, tmp_path: Path, cwd: Path) -> None:
    command = table.BY_NAME[face].script
    sh = tmp_path / command
    sh.write_text(face_script(face, "bash"), encoding="utf-8")
    assert bash_complete(sh, cwd, command, "-") == FACE_FLAGS
    assert bash_complete(sh, cwd, command, "--d") == ["--dry-run"]
    assert bash_complete(sh, cwd, command, "--dry-run", "--c") == ["--config"]
    # --config takes a file: every file, not only scenarios, and no option names.
    assert bash_complete(sh, cwd, command, "--config", "hung-") == [
        "hung-notes.txt",
        "hung-nvml-call.toml",
        "hung-nvml-init.toml",
    ]
    assert bash_complete(sh, cwd, command, "--config", "x.toml", "--v") == ["--version"]


@pytest.mark.parametrize("face", table.NAMES)
def test_every_option_a_faces_completion_offers_is_one_the_face_takes(
    face: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The completion is generated from faces/args.py's table; the face's own parser must take each flag."""
    cfg = tmp_path / "nh.toml"
    cfg.write_text(f'[paths]\nstate_dir = "{tmp_path}/state"\n[gpu]\nexpected_count = 0\n', encoding="utf-8")
    monkeypatch.setenv("NODEHEALTH_CONFIG", str(cfg))
    text = face_script(face, "bash")
    for flags, metavar, _ in OPTION_TABLE:
        for flag in flags:
            assert flag in text, flag
            argv = [flag, str(cfg), "--dry-run"] if metavar else [flag] + (["--dry-run"] if flag == "--dry-run" else [])
            assert handle(face, argv) in (0, 1), (face, argv, capsys.readouterr().err)
    assert handle(face, ["--dry-runn"]) == 2  # and one it does not take is refused


def test_nodehealth_completion_for_a_face_prints_that_faces_script(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["completion", "fish", "--for", "nodehealth-epilog"]) == 0
    assert capsys.readouterr().out == face_script("epilog", "fish")
    assert main(["completion", "tcsh", "--for", "nodehealth-epilog"]) == 2
    assert "bash, zsh or fish only" in capsys.readouterr().err


@pytest.mark.real
@pytest.mark.skipif(FISH is None, reason="fish not installed (Debian package fish)")
def test_fish_completes_a_faces_own_script(tmp_path: Path, cwd: Path) -> None:
    sh = tmp_path / "nodehealth-prolog.fish"
    sh.write_text(face_script("prolog", "fish"), encoding="utf-8")
    assert fish_complete(sh, cwd, "nodehealth-prolog --d") == ["--dry-run"]
    assert fish_complete(sh, cwd, "nodehealth-prolog --dry-run --c") == ["--config"]
    assert "hung-notes.txt" in fish_complete(sh, cwd, "nodehealth-prolog --config hung-")


@pytest.mark.real
@pytest.mark.skipif(ZSH is None, reason="zsh not installed (Debian package zsh)")
def test_zsh_loads_a_faces_script_and_offers_its_options(tmp_path: Path, cwd: Path) -> None:
    assert ZSH is not None
    sh = tmp_path / "_nodehealth-healthcheck"
    sh.write_text(face_script("healthcheck", "zsh"), encoding="utf-8")
    assert sh.read_text(encoding="utf-8").startswith("#compdef nodehealth-healthcheck\n")
    prog = (
        f"autoload -U compinit && compinit -u -d {tmp_path}/zcompdump; source {sh}; "
        "emulate -L sh; setopt kshglob noshglob braceexpand; COMP_WORDS=(nodehealth-healthcheck --d); COMP_CWORD=1; "
        '_nodehealth_healthcheck; print -r -l -- "${COMPREPLY[@]}"'
    )
    proc = subprocess.run([ZSH, "-f", "-c", prog], capture_output=True, text=True, timeout=60, cwd=cwd)
    assert proc.returncode == 0 and not proc.stderr, proc.stderr
    # zsh filters the candidates against the word itself: they are the face's options, and no other
    assert sorted(proc.stdout.split()) == ["--config", "--dry-run", "--help", "--version", "-V", "-h"]


@pytest.mark.parametrize("script", ["gen-completion.py", "gen-man.py"])
@pytest.mark.parametrize(("arg", "rc"), [("--help", 0), ("-x", 2)])
def test_the_generator_takes_an_option_for_no_directory(script: str, arg: str, rc: int, tmp_path: Path) -> None:
    gen = ROOT / "scripts" / script
    proc = subprocess.run([sys.executable, str(gen), arg], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == rc and "OUTDIR" in proc.stdout + proc.stderr
    assert list(tmp_path.iterdir()) == []
