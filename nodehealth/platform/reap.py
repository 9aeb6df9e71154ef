"""Ending the probe children a stopping process leaves behind.

A forking probe (NVML, mounts) runs its child in its own process group and abandons it at
the deadline; a daemon that stops mid-round has not reached that deadline yet. ``kill_children``
SIGKILLs the process group of every child of this process that leads its own group (the
probe children), so none outlives the daemon holding its pipes or a GPU.
"""

from __future__ import annotations

import os
import signal


def kill_children(procfs_root: str = "/proc") -> int:
    me, killed = os.getpid(), 0
    try:
        entries = [e for e in os.listdir(procfs_root) if e.isdigit()]
    except OSError:
        return 0
    for entry in entries:
        try:
            with open(os.path.join(procfs_root, entry, "stat"), "rb") as f:
                fields = f.read(1024).rsplit(b")", 1)[1].split()
            ppid, pgrp = int(fields[1]), int(fields[2])
        except (OSError, IndexError, ValueError):
            continue
        pid = int(entry)
        if ppid == me and pgrp == pid:
            try:
                os.killpg(pid, signal.SIGKILL)
                killed += 1
            except OSError:
                pass
    return killed
