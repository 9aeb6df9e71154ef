"""Who this task is in the step: rank, size, node name, job and step, from Slurm's environment."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping, Optional


class RankError(Exception):
    """The environment does not describe a Slurm task (or one task per node was not asked for)."""


@dataclass(frozen=True)
class Rank:
    rank: int
    size: int
    node: str
    job_id: str
    step_id: str
    nodelist: tuple[str, ...]  # the step's nodes in rank order (empty when not known)

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def node_of(self, rank: int) -> str:
        """The node of ``rank`` (one task per node: rank r runs on the r-th node of the list)."""
        if 0 <= rank < len(self.nodelist):
            return self.nodelist[rank]
        return f"rank{rank}"


def _int(environ: Mapping[str, str], name: str) -> Optional[int]:
    text = environ.get(name, "").strip()
    if not text:
        return None
    if not text.isdigit():
        raise RankError(f"{name}={text!r} is not a number")
    return int(text)


def expand(nodelist: str) -> tuple[str, ...]:
    """A Slurm host list (``gpu[001-003,007],login1``) as names, in order."""
    if not nodelist.strip():
        return ()
    import hostlist

    try:
        return tuple(hostlist.expand_hostlist(nodelist))
    except hostlist.BadHostlist as exc:
        raise RankError(f"cannot expand the node list {nodelist!r}: {exc}") from None


def from_env(environ: Mapping[str, str], hostname: str = "") -> Rank:
    """The task's place from ``SLURM_PROCID``/``SLURM_NTASKS``/``SLURM_NODEID``/``SLURMD_NODENAME``."""
    rank = _int(environ, "SLURM_PROCID")
    size = _int(environ, "SLURM_NTASKS") or _int(environ, "SLURM_NPROCS")
    if rank is None or size is None:
        raise RankError(
            "not a Slurm task (SLURM_PROCID and SLURM_NTASKS unset): run it as "
            "srun --ntasks-per-node=1 nodehealth preflight"
        )
    if rank >= size:
        raise RankError(f"SLURM_PROCID={rank} is not below SLURM_NTASKS={size}")
    nnodes = _int(environ, "SLURM_STEP_NUM_NODES") or _int(environ, "SLURM_NNODES")
    if nnodes is not None and nnodes != size:
        raise RankError(f"{size} tasks on {nnodes} nodes: preflight runs one task per node (srun --ntasks-per-node=1)")
    nodeid = _int(environ, "SLURM_NODEID")
    if nodeid is not None and nnodes is not None and nodeid != rank:
        raise RankError(f"task {rank} runs on node index {nodeid}: preflight needs one task per node")
    listed = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST") or ""
    nodes = expand(listed)
    if len(nodes) != size:
        nodes = ()
    node = environ.get("SLURMD_NODENAME") or (nodes[rank] if nodes else "") or hostname or f"rank{rank}"
    job = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID") or "nojob"
    step = environ.get("SLURM_STEP_ID") or environ.get("SLURM_STEPID") or "0"
    for name, value in (("job id", job), ("step id", step)):
        if not re.fullmatch(r"[A-Za-z0-9_.+-]{1,64}", value):
            raise RankError(f"the {name} {value!r} cannot name a directory")
    return Rank(rank=rank, size=size, node=node, job_id=job, step_id=step, nodelist=nodes)
