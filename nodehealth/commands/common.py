"""Helpers the commands share: loading config the same way everywhere, stream colour."""

from __future__ import annotations

import argparse
import os
import sys
from typing import IO, Optional

from nodehealth.config.loader import ConfigError, load
from nodehealth.config.schema import Config
from nodehealth.probes import ProbeSetupError, validate


class UsageError(Exception):
    """Bad command line, config or scenario: one line on stderr, exit 2."""


def load_config(args: argparse.Namespace, host: Optional[str] = None) -> Config:
    """Config from --config / NODEHEALTH_CONFIG / the default path, with --simulate applied."""
    import dataclasses

    try:
        cfg = load(getattr(args, "config", None), host=host)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    simulate = getattr(args, "simulate", None)
    if simulate:
        cfg = dataclasses.replace(cfg, nvml=dataclasses.replace(cfg.nvml, simulate=os.path.abspath(simulate)))
    try:
        validate(cfg)
    except ProbeSetupError as exc:
        raise UsageError(str(exc)) from None
    return cfg


def use_color(stream: IO[str]) -> bool:
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    return hasattr(stream, "isatty") and stream.isatty() and os.environ.get("TERM") != "dumb"


def fail_usage(exc: Exception) -> int:
    """One line on stderr, exit 2; what the command line gave (a name, a path) is shown ``printable``."""
    from nodehealth.xid.text import printable

    print(f"nodehealth: {printable(str(exc), None)}", file=sys.stderr)
    return 2
