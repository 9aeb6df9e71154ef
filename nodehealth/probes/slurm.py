"""This node as Slurm sees it: the ``slurm_node`` probe's observation (a ``NodeInfo``).

slurmctld serves the whole cluster, so the probe asks it as little as it can: the view the
health check or the daemon last read is cached in the Slurm state file, and

* the prolog and epilog never call slurmctld (SchedMD: Prolog and Epilog call no Slurm
  command): they use the cached view, however old, or answer "no cached view yet";
* the health check, the daemon and ``nodehealth check`` use it while it is younger than
  ``[slurm] reconcile_s`` (an hour by default), else read the node once
  (``scontrol show node -o NODE``, through ``nodehealth.slurm.client``) and cache what they read.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Union

from nodehealth.observations import ProbeError
from nodehealth.platform.deadline import Deadline
from nodehealth.slurm.client import Scontrol, me
from nodehealth.slurm.nodes import NodeInfo
from nodehealth.statedir import slurmstate

NO_CALL_PHASES = ("prolog", "epilog")


def show_node(scontrol: str, node: str, timeout_s: float, slurm_conf: str = "") -> Union[NodeInfo, ProbeError]:
    """``scontrol show node -o NODE`` now (one call)."""
    got = me(Scontrol(scontrol, timeout_s, Deadline(timeout_s), slurm_conf), node)
    if isinstance(got, ProbeError):
        return ProbeError("slurm_node", got.kind, got.message)
    return replace(got, seen_at=time.time())


def node_view(cfg: Any, node: str, phase: str, timeout_s: float,
              cached_only: bool = False, cache: bool = True) -> Union[NodeInfo, ProbeError]:
    """The cached view, or slurmctld's answer now; ``cache=False`` (``nodehealth check`` by hand):
    the answer is used for this run and not written to the state dir."""
    state_dir = cfg.paths.state_dir
    cached = NodeInfo.from_json(slurmstate.load(state_dir).slurm_node)
    if cached is not None and cached.name != node:
        cached = None
    now = time.time()
    if phase in NO_CALL_PHASES or cached_only:
        if cached is None:
            return ProbeError("slurm_node", "unavailable", "no cached Slurm view of this node yet "
                              "(the health check or the daemon writes it)")
        return cached
    if cached is not None and cached.fresh(now, cfg.slurm.reconcile_s):
        return cached
    got = show_node(cfg.slurm.scontrol, node, timeout_s, cfg.slurm.conf)
    if isinstance(got, NodeInfo):
        if cache:
            view = dict(got.to_json())
            slurmstate.update(state_dir, lambda s: replace(s, slurm_node=view), lock_timeout_s=0.5)
    elif cached is not None:
        return cached  # slurmctld did not answer: the last view stands (it says how old it is)
    return got
