"""The ``node_jobs`` probe: which Slurm jobs run on this node now, without asking slurmctld.

Two local sources: the job ledger (jobs whose prolog recorded a start and whose epilog has not
recorded an end, this boot), and the cgroups of the node's processes (Slurm's cgroup plugins put
every task of job N under a ``job_N`` directory). ``gpu_processes`` uses both to tell a compute
process of a running job from one that no job owns any more (a stray left by an ended job).
"""

from __future__ import annotations

import os
from typing import Union

from nodehealth.observations import NodeJobs, ProbeError
from nodehealth.probes.process_job import job_from_cgroup
from nodehealth.statedir import files, layout, ledger

MAX_PIDS = 65536  # /proc entries looked at; a node with more is not scanned further


def gather(state_dir: str, procfs_root: str) -> Union[NodeJobs, ProbeError]:
    boot = layout.read_boot_id(procfs_root)
    running = tuple(
        j
        for j in ledger.entries(r for r in ledger.read(state_dir) if r.boot_id is None or r.boot_id == boot)
        if j.end is None
    )
    pid_jobs: dict[int, str] = {}
    try:
        names = os.listdir(procfs_root)
    except OSError as exc:
        return ProbeError("node_jobs", "unavailable", f"cannot list {procfs_root}: {exc.strerror or exc}")
    for name in names[:MAX_PIDS]:
        if not name.isdigit():
            continue
        data = files.read_bytes(os.path.join(procfs_root, name, "cgroup"), 8192)
        job = job_from_cgroup(data.decode("utf-8", "replace")) if data else None
        if job is not None:
            pid_jobs[int(name)] = job
    return NodeJobs(running=running, pid_jobs=pid_jobs)
