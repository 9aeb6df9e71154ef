"""Which GPU and which Slurm job an XID event concerns (pure; the facts are read elsewhere).

GPU: the event's PCI address (``dddd:bb:dd``) against the NVML snapshot's bus ids
(``0000:3b:00.0``, NVML may also spell ``00000000:3B:00.0``) gives the NVML index and UUID.
This is the one PCI → GPU mapping: ``gpu_map`` builds it, ``gpu_at`` looks an address up; the
check, the epilog's job forensics, ``nodehealth xid`` and the daemon all go through them.

Job, in order of trust:
1. the blamed process, while it is alive (``nodehealth.probes.process_job``, when the event is
   read): the ``job_<id>`` component of its cgroup path or ``SLURM_JOB_ID`` in its environment;
2. the job ledger (``nodehealth.statedir.ledger``, its one rule ``holder``): the job that held
   the event's GPU at the event's time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Optional, cast

from nodehealth.observations import GpuObservation, JobLedgerEntry
from nodehealth.statedir import ledger as job_ledger
from nodehealth.xid.events import XidEvent

GpuMap = Mapping[str, tuple[int, Optional[str]]]  # dddd:bb:dd -> (NVML index, UUID)


def normalize_pci(bus_id: str) -> str:
    """``dddd:bb:dd`` in lower case from any PCI bus id spelling (NVML's 8-digit domain too)."""
    text = bus_id.strip().lower()
    if text.startswith("pci:"):
        text = text[4:]
    text = text.split(".", 1)[0]
    parts = text.split(":")
    if len(parts) == 2:
        parts = ["0000", *parts]
    if len(parts) != 3:
        return text
    domain = parts[0].lstrip("0").rjust(4, "0")
    return f"{domain}:{parts[1]}:{parts[2]}"


def gpu_map(gpus: Iterable[GpuObservation]) -> dict[str, tuple[int, Optional[str]]]:
    """``dddd:bb:dd`` → (NVML index, UUID) for the GPUs whose bus id NVML reported."""
    out: dict[str, tuple[int, Optional[str]]] = {}
    for gpu in gpus:
        if gpu.pci_bus_id:
            out[normalize_pci(gpu.pci_bus_id)] = (gpu.index, gpu.uuid)
    return out


def gpu_at(pci: Optional[str], gpus: GpuMap) -> Optional[tuple[int, Optional[str]]]:
    """(NVML index, UUID) of the GPU at ``pci`` (any spelling), None when ``gpus`` has none there."""
    if not pci:
        return None
    return gpus.get(normalize_pci(pci))


def attribute(
    event: XidEvent, gpus: GpuMap, ledger: Sequence[JobLedgerEntry] = (), at: Optional[float] = None
) -> XidEvent:
    """A copy of ``event`` with GPU index, UUID and job filled in where they can be told.

    What the event already carries is kept (a job found from the live process when the
    event was read beats the ledger). ``at``: Unix time of the event, for the ledger.
    """
    gpu, uuid = event.gpu, event.gpu_uuid
    if gpu is None or uuid is None:
        found = gpu_at(event.pci, gpus)
        if found is not None:
            gpu = found[0] if gpu is None else gpu
            uuid = found[1] if uuid is None else uuid
    job = event.job_id
    if job is None and ledger:
        # The observation's entries are the ledger's own records (the xid probe reads them from it).
        job = job_ledger.holder(cast(Sequence[job_ledger.JobEntry], ledger), gpu, at)
    if (gpu, uuid, job) == (event.gpu, event.gpu_uuid, event.job_id):
        return event
    return replace(event, gpu=gpu, gpu_uuid=uuid, job_id=job)
