"""The one drain/resume sequence: what the prolog, epilog, health check and daemon do with a Report.

Every face and the daemon call these two functions, so they cannot disagree on policy:

* ``on_fault`` — drain for the worst fault unless ownership, the breaker or ``[drain] enabled``
  says no (used by the prolog, the epilog, and the daemon's XID follower);
* ``after_check`` — the health-check flow: advance the clean-run count, cache this node's
  Slurm view, then drain on a fault, forget a drain record someone else resolved, or resume
  a node we drained once the hysteresis allows it (used by the health check and each daemon
  round).

Under churn (docs/operations.md, "Flapping", "Orphan drains", "Quiet logs"):

* the drain that makes ``[resume] flap_drains`` drains of one check within ``flap_window_s`` is
  held for a person (reason ``nh:flap ...``, never resumed), and each drain within the window
  needs twice the clean runs of the one before (``policy.clean_runs_needed``);
* a resume is made only on a read of the node made just before it (never on the cached view);
* a fault back after a run judged it gone reads the node before trusting our drain record (a person
  may have resumed the node by hand); a fault that has held since the drain costs no call;
* a drain for processes lasts while NVML lists a process on its GPUs (``policy.judged_clean``);
* a node drained with a nodehealth reason and no record of ours is an orphan: said once, left;
* what the sequence says of a node that stays as it is is said once per drain, not every run.

Both return an ``Acted``: an ``ActOutcome`` (an enum, not a string to re-interpret) and the node
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
from nodehealth.observations.record import record
from nodehealth.platform.deadline import Deadline
from nodehealth.slurm import policy, reboot
from nodehealth.slurm.client import BACKOFF, SlurmClient
from nodehealth.slurm.client import me as read_node
from nodehealth.slurm.nodes import REBOOT_FLAGS, NodeInfo, parse_reason, parse_state, reconcile_after_s
from nodehealth.slurm.stores import FileStore as FileStore
from nodehealth.slurm.stores import MemoryStore as MemoryStore
from nodehealth.statedir import slurmstate
from nodehealth.statedir.slurmstate import DrainRecord, State

Log = Callable[..., None]  # log(message, notable=False)


class ActOutcome(str, enum.Enum):
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
        return self in (ActOutcome.DRAINED, ActOutcome.ALREADY)


@record
class Acted:
    outcome: ActOutcome
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
    # A drain record older than this (Unix time) is not trusted without asking Slurm: a prolog
    # runs only on a node Slurm let a job start on, so a drain of ours recorded before the job
    # was allocated has been lifted since (a person resumed the node). None: trust the record.
    record_trusted_after: Optional[float] = None
    # Where the sequence keeps what it remembers (None: the state dir, ``FileStore``); a preview's
    # ``MemoryStore`` changes nothing on disk.
    store: Any = None

    def __post_init__(self) -> None:
        if self.store is None:
            self.store = FileStore(self.cfg.paths)

    def lock_timeout(self) -> float:
        return min(1.0, max(0.1, self.deadline.left()))

    def load(self) -> State:
        """The Slurm state as the sequence remembers it."""
        state: State = self.store.load()
        return state

    def save(self, change: Callable[[State], State]) -> Optional[State]:
        saved: Optional[State] = self.store.update(change, self.lock_timeout(), self.log)
        return saved

    def update_doc(self, name: str, change: Callable[[dict[str, Any]], dict[str, Any]]) -> dict[str, Any]:
        """One of the sequence's small JSON records (``statedir.records``); OSError when not written."""
        doc: dict[str, Any] = self.store.update_doc(name, change, self.lock_timeout())
        return doc

    def say(self, text: str, notable: bool = False) -> None:
        """Log ``text`` unless it is what this face last said of the node's drain (once per drain and
        change: a drained faulty node checked every 5 s says it once, not 17,000 times a day)."""
        key = f"{self.phase}~act"
        state = self.load()
        mark = f"{state.drain.time if state.drain else 0}|{text}"[: slurmstate.MAX_LOGGED_CHARS]
        if (state.logged or {}).get(key, {}).get("said") == mark:
            return
        self.log(text, notable=notable)
        self.save(lambda s: replace(s, logged=dict(s.logged or {}, **{key: {"said": mark}})))


def read_me(actor: Actor) -> Union[NodeInfo, ProbeError]:
    """This node from slurmctld now (one call), cached in the state file for the others."""
    got = read_node(actor.client, actor.node)
    if isinstance(got, NodeInfo):
        got = replace(got, seen_at=time.time())
        cache = dict(got.to_json())
        actor.save(lambda s: replace(s, slurm_node=cache))
    return got


def _disown(actor: Actor, node: NodeInfo, state: State) -> None:
    """Our drain record no longer matches Slurm: a person resumed the node or edited the reason."""
    text = node.reason.full if node.reason else None
    if node.drained and text is not None and state.disowned != text:
        actor.log(
            f"drain reason changed to {text!r} (was ours: {state.drain.reason if state.drain else ''!r}); "
            "it belongs to whoever changed it: never overwritten, never resumed",
            notable=True,
        )
    elif not node.drained:
        actor.log(f"node {node.state.text}: our drain was lifted by someone else; forgetting it")
    check = state.drain.check if state.drain is not None and state.drain.flapping and not node.drained else None

    def forget(s: State) -> State:
        # A person resumed a drain held for flapping: they judged the part; its count starts again.
        history = policy.forget_check(s.history, check) if check is not None else s.history
        return replace(s, drain=None, disowned=text if node.drained else None, history=history)

    actor.save(forget)


def _orphan(actor: Actor, node: Optional[NodeInfo], state: State) -> bool:
    """A nodehealth reason on this node with no record of ours: said once (log, state for status and
    the metric), never resumed, never overwritten. True while the node is one."""
    if state.drain is not None or node is None:
        return False
    if node.drained_by_us and node.reason is not None:
        text = node.reason.full[: slurmstate.MAX_TEXT_CHARS]
        if state.orphan != text:
            actor.log(
                f"{actor.node} is drained with a nodehealth reason and no record of ours ({text!r}; "
                "the state dir was lost or wiped?): nodehealth never resumes it; once the node is "
                f"fixed, resume it by hand: scontrol update nodename={actor.node} state=resume",
                notable=True,
            )
            actor.save(lambda s: replace(s, orphan=text))
        return True
    if state.orphan is not None:
        actor.log(f"{actor.node}: the orphan nodehealth drain is gone (node {node.state.text})")
        actor.save(lambda s: replace(s, orphan=None))
    return False


def on_fault(actor: Actor, report: Report, me: Optional[NodeInfo] = None, seen_clean: Optional[bool] = None) -> Acted:
    """Drain for the worst fault of ``report``; ``me``: this node's record when just read.

    Slurm calls: none while a drain of ours already holds the node for a fault at least as
    severe (its first reason stays) and that fault has held since the drain, nor while ``me``
    shows it drained for another reason; else one cluster view (this node and the breaker's count)
    and the drain. The drain that makes ``[resume] flap_drains`` drains of its check within
    ``flap_window_s`` is held for a person.

    ``seen_clean``: whether a run judged the drain's fault gone since the drain (the caller that
    advanced the clean-run count before this call says what the count was; else the count
    loaded). A fault that comes back after that is not the one the record drained for: a person
    may have resumed the node meanwhile (``scontrol update state=resume`` while our record stays),
    so the record is read back from Slurm, not trusted.
    """
    cfg = actor.cfg
    fault = policy.worst_failure(report, cfg.policy.unknown)
    assert fault is not None
    more = policy.fault_count(report, cfg.policy.unknown) - 1
    reason = policy.format_reason(fault, cfg.drain.reason_max_len, more)
    now = time.time()
    status = report.status.name

    def not_drained(outcome: ActOutcome, why: str, node: Optional[NodeInfo]) -> Acted:
        """A fault this run did not drain for: the clean-run count starts again."""
        actor.say(f"fault ({reason}); {why}", notable=True)
        actor.save(lambda s: replace(s, clean_runs=0, last_status=status, last_run=now))
        return Acted(outcome, node)

    if not cfg.drain.enabled:
        return not_drained(ActOutcome.DISABLED, "[drain] enabled = false: not draining", me)
    state = actor.load()
    window = cfg.resume.flap_window_s
    drains = policy.drains_within(state.history, fault.name, now, window) + 1
    held = policy.flapping(drains, cfg.resume.flap_drains)
    if not held and state.drain is not None and state.drain.flapping:
        held, drains = True, max(drains, state.drain.drains)  # a new reason never lifts a hold for a person
    if held:
        reason = policy.flap_reason(fault, drains, window, cfg.drain.reason_max_len, more)

    def record(state: State) -> State:
        rec = DrainRecord(
            reason=reason,
            check=fault.name,
            action=fault.action.value,
            boot_id=actor.boot_id,
            time=now,
            phase=actor.phase,
            job_id=actor.job_id,
            drains=drains,
            flapping=held,
            gpus=policy.fault_gpus(fault),
        )
        # The cached view predates the drain: the next look at this node reads it (and so confirms the drain).
        stale = dict(state.slurm_node, time=None) if state.slurm_node else None
        return replace(
            state,
            clean_runs=0,
            drain=rec,
            disowned=None,
            orphan=None,
            last_status=status,
            last_run=now,
            boot_id=actor.boot_id,
            slurm_node=stale,
            history=policy.remember_drain(state.history, fault.name, now, window),
        )

    def drained(what: str) -> None:
        if held:
            actor.log(
                f"{what}: held for a person: {fault.name} drained {drains} times within {policy.span(window)} "
                f"([resume] flap_drains = {cfg.resume.flap_drains}); nodehealth will not resume it: "
                f"scontrol update nodename={actor.node} state=resume once it is fixed",
                notable=True,
            )

    if seen_clean is None:
        seen_clean = state.clean_runs > 0  # recording a drain (and every fault) sets the count to 0
    trusted = (
        state.drain is not None
        and not seen_clean
        and (actor.record_trusted_after is None or state.drain.time >= actor.record_trusted_after)
    )
    if state.drain is not None and (policy.owns(me, state) if me is not None else trusted):
        # Ours already (by our record; Slurm keeps an existing reason, so no call is needed to stay drained).
        decision = policy.decide_drain(_as_ours(me, state), state, fault, reason)
        if decision.action != "drain":
            actor.say(f"fault ({reason}); {decision.why}")
            actor.save(lambda s: replace(s, clean_runs=0, last_status=status, last_run=now))
            return Acted(ActOutcome.ALREADY, me)
        # A more severe fault replaces the reason: the node is drained already, the breaker is not asked.
        out = actor.client.update(actor.node, "drain", reason)
        if not out.ok:
            return not_drained(ActOutcome.UNREACHABLE, f"{decision.why}; re-reasoning failed: {out.message}", me)
        actor.log(f"drain reason of {actor.node} replaced: {reason} ({decision.why})", notable=True)
        drained("re-reasoned")
        actor.save(record)
        return Acted(ActOutcome.DRAINED, me)
    if state.drain is None and me is not None and me.drained:
        # Drained already for a reason with no record of ours (a person's, another tool's, or an orphan
        # of ours): it stays as it is, so this just-read view saves the cluster read.
        orphan = _orphan(actor, me, state)
        decision = policy.decide_drain(me, state, fault, reason)
        if decision.action != "drain":
            return not_drained(
                ActOutcome.OTHER,
                "an orphan drain of nodehealth (no record): left as it is" if orphan else decision.why,
                me,
            )
    everyone = actor.client.show(None)
    if isinstance(everyone, ProbeError):
        return not_drained(
            ActOutcome.UNREACHABLE, f"slurmctld did not answer ({everyone.message}): cannot set the reason", me
        )
    me = next((n for n in everyone if n.name == actor.node), None)
    if me is not None:
        cache = dict(replace(me, seen_at=now).to_json())
        actor.save(lambda s: replace(s, slurm_node=cache))
    if state.drain is not None and me is not None and not policy.owns(me, state):
        _disown(actor, me, state)
        state = actor.load()
    orphan = _orphan(actor, me, state)
    decision = policy.decide_drain(me, state, fault, reason)
    if decision.action != "drain":
        if policy.owns(me, state):
            actor.save(lambda s: replace(s, clean_runs=0, last_status=status, last_run=now))
            return Acted(ActOutcome.ALREADY, me)
        return not_drained(
            ActOutcome.OTHER, "an orphan drain of nodehealth (no record): left as it is" if orphan else decision.why, me
        )
    br = policy.breaker(everyone, cfg.drain.max_share, cfg.drain.breaker_min_drained, exclude=actor.node)
    if br.tripped:
        actor.say(f"fault ({reason}); NOT draining: {br.describe()}", notable=True)
        hold = {
            "time": now,
            "ours": br.ours,
            "total": br.total,
            "share": round(br.share, 4),
            "limit": br.limit,
            "reason": reason,
            "phase": actor.phase,
        }
        actor.save(lambda s: replace(s, clean_runs=0, breaker_held=hold, last_status=status, last_run=now))
        return Acted(ActOutcome.HELD, me)
    out = actor.client.update(actor.node, "drain", reason)
    if not out.ok:
        return not_drained(ActOutcome.UNREACHABLE, f"drain failed: {out.message}", me)
    actor.log(f"drained {actor.node}: {reason}", notable=True)
    drained("drained")
    actor.save(lambda s: replace(record(s), breaker_held=None))
    reboot.after_drain(actor, fault.name, fault.action.value, reason)  # [slurm] reboot = "asap"
    return Acted(ActOutcome.DRAINED, me)


def _as_ours(me: Optional[NodeInfo], state: State) -> Optional[NodeInfo]:
    """The node as our record says it is (drained with our reason) when it was not read."""
    if me is not None or state.drain is None:
        return me
    return NodeInfo(name="", state=parse_state("IDLE+DRAIN"), reason=parse_reason(state.drain.reason))


def after_check(actor: Actor, report: Report, me: Union[NodeInfo, ProbeError, None] = None) -> Acted:
    """The health-check flow for a Report judged just now.

    ``me``: this node as the ``slurm_node`` probe gave it (cached or read), if it was needed.
    Slurm calls: none on a healthy node without a drain of ours, except one reconciliation per
    ``[slurm] reconcile_s``; with a drain of ours, one read when the resume is due (always made
    then, whatever the cache holds), the resume, and one read to confirm it.
    """
    cfg = actor.cfg
    now = time.time()
    seen_clean = [False]  # a drain of ours whose fault a run judged gone since: read back on a fault

    def advance(s: State) -> State:
        seen_clean[0] = s.drain is not None and s.clean_runs > 0
        return policy.after_run(s, report, cfg.policy.unknown, now, actor.boot_id)

    state = actor.save(advance) or actor.load()
    node = me if isinstance(me, NodeInfo) else NodeInfo.from_json(state.slurm_node)
    if node is not None and node.name != actor.node:
        node = None
    if node is not None and node.state.flags & REBOOT_FLAGS and (node.seen_at or 0.0) < report.started_at:
        # A reboot is under way: Slurm takes the node back into service by itself (nextstate=RESUME,
        # ReturnToService), so while the view says so it is read again on every run (one node: sinfo
        # -n) unless this run read it already; a record trusted instead would pass for our drain while
        # the node takes jobs.
        got = read_me(actor)
        node = got if isinstance(got, NodeInfo) else None
        now = time.time()  # the read is this run's latest word (its view is not "from the future")
    if policy.worst_failure(report, cfg.policy.unknown) is not None:
        # After a clean run only a view read in this run counts: a cached one may predate a resume by hand.
        recent = node if _fresh(node, now, 60.0) else None
        if recent is not None and seen_clean[0] and (recent.seen_at or 0.0) < report.started_at:
            recent = None
        return on_fault(actor, report, me=recent, seen_clean=seen_clean[0])
    if not _fresh(NodeInfo.from_json(state.slurm_node), now, reconcile_after_s(actor.node, cfg.slurm.reconcile_s)):
        # The hourly reconciliation; after a read that failed (here or the probe's), not before its back-off.
        got = BACKOFF.read(cfg, actor.node, lambda: read_me(actor))
        if isinstance(got, ProbeError):
            return Acted(ActOutcome.NONE)  # healthy: nothing to do, whether or not slurmctld answered
        node = got
    if state.drain is None:
        _orphan(actor, node, state)
        return Acted(ActOutcome.NONE, node)
    if node is not None and _fresh(node, now, 60.0) and not policy.owns(node, state):
        _disown(actor, node, state)
        return Acted(ActOutcome.NONE, node)
    if not cfg.resume.enabled:
        return Acted(ActOutcome.NONE, node)
    due = policy.resume_due(
        state, cfg.resume.clean_runs, actor.boot_id, cfg.resume.reboot_actions, cfg.resume.clean_runs_max
    )
    if due.action != "resume":
        actor.say(f"not resuming: {due.why}")
        return Acted(ActOutcome.NONE, node)
    # Only on a read made now: a view cached a second ago may predate a person's edit of the reason
    # ("... -- investigating DO NOT RESUME"), which is theirs from then on. The cache saves reads for
    # drains, never for a resume.
    got = read_me(actor)
    if isinstance(got, ProbeError):
        actor.say(f"resume due, but slurmctld did not answer ({got.message}); next run")
        return Acted(ActOutcome.NONE)
    node = got
    decision = policy.decide_resume(node, state, due)
    if decision.action != "resume":
        if node.drained and not policy.owns(node, state) or not node.drained:
            _disown(actor, node, state)
        else:
            actor.say(f"not resuming: {decision.why}")
        return Acted(ActOutcome.NONE, node)
    out = actor.client.update(actor.node, "resume")
    # Whatever scontrol answered, the node's state says whether it worked (right after a slurmctld
    # restart it has answered rc 1 and resumed the node all the same).
    after = read_me(actor)
    if isinstance(after, NodeInfo) and not after.drained:
        actor.log(
            f"resumed {actor.node}: {decision.why} (was: {node.reason.full if node.reason else ''})", notable=True
        )
        actor.save(lambda s: replace(s, drain=None, breaker_held=None, disowned=None))
        return Acted(ActOutcome.RESUMED, after)
    why = out.message if not out.ok else "the node is still drained"
    if isinstance(after, ProbeError):
        why += f"; could not read it back ({after.message})"
    actor.log(f"resume failed: {why}", notable=True)
    return Acted(ActOutcome.RESUME_FAILED, after if isinstance(after, NodeInfo) else node)


def _fresh(node: Optional[NodeInfo], now: float, max_age_s: float) -> bool:
    return node is not None and node.fresh(now, max_age_s)
