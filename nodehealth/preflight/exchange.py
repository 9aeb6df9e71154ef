"""The exchange over the shared directory: no service, a barrier with a deadline, nothing left behind.

Layout: ``<shared>/.nodehealth-preflight-<job>-<step>/`` holds, per rank ``r``,

* ``r<r>.json``: its report (written atomically: ``.tmp-<r>-<pid>`` then rename);
* ``p<r>.json``: what it saw of its ring peers ``r+1 .. r+k`` (mod N) tokens;

and, from rank 0, ``verdict.json``. Every rank: mkdir, write its report, wait for its ``k`` peers'
reports (a stat each poll) until the ring deadline, write its peer file, wait for the verdict
(a stat each poll), read it, remove its own files. Rank 0 instead lists the directory until every
rank's two files are there or the deadline passes, reads each (O(N), rank 0 only), writes the
verdict, waits (listing) until the others removed their files or a short grace passed, then
removes whatever is left (a killed rank's files, temp files), the verdict and the directory.

Per rank, the operations are a constant (``FsOps``) apart from polls, whose number depends on
how long it waits, never on N. All file names are fixed by rank: nobody scans for peers.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from nodehealth.preflight.ranks import Rank

PREFIX = ".nodehealth-preflight-"
VERDICT = "verdict.json"
RING = 2  # peers each rank reads
_OWN = re.compile(r"^(?:[rp](\d+)\.json|\.tmp-(\d+)-\d+)$")


@dataclass
class FsOps:
    """Shared-file-system operations of one rank, by kind (``polls`` are stats/listings while waiting)."""

    counts: dict[str, int] = field(default_factory=dict)

    def add(self, kind: str, n: int = 1) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + n

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def polls(self) -> int:
        return self.counts.get("poll_stat", 0) + self.counts.get("poll_list", 0)

    def to_json(self) -> dict[str, Any]:
        return {"total": self.total, "polls": self.polls, "by_kind": dict(sorted(self.counts.items()))}


def directory(shared: str, rank: Rank) -> str:
    return os.path.join(shared, f"{PREFIX}{rank.job_id}-{rank.step_id}")


def peers(rank: int, size: int, k: int = RING) -> list[int]:
    """The ring peers of ``rank``: the next ``k`` ranks (fewer in a small step; never itself)."""
    return [(rank + i) % size for i in range(1, min(k, size - 1) + 1)]


@dataclass
class Gathered:
    """Rank 0's view after the barrier: reports and peer files by rank, who is missing."""

    reports: dict[int, dict[str, Any]]
    peer_views: dict[int, dict[str, Any]]
    unreadable: dict[int, str]
    waited_s: float


class Exchange:
    """One rank's side of the protocol. ``clock`` and ``sleep`` are injectable for tests."""

    def __init__(self, shared: str, rank: Rank, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.rank, self.clock, self.sleep = rank, clock, sleep
        self.shared = shared
        self.dir = directory(shared, rank)
        self.ops = FsOps()
        self.created_dir = False

    # ------------------------------------------------------------ files

    def _path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def open_dir(self) -> None:
        """Create the step's directory (any rank may be first); raises OSError when the shared dir is unusable."""
        self.ops.add("mkdir")
        try:
            os.mkdir(self.dir, 0o700)
            self.created_dir = True
        except FileExistsError:
            pass

    def write(self, name: str, doc: dict[str, Any]) -> None:
        """Atomically: a temp file (O_EXCL, fsync), then rename over ``name``."""
        data = (json.dumps(doc, sort_keys=True) + "\n").encode()
        tmp = self._path(f".tmp-{self.rank.rank}-{os.getpid()}")
        self.ops.add("create")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        self.ops.add("rename")
        os.rename(tmp, self._path(name))

    def read(self, name: str) -> dict[str, Any]:
        self.ops.add("read")
        with open(self._path(name), "rb") as fh:
            doc = json.loads(fh.read(1 << 20).decode("utf-8", "replace"))
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
        return doc

    def exists(self, name: str) -> bool:
        self.ops.add("poll_stat")
        try:
            os.stat(self._path(name))
        except FileNotFoundError:
            return False
        return True

    def remove(self, name: str) -> None:
        self.ops.add("unlink")
        try:
            os.unlink(self._path(name))
        except FileNotFoundError:
            pass

    def listing(self) -> set[str]:
        self.ops.add("poll_list")
        return set(os.listdir(self.dir))

    def _wait(self, until: float, done: Callable[[], bool]) -> bool:
        pause = 0.01
        while True:
            if done():
                return True
            left = until - self.clock()
            if left <= 0:
                return False
            self.sleep(min(pause, left))
            pause = min(pause * 1.5, 0.1)

    # ------------------------------------------------------------ protocol

    def publish(self, report: dict[str, Any]) -> None:
        self.write(f"r{self.rank.rank}.json", report)

    def ring(self, until: float) -> dict[str, Any]:
        """Wait for the ring peers' reports until ``until``; record what was seen; write ``p<r>.json``."""
        want = peers(self.rank.rank, self.rank.size)
        seen: dict[int, str] = {}
        t0 = self.clock()

        def all_seen() -> bool:
            for p in want:
                if p not in seen and self.exists(f"r{p}.json"):
                    try:
                        doc = self.read(f"r{p}.json")
                        seen[p] = "ok" if doc.get("rank") == p else f"holds rank {doc.get('rank')!r}"
                    except (OSError, ValueError) as exc:
                        seen[p] = f"unreadable: {exc}"
            return len(seen) == len(want)

        self._wait(until, all_seen)
        view = {"rank": self.rank.rank, "node": self.rank.node, "waited_s": round(self.clock() - t0, 3),
                "peers": {str(p): seen.get(p, "missing") for p in want}}
        self.write(f"p{self.rank.rank}.json", view)
        return view

    def gather(self, until: float) -> Gathered:
        """Rank 0: list the directory until every rank's two files are there (or ``until``), then read them."""
        n = self.rank.size
        wanted = {f"{k}{r}.json" for r in range(n) for k in "rp"}
        t0 = self.clock()
        names: set[str] = set()

        def complete() -> bool:
            nonlocal names
            names = self.listing()
            return wanted <= names

        self._wait(until, complete)
        reports: dict[int, dict[str, Any]] = {}
        views: dict[int, dict[str, Any]] = {}
        bad: dict[int, str] = {}
        for r in range(n):
            for kind, into in (("r", reports), ("p", views)):
                name = f"{kind}{r}.json"
                if name not in names:
                    continue
                try:
                    into[r] = self.read(name)
                except (OSError, ValueError) as exc:
                    bad[r] = f"{name}: {exc}"
        return Gathered(reports, views, bad, self.clock() - t0)

    def announce(self, verdict: dict[str, Any]) -> None:
        self.write(VERDICT, verdict)

    def await_verdict(self, until: float) -> Optional[dict[str, Any]]:
        if not self._wait(until, lambda: self.exists(VERDICT)):
            return None
        try:
            return self.read(VERDICT)
        except (OSError, ValueError):
            return None

    def leave(self) -> None:
        """Any rank but 0: remove its own files; the last one out of a directory nobody else uses removes it."""
        for name in (f"r{self.rank.rank}.json", f"p{self.rank.rank}.json"):
            self.remove(name)

    def leave_unshared(self) -> None:
        """No verdict came: remove our files and, when the directory is then empty, the directory too."""
        self.leave()
        self.ops.add("rmdir")
        try:
            os.rmdir(self.dir)
        except OSError:
            pass

    def close(self, grace_until: float) -> list[str]:
        """Rank 0, after the verdict: wait until the others removed their files (or ``grace_until``),
        then remove every leftover, the verdict and the directory. Returns the leftovers removed."""
        me = self.rank.rank
        left: set[str] = set()

        def others_gone() -> bool:
            nonlocal left
            left = {n for n in self.listing() if _owner(n) not in (None, me)}
            return not left

        try:
            self._wait(grace_until, others_gone)
            removed = sorted(left)
            for name in sorted(self.listing()):
                self.remove(name)
            self.ops.add("rmdir")
            os.rmdir(self.dir)
        except FileNotFoundError:
            return []
        except OSError:  # a late rank wrote again: its own exit removes its files
            return sorted(left)
        return removed


def _owner(name: str) -> Optional[int]:
    """The rank a file of the directory belongs to (None: the verdict or a stranger)."""
    m = _OWN.match(name)
    if not m:
        return None
    return int(m.group(1) or m.group(2))
