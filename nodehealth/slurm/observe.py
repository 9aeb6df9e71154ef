"""Observe mode (``[slurm] mode = "observe"``): decide as usual, change nothing in Slurm.

A site rolls nodehealth out by reading what it *would* drain for a while before it lets it drain
(docs/operations.md, "Rolling out"). ``ObserveClient`` wraps the real ``Scontrol`` so that the one
act sequence (``nodehealth.slurm.act``) runs unchanged, breaker, hysteresis and damping included:

* reads are real (``show``), with this node's *would-be* drain laid over its record: state
  ``+DRAIN`` and our reason, while Slurm shows no reason of its own there. A reason Slurm shows
  (an administrator's drain, "Kill task failed", a reboot) wins: the real node is returned and
  the would-be drain is forgotten, as the act sequence forgets a drain someone else took over;
* ``update`` and ``reboot`` never call scontrol: they log ``would drain NODE: <reason>`` /
  ``would resume NODE`` / ``would reboot NODE``, count the action and keep the would-be drain in
  ``slurm-observe.json`` (persistent, like the drain record it mirrors), so the next run sees
  the world this one would have made.

The file also holds the count of each would-be action since it was created; the daemon exports
it as ``nodehealth_slurm_would_total{action}`` (the faces' actions included) beside the gauge
``nodehealth_slurm_observe_mode``.

``RecordingClient`` is the other client that changes nothing, for a person's preview (``--dry-run``,
``check --as``): no slurmctld call at all, the cached view only, every change recorded in the object.

Only root's configuration turns observe mode on: ``[slurm] mode`` is a config key like any other
(``config.trust``: a file others can change is refused), and a value other than ``enforce`` or
``observe`` is a config error, never observe (the run uses the last configuration that validated,
else the defaults: enforce). Nothing else switches it: the file here is read only in observe mode,
and in enforce mode ``leave`` clears what observe mode left (a would-be drain recorded as ours
would otherwise pass for a real one: a fault would be "already drained" and never drained).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Optional, Union

from nodehealth.observations import ProbeError
from nodehealth.slurm.client import SlurmClient, UpdateOutcome
from nodehealth.slurm.nodes import NodeInfo, parse_reason, parse_state
from nodehealth.statedir import layout, slurmstate
from nodehealth.statedir.records import read_doc, update_doc

OBSERVE = "observe"
FILE_NAME = layout.SLURM_OBSERVE
ACTIONS = ("drain", "resume", "reboot")  # the would-be actions counted (``action`` label values)
MAX_REASON_CHARS = 2048
MAX_COUNT = 10**12

Log = Callable[..., None]


def observing(cfg: Any) -> bool:
    return bool(getattr(cfg.slurm, "mode", "enforce") == OBSERVE)


# ----------------------------------------------------------------------------- the file


def _reason(raw: Any) -> Optional[str]:
    return raw[:MAX_REASON_CHARS] if isinstance(raw, str) and raw else None


def virtual_drain(doc: Mapping[str, Any], node: str) -> Optional[str]:
    """The would-be drain's reason recorded for ``node``, or None."""
    drain = doc.get("drain")
    if not isinstance(drain, Mapping) or drain.get("node") != node:
        return None
    return _reason(drain.get("reason"))


def would_counts(doc: Mapping[str, Any]) -> dict[str, int]:
    """action -> how many times it would have been done (only the ``ACTIONS``, bounded)."""
    raw = doc.get("would")
    if not isinstance(raw, Mapping):
        return {}
    return {
        a: n
        for a, n in raw.items()
        if a in ACTIONS and isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= MAX_COUNT
    }


def effective(paths: Any, node: str) -> Optional[str]:
    """The would-be drain of ``node`` that still stands: recorded here *and* still the act sequence's
    drain record (once the sequence forgot its drain, a person's reason having won, so is this)."""
    reason = virtual_drain(read_doc(paths, FILE_NAME), node)
    if reason is None:
        return None
    rec = slurmstate.load(paths).drain
    return reason if rec is not None and rec.reason == reason else None


def overlay(node: NodeInfo, reason: Optional[str]) -> NodeInfo:
    """``node`` as the would-be drain ``reason`` would have left it: only while Slurm shows no reason
    of its own there (a real reason wins) and the node is not drained already."""
    if reason is None or node.reason is not None or node.drained:
        return node
    return replace(node, state=parse_state(f"{node.state.text}+DRAIN"), reason=parse_reason(reason))


def view(cfg: Any, node: NodeInfo) -> NodeInfo:
    """This node's record as observe mode shows it to the act sequence (read-only; enforce: as is)."""
    if not observing(cfg):
        return node
    return overlay(node, effective(cfg.paths, node.name))


# ----------------------------------------------------------------------------- the client


class ObserveClient:
    """A ``SlurmClient`` that reads through ``real`` and records what it would have changed."""

    def __init__(self, real: SlurmClient, node: str, paths: Any, log: Log, clock: Callable[[], float] = time.time):
        self.real, self.node, self.paths, self.log, self.clock = real, node, paths, log, clock

    @property
    def calls(self) -> int:
        """The real client's count: only reads reach slurmctld."""
        return self.real.calls

    @calls.setter
    def calls(self, value: int) -> None:
        self.real.calls = value

    def show(self, node: Optional[str]) -> Union[list[NodeInfo], ProbeError]:
        got = self.real.show(node)
        if isinstance(got, ProbeError):
            return got
        reason = effective(self.paths, self.node)
        out = []
        for n in got:
            if n.name == self.node and reason is not None:
                if n.reason is not None and n.reason.text != reason:
                    self._forget(
                        f"Slurm shows {n.reason.full!r} on {n.name}: the real node wins, "
                        f"forgetting the would-be drain ({reason})"
                    )
                n = overlay(n, reason)
            out.append(n)
        return out

    def update(self, node: str, state: str, reason: Optional[str] = None) -> UpdateOutcome:
        """No scontrol call: the would-be ``state`` is logged, counted and (a drain) remembered."""
        if node != self.node:
            return UpdateOutcome(False, f"observe mode acts only on this node ({self.node}), not {node}")
        if state == "drain" and reason:
            return self._would(
                "drain", f"would drain {node}: {reason}", {"node": node, "reason": reason, "time": self.clock()}
            )
        if state == "resume":
            return self._would("resume", f"would resume {node}", None)
        return UpdateOutcome(False, f"observe mode: state={state} is not an action of nodehealth")

    def reboot(self, node: str, reason: str) -> UpdateOutcome:
        """No scontrol call: ``would reboot NODE`` (the would-be drain stays, as Slurm's ASAP keeps it)."""
        if node != self.node:
            return UpdateOutcome(False, f"observe mode acts only on this node ({self.node}), not {node}")
        return self._would("reboot", f"would reboot {node} (scontrol reboot ASAP nextstate=RESUME): {reason}", ...)

    def _would(self, action: str, line: str, drain: Any) -> UpdateOutcome:
        def change(doc: dict[str, Any]) -> dict[str, Any]:
            counts = would_counts(doc)
            counts[action] = min(MAX_COUNT, counts.get(action, 0) + 1)
            doc["would"] = counts
            if drain is not ...:
                doc["drain"] = drain
            doc["last"] = {"action": action, "line": line[:MAX_REASON_CHARS], "time": self.clock()}
            return doc

        try:
            update_doc(self.paths, FILE_NAME, change)
        except OSError as exc:  # not remembered: the act sequence sees it as a failed call, nothing sent
            self.log(f"observe mode: {line}; cannot record it: {exc}", notable=True)
            return UpdateOutcome(False, f"observe mode: cannot record the would-be action: {exc}")
        self.log(f"observe mode: {line} (no scontrol call)", notable=True)
        return UpdateOutcome(True, "observe mode: not sent")

    def _forget(self, why: str) -> None:
        try:
            update_doc(self.paths, FILE_NAME, lambda d: dict(d, drain=None))
        except OSError:
            return
        self.log(f"observe mode: {why}")


# ----------------------------------------------------------------------------- the preview's client


@dataclass(frozen=True)
class Recorded:
    """One change a ``RecordingClient`` was asked for: ``drain``/``resume`` (``scontrol update``) or ``reboot``."""

    action: str
    node: str
    reason: Optional[str] = None

    def describe(self) -> str:
        if self.action == "drain":
            return f"drain the node with reason {self.reason!r}"
        if self.action == "resume":
            return "resume the node (scontrol update state=resume)"
        if self.action == "reboot":
            return f"ask Slurm to reboot the node (ASAP, nextstate=RESUME): {self.reason}"
        return f"set the node {self.action}"


class RecordingClient:
    """A ``SlurmClient`` that acts on nothing, for ``--dry-run`` and ``check --as``: the real sequence runs
    against it and what it would have changed is in ``recorded``.

    Reads never reach slurmctld: this node's view is the one the health check or the daemon cached
    (``cached``; None: the node as Slurm shows a node in service, which the one a job was just started on
    is), and the cluster the breaker counts is that one node. ``update`` and ``reboot`` are recorded and
    answered as done, and the view follows them (a drain shows ``+DRAIN`` and its reason), so the read
    that confirms a resume sees it. ``calls`` stays 0."""

    def __init__(self, node: str, cached: Optional[NodeInfo] = None) -> None:
        self.node = node
        self.assumed = cached is None or cached.name != node
        self.view = NodeInfo(name=node, state=parse_state("IDLE")) if self.assumed or cached is None else cached
        self.recorded: list[Recorded] = []
        self.calls = 0

    @classmethod
    def from_state(cls, node: str, state: slurmstate.State) -> RecordingClient:
        """Over the state file's cached view, with our drain record laid over a view that predates it (the
        drain cleared the view's time: the next real read would have confirmed it). No view at all: the
        node as Slurm shows one in service (a record with no view is one a wipe or an upgrade left)."""
        cached = NodeInfo.from_json(state.slurm_node)
        client = cls(node, cached)
        rec = state.drain
        if rec is not None and not client.assumed and (client.view.seen_at or 0.0) < rec.time:
            view = client.view
            flags = view.state.text if view.drained else f"{view.state.text}+DRAIN"
            client.view = replace(view, state=parse_state(flags), reason=parse_reason(rec.reason))
        return client

    def show(self, node: Optional[str]) -> Union[list[NodeInfo], ProbeError]:
        return [self.view] if node in (None, self.node) else []

    def update(self, node: str, state: str, reason: Optional[str] = None) -> UpdateOutcome:
        self.recorded.append(Recorded(state, node, reason))
        if node == self.node and state == "drain" and reason:
            flags = self.view.state.text if self.view.drained else f"{self.view.state.text}+DRAIN"
            self.view = replace(self.view, state=parse_state(flags), reason=parse_reason(reason))
        elif node == self.node and state == "resume":
            base = self.view.state.text.split("+")[0]
            self.view = replace(self.view, state=parse_state(base), reason=None)
        return UpdateOutcome(True, "recorded, not sent")

    def reboot(self, node: str, reason: str) -> UpdateOutcome:
        self.recorded.append(Recorded("reboot", node, reason))
        return UpdateOutcome(True, "recorded, not sent")


# ----------------------------------------------------------------------------- where clients are built


def client(cfg: Any, node: str, real: SlurmClient, log: Log) -> SlurmClient:
    """The client the faces and the daemon act through: ``real`` in enforce mode (after ``leave``),
    wrapped in an ``ObserveClient`` in observe mode."""
    from nodehealth.slurm import reboot

    reboot.after_boot(cfg, layout.read_boot_id(cfg.paths.procfs_root), log)
    if observing(cfg):
        wrapped = ObserveClient(real, node, cfg.paths, log)
        if virtual_drain(read_doc(cfg.paths, FILE_NAME), node) is not None and effective(cfg.paths, node) is None:
            wrapped._forget("the act sequence no longer holds the would-be drain (a reason of Slurm's won); forgotten")
        return wrapped
    leave(cfg, node, log)
    return real


def leave(cfg: Any, node: str, log: Log) -> None:
    """Enforce mode after observe mode: forget the would-be drain and, when the drain record is the
    would-be one, that record and the cached view (they describe a drain Slurm never made). A
    node with no would-be drain recorded costs one failed open."""
    doc = read_doc(cfg.paths, FILE_NAME)
    reason = virtual_drain(doc, node)
    if reason is None:
        return
    try:
        update_doc(cfg.paths, FILE_NAME, lambda d: dict(d, drain=None))
    except OSError as exc:
        log(f"observe mode left: cannot forget the would-be drain: {exc}", notable=True)
        return

    def forget(s: slurmstate.State) -> slurmstate.State:
        if s.drain is None or s.drain.reason != reason:
            return s
        return replace(s, drain=None, clean_runs=0, slurm_node=dict(s.slurm_node, time=None) if s.slurm_node else None)

    slurmstate.update(cfg.paths, forget, 0.5, log)
    log(f"enforce mode: the would-be drain of observe mode ({reason}) was never made; forgotten", notable=True)


def exit_code(cfg: Any, code: int, log: Log) -> int:
    """A face's exit code: in observe mode always 0, saying what it would have been."""
    if code != 0 and observing(cfg):
        log(f"observe mode: would exit {code} (Slurm would drain the node); exiting 0")
        return 0
    return code
