"""The memory of the drain/resume sequence (``nodehealth.slurm.act``): the state dir, or a preview's copy.

A store has ``load()``, ``update(change, lock_timeout_s, log)`` and ``update_doc(name, change,
lock_timeout_s)``: ``FileStore`` changes the Slurm state file and the small JSON records under their
locks; ``MemoryStore`` starts from what the files hold and changes only itself (``--dry-run``,
``check --as``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Optional

from nodehealth.statedir import records, slurmstate
from nodehealth.statedir.slurmstate import State

Log = Callable[..., None]  # log(message, notable=False)


class FileStore:
    """The sequence's memory in the state dir: the Slurm state file and the small JSON records."""

    def __init__(self, paths: Any) -> None:
        self.paths = paths

    def load(self) -> State:
        return slurmstate.load(self.paths)

    def update(self, change: Callable[[State], State], lock_timeout_s: float, log: Log) -> Optional[State]:
        return slurmstate.update(self.paths, change, lock_timeout_s, log)

    def update_doc(
        self, name: str, change: Callable[[dict[str, Any]], dict[str, Any]], lock_timeout_s: float
    ) -> dict[str, Any]:
        return records.update_doc(self.paths, name, change, lock_timeout_s)


class MemoryStore:
    """The sequence's memory for a preview: what the state dir holds now, changed in memory only.

    Starts from the state file with nothing marked as said (a preview shows every line the run
    would say); changes and records (the reboot count) stay in this object, the files untouched."""

    def __init__(self, paths: Any) -> None:
        self.paths = paths
        self.state = replace(slurmstate.load(paths), logged=None)
        self.docs: dict[str, dict[str, Any]] = {}

    def load(self) -> State:
        return self.state

    def update(self, change: Callable[[State], State], lock_timeout_s: float, log: Log) -> Optional[State]:
        self.state = change(self.state)
        return self.state

    def update_doc(
        self, name: str, change: Callable[[dict[str, Any]], dict[str, Any]], lock_timeout_s: float
    ) -> dict[str, Any]:
        doc = dict(self.docs[name]) if name in self.docs else records.read_doc(self.paths, name)
        self.docs[name] = change(doc)
        return self.docs[name]
