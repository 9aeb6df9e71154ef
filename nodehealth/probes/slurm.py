"""This node as Slurm sees it: the ``slurm_node`` probe's observation (a ``NodeInfo``).

One ``scontrol show node -o NODE`` through ``nodehealth.slurm.client`` (the same call, parser
and ``SLURM_CONF`` handling the Slurm faces use).
"""

from __future__ import annotations

from typing import Union

from nodehealth.observations import ProbeError
from nodehealth.platform.deadline import Deadline
from nodehealth.slurm.client import Scontrol, me
from nodehealth.slurm.nodes import NodeInfo


def show_node(scontrol: str, node: str, timeout_s: float, slurm_conf: str = "") -> Union[NodeInfo, ProbeError]:
    got = me(Scontrol(scontrol, timeout_s, Deadline(timeout_s), slurm_conf), node)
    if isinstance(got, ProbeError):
        return ProbeError("slurm_node", got.kind, got.message)
    return got
