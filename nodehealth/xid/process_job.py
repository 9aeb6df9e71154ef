"""The facts job attribution needs: a live process's Slurm job, and the job ledger.

The matching itself is pure (``nodehealth.xid.attribution``); this module only reads
``<procfs_root>/<pid>/{stat,cgroup,environ}`` and the job ledger file (its records parsed
by ``nodehealth.statedir.ledger``).
"""

from __future__ import annotations

import os
from typing import Optional

from nodehealth.observations import JobLedgerEntry
from nodehealth.statedir import ledger
from nodehealth.xid.attribution import job_from_cgroup, job_from_environ, ledger_entries

LEDGER_TAIL_BYTES = 2 << 20  # [ledger] max_bytes is 1 MiB by default
_MAX_PROC_READ = 1 << 20


def _read(path: str, limit: int = _MAX_PROC_READ) -> Optional[bytes]:
    try:
        with open(path, "rb") as fh:
            return fh.read(limit)
    except OSError:
        return None


def _start_uptime_s(procfs_root: str, pid: int) -> Optional[float]:
    """Seconds after boot the process started (field 22 of ``/proc/<pid>/stat``)."""
    data = _read(os.path.join(procfs_root, str(pid), "stat"), 4096)
    if data is None:
        return None
    try:
        fields = data[data.rindex(b")") + 2:].split()
        ticks = int(fields[19])
        return ticks / os.sysconf("SC_CLK_TCK")
    except (ValueError, IndexError, OSError):
        return None


def live_job(pid: int, procfs_root: str = "/proc", event_uptime_s: Optional[float] = None) -> Optional[str]:
    """The Slurm job of process ``pid`` while it is alive: cgroup path, else ``SLURM_JOB_ID``.

    When the event's uptime is known and the process started after it, the pid was reused
    by another process since, and None is returned rather than a wrong job.
    """
    if pid <= 0:
        return None
    if event_uptime_s is not None:
        started = _start_uptime_s(procfs_root, pid)
        if started is not None and started > event_uptime_s + 1.0:
            return None
    base = os.path.join(procfs_root, str(pid))
    cgroup = _read(os.path.join(base, "cgroup"))
    if cgroup is not None:
        job = job_from_cgroup(cgroup.decode("utf-8", errors="replace"))
        if job is not None:
            return job
    environ = _read(os.path.join(base, "environ"))
    if environ is not None:
        return job_from_environ(environ)
    return None


def ledger_path(state_dir: str) -> str:
    return os.path.join(state_dir, ledger.FILE_NAME)


def read_ledger(state_dir: str, tail_bytes: int = LEDGER_TAIL_BYTES) -> tuple[JobLedgerEntry, ...]:
    """The job ledger as one entry per job; empty when there is no ledger.

    Only the last ``tail_bytes`` of the file are read (the ledger is compacted well below
    that); a line cut by that limit, like any invalid line, is skipped.
    """
    try:
        with open(ledger_path(state_dir), "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            start = max(0, size - tail_bytes)
            fh.seek(start)
            data = fh.read(tail_bytes)
    except OSError:
        return ()
    lines = data.decode("utf-8", errors="replace").split("\n")
    if start > 0 and lines:
        lines = lines[1:]
    records = [r for r in (ledger.parse_line(line) for line in lines if line.strip()) if r is not None]
    return ledger_entries(records)
