"""Which GPU and which Slurm job an XID event concerns (pure; the probes read the facts).

GPU: the event's PCI address (``dddd:bb:dd``) against the NVML snapshot's bus ids
(``0000:3b:00.0``, NVML may also spell ``00000000:3B:00.0``) gives the NVML index and UUID.

Job, in order of trust:
1. the blamed process, while it is alive: the ``job_<id>`` component of its cgroup path
   (Slurm's cgroup plugins, v1 and v2) or ``SLURM_JOB_ID`` in its environment;
2. the job ledger: the job that held the event's GPU at the event's time.

The job ledger (``<state_dir>/jobs.jsonl``) is the one ``nodehealth.statedir.ledger`` defines: start
records from the prolog, end records from the epilog; ``ledger_entries`` pairs them into one
``JobLedgerEntry`` (start, end, user, GPUs) per job.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Optional

from nodehealth.observations import GpuObservation, JobLedgerEntry
from nodehealth.statedir.ledger import JobRecord
from nodehealth.xid.catalog import normalize_pci
from nodehealth.xid.events import XidEvent

# A job that ends because its GPU failed is often torn down before the XID is logged, and
# the clocks of the epilog and the kernel log differ a little: an event this many seconds
# after a job's end still belongs to it (when no running job holds the GPU).
LEDGER_SLACK_S = 30.0

# Slurm cgroup paths, v1 and v2 (0::/system.slice/slurmstepd.scope/job_81234/step_0/user/task_0,
# 4:devices:/slurm/uid_1000/job_81234/step_batch).
_CGROUP_JOB_RE = re.compile(r"/job_(\d+)(?:/|$)")


def job_from_cgroup(text: str) -> Optional[str]:
    """The Slurm job id in the contents of ``/proc/<pid>/cgroup``, or None."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        m = _CGROUP_JOB_RE.search(path.strip())
        if m:
            return m.group(1)
    return None


def job_from_environ(data: bytes) -> Optional[str]:
    """``SLURM_JOB_ID`` (or the older ``SLURM_JOBID``) from ``/proc/<pid>/environ`` bytes."""
    found: dict[str, str] = {}
    for item in data.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key in (b"SLURM_JOB_ID", b"SLURM_JOBID"):
            text = value.decode("ascii", errors="replace").strip()
            if text.isdigit():
                found[key.decode()] = text
    return found.get("SLURM_JOB_ID") or found.get("SLURM_JOBID")


def ledger_entries(records: Iterable[JobRecord]) -> tuple[JobLedgerEntry, ...]:
    """One entry per job from the ledger's start and end records (``nodehealth.statedir.ledger``).

    A job's latest start record gives its start, user and GPUs; its end record, when there
    is one after that start, its end. An end without a start is not a job we can place.
    """
    starts: dict[str, JobRecord] = {}
    ends: dict[str, float] = {}
    for r in records:
        if r.event == "start":
            starts[r.job_id] = r
            ends.pop(r.job_id, None)
        elif r.event == "end":
            ends[r.job_id] = r.time
    return tuple(
        JobLedgerEntry(job_id=job, start=rec.time, end=ends.get(job), user=rec.user, gpus=rec.gpus)
        for job, rec in starts.items())


def job_from_ledger(ledger: Sequence[JobLedgerEntry], gpu: Optional[int], at: Optional[float],
                    slack_s: float = LEDGER_SLACK_S) -> Optional[str]:
    """The job that held ``gpu`` at Unix time ``at``, from the ledger; None when unsure.

    A job running at ``at`` wins over one that ended within ``slack_s`` before it. With the
    GPU unknown, a job is named only when it is the one job on the node at that time. Two
    candidates of the same kind (a ledger with overlapping jobs on one GPU) name no one.
    """
    if at is None:
        return None
    running: list[JobLedgerEntry] = []
    recent: list[JobLedgerEntry] = []
    for entry in ledger:
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
            return candidates[0].job_id
        if candidates:
            return None
    return None


def gpu_map(gpus: Iterable[GpuObservation]) -> dict[str, tuple[int, Optional[str]]]:
    """``dddd:bb:dd`` → (NVML index, UUID) for the GPUs whose bus id NVML reported."""
    out: dict[str, tuple[int, Optional[str]]] = {}
    for gpu in gpus:
        if gpu.pci_bus_id:
            out[normalize_pci(gpu.pci_bus_id)] = (gpu.index, gpu.uuid)
    return out


def attribute(event: XidEvent, gpus: Mapping[str, tuple[int, Optional[str]]],
              ledger: Sequence[JobLedgerEntry] = (), at: Optional[float] = None) -> XidEvent:
    """A copy of ``event`` with GPU index, UUID and job filled in where they can be told.

    What the event already carries is kept (a job found from the live process when the
    event was read beats the ledger).
    """
    gpu, uuid = event.gpu, event.gpu_uuid
    if event.pci is not None and (gpu is None or uuid is None):
        found = gpus.get(normalize_pci(event.pci))
        if found is not None:
            gpu = found[0] if gpu is None else gpu
            uuid = found[1] if uuid is None else uuid
    job = event.job_id
    if job is None and ledger:
        job = job_from_ledger(ledger, gpu, at)
    if (gpu, uuid, job) == (event.gpu, event.gpu_uuid, event.job_id):
        return event
    return replace(event, gpu=gpu, gpu_uuid=uuid, job_id=job)
