"""``nodehealth``: the administrator's command line.

Exit codes: 0 healthy (warnings allowed), 1 a check failed, 2 usage or config error,
3 internal error.
"""

from __future__ import annotations

import argparse
import os
import sys

from nodehealth.commands.options import ExitCode

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing only for the annotations: ``import nodehealth.cli`` does not load it
    from typing import Optional, Sequence

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_INTERNAL = ExitCode.OK, ExitCode.FAULT, ExitCode.USAGE, ExitCode.INTERNAL

# Each command module (``nodehealth.commands.<module>``): register(subparsers) adds its parser and sets
# func=(args) -> int. Named by string, with the word that selects it: a run imports only its own command's
# module (``import nodehealth.cli`` imports none), so ``check`` pays nothing for ``xid`` or ``status``.
COMMANDS: tuple[tuple[str, str], ...] = (
    ("check", "check"),
    ("status", "status"),
    ("list-checks", "list_checks"),
    ("config", "config_cmd"),
    ("xid", "xid"),
    ("daemon", "daemon"),
    ("validate-nvml", "validate"),
    ("nccl", "nccl"),
    ("preflight", "preflight"),
    ("completion", "completion"),
)
WHOLE = frozenset({"completion"})  # commands that describe the whole command line: every command registered


def _help_width() -> int:
    """``shutil.get_terminal_size().columns - 2``, argparse's own width for help text, read without
    ``shutil``: argparse makes a formatter for every ``add_argument``, and its ``import shutil`` brings
    bz2, lzma and zlib to every run."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        stdout = sys.__stdout__
        try:
            columns = os.get_terminal_size(stdout.fileno()).columns if stdout is not None else 0
        except (AttributeError, ValueError, OSError):  # closed, detached, not a terminal
            columns = 0
    return (columns or 80) - 2


class _Parser(argparse.ArgumentParser):
    def _get_formatter(self) -> argparse.HelpFormatter:
        # every HelpFormatter takes width; typeshed's protocol names only prog
        return self.formatter_class(prog=self.prog, width=_help_width())  # type: ignore[call-arg]

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")

    def _check_value(self, action: argparse.Action, value: object) -> None:
        """A value outside ``choices`` (a phase, a face, a command) is a usage error naming every choice,
        with the nearest one as ``--only`` names a check's."""
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError as exc:
            import difflib

            choices = [c for c in (action.choices or ()) if isinstance(c, str)]
            near = difflib.get_close_matches(str(value), choices, n=1) if isinstance(value, str) else []
            if not near:
                raise
            raise argparse.ArgumentError(action, f"{exc.message} (did you mean {near[0]}?)") from None


class _Version(argparse.Action):
    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: Optional[str] = None,
    ) -> None:
        from nodehealth.commands.version import describe

        print(describe("nodehealth"))
        parser.exit(0)


def _chosen(argv: Optional[Sequence[str]]) -> tuple[tuple[str, str], ...]:
    """The commands to register: the one ``argv`` names first, else (help, a typo, none) all of them."""
    if argv is None:
        return COMMANDS
    word = next((a for a in argv if not a.startswith("-")), None)
    named = tuple(c for c in COMMANDS if c[0] == word and c[0] not in WHOLE)
    return named or COMMANDS


def build_parser(argv: Optional[Sequence[str]] = None) -> argparse.ArgumentParser:
    """The whole command line; with ``argv``, only the command it names (when it names one)."""
    parser = _Parser(prog="nodehealth", description="Health checks for GPU nodes of a Slurm cluster.")
    parser.add_argument(
        "--version",
        action=_Version,
        nargs=0,
        help="print the version, commit, nvidia-ml-py and the NVIDIA driver, and exit",
    )
    parser.set_defaults(root_parser=parser)  # for `completion`, which describes the whole parser
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    import importlib

    for _, module in _chosen(argv):
        importlib.import_module(f"nodehealth.commands.{module}").register(sub)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        code: int = args.func(args)
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED
    except BrokenPipeError:
        return EXIT_OK
    except Exception as exc:  # noqa: BLE001 - last resort: one line, documented exit code
        print(f"nodehealth: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_INTERNAL
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
