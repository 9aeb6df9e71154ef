"""The job ledger: which Slurm job had which GPUs on this node, and when.

The prolog appends a ``start`` record and the epilog an ``end`` record to
``<state_dir>/jobs.jsonl`` (one JSON object per line, UTF-8). The record is built from the
job's environment by ``nodehealth.slurm.jobenv.record``; this module owns the file: the
append (one ``write(2)``, bounded size, atomic compaction), reading it back, and the one rule
for "which job held this GPU at that time" (``holder``) that the XID attribution, the
epilog's job forensics and the daemon's job labels all use. docs/operations.md ("Job
ledger") documents the format.

Record (format version 1)::

    {"v": 1, "event": "start", "job_id": "1234", "user": "alice", "uid": 1000,
     "gpus": [0, 1], "node": "gpu017", "time": 1732912345.123, "boot_id": "…"}

``event`` is ``start`` (prolog) or ``end`` (epilog); ``gpus`` is null when the job has no
GPUs or the list is not known; ``time`` is Unix time in seconds. Unknown keys are ignored by
readers, so later versions may add keys.

Standard library only (``json``), and no ``dataclasses``/``typing``/``collections`` at run time: the prolog's fast path
appends through ``append``.
"""

from __future__ import annotations

import json

from nodehealth.statedir import files, layout

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Iterable, Mapping, Optional, Sequence

FORMAT_VERSION = 1
FILE_NAME = layout.LEDGER
TAIL_BYTES = 2 << 20  # readers look at this much of the end of the file ([ledger] max_bytes is 1 MiB)
SLACK_S = 30.0  # an event this soon after a job's end may still be that job's (teardown)


class _Record:
    """A small immutable record (a ``namedtuple`` costs the fast path its class generation)."""

    __slots__: tuple[str, ...] = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        names = self.__slots__
        if len(args) > len(names):
            raise TypeError(f"{type(self).__name__} takes at most {len(names)} arguments")
        values = dict(zip(names, args))
        for k, v in kwargs.items():
            if k not in names or k in values:
                raise TypeError(f"{type(self).__name__}: unexpected or repeated argument {k!r}")
            values[k] = v
        for k in names:
            object.__setattr__(self, k, values.get(k))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def _tuple(self) -> tuple[Any, ...]:
        return tuple(getattr(self, k) for k in self.__slots__)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Record) and type(other) is type(self) and self._tuple() == other._tuple()

    def __hash__(self) -> int:
        return hash(self._tuple())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={getattr(self, k)!r}' for k in self.__slots__)})"


class JobRecord(_Record):
    """One ledger line: ``event`` is ``start`` or ``end``; ``gpus`` a tuple or None (not known)."""

    __slots__ = ("event", "job_id", "time", "user", "uid", "gpus", "node", "boot_id")
    event: str
    job_id: str
    time: float
    user: Optional[str]
    uid: Optional[int]
    gpus: Optional[tuple[int, ...]]
    node: Optional[str]
    boot_id: Optional[str]

    def to_json(self) -> dict[str, Any]:
        return {"v": FORMAT_VERSION, "event": self.event, "job_id": self.job_id, "user": self.user,
                "uid": self.uid, "gpus": list(self.gpus) if self.gpus is not None else None,
                "node": self.node, "time": round(self.time, 3), "boot_id": self.boot_id}

    def line(self) -> str:
        return json.dumps(self.to_json(), separators=(",", ":")) + "\n"


class JobEntry(_Record):
    """One job placed in time: its latest start, its end (None: still running), user and GPUs."""

    __slots__ = ("job_id", "start", "end", "user", "gpus")
    job_id: str
    start: float
    end: Optional[float]
    user: Optional[str]
    gpus: Optional[tuple[int, ...]]


def from_json(raw: Any) -> Optional[JobRecord]:
    if not isinstance(raw, dict) or raw.get("event") not in ("start", "end") or not raw.get("job_id"):
        return None
    try:
        gpus = raw.get("gpus")
        uid = raw.get("uid")
        return JobRecord(event=str(raw["event"]), job_id=str(raw["job_id"]), time=float(raw.get("time", 0.0)),
                         user=None if raw.get("user") is None else str(raw["user"]),
                         uid=uid if isinstance(uid, int) and not isinstance(uid, bool) else None,
                         gpus=tuple(int(g) for g in gpus) if isinstance(gpus, list) else None,
                         node=None if raw.get("node") is None else str(raw["node"]),
                         boot_id=None if raw.get("boot_id") is None else str(raw["boot_id"]))
    except (TypeError, ValueError, OverflowError):
        return None


def parse_line(line: str) -> Optional[JobRecord]:
    """One ledger line, or None for a line that is not a valid record (skipped by readers)."""
    try:
        return from_json(json.loads(line))
    except ValueError:
        return None


def parse(text: str) -> list[JobRecord]:
    return [r for r in (parse_line(line) for line in text.splitlines() if line.strip()) if r is not None]


def read(state_dir: str, tail_bytes: int = TAIL_BYTES) -> list[JobRecord]:
    """The records of ``<state_dir>/jobs.jsonl`` (its last ``tail_bytes``; a cut first line is skipped)."""
    path = layout.path(state_dir, FILE_NAME)
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - tail_bytes))
            data = f.read(tail_bytes)
    except OSError:
        return []
    text = data.decode("utf-8", "replace")
    if size > tail_bytes:
        text = text.partition("\n")[2]
    return parse(text)


def compact(lines: list[str], max_bytes: int) -> list[str]:
    """The newest lines that fit in half of ``max_bytes`` (room to append before the next compaction)."""
    keep: list[str] = []
    size = 0
    for line in reversed(lines):
        size += len(line.encode("utf-8"))
        if size > max_bytes // 2:
            break
        keep.append(line)
    keep.reverse()
    return keep


def append(state_dir: str, record: Mapping[str, Any], max_bytes: int) -> None:
    """Append one record; when the file outgrows ``max_bytes``, keep its newest half (atomic rewrite).

    Raises OSError (``files.ShortWrite`` included) when the record could not be stored whole.
    """
    path = layout.path(state_dir, FILE_NAME)
    size = files.append_line(path, json.dumps(record, separators=(",", ":")) + "\n")
    if size > max_bytes:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.readlines()
        files.write_atomic(path, "".join(compact(lines, max_bytes)))


def entries(records: Iterable[JobRecord]) -> tuple[JobEntry, ...]:
    """One entry per job from its start and end records.

    A job's latest start record gives its start, user and GPUs (a requeued job starts again);
    its end record, when there is one after that start, its end. An end without a start is
    not a job we can place.
    """
    starts: dict[str, JobRecord] = {}
    ends: dict[str, float] = {}
    for r in records:
        if r.event == "start":
            starts[r.job_id] = r
            ends.pop(r.job_id, None)
        elif r.event == "end":
            ends[r.job_id] = r.time
    return tuple(JobEntry(job, rec.time, ends.get(job), rec.user, rec.gpus) for job, rec in starts.items())


def holder(jobs: Sequence[JobEntry], gpu: Optional[int], at: Optional[float],
           slack_s: float = SLACK_S) -> Optional[str]:
    """The job that held ``gpu`` at Unix time ``at``; None when unsure. The one rule for it.

    A job running at ``at`` wins over one that ended within ``slack_s`` before it. With the
    GPU unknown, a job is named only when it is the one job on the node at that time. Two
    candidates of the same kind (overlapping jobs on one GPU) name no one.
    """
    if at is None:
        return None
    running: list[JobEntry] = []
    recent: list[JobEntry] = []
    for entry in jobs:
        if gpu is not None and entry.gpus is not None and gpu not in entry.gpus:
            continue
        if entry.start > at:
            continue
        if entry.end is None or entry.end >= at:
            running.append(entry)
        elif at - entry.end <= slack_s:
            recent.append(entry)
    for candidates in (running, recent):
        if len(candidates) == 1:
            return str(candidates[0].job_id)
        if candidates:
            return None
    return None


def start_time(records: Iterable[JobRecord], job_id: str, boot_id: Optional[str]) -> Optional[float]:
    """The job's latest ``start`` on this boot (records without a boot id count)."""
    starts = [r.time for r in records if r.event == "start" and r.job_id == job_id
              and (r.boot_id is None or r.boot_id == boot_id)]
    return starts[-1] if starts else None
