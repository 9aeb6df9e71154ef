"""Small JSON records of the Slurm sequence in the persistent dir (observe mode's would-be drain, the reboot
count): read as an object or nothing, written atomically under a lock, 0600, through ``statedir.files``."""

from __future__ import annotations

from typing import Any, Callable, Mapping

from nodehealth.statedir import files, layout


def read_doc(paths: Any, name: str) -> dict[str, Any]:
    """A small JSON object of ours in the persistent dir (``{}`` when absent, unsafe or unusable)."""
    if files.check_dir(layout.dir_for(paths, name)):
        return {}
    got = files.read_json(layout.path_for(paths, name))
    return dict(got) if isinstance(got, Mapping) else {}


def update_doc(
    paths: Any, name: str, change: Callable[[dict[str, Any]], dict[str, Any]], lock_timeout_s: float = 0.5
) -> dict[str, Any]:
    """Re-read the object under its lock, apply ``change``, write it atomically (0600) through
    ``files.update_json`` (never more than the readers read); OSError when it cannot be written
    (an unsafe directory is one, a document over ``files.MAX_READ`` another)."""
    p = layout.path_for(paths, name)
    files.require_state_dir(layout.dir_for(paths, name))
    return files.update_json(p, lambda raw: change(dict(raw) if isinstance(raw, Mapping) else {}), lock_timeout_s)
