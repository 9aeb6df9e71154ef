"""The ``node_jobs`` probe: which Slurm jobs run on this node now, without asking slurmctld.

Two local sources: the job ledger (jobs whose prolog recorded a start and whose epilog has not
recorded an end, this boot), and the cgroups of the node's processes (Slurm's cgroup plugins put
every task of job N under a ``job_N`` directory). ``gpu_processes`` uses both to tell a compute
process of a running job from one that no job owns any more (a stray left by an ended job).

**The cgroup cache.** The daemon scans every round, and most of the node's processes are the
same from one round to the next, so a process's cgroup is read once and kept (``_CACHE``, in
the process that scans: a one-shot face scans once and exits with it). A kept answer is used
only for the same process, and only once it was read after the process settled into its
cgroup; anything else is read again:

- *The same process*, not a new one under a reused pid. The key is ``os.stat`` of
  ``/proc/<pid>``: (inode number, ctime, uid). In procfs (fs/proc/base.c) that directory's inode
  is made when it is first looked up (``proc_pid_make_inode``: ``new_inode``, its number from
  ``get_next_ino``, its times the current time), and it holds the ``struct pid`` of *that*
  process; a lookup revalidates it (``pid_revalidate``), and once that process is gone the
  entry is dropped, so a process that reuses the number gets a new inode: another inode
  number and a ctime no earlier than its own start. It is not the process's start time (an
  inode evicted under memory pressure is made again, with a new ctime): that only costs one
  more read, never a wrong answer. The uid is the task's euid, updated at every lookup
  (``pid_update_inode``): a Slurm task leaves slurmstepd (root) for its cgroup *before* it
  drops to the user and execs, so a task seen in between has another key afterwards.
- *Settled*: a process can move into a job's cgroup after it started (slurmstepd adds a task
  it has just forked, pam_slurm_adopt a new ssh session); an answer read then would call the
  job's process a stray for the rest of its life (a healthy node drained). So a process is
  read again at every scan until ``SETTLE_S`` after the scan that first saw it, and the
  answer kept is the first one read after that.

The cache holds the processes of the last scan only (a pid gone is dropped), at most ``MAX_PIDS``.
"""

from __future__ import annotations

import os
import time
from typing import Callable, Optional, Union

from nodehealth.observations import NodeJobs, ProbeError
from nodehealth.probes.process_job import job_from_cgroup
from nodehealth.statedir import files, layout, ledger

MAX_PIDS = 65536  # /proc entries looked at; a node with more is not scanned further
# How long after its first sighting a process is still read at every scan (it may be moving
# into a job's cgroup). Launching a task or adopting a session takes milliseconds; 60 s is two
# rounds of the daemon's default interval.
SETTLE_S = 60.0

Key = tuple[int, int, int]  # (st_ino, st_ctime_ns, st_uid) of /proc/<pid>


class _Seen:
    """What one scan learned about a process: its key, when it was first seen and last read."""

    __slots__ = ("first_s", "job", "key", "read_s")

    def __init__(self, key: Key, first_s: float, read_s: float, job: Optional[str]) -> None:
        self.key, self.first_s, self.read_s, self.job = key, first_s, read_s, job


# procfs root -> pid -> what the last scan learned (one root kept). No lock: a scan reads it once
# and replaces it whole (its entries are never changed), so two scans at once (a round's probe
# abandoned at its deadline and the next one's) each give a right answer, whichever is kept.
_CACHE: dict[str, dict[int, _Seen]] = {}


def gather(
    state_dir: str, procfs_root: str, clock: Callable[[], float] = time.monotonic
) -> Union[NodeJobs, ProbeError]:
    boot = layout.read_boot_id(procfs_root)
    running = tuple(
        j
        for j in ledger.entries(r for r in ledger.read(state_dir) if r.boot_id is None or r.boot_id == boot)
        if j.end is None
    )
    try:
        names = os.listdir(procfs_root)
    except OSError as exc:
        return ProbeError("node_jobs", "unavailable", f"cannot list {procfs_root}: {exc.strerror or exc}")
    pid_jobs = _scan(procfs_root, names[:MAX_PIDS], clock())
    return NodeJobs(running=running, pid_jobs=pid_jobs)


def _scan(procfs_root: str, names: list[str], now: float) -> dict[int, str]:
    """pid -> job of every process in ``names`` in a job's cgroup; ``_CACHE`` becomes this scan's."""
    pid_jobs: dict[int, str] = {}
    known = _CACHE.get(procfs_root, {})
    seen: dict[int, _Seen] = {}
    for name in names:
        if not name.isdigit():
            continue
        pid = int(name)
        base = os.path.join(procfs_root, name)
        try:
            st = os.stat(base, follow_symlinks=False)
        except OSError:
            continue  # gone since the listing
        key = (st.st_ino, st.st_ctime_ns, st.st_uid)
        entry = known.get(pid)
        if entry is None or entry.key != key:
            entry = _Seen(key, now, now, _read_job(base))
        elif entry.read_s - entry.first_s < SETTLE_S:
            entry = _Seen(key, entry.first_s, now, _read_job(base))
        seen[pid] = entry
        if entry.job is not None:
            pid_jobs[pid] = entry.job
    if list(_CACHE) != [procfs_root]:
        _CACHE.clear()
    _CACHE[procfs_root] = seen
    return pid_jobs


def _read_job(base: str) -> Optional[str]:
    data = files.read_bytes(os.path.join(base, "cgroup"), 8192)
    return job_from_cgroup(data.decode("utf-8", "replace")) if data else None
