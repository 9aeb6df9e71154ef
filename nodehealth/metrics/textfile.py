"""The daemon's page as a node_exporter textfile-collector file (``[daemon] textfile_dir``)."""

from __future__ import annotations

import os

from nodehealth.statedir import files


def textfile_path(directory: str, name: str) -> str:
    return os.path.join(directory, f"nodehealth-{name}.prom")


def write_textfile(directory: str, name: str, payload: bytes) -> str:
    """Write ``payload`` to ``<directory>/nodehealth-<name>.prom`` atomically (temp, fsync, rename).

    The directory must exist (a missing one is a configuration error, not created here).
    """
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"textfile directory {directory} does not exist")
    path = textfile_path(directory, name)
    files.write_atomic(path, payload.decode("utf-8"), files.FILE_MODE)  # node_exporter reads it
    return path
