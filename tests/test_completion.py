"""Shell completion as a person meets it: the generated bash, zsh and fish scripts run in the shells
themselves, completing subcommands, options, check names for --only and scenario files for --simulate;
and the packages install all three."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nodehealth.cli import build_parser
from nodehealth.commands.completion import SCENARIO_DIR, script, tree
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
    completed), through the function the script registers."""
    prog = (
        f'source {completion}; COMP_WORDS=("$@"); COMP_CWORD=$(( $# - 1 )); '
        "fn=$(complete -p nodehealth | sed 's/.*-F \\([^ ]*\\).*/\\1/'); $fn; printf '%s\\n' \"${COMPREPLY[@]}\""
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
    spec = importlib.util.spec_from_file_location("gen_completion", gen)
    assert spec is not None and spec.loader is not None
    files = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert files == ["_nodehealth", "nodehealth", "nodehealth.fish"]
    install = (ROOT / "packaging" / "debian" / "nodehealth.install").read_text(encoding="utf-8")
    rules = (ROOT / "packaging" / "debian" / "rules").read_text(encoding="utf-8")
    rpm = (ROOT / "packaging" / "rpm" / "nodehealth.spec").read_text(encoding="utf-8")
    assert "scripts/gen-completion.py debian/completions" in rules and "scripts/gen-completion.py completions" in rpm
    where = {
        "nodehealth": ("usr/share/bash-completion/completions/", "%{_datadir}/bash-completion/completions/"),
        "_nodehealth": ("usr/share/zsh/vendor-completions/", "%{_datadir}/zsh/site-functions/"),
        "nodehealth.fish": ("usr/share/fish/vendor_completions.d/", "%{_datadir}/fish/vendor_completions.d/"),
    }
    for name in files:
        deb, rpm_dir = where[name]
        assert f"debian/completions/{name} {deb}\n" in install, name
        assert f"{rpm_dir}{name}\n" in rpm.split("%files", 1)[1], name
