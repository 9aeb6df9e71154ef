"""``nodehealth``: the administrator's command line.

Exit codes: 0 healthy (warnings allowed), 1 a check failed, 2 usage or config error,
3 internal error.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from nodehealth.commands import (
    check,
    completion,
    config_cmd,
    daemon,
    list_checks,
    nccl,
    preflight,
    status,
    validate,
    xid,
)
from nodehealth.commands.options import ExitCode

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_INTERNAL = ExitCode.OK, ExitCode.FAULT, ExitCode.USAGE, ExitCode.INTERNAL

# Each command module: register(subparsers) adds its parser and sets func=(args) -> int.
COMMANDS = (check, status, list_checks, config_cmd, xid, daemon, validate, nccl, preflight, completion)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


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


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="nodehealth", description="Health checks for GPU nodes of a Slurm cluster.")
    parser.add_argument(
        "--version",
        action=_Version,
        nargs=0,
        help="print the version, commit, nvidia-ml-py and the NVIDIA driver, and exit",
    )
    parser.set_defaults(root_parser=parser)  # for `completion`, which describes the whole parser
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for module in COMMANDS:
        module.register(sub)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
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
