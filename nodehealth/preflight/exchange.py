"""The exchange over the shared directory: no service, a barrier with a deadline, nothing left behind.

The shared directory is someone else's ground (``platform/ground.py``): any user may have put any
name there. So nothing is found by a predictable name alone:

* rank 0 makes a **fresh directory with a random name**, ``<shared>/.nodehealth-preflight-<job>-<step>-
  <32 hex>/`` (mkdir 0700, verified on its descriptor), and makes its name known in a **pointer**,
  ``<shared>/.nodehealth-preflight-<job>-<step>.name``, a file written whole under a temp name and
  ``link()``ed into place (it appears whole, and never replaces a name someone else holds);
* every other rank waits for the pointer and accepts it only when it is a regular file of its own
  user (all ranks of a step run as one user) that nobody else may write, holding the step's key
  and a name of that exact form; it opens the directory the same way (``open_own_dir``). A pointer
  or directory that is not the user's is refused, naming its owner (``Taken``): no node is judged.

Inside the directory, per rank ``r``: ``r<r>.json`` (its report) and ``p<r>.json`` (what it saw of its
ring peers ``r+1 .. r+k`` mod N), both written through the one temp name ``.tmp-r<r>``, and from rank
0 ``verdict.json``. Every file is read ``O_NOFOLLOW|O_NONBLOCK`` as a regular file of the user with one
name, at most ``MAX_DOC`` bytes, as strict JSON, and checked by ``schema``. Everything goes through
the directories' descriptors. Names are removed by name, never by listing: each rank its own; rank
0, at the end, every name a rank of the step may have made (a killed rank's files and temp file),
then the directory when it is empty and the pointer while it is still its own.

Per rank, the operations are a constant (``FsOps``) apart from polls, whose number depends on
how long it waits, never on N. All file names are fixed by rank: nobody scans for peers.
"""

from __future__ import annotations

import json
import os
import re
import stat
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from nodehealth.platform import ground
from nodehealth.preflight import schema
from nodehealth.preflight.ranks import Rank
from nodehealth.statedir.files import parse_json

PREFIX = ".nodehealth-preflight-"
VERDICT = "verdict.json"
FINAL = "final.json"  # rank 0's verdict after the all-reduce across the allocation (--across)
RING = 2  # peers each rank reads
MAX_DOC = 64 << 10  # a rank's report is a few KiB
MAX_POINTER = 1024


class Taken(Exception):
    """The exchange's name in the shared directory is held by something that is not this user's."""


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


def pointer_name(rank: Rank) -> str:
    """The one predictable name: the file through which rank 0 says where the exchange is."""
    return f"{PREFIX}{rank.job_id}-{rank.step_id}.name"


def dir_prefix(rank: Rank) -> str:
    return f"{PREFIX}{rank.job_id}-{rank.step_id}-"


def peers(rank: int, size: int, k: int = RING) -> list[int]:
    """The ring peers of ``rank``: the next ``k`` ranks (fewer in a small step; never itself)."""
    return [(rank + i) % size for i in range(1, min(k, size - 1) + 1)]


def names_of(rank: int) -> tuple[str, ...]:
    """Every name rank ``rank`` may create in the exchange directory (rank 0 also the verdict)."""
    own = (f"r{rank}.json", f"p{rank}.json", f"a{rank}.json", f".tmp-r{rank}")
    return own + ((VERDICT, FINAL) if rank == 0 else ())


@dataclass
class Gathered:
    """Rank 0's view after the barrier: reports and peer files by rank, and the files it refused."""

    reports: dict[int, dict[str, Any]]
    peer_views: dict[int, dict[str, Any]]
    unreadable: dict[int, str]
    waited_s: float


class Exchange:
    """One rank's side of the protocol. ``clock`` and ``sleep`` are injectable for tests.

    ``step_key``: a text every rank of this step has and a later step does not (srun's address
    and port); a pointer left by an earlier step with another key is not joined.
    """

    def __init__(
        self,
        shared: str,
        rank: Rank,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        step_key: str = "",
    ) -> None:
        self.rank, self.clock, self.sleep = rank, clock, sleep
        self.shared = shared
        self.step_key = step_key
        self.pointer = pointer_name(rank)
        self.dir = os.path.join(shared, self.pointer)  # where to look, until the directory is known
        self.name: Optional[str] = None
        self.shared_fd: Optional[int] = None
        self.fd: Optional[int] = None
        self.pointer_id: Optional[os.stat_result] = None
        self.leader_until_wall = 0.0  # from the pointer: when rank 0 stops collecting (time.time())
        self.ops = FsOps()
        self.notes: list[str] = []
        self._uid = os.geteuid()
        self._last_refusal: Optional[ground.Foreign] = None

    # ------------------------------------------------------------ setting up

    def open_shared(self) -> None:
        """Open the shared directory (the user's choice: a link to it is followed); OSError when unusable."""
        self.shared_fd = os.open(self.shared, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    def _taken(self, what: str, exc: ground.Foreign) -> Taken:
        return Taken(
            f"the exchange name {what} in {self.shared} is not this user's ({exc}): no node was judged; "
            "use another --shared-dir, or ask its owner to remove it"
        )

    def create(self, until_wall: float = 0.0) -> None:
        """Rank 0: a fresh directory of our own, then the pointer to it. Raises Taken when the pointer's
        name is held by another user (or is not a regular file), OSError when the directory is unusable."""
        assert self.shared_fd is not None
        self.ops.add("mkdir")
        self.fd, self.name = ground.make_own_dir(self.shared, dir_prefix(self.rank), 0o700)
        self.dir = os.path.join(self.shared, self.name)
        # ``until``: when rank 0 stops collecting (wall clock), so the others wait for their peers as long.
        data = (
            json.dumps({"dir": self.name, "key": self.step_key, "until": until_wall}, sort_keys=True) + "\n"
        ).encode()
        for attempt in range(2):
            self.ops.add("create")
            try:
                self.pointer_id = ground.publish_new(self.shared_fd, self.pointer, data, 0o600)
                return
            except FileExistsError:
                st = os.stat(self.pointer, dir_fd=self.shared_fd, follow_symlinks=False)
                mine = st.st_uid == self._uid and stat.S_ISREG(st.st_mode) and st.st_nlink == 1
                links = f" with {st.st_nlink} names (a hard link)" if st.st_nlink > 1 else ""
                if not mine or attempt:
                    self._drop_dir()
                    kind = (
                        "a regular file"
                        if stat.S_ISREG(st.st_mode)
                        else "a directory"
                        if stat.S_ISDIR(st.st_mode)
                        else "a symbolic link"
                        if stat.S_ISLNK(st.st_mode)
                        else "a special file"
                    )
                    raise self._taken(
                        self.pointer, ground.Foreign(f"{kind}{links} owned by {ground.who(st.st_uid)}", st.st_uid)
                    ) from None
                # Ours, left by a step of this job id that was killed: it names nothing of this step.
                ground.unlink_own(self.shared_fd, self.pointer)
                self.notes.append(f"note: replaced a pointer {self.pointer} a stopped run of this user left")

    def _read_pointer(self) -> Optional[str]:
        """The directory named by the pointer, None while there is none (yet) for this step."""
        assert self.shared_fd is not None
        try:
            fd = ground.open_regular(self.pointer, dir_fd=self.shared_fd, owner=self._uid)
        except FileNotFoundError:
            self.ops.add("poll_stat")
            return None
        except ground.Foreign as exc:
            if exc.reason == "links" and exc.owner == self._uid:  # rank 0 between link() and unlink()?
                self.ops.add("poll_stat")
                self._last_refusal = exc  # if it stays so, a hard link: refused at the deadline
                return None
            raise self._taken(self.pointer, exc) from None
        try:
            self.ops.add("read")
            ident = os.fstat(fd)
            data = os.read(fd, MAX_POINTER + 1)
        finally:
            os.close(fd)
        try:
            doc = parse_json(data) if len(data) <= MAX_POINTER else None
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            doc = {}
        name = doc.get("dir")
        if not isinstance(name, str) or not re.fullmatch(re.escape(dir_prefix(self.rank)) + r"[0-9a-f]{32}", name):
            raise self._taken(self.pointer, ground.Foreign("it holds no exchange directory's name"))
        if doc.get("key") != self.step_key:  # an earlier step's, which rank 0 replaces
            return None
        self.pointer_id = ident
        until = doc.get("until")
        self.leader_until_wall = (
            float(until) if isinstance(until, (int, float)) and not isinstance(until, bool) else 0.0
        )
        return name

    def join(self, until: float) -> bool:
        """Any rank but 0: wait until ``until`` for rank 0's pointer, then open the directory it names.

        False when none came in time (the directory is not shared with this node, or rank 0 did not
        start); Taken when the pointer or the directory is not this user's."""
        assert self.shared_fd is not None
        joined = False

        def found() -> bool:
            nonlocal joined
            name = self._read_pointer()
            if name is None:
                return False
            try:
                self.ops.add("open")
                self.fd = ground.open_own_dir(name, dir_fd=self.shared_fd)
            except FileNotFoundError:  # a stale pointer, about to be replaced
                return False
            except ground.Foreign as exc:
                raise self._taken(name, exc) from None
            self.name, self.dir, joined = name, os.path.join(self.shared, name), True
            return True

        self._last_refusal = None
        self._wait(until, found)
        if not joined and self._last_refusal is not None:
            raise self._taken(self.pointer, self._last_refusal)
        return joined

    def release(self) -> None:
        for fd in (self.fd, self.shared_fd):
            if fd is not None:
                os.close(fd)
        self.fd = self.shared_fd = None

    # ------------------------------------------------------------ files

    def write(self, name: str, doc: dict[str, Any]) -> None:
        """Atomically: this rank's temp file (O_EXCL, fsync), then rename over ``name``."""
        assert self.fd is not None
        data = (json.dumps(doc, sort_keys=True) + "\n").encode()
        self.ops.add("create")
        self.ops.add("rename")
        ground.replace_own(self.fd, name, data, 0o600, tmp=f".tmp-r{self.rank.rank}")

    def read(self, name: str) -> Any:
        """A JSON document of the directory: a regular file of this user, one name, at most MAX_DOC bytes."""
        assert self.fd is not None
        self.ops.add("read")
        return parse_json(ground.read_regular(name, MAX_DOC, dir_fd=self.fd, owner=self._uid))

    def exists(self, name: str) -> bool:
        assert self.fd is not None
        self.ops.add("poll_stat")
        try:
            os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        return True

    def remove(self, name: str) -> None:
        assert self.fd is not None
        self.ops.add("unlink")
        ground.unlink_own(self.fd, name)

    def listing(self) -> set[str]:
        assert self.fd is not None
        self.ops.add("poll_list")
        return set(os.listdir(self.fd))

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
                        schema.report(self.read(f"r{p}.json"), p)
                        seen[p] = "ok"
                    except (OSError, ValueError) as exc:
                        seen[p] = f"unreadable: {exc}"
            return len(seen) == len(want)

        self._wait(until, all_seen)
        view = {
            "rank": self.rank.rank,
            "node": self.rank.node,
            "waited_s": round(self.clock() - t0, 3),
            "peers": {str(p): seen.get(p, "missing") for p in want},
        }
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
            for kind, into, check in (("r", reports, schema.report), ("p", views, schema.peer_view)):
                name = f"{kind}{r}.json"
                if name not in names:
                    continue
                try:
                    into[r] = check(self.read(name), r)
                except (OSError, ValueError) as exc:
                    bad[r] = f"{name}: {schema.printable(str(exc), schema.MAX_TEXT)}"
        return Gathered(reports, views, bad, self.clock() - t0)

    def announce(self, verdict: dict[str, Any]) -> None:
        self.write(VERDICT, verdict)

    def await_verdict(self, until: float, name: str = VERDICT) -> Optional[dict[str, Any]]:
        if not self._wait(until, lambda: self.exists(name)):
            return None
        try:
            return schema.verdict(self.read(name))
        except (OSError, ValueError):
            return None

    def leave(self) -> None:
        """Any rank but 0: remove its own files (by name)."""
        if self.fd is None:
            return
        for name in (f"r{self.rank.rank}.json", f"p{self.rank.rank}.json"):
            self.remove(name)

    def leave_unshared(self) -> None:
        """No verdict came: remove our files and, when the directory is then empty (rank 0 is gone),
        the directory and the pointer that names it."""
        self.leave()
        if self.fd is None or self.shared_fd is None or self.name is None:
            return
        ground.unlink_own(self.fd, f".tmp-r{self.rank.rank}")
        self.ops.add("rmdir")
        if ground.remove_own_dir(self.shared_fd, self.name, self.fd) and self.pointer_id is not None:
            ground.unlink_if_same(self.shared_fd, self.pointer, self.pointer_id)

    def _drop_dir(self) -> None:
        if self.fd is not None and self.shared_fd is not None and self.name is not None:
            ground.remove_own_dir(self.shared_fd, self.name, self.fd)

    def close(self, grace_until: float) -> list[str]:
        """Rank 0, after the verdict: wait until the others removed their files (or ``grace_until``),
        then remove, by name, whatever any rank of the step may have left (a killed rank's files,
        temp files), the verdict, the directory and the pointer. Returns the leftovers removed."""
        assert self.fd is not None and self.shared_fd is not None and self.name is not None
        me = self.rank.rank
        left: set[str] = set()
        theirs = {name: r for r in range(self.rank.size) if r != me for name in names_of(r)}

        def others_gone() -> bool:
            nonlocal left
            left = self.listing() & set(theirs)
            return not left

        self._wait(grace_until, others_gone)
        # Only names of the step's own making: the listing says which of them exist, never what to remove.
        present = self.listing()
        for name in [*names_of(me), *sorted(set(theirs) & present)]:
            self.remove(name)
        self.ops.add("rmdir")
        if not ground.remove_own_dir(self.shared_fd, self.name, self.fd):
            self.notes.append(f"note: left {self.dir}: it holds names no rank of this step made")
        if self.pointer_id is not None:
            ground.unlink_if_same(self.shared_fd, self.pointer, self.pointer_id)
        return sorted(left)
