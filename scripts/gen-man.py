#!/usr/bin/env python3
"""Write man pages generated from the argument parsers (argparse-manpage) and the config schema:
nodehealth(8), the faces' pages (8) and nodehealth.toml(5).

python scripts/gen-man.py OUTDIR

Each section 8 page is the parser's NAME, SYNOPSIS, DESCRIPTION and OPTIONS, then EXIT STATUS (the
``ExitCode`` enum, in the words below), ENVIRONMENT, FILES (the state files from the table in
``nodehealth/statedir/layout.py``), EXAMPLES and SEE ALSO. nodehealth.toml(5) lists every key of the
schema with its default, unit, choices and range, as ``nodehealth config defaults`` does.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

from argparse_manpage.manpage import Manpage

from nodehealth import __version__
from nodehealth.cli import build_parser
from nodehealth.commands.options import ExitCode
from nodehealth.config import lean
from nodehealth.config.sample import fields_of, key_note
from nodehealth.config.schema import Config
from nodehealth.faces.args import usage
from nodehealth.faces.table import BY_NAME, FACES
from nodehealth.registry import CHECKS, PHASES
from nodehealth.statedir import layout

FACE_SECTION = "8"
CONFIG_PAGE = "nodehealth.toml"
SCENARIOS = "/usr/share/nodehealth/scenarios"

# What each exit code means, for nodehealth(8); every member of ExitCode has its words here.
EXIT_WORDS = {
    ExitCode.OK: "healthy (warnings allowed), or the command did what was asked; a preview (--as, --dry-run) done",
    ExitCode.FAULT: "a check FAILed; status: the node is drained or failing; daemon: it cannot start as configured",
    ExitCode.USAGE: "a bad command line, configuration or scenario file: nothing was done; xid explain: an XID "
    "the catalog does not list (its stand-in entry is printed)",
    ExitCode.INTERNAL: "an internal error (a bug in nodehealth: please report it with the output)",
    ExitCode.NO_VERDICT: "status only: it cannot tell (no daemon verdict yet, the daemon stopped, an UNKNOWN verdict)",
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C)",
}
FACE_EXIT = {
    0: "the node may take the job (or, --dry-run, the decision was printed)",
    1: "a node fault: nodehealth has drained the node with its reason (slurmd drains it too: "
    '"Prolog error" or "Epilog error"); the health check drains by itself, Slurm only logs its exit code',
    2: "a usage error (an unknown argument): nothing was done",
}
ENVIRONMENT = {
    lean.ENV_VAR: f"the configuration file, instead of {lean.DEFAULT_PATH} (--config sets it)",
    "NO_COLOR": "set: no colour in the text report, even on a terminal",
}
FACE_ENVIRONMENT = {
    lean.ENV_VAR: f"the configuration file, instead of {lean.DEFAULT_PATH}",
    "SLURM_JOB_ID, SLURM_JOB_USER, SLURM_JOB_GPUS, CUDA_VISIBLE_DEVICES": "the job slurmd runs the face for "
    "(its id, user and GPUs); set them by hand with --dry-run to preview a job",
}
EXAMPLES = {
    "nodehealth": [
        ("Check this node, as a person reads it:", "nodehealth check"),
        ("Only what is not OK, as JSON:", "nodehealth check -q --format json"),
        ("Two checks on GPU 3:", "nodehealth check --only gpu_ecc,gpu_remapped_rows --gpu 3"),
        (
            "What the prolog would decide for job 42 on GPUs 0 and 1:",
            "nodehealth check --as prolog --job 42 --gpus 0,1",
        ),
        ("A simulated node (needs nodehealth-sim):", f"nodehealth check --simulate {SCENARIOS}/row-remap-pending.toml"),
        ("What nodehealth knows of this node now:", "nodehealth status"),
        ("Validate a configuration file before installing it:", "nodehealth config check /tmp/nodehealth.toml"),
        ("The XID errors of this boot, and what XID 79 means:", "nodehealth xid scan; nodehealth xid explain 79"),
        ("Shell completion for bash (the packages install it):", "nodehealth completion bash"),
    ],
}
FACE_EXAMPLES = [
    ("In slurm.conf:", "{key}/usr/bin/{script}"),
    (
        "What it would decide for job 42 on GPUs 0 and 1, changing nothing:",
        "SLURM_JOB_ID=42 SLURM_JOB_GPUS=0,1 {script} --dry-run",
    ),
]


def roff(text: str) -> str:
    """Plain text made safe for a man page line."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return re.sub(r"^([.'])", r"\\&\1", text)


def state_files() -> list[tuple[str, str, str]]:
    """(name, where, what) of every state file, from the table in statedir/layout.py's docstring."""
    rows: list[list[str]] = []
    for line in (layout.__doc__ or "").splitlines():
        m = re.match(r"^``([^`]+)``\s+(.+?)\s{2,}(run\*?|kept)\s{2,}", line)
        if m:
            rows.append([m.group(1), m.group(3), m.group(2)])
        elif rows and re.match(r"^\s{20,}\S", line) and not line.strip().startswith("="):
            rows[-1][2] += " " + line.strip()
    return [(name, where, what) for name, where, what in rows]


def _section(title: str, items: list[tuple[str, str]]) -> str:
    out = [f'.SH "{title}"']
    for head, body in items:
        out += [".TP", f"\\fB{roff(head)}\\fR", roff(body)]
    return "\n".join(out) + "\n"


def _examples(items: list[tuple[str, str]]) -> str:
    out = ['.SH "EXAMPLES"']
    for said, command in items:
        out += [".PP", roff(said), ".PP", ".RS", ".nf", f"\\fB{roff(command)}\\fR", ".fi", ".RE"]
    return "\n".join(out) + "\n"


def files_section() -> str:
    run, kept = lean.documented(lean.default("paths.state_dir")), lean.documented(lean.default("paths.persistent_dir"))
    items = [(lean.DEFAULT_PATH, f"the configuration (nodehealth.toml(5)); {lean.ENV_VAR} or --config name another")]
    for name, where, what in state_files():
        folder = kept if where == "kept" else run
        items.append((f"{folder}/{name}", re.sub(r"``", "", what)))
    items.append((SCENARIOS, "the shipped scenario files for --simulate (nodehealth-sim runs them)"))
    return _section("FILES", items)


def _extra(name: str) -> str:
    faces = ", ".join(f"{row.script}(8)" for row in FACES)
    if name == "nodehealth":
        exit_items = [(str(int(code)), EXIT_WORDS[code]) for code in ExitCode]
        see = f"{CONFIG_PAGE}(5), {faces}, slurm.conf(5), scontrol(1)"
        return (
            _section("EXIT STATUS", exit_items)
            + _section("ENVIRONMENT", list(ENVIRONMENT.items()))
            + files_section()
            + _examples(EXAMPLES["nodehealth"])
            + f'.SH "SEE ALSO"\n{roff(see)}\n'
        )
    row = next(r for r in FACES if r.script == name)
    examples = [(said, cmd.format(key=row.started_by, script=row.script)) for said, cmd in FACE_EXAMPLES]
    return (
        _section("EXIT STATUS", [(str(code), words) for code, words in FACE_EXIT.items()])
        + _section("ENVIRONMENT", list(FACE_ENVIRONMENT.items()))
        + files_section()
        + _examples(examples)
        + f'.SH "SEE ALSO"\n{roff(f"nodehealth(8), {CONFIG_PAGE}(5), slurm.conf(5)")}\n'
    )


def face_parser(face: str) -> argparse.ArgumentParser:
    """The faces parse their few options by hand (nothing to import on the prolog's path); this is
    the same surface for the page, kept honest by tests/test_man_completion.py."""
    row = BY_NAME[face]
    p = argparse.ArgumentParser(
        prog=row.script, description=usage(face).split("\n\n", 1)[1].split("\n\n")[0].replace("\n", " ")
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="decide as Slurm's run would and print it; change "
        "nothing (no drain, no resume, no state written, no Slurm call)",
    )
    p.add_argument("--config", metavar="FILE", help="the config file")
    p.add_argument("--version", action="store_true", help="print the version and exit")
    return p


def _keys(obj: Any, table: str, out: list[str]) -> None:
    scalars, nested = fields_of(obj)
    if scalars and table:
        out.append(f".SS [{roff(table)}]")
    for f, value in scalars:
        shown = lean.documented(value)
        default = f'"{shown}"' if isinstance(shown, str) else str(shown).lower() if isinstance(shown, bool) else shown
        out += [".TP", f"\\fB{roff(f.name)}\\fR = {roff(str(default))}", roff(key_note(f))]
    for f, value in nested:
        _keys(value, f"{table}.{f.name}" if table else f.name, out)


def config_page() -> str:
    """nodehealth.toml(5): every key of the schema, and every check's table."""
    out = [
        f'.TH NODEHEALTH.TOML "5" "" "nodehealth {__version__}" "nodehealth"',
        ".SH NAME",
        f"{CONFIG_PAGE} \\- the configuration file of nodehealth",
        ".SH SYNOPSIS",
        roff(lean.DEFAULT_PATH),
        ".SH DESCRIPTION",
        roff(
            f"TOML. Every key is optional; its default is shown below. Unknown keys, wrong types, out-of-range "
            f"values and relative paths are errors that name the key: while the file does not validate, "
            f"nodehealth keeps checking with the last version of it that did. {lean.ENV_VAR} or --config name "
            "another file; `nodehealth config defaults` prints this list as a commented file and "
            "`nodehealth config check FILE` validates one. Running as root, the file and its directories "
            "must be root's own and not writable by group or others."
        ),
        ".SH KEYS",
    ]
    _keys(Config(), "", out)
    out.append('.SH "CHECKS"')
    out.append(roff("Each check has a table of its own, [checks.NAME], with enabled and timeout_s and its settings."))
    for spec in CHECKS:
        out.append(f".SS [checks.{roff(spec.name)}]")
        phases = ", ".join(p for p in PHASES if p in spec.phases)
        out.append(roff(f"{spec.summary} Phases: {phases}; on by default: {'yes' if spec.default_enabled else 'no'}."))
        _keys(spec.settings_class(), "", out)
    out += [
        '.SH "PER-HOST OVERRIDES"',
        roff(
            "Each [[override]] applies to the nodes its Slurm hostlist expression (hosts) names, in file order "
            "(later wins); any table above may appear inside one, as dotted keys."
        ),
        ".PP",
        ".nf",
        roff('[[override]]\nhosts = "gpu[001-064]"\ngpu.expected_count = 4'),
        ".fi",
        '.SH "FILES"',
        roff(lean.DEFAULT_PATH),
        '.SH "SEE ALSO"',
        roff("nodehealth(8), " + ", ".join(f"{row.script}(8)" for row in FACES)),
    ]
    return "\n".join(out) + "\n"


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1].startswith("-"):  # an option is no OUTDIR: never a directory "--help"
        print(__doc__.strip(), file=sys.stdout if sys.argv[1] in ("-h", "--help") else sys.stderr)
        return 0 if sys.argv[1] in ("-h", "--help") else 2
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "build/man")
    out.mkdir(parents=True, exist_ok=True)
    pages = {"nodehealth": build_parser()}
    pages.update({row.script: face_parser(row.name) for row in FACES})
    titles = {row.script: f"the Slurm {row.title} ({row.started_by}) of nodehealth" for row in FACES}
    for name, parser in pages.items():
        parser.prog = name
        summary = titles.get(name, "node-health checks for the GPU nodes of a Slurm cluster")
        page = Manpage(
            parser,
            _data={
                "project_name": "nodehealth",
                "version": __version__,
                "manual_section": FACE_SECTION,
                "manual_title": "nodehealth",
                "description": summary,
            },
        )
        text = str(page)
        (out / f"{name}.{FACE_SECTION}").write_text(
            text + ("" if text.endswith("\n") else "\n") + _extra(name), encoding="utf-8"
        )
    (out / f"{CONFIG_PAGE}.5").write_text(config_page(), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
