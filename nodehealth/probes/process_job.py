"""The Slurm job of a live process: what XID attribution learns from ``/proc/<pid>``.

When the driver blames a process and it is still alive when the record is read, its job is
the ``job_<id>`` component of ``<procfs_root>/<pid>/cgroup`` (Slurm's cgroup plugins, v1 and
v2 layouts), else ``SLURM_JOB_ID`` in ``<procfs_root>/<pid>/environ``. The parsers of those
files are pure; ``live_job`` reads them. The matching of events to GPUs and to the job ledger
is ``nodehealth.xid.attribution``.
"""

from __future__ import annotations

import os
import re
from typing import Optional

from nodehealth.statedir.files import read_bytes
from nodehealth.statedir.layout import valid_job_id

_MAX_PROC_READ = 1 << 20

# Slurm cgroup paths, v1 and v2 (0::/system.slice/slurmstepd.scope/job_81234/step_0/user/task_0,
# 4:devices:/slurm/uid_1000/job_81234/step_batch).
_CGROUP_JOB_RE = re.compile(r"/job_(\d+)(?:/|$)")


def job_from_cgroup(text: str) -> Optional[str]:
    """The Slurm job id in the contents of ``/proc/<pid>/cgroup``, or None."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        m = _CGROUP_JOB_RE.search(path.strip())
        if m:
            return valid_job_id(m.group(1))  # \d is any Unicode digit, of any length
    return None


def job_from_environ(data: bytes) -> Optional[str]:
    """``SLURM_JOB_ID`` (or the older ``SLURM_JOBID``) from ``/proc/<pid>/environ`` bytes."""
    found: dict[str, str] = {}
    for item in data.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key in (b"SLURM_JOB_ID", b"SLURM_JOBID"):
            text = value.decode("ascii", errors="replace").strip()
            if valid_job_id(text) is not None:
                found[key.decode()] = text
    return found.get("SLURM_JOB_ID") or found.get("SLURM_JOBID")


def _start_uptime_s(procfs_root: str, pid: int) -> Optional[float]:
    """Seconds after boot the process started (field 22 of ``/proc/<pid>/stat``)."""
    data = read_bytes(os.path.join(procfs_root, str(pid), "stat"), 4096)
    if data is None:
        return None
    try:
        fields = data[data.rindex(b")") + 2 :].split()
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
    cgroup = read_bytes(os.path.join(base, "cgroup"), _MAX_PROC_READ)
    if cgroup is not None:
        job = job_from_cgroup(cgroup.decode("utf-8", errors="replace"))
        if job is not None:
            return job
    environ = read_bytes(os.path.join(base, "environ"), _MAX_PROC_READ)
    if environ is not None:
        return job_from_environ(environ)
    return None
