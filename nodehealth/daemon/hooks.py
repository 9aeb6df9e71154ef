"""What the daemon plugs in around its rounds, each replaceable (tests pass their own).

* ``SlurmHook``: act on a round's Report: drain on a fault, resume when clean, through the
  same sequence as the health check (``nodehealth.slurm.act``: ownership, breaker,
  hysteresis, reboot-class faults), so the daemon and the Slurm faces can never disagree.
* ``XidFollower``: follow the kernel log and call back for every XID event, judged with the
  XID catalog. A drain-class event makes the daemon act at once, not at its next round. The
  default is ``nodehealth.probes.xid_follower.StoreXidFollower``.
* ``ledger_jobs``: which Slurm job holds each GPU, from the job ledger the prolog/epilog keep.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional, Protocol

from nodehealth.config.schema import Config
from nodehealth.metrics import SlurmView
from nodehealth.model import Report
from nodehealth.probes.xid_follower import StoreXidFollower as StoreXidFollower  # the default XidFollower

Logger = Callable[..., None]


class SlurmHook(Protocol):
    def after_round(self, cfg: Config, report: Report, node: str, boot_id: Optional[str]) -> Optional[SlurmView]:
        """Drain or resume as the policy says; what Slurm shows now (None: not known)."""

    def on_fault(self, cfg: Config, report: Report, node: str, boot_id: Optional[str]) -> Optional[SlurmView]:
        """A fault that cannot wait for the next round (a drain-class XID): drain now."""


class XidFollower(Protocol):
    def start(self, on_event: Callable[[Any], None]) -> None: ...

    def state(self) -> str:
        """``alive`` or ``dead``."""

    def stop(self) -> None: ...


class ActSlurm:
    """The one drain/resume sequence (``nodehealth.slurm.act``), run by the daemon."""

    def __init__(self, log: Logger) -> None:
        self.log = log
        self.lock = threading.Lock()

    def _actor(self, cfg: Config, node: str, boot_id: Optional[str]) -> Any:
        from nodehealth.platform.deadline import Deadline
        from nodehealth.slurm import act, observe
        from nodehealth.slurm.client import Scontrol

        deadline = Deadline(max(1.0, 3 * cfg.slurm.timeout_s))
        real = Scontrol(cfg.slurm.scontrol, cfg.slurm.timeout_s, deadline, cfg.slurm.conf)
        client = observe.client(cfg, node, real, self.log)  # [slurm] mode = "observe": no update
        return act.Actor(
            cfg=cfg, node=node, phase="daemon", client=client, deadline=deadline, log=self.log, boot_id=boot_id
        )

    def on_fault(self, cfg: Config, report: Report, node: str, boot_id: Optional[str]) -> Optional[SlurmView]:
        from nodehealth.slurm import act
        from nodehealth.slurm.policy import worst_failure

        if worst_failure(report, cfg.policy.unknown) is None:
            return None
        with self.lock:
            return with_loop(slurm_view(act.on_fault(self._actor(cfg, node, boot_id), report), cfg.paths), cfg, node)

    def after_round(self, cfg: Config, report: Report, node: str, boot_id: Optional[str]) -> Optional[SlurmView]:
        """The health-check flow on the round's Report: no Slurm call on a healthy node but the
        hourly reconciliation (the round's ``slurm_node`` probe and this share the cached view)."""
        from nodehealth.slurm import act

        with self.lock:
            return with_loop(slurm_view(act.after_check(self._actor(cfg, node, boot_id), report), cfg.paths), cfg, node)


def slurm_view(acted: Any, paths: Any) -> SlurmView:
    """What the metrics show of an ``act.Acted``: the node's drain state, the action taken, and
    whether the breaker holds a drain of this node back (by anyone: a prolog or epilog that was
    held records it in the Slurm state file, and only a drain, a resume or a clean run clears it)."""
    from nodehealth.slurm import policy
    from nodehealth.slurm.act import ActOutcome
    from nodehealth.statedir import slurmstate

    state = slurmstate.load(paths)
    held = state.breaker_held is not None
    o, n = acted.outcome, acted.node
    action = "" if o in (ActOutcome.NONE, ActOutcome.ALREADY) else o.value
    # Flap hold and orphan from the state file, whoever found them (a face or the daemon).
    flapping = state.drain is not None and state.drain.flapping
    orphan = state.drain is None and state.orphan is not None
    if n is None:
        ours = True if o.drained_by_us else None
        return SlurmView(
            drained=ours,
            drained_by_nodehealth=ours,
            breaker_open=held,
            last_action=action,
            flapping=flapping,
            orphan_drain=orphan,
        )
    return SlurmView(
        drained=n.drained or o == ActOutcome.DRAINED,
        drained_by_nodehealth=policy.owns(n, state) or o == ActOutcome.DRAINED,
        breaker_open=held,
        reason=n.reason.full if n.reason else None,
        last_action=action,
        flapping=flapping,
        orphan_drain=orphan,
    )


def with_loop(view: SlurmView, cfg: Config, node: str) -> SlurmView:
    """``view`` with observe mode and the reboot loop: the mode, the would-be counts (the faces' too),
    the reboots asked within the window and whether our drain is held after them."""
    import dataclasses

    from nodehealth.slurm import observe, reboot
    from nodehealth.statedir.records import read_doc

    would = observe.would_counts(read_doc(cfg.paths, observe.FILE_NAME))
    loop = reboot.status(cfg, node)
    if observe.observing(cfg) and observe.effective(cfg.paths, node) is not None:
        # The act sequence saw its would-be drain; Slurm has the node in service (no reason of its own there).
        view = dataclasses.replace(view, drained=False, drained_by_nodehealth=False)
    return dataclasses.replace(
        view,
        observe_mode=observe.observing(cfg),
        would=tuple(sorted(would.items())),
        reboots_requested=loop[0],
        reboot_escalated=loop[1],
    )


def default_slurm_hook(log: Logger) -> Optional[SlurmHook]:
    return ActSlurm(log)


def ledger_jobs(state_dir: str, gpus: list[int], now: float) -> dict[int, str]:
    """GPU index -> the job holding it now, by the ledger's one rule (``statedir.ledger.holder``)."""
    from nodehealth.statedir import ledger

    jobs = ledger.entries(ledger.read(state_dir))
    out: dict[int, str] = {}
    for gpu in gpus:
        job = ledger.holder(jobs, gpu, now, slack_s=0.0)
        if job is not None:
            out[gpu] = job
    return out
