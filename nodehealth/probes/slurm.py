"""This node as Slurm sees it: the ``slurm_node`` probe's observation (a ``NodeInfo``).

slurmctld serves the whole cluster, so the probe asks it as little as it can: the view the
health check or the daemon last read is cached in the Slurm state file, and

* the prolog and epilog never call slurmctld (SchedMD: Prolog and Epilog call no Slurm
  command): they use the cached view, however old, or answer "no cached view yet";
* the health check, the daemon and ``nodehealth check`` use it while it is younger than
  ``[slurm] reconcile_s`` (an hour by default), else read the node once
  (``scontrol show node -o NODE``, through ``nodehealth.slurm.client``) and cache what they read;
  after a read that failed, the next waits (``client.BACKOFF``), the cached view standing meanwhile.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Union

from nodehealth.observations import ProbeError
from nodehealth.slurm.nodes import NodeInfo, reconcile_after_s
from nodehealth.statedir import slurmstate

NO_CALL_PHASES = ("prolog", "epilog")
# What the cache keeps of slurmctld's answer, each field bounded before it is stored: a node name is a
# host name (at most 255 characters), a state a few flags, a reason at most [drain] reason_max_len
# (1000) with Slurm's "[user@time]" suffix; a longer one is no reason of ours and is cut.
MAX_NAME_CHARS = 255
MAX_STATE_CHARS = 128
MAX_REASON_CHARS = 2048


def _bounded_text(value: Any, limit: int) -> Any:
    if not isinstance(value, str):
        return None
    text = "".join(ch if ch.isprintable() else "?" for ch in value[:limit])
    return text


def cached_view(info: NodeInfo) -> Union[dict[str, Any], None]:
    """The bounded fields the Slurm state file keeps of ``info`` (``NodeInfo.to_json``'s keys), or None
    for a name no cache should hold (empty, too long, not printable ASCII)."""
    raw = info.to_json()
    name = raw.get("name")
    if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME_CHARS or not all(" " < ch <= "~" for ch in name):
        return None
    gres = raw.get("gres_gpus")
    return {
        "name": name,
        "gres_gpus": gres if isinstance(gres, int) and not isinstance(gres, bool) and 0 <= gres < 1 << 16 else None,
        "state": _bounded_text(raw.get("state"), MAX_STATE_CHARS),
        "reason": _bounded_text(raw.get("reason"), MAX_REASON_CHARS),
        "time": raw.get("time"),
    }


def show_node(scontrol: str, node: str, timeout_s: float, slurm_conf: str = "") -> Union[NodeInfo, ProbeError]:
    """``scontrol show node -o NODE`` now (one call)."""
    # Imported here: the prolog and epilog read the cached view only, and never pay for the client.
    from nodehealth.platform.deadline import Deadline
    from nodehealth.slurm.client import Scontrol, me

    got = me(Scontrol(scontrol, timeout_s, Deadline(timeout_s), slurm_conf), node)
    if isinstance(got, ProbeError):
        return ProbeError("slurm_node", got.kind, got.message)
    return replace(got, seen_at=time.time())


def node_view(
    cfg: Any,
    node: str,
    phase: str,
    timeout_s: float,
    cached_only: bool = False,
    cache: bool = True,
    clock: Any = time.monotonic,
) -> Union[NodeInfo, ProbeError]:
    """The cached view, or slurmctld's answer now; ``cache=False`` (``nodehealth check`` by hand):
    the answer is used for this run and not written to the state dir. After a failed read none is
    made until its back-off has passed (``client.BACKOFF``; ``clock``: the back-off's)."""
    cached = NodeInfo.from_json(slurmstate.load(cfg.paths).slurm_node)
    if cached is not None and cached.name != node:
        cached = None
    now = time.time()
    if phase in NO_CALL_PHASES or cached_only:
        if cached is None:
            return ProbeError(
                "slurm_node",
                "unavailable",
                "no cached Slurm view of this node yet (the health check or the daemon writes it)",
            )
        return cached
    if cached is not None and cached.fresh(now, reconcile_after_s(node, cfg.slurm.reconcile_s)):
        return cached
    from nodehealth.slurm.client import BACKOFF

    got = BACKOFF.read(cfg, node, lambda: show_node(cfg.slurm.scontrol, node, timeout_s, cfg.slurm.conf), clock)
    if isinstance(got, NodeInfo):
        from nodehealth.slurm import observe

        got = observe.view(cfg, got)  # observe mode: the would-be drain over the real record
        view = cached_view(got) if cache else None
        if view is not None:
            slurmstate.update(cfg.paths, lambda s: replace(s, slurm_node=view), lock_timeout_s=0.5)
    elif cached is not None:
        return cached  # slurmctld did not answer (or is backed off): the last view stands (it says how old it is)
    return got
