"""Helpers the commands share: loading config the same way everywhere, stream colour."""

from __future__ import annotations

import argparse
import os
import sys
from typing import IO, Optional

from nodehealth.commands.options import ExitCode
from nodehealth.config.schema import Config
from nodehealth.config.use import ConfigError, use


class UsageError(Exception):
    """Bad command line, config or scenario: one line on stderr, exit 2."""


def load_config(args: argparse.Namespace, host: Optional[str] = None) -> Config:
    """Config from --config / NODEHEALTH_CONFIG / the default path, with --simulate applied
    (``nodehealth.config.use``: the file's own config or a usage error, nothing recorded)."""
    try:
        return use(
            getattr(args, "config", None), fallback="none", simulate=getattr(args, "simulate", None), host=host
        ).cfg
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def use_color(stream: IO[str]) -> bool:
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    return hasattr(stream, "isatty") and stream.isatty() and os.environ.get("TERM") != "dumb"


def fail_usage(exc: Exception) -> int:
    """One line on stderr (one per error, when a config has several), exit 2; what the command line or
    the file gave (a name, a path) is shown ``printable``."""
    from nodehealth.observations.text import printable

    first, *rest = str(exc).split("\n")
    print(
        "\n".join([f"nodehealth: {printable(first, None)}", *(printable(line, None) for line in rest)]), file=sys.stderr
    )
    return ExitCode.USAGE
