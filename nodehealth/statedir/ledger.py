"""The job ledger: which Slurm job had which GPUs on this node, and when.

The prolog appends a ``start`` record and the epilog an ``end`` record to
``<state_dir>/jobs.jsonl`` (one JSON object per line, UTF-8). The XID watcher reads it to
name the job that was running on a GPU when an event happened and its process is gone.
docs/operations.md ("Job ledger") documents the format; this module builds and reads
records (pure), ``nodehealth.statedir.files`` does the file I/O (append, bounded size,
atomic compaction).

Record (format version 1)::

    {"v": 1, "event": "start", "job_id": "1234", "user": "alice", "uid": 1000,
     "gpus": [0, 1], "node": "gpu017", "time": 1732912345.123, "boot_id": "…"}

``event`` is ``start`` (prolog) or ``end`` (epilog); ``gpus`` is null when the job has no
GPUs or the list is not known; ``time`` is Unix time in seconds. Unknown keys are ignored by
readers, so later versions may add keys.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional

from nodehealth.slurm.jobenv import job_gpus, sanitize

FORMAT_VERSION = 1
FILE_NAME = "jobs.jsonl"
_MAX_FIELD = 128


@dataclass(frozen=True)
class JobRecord:
    event: str  # "start" | "end"
    job_id: str
    time: float
    user: Optional[str] = None
    uid: Optional[int] = None
    gpus: Optional[tuple[int, ...]] = None
    node: Optional[str] = None
    boot_id: Optional[str] = None

    def to_json(self) -> dict[str, Any]:
        return {"v": FORMAT_VERSION, "event": self.event, "job_id": self.job_id, "user": self.user,
                "uid": self.uid, "gpus": list(self.gpus) if self.gpus is not None else None,
                "node": self.node, "time": round(self.time, 3), "boot_id": self.boot_id}

    def line(self) -> str:
        return json.dumps(self.to_json(), separators=(",", ":"), sort_keys=False) + "\n"


def _field(value: Optional[str]) -> Optional[str]:
    if value is None:
        return None
    text = sanitize(value, _MAX_FIELD)
    return text or None


def from_environ(event: str, environ: Mapping[str, str], now: float, node: Optional[str] = None,
                 boot_id: Optional[str] = None) -> Optional[JobRecord]:
    """The record for the job in a prolog/epilog environment; None without ``SLURM_JOB_ID``.

    Environment values are data: sanitised, length-capped, never interpreted.
    """
    job = _field(environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID"))
    if not job:
        return None
    uid_text = environ.get("SLURM_JOB_UID", "")
    uid = int(uid_text) if uid_text.isdigit() and len(uid_text) < 11 else None
    return JobRecord(event=event, job_id=job, time=now, user=_field(environ.get("SLURM_JOB_USER")), uid=uid,
                     gpus=job_gpus(environ), node=_field(node or environ.get("SLURMD_NODENAME")), boot_id=boot_id)


def parse_line(line: str) -> Optional[JobRecord]:
    """One ledger line, or None for a line that is not a valid record (skipped by readers)."""
    try:
        raw = json.loads(line)
    except ValueError:
        return None
    if not isinstance(raw, dict) or raw.get("event") not in ("start", "end") or not raw.get("job_id"):
        return None
    try:
        gpus = raw.get("gpus")
        return JobRecord(event=str(raw["event"]), job_id=str(raw["job_id"]), time=float(raw.get("time", 0.0)),
                         user=None if raw.get("user") is None else str(raw["user"]),
                         uid=raw.get("uid") if isinstance(raw.get("uid"), int) else None,
                         gpus=tuple(int(g) for g in gpus) if isinstance(gpus, list) else None,
                         node=None if raw.get("node") is None else str(raw["node"]),
                         boot_id=None if raw.get("boot_id") is None else str(raw["boot_id"]))
    except (TypeError, ValueError):
        return None


def parse(text: str) -> list[JobRecord]:
    return [r for r in (parse_line(line) for line in text.splitlines() if line.strip()) if r is not None]


def jobs_on_gpu(records: Iterable[JobRecord], gpu: Optional[int], at: float) -> list[str]:
    """Job ids that held ``gpu`` (any GPU when None) at Unix time ``at``, most recent start first.

    A job is running from its ``start`` to its ``end`` record; a job with a start and no end
    yet is running. A job whose GPU list is unknown matches any GPU.
    """
    starts: dict[str, JobRecord] = {}
    ends: dict[str, float] = {}
    for r in records:
        if r.event == "start":
            starts[r.job_id] = r
        elif r.event == "end":
            ends[r.job_id] = r.time
    hits = []
    for job, rec in starts.items():
        if rec.time > at:
            continue
        end = ends.get(job)
        if end is not None and end < at:
            continue
        if gpu is not None and rec.gpus is not None and gpu not in rec.gpus:
            continue
        hits.append((rec.time, job))
    return [job for _, job in sorted(hits, reverse=True)]


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
