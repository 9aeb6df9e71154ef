"""What the daemon checks before it starts (``validate_start``): the probes' setup, the state and
persistent dirs (created 0700, refused when unsafe) and the textfile dir, each failure one clear line."""

from __future__ import annotations

import os

from nodehealth.config.schema import Config


class StartError(Exception):
    """The daemon cannot start as configured (listen address, state dir, textfile dir)."""


def validate_start(cfg: Config) -> None:
    """Fail early, with one clear line, on what would only fail later."""
    from nodehealth.probes import ProbeSetupError, validate

    try:
        validate(cfg)
    except ProbeSetupError as exc:
        raise StartError(str(exc)) from None
    from nodehealth.statedir import files

    dirs = [("state dir", cfg.paths.state_dir)]
    if cfg.paths.persistent_dir != cfg.paths.state_dir:  # one directory for both: a config that moved only state_dir
        dirs.append(("persistent dir", cfg.paths.persistent_dir))
    for what, sd in dirs:
        unsafe = files.ensure_state_dir(sd)  # created 0700; refused when another user's, writable by others, a link
        if unsafe:
            raise StartError(f"{what} {sd}: {unsafe}")
        if not os.access(sd, os.W_OK):
            raise StartError(f"{what} {sd} is not writable")
    td = cfg.daemon.textfile_dir
    if td and not os.path.isdir(td):
        raise StartError(f'textfile_dir {td} does not exist (create it, or set [daemon] textfile_dir = "")')
    if td and not os.access(td, os.W_OK):
        raise StartError(f"textfile_dir {td} is not writable")
