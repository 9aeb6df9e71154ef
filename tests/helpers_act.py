"""The drain sequence's actor as the health check on the fake node ``n1`` has it (tests of the sequence)."""

from __future__ import annotations

from typing import Any

from nodehealth.platform.deadline import Deadline
from nodehealth.slurm import act


def healthcheck_actor(cfg: Any, client: Any, log: act.Log, **more: Any) -> act.Actor:
    """``act.Actor`` of the health check on n1 with ``cfg`` and ``client``, 30 s, boot ``boot-1``; ``more``:
    its other fields (``store``...)."""
    return act.Actor(
        cfg=cfg, node="n1", phase="healthcheck", client=client, deadline=Deadline(30), log=log, boot_id="boot-1", **more
    )
