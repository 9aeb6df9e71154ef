"""``nodehealth completion bash|zsh|tcsh``: shell completion generated from the argument parser (shtab)."""

from __future__ import annotations

import argparse
import sys

SHELLS = ("bash", "zsh", "tcsh")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "completion",
        help="print shell completion for nodehealth (bash, zsh, tcsh)",
        description="Print a completion script generated from nodehealth's own argument parser. "
        "bash: nodehealth completion bash > /etc/bash_completion.d/nodehealth",
    )
    p.add_argument("shell", choices=SHELLS)
    p.set_defaults(func=run)


def script(parser: argparse.ArgumentParser, name: str) -> str:
    import shtab

    text: str = shtab.complete(parser, name)  # the shell, positionally
    return text


def run(args: argparse.Namespace) -> int:
    try:
        text = script(args.root_parser, args.shell)
    except ImportError:
        print("nodehealth: completion needs the shtab package (pip install 'nodehealth[completion]')", file=sys.stderr)
        return 2
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return 0
