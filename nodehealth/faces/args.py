"""The faces' command line, for a person running one by hand (Slurm passes no argument).

``--help``, ``--version``, ``--dry-run`` (decide and print, change nothing: no drain, no resume,
no state written), ``--config FILE``. Any other argument is a usage error (exit 2) that acts on
nothing. Parsed only when there are arguments, so the prolog's fast path pays nothing for it.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional, Sequence

USAGE = """usage: {script} [--dry-run] [--config FILE] | --help | --version

The Slurm {title} of nodehealth ({started_by}). Slurm runs it with no arguments; then it
{does}.

  --dry-run      decide as Slurm's run would and print it; change nothing (no drain, no resume,
                 no state written, no Slurm call); exit with the code the face would exit with
                 (0 healthy, 1 it would fail and drain)
  --config FILE  the config file (default: $NODEHEALTH_CONFIG or /etc/nodehealth/nodehealth.toml)
  --version      print the version and exit
  --help         print this and exit

To see what it would decide for a job: SLURM_JOB_ID=N SLURM_JOB_GPUS=0,1 {script} --dry-run,
or nodehealth check --as {face} --job N --gpus 0,1.
"""


# The faces' options: the flags, the value's metavar ("" when none) and a line of what it does (the shell
# completion, generated from this, shows the line; USAGE says it at length).
OPTION_TABLE = (
    (("--dry-run",), "", "decide as Slurm's run would and print it; change nothing"),
    (("--config",), "FILE", "the config file (default: $NODEHEALTH_CONFIG or /etc/nodehealth/nodehealth.toml)"),
    (("-V", "--version"), "", "print the version and exit"),
    (("-h", "--help"), "", "print the usage and exit"),
)
OPTIONS = tuple(flags[-1] for flags, _, _ in OPTION_TABLE)


def usage(face: str) -> str:
    """The face's ``--help`` text, from its row of ``faces.table``."""
    from nodehealth.faces.table import BY_NAME

    row = BY_NAME[face]
    return USAGE.format(face=face, script=row.script, title=row.title, started_by=row.started_by, does=row.does)


def handle(face: str, argv: Sequence[str]) -> Optional[int]:
    """None: no arguments, run as Slurm does. Else the exit code, having done what was asked."""
    args = list(argv)
    if not args:
        return None
    from nodehealth.commands.options import ExitCode
    from nodehealth.faces.table import BY_NAME

    row = BY_NAME[face]
    dry_run = False
    while args:
        arg = args.pop(0)
        if arg in ("-h", "--help"):
            sys.stdout.write(usage(face))
            return ExitCode.OK
        if arg in ("-V", "--version"):
            from nodehealth.commands.version import describe

            sys.stdout.write(describe(row.script) + "\n")
            return ExitCode.OK
        if arg == "--dry-run":
            dry_run = True
        elif arg == "--config" or arg.startswith("--config="):
            value = arg.partition("=")[2] if "=" in arg else (args.pop(0) if args else "")
            if not value:
                return _usage(face, "--config needs a FILE")
            os.environ["NODEHEALTH_CONFIG"] = value
        else:
            import difflib

            from nodehealth.observations.text import printable

            near = difflib.get_close_matches(arg.partition("=")[0], OPTIONS, n=1)
            return _usage(
                face, f"unknown argument '{printable(arg)}'" + (f" (did you mean {near[0]}?)" if near else "")
            )
    if not dry_run:
        return _usage(face, "--config is for --dry-run (Slurm runs the face with no arguments)")
    from nodehealth.faces.preview import preview

    result = preview(face, os.environ)
    if result.report is not None:
        from nodehealth import render

        sys.stdout.write(render.text(result.report, color=False))
    sys.stdout.write("\n".join(result.lines()) + "\n")
    return result.exit_code


def _usage(face: str, message: str) -> int:
    from nodehealth.commands.options import ExitCode
    from nodehealth.faces.table import BY_NAME

    sys.stderr.write(f"{BY_NAME[face].script}: error: {message} (nothing was done; see --help)\n")
    return ExitCode.USAGE
