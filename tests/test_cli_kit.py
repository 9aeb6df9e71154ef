"""The CLI kit: one exit-code enum, the shared options declared once (``commands/options.py``), ``--simulate``
applied in one place and one config-load recipe (``config/use.py``). Each rule reads the source of the
product (``ast``), and each is also run on a small source that breaks it, so a rule that stops catching
anything fails too."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from nodehealth.cli import EXIT_FAIL, EXIT_INTERNAL, EXIT_OK, EXIT_USAGE, main
from nodehealth.commands.options import ExitCode
from nodehealth.config.use import simulated, use

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "nodehealth"
SHARED = ("--config", "--format", "--simulate")
# Declarations of a shared option allowed outside commands/options.py, each with its reason.
OWN_OPTION = {
    # the NCCL parsers are a lower layer than commands/ (they may not import it); ``--format`` only
    ("nccl/cli_parse.py", "--format"): "nccl/ may not import commands/",
    # ``validate-nvml --simulate SCENARIO`` records a simulated node: another meaning, the validation kit's
    ("commands/validate.py", "--simulate"): "the validation kit's own option",
}
# Where the config is loaded: config/use.py for every face, command and the daemon; these besides.
OWN_LOAD = {
    "config/": "the loader itself",
    "daemon/core.py": "SIGHUP's reload keeps the running config on a bad file (load_valid, no fallback)",
    "daemon/config_watch.py": "the same reload and the changed-file watch, split out of daemon/core.py",
    "commands/config_cmd.py": "`config check FILE` validates a file given by name (load, nothing else)",
}


def _modules() -> list[tuple[str, ast.Module]]:
    out = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).as_posix()
        out.append((rel, ast.parse(path.read_text(encoding="utf-8"), rel)))
    return out


def option_declarations(tree: ast.AST) -> list[str]:
    """The shared options a module declares itself (``add_argument("--format", ...)``)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            for arg in node.args:
                if isinstance(arg, ast.Constant) and arg.value in SHARED:
                    found.append(str(arg.value))
    return found


def simulate_overrides(tree: ast.AST) -> int:
    """``replace(..., simulate=...)``: an ``[nvml] simulate`` set by hand."""
    return sum(
        1
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        for kw in node.keywords
        if kw.arg == "simulate"
        and isinstance(node.func, (ast.Attribute, ast.Name))
        and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id) == "replace"
    )


def config_loads(tree: ast.AST) -> list[str]:
    """Calls of the loader's entry points (``load``, ``load_safe``, ``load_valid`` of ``config.loader``)."""
    names = {"load_safe", "load_valid"}
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "nodehealth.config.loader":
            imported |= {a.asname or a.name for a in node.names if a.name in names | {"load"}}
    return [
        n.func.id
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in imported
    ]


def test_exit_codes_are_one_enum() -> None:
    assert [(c.name, int(c)) for c in ExitCode] == [
        ("OK", 0),
        ("FAULT", 1),
        ("USAGE", 2),
        ("INTERNAL", 3),
        ("NO_VERDICT", 4),
        ("INTERRUPTED", 130),
    ]
    assert (EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_INTERNAL) == tuple(ExitCode)[:4]
    with pytest.raises(SystemExit) as exc:
        main(["no-such-command"])
    assert exc.value.code == ExitCode.USAGE


def test_shared_options_are_declared_once() -> None:
    bad = [
        f"{rel}: {opt}"
        for rel, tree in _modules()
        if rel != "commands/options.py"
        for opt in option_declarations(tree)
        if (rel, opt) not in OWN_OPTION
    ]
    assert bad == [], "declare these with nodehealth.commands.options (add_config, add_format, add_simulate)"
    assert option_declarations(ast.parse('p.add_argument("--format", choices=("a",))')) == ["--format"]


FRONT = ("cli.py", "commands/", "faces/", "daemon/")  # what a person, systemd or Slurm starts


def own_exit_codes(tree: ast.AST) -> list[str]:
    """``EXIT_X = 2`` or ``EXIT_A, EXIT_B = 0, 1``: exit codes as numbers of a module's own."""
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Assign):
            continue
        for target in node.targets:
            names = target.elts if isinstance(target, ast.Tuple) else [target]
            values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
            out += [
                n.id
                for n, v in zip(names, values)
                if isinstance(n, ast.Name) and n.id.startswith("EXIT_") and isinstance(v, ast.Constant)
            ]
    return out


def test_exit_codes_are_not_numbers_of_a_modules_own() -> None:
    """The faces, commands and daemon take their exit codes from ``ExitCode`` (nccl/'s are nccl-tests' and
    its runner's protocol, a lower layer)."""
    bad = [f"{rel}: {name}" for rel, tree in _modules() if rel.startswith(FRONT) for name in own_exit_codes(tree)]
    assert bad == [], "use nodehealth.commands.options.ExitCode"
    assert own_exit_codes(ast.parse("EXIT_OK, EXIT_USAGE = 0, 2\nEXIT_X = ExitCode.OK")) == ["EXIT_OK", "EXIT_USAGE"]


def test_simulate_is_applied_in_one_place() -> None:
    # config/loader.py: a relative ``[nvml] simulate`` in a file is relative to that file (not --simulate)
    bad = [
        rel for rel, tree in _modules() if simulate_overrides(tree) and rel not in ("config/use.py", "config/loader.py")
    ]
    assert bad == [], "apply --simulate with nodehealth.config.use (use(..., simulate=) or simulated())"
    assert simulate_overrides(ast.parse("dataclasses.replace(cfg.nvml, simulate=p)")) == 1


def test_faces_commands_and_daemon_load_the_config_through_use() -> None:
    bad = [
        f"{rel}: {', '.join(calls)}"
        for rel, tree in _modules()
        for calls in [config_loads(tree)]
        if calls and not any(rel.startswith(k) for k in OWN_LOAD)
    ]
    assert bad == [], "load the configuration with nodehealth.config.use.use"
    assert config_loads(ast.parse("from nodehealth.config.loader import load_safe\nload_safe()")) == ["load_safe"]


def test_use_applies_simulate_and_its_fallbacks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from nodehealth.config.loader import ConfigError

    bad = tmp_path / "bad.toml"
    bad.write_text(f'[paths]\nstate_dir = "{tmp_path}/state"\n[gpu]\nexpected_count = "many"\n')
    with pytest.raises(ConfigError):
        use(str(bad), fallback="none")
    got = use(str(bad), fallback="defaults", remember=False, setup=False)
    assert got.error is not None and got.using == "defaults"
    good = tmp_path / "good.toml"
    good.write_text(f'[paths]\nstate_dir = "{tmp_path}/state"\npersistent_dir = "{tmp_path}/lib"\n')
    monkeypatch.chdir(tmp_path)
    assert simulated(use(str(good), fallback="none", setup=False).cfg, "x.toml").nvml.simulate == os.path.join(
        str(tmp_path), "x.toml"
    )
    with pytest.raises(ConfigError):  # a scenario that is not there is a setup error, not a fallback
        use(str(good), fallback="last_good", simulate="missing.toml", remember=False)


def journal_imports(tree: ast.AST) -> int:
    """``from systemd import journal`` / ``import systemd.journal``: looking for the journal."""
    return sum(
        1
        for n in ast.walk(tree)
        if (isinstance(n, ast.ImportFrom) and n.module == "systemd" and any(a.name == "journal" for a in n.names))
        or (isinstance(n, ast.Import) and any(a.name == "systemd.journal" for a in n.names))
    )


def test_one_log_for_faces_and_daemon_and_one_journal_lookup() -> None:
    from nodehealth.daemon import hooks
    from nodehealth.daemon.logs import Log as DaemonLog
    from nodehealth.faces.log import Log as FaceLog
    from nodehealth.platform.log import Log

    assert FaceLog is Log and DaemonLog is Log
    assert not hasattr(hooks.ActSlurm, "_act_log"), "the act sequence takes the daemon's Log as it is"
    # probes/ read the kernel log from the journal (a probe's job); writing to it is looked up in one place
    where = [rel for rel, tree in _modules() if journal_imports(tree) and not rel.startswith("probes/")]
    assert where == ["platform/sdnotify.py"], where
    assert journal_imports(ast.parse("from systemd import journal")) == 1
