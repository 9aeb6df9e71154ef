"""Ending the probe children a stopping process leaves behind, with the programs they run.

A forking probe (NVML, mounts, the NCCL self-test) runs its child in its own process group
and abandons it at the deadline; a daemon that stops mid-round has not reached that deadline
yet. A probe child may itself run a program (the NCCL runner, through ``platform.proc.run``),
which leads a session and process group of its own: killing the probe child's group alone
would leave that program and everything it forked running.

``end_tree(pid)`` ends a probe child and what it runs: it stops the child's group (SIGSTOP: no
new fork, and the child cannot die, so its children keep it as their parent while we look),
SIGKILLs the process group of each of its children (the runner's group holds every background
and double-forked descendant, re-parented or not), then SIGKILLs the child's group.
``kill_children`` does that for every child of this process that leads its own group.

No race with a runner being started: until it has called ``setsid`` it is still in the child's
group, so the SIGSTOP stopped it there and the last kill takes it; once it has, the scan finds it
by its parent (the stopped child cannot die and hand it to init meanwhile).
"""

from __future__ import annotations

import os
import signal


def _stats(procfs_root: str) -> list[tuple[int, int, int]]:
    """(pid, ppid, pgrp) of every process."""
    try:
        entries = [e for e in os.listdir(procfs_root) if e.isdigit()]
    except OSError:
        return []
    out = []
    for entry in entries:
        try:
            with open(os.path.join(procfs_root, entry, "stat"), "rb") as f:
                fields = f.read(1024).rsplit(b")", 1)[1].split()
            out.append((int(entry), int(fields[1]), int(fields[2])))
        except (OSError, IndexError, ValueError):
            continue
    return out


def _killpg(pgid: int, sig: int) -> bool:
    if pgid <= 1 or pgid == os.getpgrp():
        return False
    try:
        os.killpg(pgid, sig)
        return True
    except OSError:
        return False


def kill_descendant_groups(pid: int, procfs_root: str = "/proc") -> int:
    """SIGKILL the process group of every child of ``pid`` that is in another group; how many."""
    killed = 0
    for child, ppid, pgrp in _stats(procfs_root):
        if ppid != pid:
            continue
        if pgrp != pid and _killpg(pgrp, signal.SIGKILL):
            killed += 1
        try:
            os.kill(child, signal.SIGKILL)
        except OSError:
            pass
    return killed


def end_tree(pid: int, procfs_root: str = "/proc") -> None:
    """End the probe child ``pid`` (a group leader), the programs it runs and their groups."""
    if not _killpg(pid, signal.SIGSTOP):
        try:
            os.kill(pid, signal.SIGSTOP)
        except OSError:
            return
    kill_descendant_groups(pid, procfs_root)
    if not _killpg(pid, signal.SIGKILL):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def kill_children(procfs_root: str = "/proc") -> int:
    """``end_tree`` every child of this process that leads its own group; how many."""
    me, killed = os.getpid(), 0
    for pid, ppid, pgrp in _stats(procfs_root):
        if ppid == me and pgrp == pid:
            end_tree(pid, procfs_root)
            killed += 1
    return killed
