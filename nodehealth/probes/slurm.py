"""This node as Slurm sees it: the ``slurm_node`` probe's observation.

One ``scontrol show node -o NODE`` through ``probes.slurmctl`` (the same call, parser and
``SLURM_CONF`` handling the Slurm faces use), turned into a ``SlurmNode``.
"""

from __future__ import annotations

from typing import Union

from nodehealth.observations import ProbeError, SlurmNode
from nodehealth.slurm import client as slurmctl
from nodehealth.slurm.policy import NodeInfo


def as_slurm_node(info: NodeInfo) -> SlurmNode:
    return SlurmNode(name=info.name, gres_gpus=info.gres_gpus, state=info.state.text,
                     reason=info.reason.full if info.reason else None)


def show_node(scontrol: str, node: str, timeout_s: float, slurm_conf: str = "") -> Union[SlurmNode, ProbeError]:
    got = slurmctl.show_nodes(scontrol, node, timeout_s, slurmctl.environment(slurm_conf))
    if isinstance(got, ProbeError):
        return ProbeError("slurm_node", got.kind, got.message)
    return as_slurm_node(next(n for n in got if n.name == node))
