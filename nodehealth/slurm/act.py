"""The one drain/resume sequence: what the prolog, epilog, health check and daemon do with a Report.

Every face and the daemon call these two functions, so they cannot disagree on policy:

* ``on_fault`` — drain for the worst fault unless ownership, the breaker or ``[drain] enabled``
  says no (used by the prolog, the epilog, and the daemon's XID follower);
* ``after_check`` — the health-check flow: advance the clean-run count, cache this node's
  Slurm view, then drain on a fault, forget a drain record someone else resolved, or resume
  a node we drained once the hysteresis allows it (used by the health check and each daemon
  round).

Both return an ``Acted``: an ``Outcome`` (an enum, not a string to re-interpret) and the node
as Slurm showed it, from which callers derive exit codes and metrics. The decisions are the
pure functions of ``nodehealth.slurm.policy``; the Slurm calls go through a ``SlurmClient``
bounded by the caller's deadline; the memory is ``nodehealth.statedir.slurmstate``.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional, Union

from nodehealth.model import Report
from nodehealth.observations import ProbeError
from nodehealth.platform.deadline import Deadline
from nodehealth.slurm import policy
from nodehealth.slurm.client import SlurmClient
from nodehealth.slurm.nodes import NodeInfo, parse_state
from nodehealth.statedir import slurmstate
from nodehealth.statedir.slurmstate import DrainRecord, State

Log = Callable[..., None]  # log(message, notable=False)


class Outcome(str, enum.Enum):
    """What the sequence did. The value is the ``action`` label of ``nodehealth_slurm_actions_total``."""

    NONE = ""  # nothing to do (healthy, or a fault already drained for by us)
    DRAINED = "drained"
    ALREADY = "already"  # our own drain holds the node already
    OTHER = "other"  # another reason holds the node: left untouched
    HELD = "held"  # the drain-storm breaker held the drain back
    DISABLED = "disabled"  # [drain] enabled = false
    UNREACHABLE = "unreachable"  # a fault, and slurmctld did not answer (or no time was left)
    RESUMED = "resumed"
    RESUME_FAILED = "resume_failed"

    @property
    def drained_by_us(self) -> bool:
        return self in (Outcome.DRAINED, Outcome.ALREADY)


@dataclass(frozen=True)
class Acted:
    outcome: Outcome
    node: Optional[NodeInfo] = None  # this node as Slurm last showed it (None: not read)


@dataclass
class Actor:
    """Who acts, on which node, with what: one per face run or daemon action."""

    cfg: Any  # nodehealth.config.schema.Config
    node: str
    phase: str
    client: SlurmClient
    deadline: Deadline
    log: Log
    boot_id: Optional[str]
    job_id: Optional[str] = None

    def lock_timeout(self) -> float:
        return min(1.0, max(0.1, self.deadline.left()))

    def save(self, change: Callable[[State], State]) -> Optional[State]:
        return slurmstate.update(self.cfg.paths.state_dir, change, self.lock_timeout(), self.log)


def on_fault(actor: Actor, report: Report, me: Optional[NodeInfo] = None) -> Acted:
    """Drain for the worst fault of ``report``; ``me``: this node's record when already read."""
    cfg = actor.cfg
    fault = policy.worst_failure(report, cfg.policy.unknown)
    assert fault is not None
    reason = policy.format_reason(fault, cfg.drain.reason_max_len,
                                  policy.fault_count(report, cfg.policy.unknown) - 1)
    now = time.time()
    status = report.status.name

    def record(state: State) -> State:
        rec = DrainRecord(reason=reason, check=fault.name, action=fault.action.value, boot_id=actor.boot_id,
                          time=now, phase=actor.phase, job_id=actor.job_id)
        return replace(state, clean_runs=0, drain=rec, last_status=status, last_run=now, boot_id=actor.boot_id)

    def not_drained(outcome: Outcome, why: str, node: Optional[NodeInfo]) -> Acted:
        """A fault this run did not drain for: the clean-run count starts again."""
        actor.log(f"fault ({reason}); {why}", notable=True)
        actor.save(lambda s: replace(s, clean_runs=0, last_status=status, last_run=now))
        return Acted(outcome, node)

    if not cfg.drain.enabled:
        return not_drained(Outcome.DISABLED, "[drain] enabled = false: not draining", me)
    nodes: Optional[list[NodeInfo]] = None
    if me is None:
        everyone = actor.client.show(None)
        if isinstance(everyone, ProbeError):
            return not_drained(Outcome.UNREACHABLE, f"slurmctld did not answer ({everyone.message}): "
                               "cannot set the reason", None)
        nodes = everyone
        me = next((n for n in everyone if n.name == actor.node), None)
    decision = policy.decide_drain(me, fault, reason)
    if decision.action != "drain":
        if me is not None and me.drained_by_us:
            actor.log(f"fault ({reason}); {decision.why}", notable=True)
            # Keep the first record of this drain (its phase, job and boot id).
            actor.save(lambda s: replace(s, clean_runs=0) if s.drain and s.drain.reason == reason else record(s))
            return Acted(Outcome.ALREADY, me)
        return not_drained(Outcome.OTHER, decision.why, me)
    if nodes is None:
        everyone = actor.client.show(None)
        if isinstance(everyone, ProbeError):
            return not_drained(Outcome.UNREACHABLE, f"cannot count drained nodes ({everyone.message}): "
                               "not draining", me)
        nodes = everyone
    br = policy.breaker(nodes, cfg.drain.max_share, cfg.drain.breaker_min_drained, exclude=actor.node)
    if br.tripped:
        actor.log(f"fault ({reason}); NOT draining: {br.describe()}", notable=True)
        held = {"time": now, "ours": br.ours, "total": br.total, "share": round(br.share, 4),
                "limit": br.limit, "reason": reason, "phase": actor.phase}
        actor.save(lambda s: replace(s, clean_runs=0, breaker_held=held, last_status=status, last_run=now))
        return Acted(Outcome.HELD, me)
    out = actor.client.update(actor.node, "drain", reason)
    if not out.ok:
        return not_drained(Outcome.UNREACHABLE, f"drain failed: {out.message}", me)
    actor.log(f"drained {actor.node}: {reason}", notable=True)
    actor.save(lambda s: replace(record(s), breaker_held=None))
    return Acted(Outcome.DRAINED, me)


def after_check(actor: Actor, report: Report, me: Union[NodeInfo, ProbeError]) -> Acted:
    """The health-check flow for a Report judged just now; ``me``: this node's record read for it."""
    cfg = actor.cfg
    now = time.time()

    def advance(s: State) -> State:
        s = policy.after_run(s, report, cfg.policy.unknown, now, actor.boot_id)
        if isinstance(me, NodeInfo):
            s = replace(s, slurm_node=dict(me.to_json(), time=now))
        return s

    state = actor.save(advance) or slurmstate.load(cfg.paths.state_dir)
    if policy.worst_failure(report, cfg.policy.unknown) is not None:
        if isinstance(me, ProbeError):
            actor.log(f"fault, but slurmctld did not answer ({me.message}): cannot drain now", notable=True)
            return Acted(Outcome.UNREACHABLE)
        return on_fault(actor, report, me=me)
    if isinstance(me, ProbeError):
        return Acted(Outcome.NONE)  # healthy: nothing to do, whether or not slurmctld answered
    if state.drain is not None and not me.drained_by_us:
        # Resumed or re-reasoned by someone else: forget our drain.
        actor.log(f"our drain record is stale (node {me.state.text}, reason "
                  f"{me.reason.full if me.reason else None!r}); forgetting it")
        state = actor.save(lambda s: replace(s, drain=None)) or replace(state, drain=None)
    if not cfg.resume.enabled:
        return Acted(Outcome.NONE, me)
    decision = policy.decide_resume(me, state, cfg.resume.clean_runs, actor.boot_id, cfg.resume.reboot_actions)
    if decision.action != "resume":
        if me.drained:
            actor.log(f"not resuming: {decision.why}")
        return Acted(Outcome.NONE, me)
    out = actor.client.update(actor.node, "resume")
    if not out.ok:
        actor.log(f"resume failed: {out.message}", notable=True)
        return Acted(Outcome.RESUME_FAILED, me)
    actor.log(f"resumed {actor.node}: {decision.why} (was: {me.reason.full if me.reason else ''})", notable=True)
    actor.save(lambda s: replace(s, drain=None, breaker_held=None))
    return Acted(Outcome.RESUMED, replace(me, state=parse_state(me.state.base), reason=None))
