"""The job ledger: which Slurm job had which GPUs on this node, and when.

The prolog appends a ``start`` record and the epilog an ``end`` record to
``<state_dir>/jobs.jsonl`` (one JSON object per line, UTF-8). The record is built from the
job's environment by ``nodehealth.slurm.jobenv.record``; this module owns the file: the
append (one ``write(2)``, bounded size, atomic compaction, both under the ledger's lock so 40
prologs at once lose nothing), reading it back, and the one rule
for "which job held this GPU at that time" (``holder``) that the XID attribution, the
epilog's job forensics and the daemon's job labels all use. docs/operations.md ("Job
ledger") documents the format.

Record (format version 1)::

    {"v": 1, "event": "start", "job_id": "1234", "user": "alice", "uid": 1000,
     "gpus": [0, 1], "node": "gpu017", "time": 1732912345.123, "boot_id": "…"}

``event`` is ``start`` (prolog) or ``end`` (epilog); ``gpus`` is null when the job has no
GPUs or the list is not known; ``time`` is Unix time in seconds. Unknown keys are ignored by
readers, so later versions may add keys. A line that is not a whole record (torn by a short
write on a full disk, junk) is skipped by readers and dropped by the next compaction; the
append after a torn record starts on a new line, so the two are never glued together.

Standard library only, and no ``json``, ``dataclasses``, ``typing`` or ``collections`` at import time: the prolog's
fast path appends through ``append``, which encodes its record with ``strictjson.dumps_small`` (``json`` is
imported by a read or a compaction).
"""

from __future__ import annotations

import os

from nodehealth.statedir import files, layout
from nodehealth.statedir.strictjson import dumps_small

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Iterable, Mapping, Optional, Sequence

FORMAT_VERSION = 1
FILE_NAME = layout.LEDGER
TAIL_BYTES = 2 << 20  # readers look at this much of the end of the file ([ledger] max_bytes is 1 MiB)
SLACK_S = 30.0  # an event this soon after a job's end may still be that job's (teardown)
REPLACE_TRIES = 8  # an append without the lock follows this many compactions' renames
LOCK_TIMEOUT_S = 1.0  # appends wait this long for the lock (held for a write, or a compaction)
MAX_GPUS = 10000  # GPU indexes are below this (Slurm's lists: at most 4 digits)
MAX_DEPTH = 4  # a record is flat: {"gpus": [...]} is two levels


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
        return {
            "v": FORMAT_VERSION,
            "event": self.event,
            "job_id": self.job_id,
            "user": self.user,
            "uid": self.uid,
            "gpus": list(self.gpus) if self.gpus is not None else None,
            "node": self.node,
            "time": round(self.time, 3),
            "boot_id": self.boot_id,
        }

    def line(self) -> str:
        import json

        return json.dumps(self.to_json(), separators=(",", ":")) + "\n"


class JobEntry(_Record):
    """One job placed in time: its latest start, its end (None: still running), user and GPUs."""

    __slots__ = ("job_id", "start", "end", "user", "gpus")
    job_id: str
    start: float
    end: Optional[float]
    user: Optional[str]
    gpus: Optional[tuple[int, ...]]


def _number(value: Any) -> Optional[float]:
    """A finite JSON number as a float; None for anything else (a string, a bool, NaN)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if value - value == 0.0 else None


def _small_int(value: Any, limit: int) -> Optional[int]:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < limit:
        return value
    return None


def from_json(raw: Any) -> Optional[JobRecord]:
    """The record in one parsed line; None for anything that is not a whole record of ours (a
    missing or non-numeric time, GPUs that are not small integers, a user that is not text)."""
    if not isinstance(raw, dict) or raw.get("event") not in ("start", "end"):
        return None
    job, when, gpus = layout.valid_job_id(raw.get("job_id")), _number(raw.get("time", 0.0)), raw.get("gpus")
    if job is None or when is None:  # a job id that is not one (a path, a sign, hex) is no record of ours
        return None
    if gpus is not None:
        if not isinstance(gpus, list) or len(gpus) > MAX_GPUS:
            return None
        gpus = tuple(_small_int(g, MAX_GPUS) for g in gpus)
        if None in gpus:
            return None
    texts = [raw.get(k) for k in ("user", "node", "boot_id")]
    if any(t is not None and not isinstance(t, str) for t in texts):
        return None
    user, node, boot = texts
    return JobRecord(
        event=raw["event"],
        job_id=job,
        time=when,
        user=user,
        uid=_small_int(raw.get("uid"), 1 << 32),
        gpus=gpus,
        node=node,
        boot_id=boot,
    )


def parse_line(line: str) -> Optional[JobRecord]:
    """One ledger line, or None for a line that is not a valid record (skipped by readers)."""
    try:
        return from_json(files.parse_json(line, MAX_DEPTH))
    except ValueError:
        return None


def parse(text: str) -> list[JobRecord]:
    return scan(text)[0]


def scan(text: str) -> tuple[list[JobRecord], int]:
    """The records in ``text`` and the number of non-blank lines that are not records (torn, junk)."""
    records: list[JobRecord] = []
    bad = 0
    for line in text.splitlines():
        if not line.strip():
            continue
        rec = parse_line(line)
        if rec is None:
            bad += 1
        else:
            records.append(rec)
    return records, bad


def _tail(path: str, tail_bytes: int, fd: Optional[int] = None, end: Optional[int] = None) -> Optional[str]:
    """The last ``tail_bytes`` of the file (up to ``end``) as text, from its first whole line; None when
    unreadable. Opened ``O_NOFOLLOW`` (or read from ``fd``): a symlink in place of the ledger is not read."""
    own = fd is None
    if fd is None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None
    try:
        st = os.fstat(fd)
        if st.st_mode & 0o170000 != 0o100000:
            return None
        size = st.st_size if end is None else min(end, st.st_size)
        first = max(0, size - tail_bytes)
        data = _pread_range(fd, first, size - first)
    except OSError:
        return None
    finally:
        if own:
            os.close(fd)
    text = data.decode("utf-8", "replace")
    return text.partition("\n")[2] if first > 0 else text


def _pread_range(fd: int, at: int, length: int) -> bytes:
    chunks = []
    while length > 0:
        chunk = os.pread(fd, min(1 << 20, length), at)
        if not chunk:
            break
        chunks.append(chunk)
        at += len(chunk)
        length -= len(chunk)
    return b"".join(chunks)


def _read_from(fd: int, at: int) -> str:
    """What was appended to the open file from ``at`` on (bounded: ``TAIL_BYTES``), as text."""
    try:
        return _pread_range(fd, at, TAIL_BYTES).decode("utf-8", "replace")
    except OSError:
        return ""


def read(state_dir: str, tail_bytes: int = TAIL_BYTES) -> list[JobRecord]:
    """The records of ``<state_dir>/jobs.jsonl`` (its last ``tail_bytes``; a cut first line is skipped)."""
    return read_checked(state_dir, tail_bytes)[0]


def read_checked(state_dir: str, tail_bytes: int = TAIL_BYTES) -> tuple[list[JobRecord], int]:
    """``read``, and how many lines were skipped as not records (the caller may warn; compaction
    drops them)."""
    text = _tail(layout.path(state_dir, FILE_NAME), tail_bytes)
    return scan(text) if text else ([], 0)


def compact(lines: list[str], max_bytes: int) -> list[str]:
    """The newest whole records that fit in half of ``max_bytes`` (room to append before the next
    compaction); lines that are not records (torn by a short write, junk) are dropped."""
    keep: list[str] = []
    size = 0
    for line in reversed(lines):
        if not line.endswith("\n") or parse_line(line) is None:
            continue
        size += len(line.encode("utf-8"))
        if size > max_bytes // 2:
            break
        keep.append(line)
    keep.reverse()
    return keep


def append(
    state_dir: str, record: Mapping[str, Any], max_bytes: int, lock_timeout_s: float = LOCK_TIMEOUT_S
) -> Optional[str]:
    """Append one record; when the file outgrows ``max_bytes``, keep its newest half.

    Appends and compaction take the ledger's lock (``jobs.jsonl.lock``), so a compaction never
    drops a record appended while it ran. Without the lock in ``lock_timeout_s`` the record is
    still appended (``O_APPEND``) but nothing is compacted; the returned note says so (None
    when all went as planned). Raises OSError when the record could not be stored whole
    (``files.ShortWrite``: the next append starts on a new line, the torn one is dropped at
    compaction) or the state dir is not safe (``files.UnsafeDir``).
    """
    if layout.valid_job_id(record.get("job_id")) is None:  # readers would skip it; never store it
        return "not appended: the record's job id is not a Slurm job id"
    files.require_state_dir(state_dir)
    path = layout.path(state_dir, FILE_NAME)
    line = dumps_small(dict(record)) + "\n"
    with files.locked(path, lock_timeout_s) as got:
        if not got:  # a compaction may be renaming a new ledger over the one written: follow it
            files.append_line(path, line, files.STATE_FILE_MODE, follow_replace=REPLACE_TRIES)
            return f"the job ledger lock {path}.lock was not free within {lock_timeout_s:g} s; appended without it"
        if files.append_line(path, line, files.STATE_FILE_MODE) > max_bytes:
            _compact(path, max_bytes)
    return None


def _compact(path: str, max_bytes: int) -> None:
    """Replace the ledger by its newest half, under its lock. A writer that could not get the lock
    appends to the open file meanwhile: after the rename, what reached the old file past what was
    read is copied into the new one (and such a writer checks the name afterwards: ``append_line``'s
    ``follow_replace``), so no record is lost to the rename."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    try:
        end = os.fstat(fd).st_size
        text = _tail(path, max_bytes, fd=fd, end=end)
        if text is None:
            return
        files.write_atomic(path, "".join(compact(text.splitlines(keepends=True), max_bytes)), files.STATE_FILE_MODE)
        late = _read_from(fd, end)
    finally:
        os.close(fd)
    for record in late.splitlines(keepends=True):
        if record.endswith("\n") and parse_line(record) is not None:
            files.append_line(path, record, files.STATE_FILE_MODE)


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


def holding(jobs: Sequence[JobEntry], gpu: Optional[int], at: float, slack_s: float = SLACK_S) -> tuple[JobEntry, ...]:
    """The candidates of the one rule for "which job held ``gpu`` at Unix time ``at``".

    The jobs running at ``at`` (started at or before it, no end or an end at or after it); when
    there are none, those that ended within ``slack_s`` before it (teardown). With ``gpu`` None
    every GPU counts (a job on any GPU of the node, or with its GPUs unknown). ``holder`` names
    the one candidate; the daemon's self-test calls the node busy while there is any.
    """
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
    return tuple(running or recent)


def holder(
    jobs: Sequence[JobEntry], gpu: Optional[int], at: Optional[float], slack_s: float = SLACK_S
) -> Optional[str]:
    """The job that held ``gpu`` at Unix time ``at``; None when unsure. The one rule for it.

    A job running at ``at`` wins over one that ended within ``slack_s`` before it. With the
    GPU unknown, a job is named only when it is the one job on the node at that time. Two
    candidates of the same kind (overlapping jobs on one GPU) name no one (``holding``).
    """
    if at is None:
        return None
    candidates = holding(jobs, gpu, at, slack_s)
    return str(candidates[0].job_id) if len(candidates) == 1 else None


def of_boot(records: Iterable[JobRecord], boot_id: Optional[str]) -> list[JobRecord]:
    """The records of boot ``boot_id`` (records without a boot id count; None: every record)."""
    return [r for r in records if r.boot_id is None or boot_id is None or r.boot_id == boot_id]


def start_time(records: Iterable[JobRecord], job_id: str, boot_id: Optional[str]) -> Optional[float]:
    """The job's latest ``start`` on this boot (records without a boot id count)."""
    starts = [
        r.time
        for r in records
        if r.event == "start" and r.job_id == job_id and (r.boot_id is None or r.boot_id == boot_id)
    ]
    return starts[-1] if starts else None
