"""What the commands and faces share on their command lines: the exit codes and the common options.

``ExitCode`` is the one list of exit codes (``nodehealth`` and its commands, the faces run by hand);
``add_config``, ``add_format`` and ``add_simulate`` declare ``--config``, ``--format`` and ``--simulate``
once, with one help text each; the value of ``--simulate`` is applied in one place,
``nodehealth.config.use``. Nothing here imports argparse at run time, so the faces' by-hand path
(``faces/args.py``, which parses its four options itself) can use ``ExitCode`` for the price of ``enum``.
"""

from __future__ import annotations

import enum

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from typing import Optional, Sequence


class ExitCode(enum.IntEnum):
    """The exit codes of ``nodehealth`` (docs/cli.md, man/nodehealth.8) and of a face run by hand."""

    OK = 0  # healthy (warnings allowed), or done
    FAULT = 1  # a check failed (a face: the node is drained); ``daemon``: cannot start; ``status``: drained or failing
    USAGE = 2  # bad command line, configuration or scenario: nothing was done
    INTERNAL = 3  # a bug in nodehealth
    # ``status`` only: it cannot tell (no daemon verdict yet, the daemon stopped, an UNKNOWN verdict, a
    # config that does not validate)
    NO_VERDICT = 4
    INTERRUPTED = 130  # Ctrl-C


CONFIG_HELP = "config file (default: $NODEHEALTH_CONFIG or /etc/nodehealth/nodehealth.toml)"
SIMULATE_HELP = "use simulated GPUs from this scenario file (needs nodehealth-sim)"


def add_config(parser: argparse.ArgumentParser, help: Optional[str] = None) -> None:
    """``--config FILE`` (``args.config``; None: ``$NODEHEALTH_CONFIG`` or the default path)."""
    parser.add_argument("--config", metavar="FILE", default=None, help=help or CONFIG_HELP)


def add_format(
    parser: argparse.ArgumentParser, choices: Sequence[str] = ("text", "json"), help: Optional[str] = None
) -> None:
    """``--format`` (``args.format``), the first choice the default."""
    parser.add_argument(
        "--format", choices=tuple(choices), default=choices[0], help=help or f"output format (default: {choices[0]})"
    )


def add_simulate(parser: argparse.ArgumentParser, metavar: str = "FILE", help: Optional[str] = None) -> None:
    """``--simulate FILE`` (``args.simulate``), applied by ``nodehealth.config.use.use``."""
    parser.add_argument("--simulate", metavar=metavar, default=None, help=help or SIMULATE_HELP)
