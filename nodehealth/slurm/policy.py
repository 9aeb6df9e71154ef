"""What the Slurm faces and the daemon decide, as pure functions: no I/O, no clock, no subprocess.

* Ownership: a drain is ours only when Slurm's reason is the one we recorded; another reason
  is never overwritten and never resumed.
* Reason text: ``nh:<code>[ GPU<i>] <check>: <summary>``, sanitised for ``scontrol`` and capped.
* Hysteresis: resume after N consecutive clean runs; a reboot-class fault also needs a new
  boot id.
* Drain-storm breaker: past a share of nodes already drained by nodehealth, stop draining.

``nodehealth.slurm.act`` carries these decisions out through the client.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterable, Mapping, Optional, Sequence

from nodehealth.model import Action, CheckResult, Report, Status
from nodehealth.observations.record import record
from nodehealth.slurm.nodes import NodeInfo
from nodehealth.slurm.reasons import REASON_MAX as REASON_MAX
from nodehealth.slurm.reasons import flap_reason as flap_reason
from nodehealth.slurm.reasons import format_reason as format_reason
from nodehealth.slurm.reasons import reason_head as reason_head
from nodehealth.slurm.reasons import span as span
from nodehealth.statedir.slurmstate import MAX_HISTORY, MAX_LOGGED_CHARS, DrainEvent, DrainRecord, State


def worst_failure(report: Report, unknown_policy: str = "pass") -> Optional[CheckResult]:
    """The result that makes this run a node fault, or None.

    FAIL results first (the most invasive action among them); with ``policy.unknown = fail``
    an UNKNOWN result counts too.
    """
    bad = [r for r in report.results if r.status == Status.FAIL]
    if not bad and unknown_policy == "fail":
        bad = [r for r in report.results if r.status == Status.UNKNOWN]
    if not bad:
        return None
    return max(bad, key=lambda r: (r.status, r.action.rank))


def fault_count(report: Report, unknown_policy: str = "pass") -> int:
    worst = worst_failure(report, unknown_policy)
    if worst is None:
        return 0
    return sum(1 for r in report.results if r.status == worst.status)


# ----------------------------------------------------------------------------- job scoping


def scope_processes(report: Report, gpus: Optional[Sequence[int]]) -> Report:
    """Judge ``gpu_processes`` on the job's GPUs only (shared nodes run other jobs' processes).

    With the job's GPUs unknown the check's own node-wide verdict stands.
    """
    if gpus is None:
        return report
    keep = {str(g) for g in gpus}
    out = []
    for r in report.results:
        per_gpu = r.details.get("gpus") if r.name == "gpu_processes" else None
        if r.status > Status.WARN and isinstance(per_gpu, Mapping) and per_gpu:
            mine = {k: v for k, v in per_gpu.items() if k in keep}
            others = sorted(k for k in per_gpu if k not in keep)
            details = dict(r.details, gpus=mine, job_gpus=list(gpus))
            if others:
                details["other_jobs_gpus"] = others
            if not mine:
                r = replace(
                    r,
                    status=Status.OK,
                    gpu=None,
                    action=Action.NONE,
                    details=details,
                    summary=f"job GPU(s) {','.join(sorted(keep, key=int))} idle "
                    f"(processes only on GPU(s) {','.join(others)} of other jobs)",
                )
            else:
                first = sorted(mine, key=int)[0]
                text = "; ".join(str(mine[k]) for k in sorted(mine, key=int))
                r = replace(r, gpu=int(first), details=details, summary=text)
        out.append(r)
    return replace(report, results=tuple(out))


# ----------------------------------------------------------------------------- breaker


@record
class Breaker:
    """The drain-storm breaker's view of the cluster."""

    total: int
    ours: int
    share: float
    limit: float
    tripped: bool

    def describe(self) -> str:
        if self.total == 0:
            return "drain-storm breaker HOLDING (no new drain): the cluster's nodes could not be counted"
        state = "HOLDING (no new drain)" if self.tripped else "closed"
        return (
            f"drain-storm breaker {state}: {self.ours} of {self.total} node(s) "
            f"({self.share:.0%}) drained by nodehealth, limit {self.limit:.0%}"
        )


def breaker(
    nodes: Iterable[NodeInfo], max_share: float, min_drained: int = 1, exclude: Optional[str] = None
) -> Breaker:
    """Trip when the share of nodes already drained by nodehealth is over ``max_share``.

    ``exclude`` (this node) is left out of the count of ours, so re-draining a node that is
    already ours never counts against itself. ``min_drained``: below this many nodes drained
    by us the breaker never trips (small clusters). Other nodes' drains are counted by the
    prefix of their reason (their records are theirs). It fails closed: a cluster view with no
    node in it cannot be counted, and holds.
    """
    nodes = list(nodes)
    total = len(nodes)
    ours = sum(1 for n in nodes if n.drained_by_us and n.name != exclude)
    share = ours / total if total else 1.0
    tripped = total == 0 or (ours >= min_drained and share > max_share)
    return Breaker(total, ours, share, max_share, tripped)


def is_clean(report: Report, unknown_policy: str = "pass") -> Optional[bool]:
    """True: a clean run (nothing worse than WARN). False: a fault. None: UNKNOWN, no evidence."""
    if worst_failure(report, unknown_policy) is not None:
        return False
    if report.status == Status.UNKNOWN:
        return None
    return True


# A check that runs only where the health check does not (the epilog's job forensics) is judged
# gone by the checks that see the same faults on the node.
JUDGED_BY = {"job_forensics": ("gpu_ecc", "gpu_remapped_rows", "gpu_xid")}


def judged_ok(report: Report, check: str) -> Optional[bool]:
    """Did this run judge ``check`` (or what stands in for it) OK? None: it did not judge it.

    SKIPPED, UNKNOWN or a result that only reports (``details["judged"] is False``: processes
    outside the idle phases that belong to a running job, say) is no evidence either way.
    """
    by_name = {r.name: r for r in report.results}
    names = (check,) if check in by_name else JUDGED_BY.get(check, (check,))
    verdicts = []
    for name in names:
        r = by_name.get(name)
        if r is None or r.status in (Status.SKIPPED, Status.UNKNOWN) or r.details.get("judged") is False:
            return None
        verdicts.append(r.status <= Status.WARN)
    return all(verdicts) if verdicts else None


# Drains for processes on a GPU (the epilog's "left by job N", a stray): they last while NVML lists a
# compute process on that GPU, whatever the ledger or the cgroups say about jobs.
PROCESS_CHECKS = ("gpu_processes",)


def processes_gone(report: Report, gpus: Sequence[int]) -> Optional[bool]:
    """Did this run's NVML list no compute process on ``gpus`` (every GPU when empty)? None: not read.

    ``gpu_processes`` names the GPUs it read (``gpus_judged``) and, outside the idle phases, the
    processes it saw there whoever they belong to (``processes``; a fault's ``gpus``): a process of
    a job the ledger calls running, or in a job's cgroup, is still a process on that GPU.
    """
    r = next((x for x in report.results if x.name == "gpu_processes"), None)
    if r is None or r.status in (Status.SKIPPED, Status.UNKNOWN):
        return None
    judged = r.details.get("gpus_judged")
    read = {int(g) for g in judged if isinstance(g, int)} if isinstance(judged, (list, tuple)) else set()
    want = set(gpus) if gpus else read
    if not want or not want <= read:
        return None
    busy: set[int] = set()
    for key in ("processes", "gpus"):
        seen = r.details.get(key)
        if isinstance(seen, Mapping):
            busy |= {int(k) for k in seen if isinstance(k, str) and k.isdigit()}
    if r.status > Status.WARN and not busy:
        return False
    return not (busy & want)


def judged_clean(report: Report, drain: Optional[DrainRecord]) -> Optional[bool]:
    """Is this run clean for ``drain`` (``judged_ok`` of its check; for a process drain, NVML's list)?"""
    if drain is None:
        return True
    if drain.check in PROCESS_CHECKS:
        return processes_gone(report, drain.gpus)
    return judged_ok(report, drain.check)


def fault_gpus(fault: CheckResult) -> tuple[int, ...]:
    """The GPUs a fault names: its per-GPU findings (``details["gpus"]``), else its one GPU."""
    per_gpu = fault.details.get("gpus")
    if isinstance(per_gpu, Mapping) and per_gpu:
        return tuple(sorted({int(k) for k in per_gpu if isinstance(k, str) and k.isdigit()}))
    return (fault.gpu,) if isinstance(fault.gpu, int) else ()


# ----------------------------------------------------------------------------- flap damping


def drains_within(history: Sequence[DrainEvent], check: str, now: float, window_s: float) -> int:
    """Drains recorded for ``check`` in the last ``window_s`` seconds."""
    return sum(1 for e in history if e.check == check and 0 <= now - e.time < window_s)


def remember_drain(history: Sequence[DrainEvent], check: str, now: float, window_s: float) -> tuple[DrainEvent, ...]:
    """``history`` with this drain added; drains older than the window (or in the future) dropped, bounded."""
    kept = [e for e in history if 0 <= now - e.time < window_s]
    return tuple(kept + [DrainEvent(check, now)])[-MAX_HISTORY:]


def forget_check(history: Sequence[DrainEvent], check: str) -> tuple[DrainEvent, ...]:
    """A person resumed a drain held for flapping: its count starts again."""
    return tuple(e for e in history if e.check != check)


def flapping(drains: int, flap_drains: int) -> bool:
    """The ``drains``-th drain within the window holds the node for a person (``flap_drains`` 0: never)."""
    return flap_drains > 0 and drains >= flap_drains


def clean_runs_needed(base: int, drains: int, cap: int) -> int:
    """The backoff: the Nth drain within the window needs ``base`` x 2^(N-1) clean runs, at most ``cap``
    (never fewer than ``base``)."""
    return min(max(base, cap), base << max(0, min(drains, MAX_HISTORY) - 1))


# ----------------------------------------------------------------------------- quiet logs


def result_lines(report: Report) -> dict[str, str]:
    """check -> ``STATUS check: summary`` for every result worse than OK (what a face logs of a run)."""
    return {r.name: f"{r.status.name} {r.name}: {r.summary}" for r in report.results if r.status >= Status.WARN}


def changed_lines(before: Mapping[str, str], now: Mapping[str, str]) -> list[str]:
    """The lines to log for a run: a finding that appeared or changed, and one that cleared."""
    out = [line for name, line in now.items() if (before.get(name) or "")[:MAX_LOGGED_CHARS] != line[:MAX_LOGGED_CHARS]]
    out += [f"OK {name}: cleared (was: {line})" for name, line in before.items() if name not in now]
    return out


def after_run(state: State, report: Report, unknown_policy: str, now: float, boot_id: Optional[str]) -> State:
    """Advance the clean-run counter: +1 on a clean run, 0 on a fault, unchanged without evidence.

    While a drain of ours is recorded, a run is clean for it only when it judged the drain's
    check OK (``judged_ok``), and for a drain for processes only when NVML listed none on its
    GPUs (``processes_gone``: a process that lives resets the count, whoever owns it); a run
    that did not judge it leaves the count as it was. Runs of an
    earlier boot never count: the count starts again when the boot id changes. A run without a
    fault clears a breaker hold (there is nothing left to drain).
    """
    count = state.clean_runs
    if boot_id is not None and state.boot_id is not None and boot_id != state.boot_id:
        count = 0
    clean = is_clean(report, unknown_policy)
    if clean is True and state.drain is not None:
        clean = judged_clean(report, state.drain)
    held = state.breaker_held
    if clean is True:
        count += 1
    elif clean is False:
        count = 0
    if is_clean(report, unknown_policy):
        held = None  # nothing is held back from a node without a fault
    return replace(
        state, clean_runs=count, last_status=report.status.name, last_run=now, boot_id=boot_id, breaker_held=held
    )


def owns(node: Optional[NodeInfo], state: State) -> bool:
    """This node's drain is ours: drained, and Slurm's reason is exactly the one we recorded.

    A reason a person or another tool wrote or edited (even one that starts like ours) is not. The
    one edit that keeps it ours is Slurm's own: while a reboot we asked for (``scontrol reboot ASAP
    nextstate=RESUME``) is issued, slurmctld appends ``REBOOT_ISSUED_SUFFIX`` to the reason.
    """
    if node is None or not node.drained or state.drain is None or node.reason is None:
        return False
    text, ours = node.reason.text, state.drain.reason
    return text == ours or ("REBOOT_ISSUED" in node.state.flags and text == ours + REBOOT_ISSUED_SUFFIX)


# slurmctld's reboot_nodes (src/slurmctld/node_mgr.c, 22.05): when the reboot has a next state and
# the node a reason, ``xstrcat(node_ptr->reason, " : reboot issued")``.
REBOOT_ISSUED_SUFFIX = " : reboot issued"


# ----------------------------------------------------------------------------- decisions


@record
class Decision:
    """What a face should do with Slurm: ``none``, ``drain`` or ``resume``, and why."""

    action: str
    why: str


def decide_drain(node: Optional[NodeInfo], state: State, fault: CheckResult, reason: str) -> Decision:
    """Whether to set our drain reason on a node with a fault.

    Never overwrite a reason that is not ours (an admin's drain, an edited reason, Slurm's own
    "Kill task failed", another tool's). While a drain of ours holds, its first reason stays
    (it names the job and the phase that saw the fault) unless a fault with a more invasive
    action replaces it.
    """
    rec = state.drain
    if owns(node, state) and rec is not None:
        if fault.action.rank > _rank(rec.action):
            return Decision(
                "drain",
                f"{fault.name} ({fault.action.value}) is more severe than the drain's {rec.check} ({rec.action})",
            )
        return Decision("none", "already drained by nodehealth (its first reason stays)")
    if node is not None and node.reason is not None and (node.drained or node.state.base == "DOWN"):
        return Decision(
            "none", f"node already out of service for another reason ({node.reason.full!r}); left untouched"
        )
    return Decision("drain", f"{fault.name} {fault.status.name}")


def _rank(action: str) -> int:
    try:
        return Action(action).rank
    except ValueError:
        return 0


def reboot_class(action: str, reboot_actions: Sequence[str]) -> bool:
    return action in reboot_actions


def decide_resume(node: Optional[NodeInfo], state: State, due: Decision) -> Decision:
    """Whether a clean node that nodehealth drained may go back into service: ``due`` (``resume_due``'s
    answer, asked first so that nothing is asked of slurmctld before it can say yes) on a node that says so.

    Only a drain that is ours (``owns``: Slurm's reason is exactly the one recorded); not while a
    reboot or maintenance is pending.
    """
    if node is None:
        return Decision("none", "node state unknown")
    if not node.drained:
        return Decision("none", "node not drained")
    if not owns(node, state):
        return Decision("none", "drained for a reason that is not exactly ours; never resumed by nodehealth")
    if node.state.hands_off:
        return Decision("none", f"node state {node.state.text}: reboot/maintenance pending, left alone")
    return due


def resume_due(
    state: State,
    clean_runs_needed: int,
    boot_id: Optional[str],
    reboot_actions: Sequence[str],
    clean_runs_max: Optional[int] = None,
) -> Decision:
    """What the drain record and the clean-run count alone say about resuming (no Slurm view).

    After ``clean_runs_needed`` consecutive runs that judged the drain's check OK; for a reboot-class
    fault only once the boot id differs from the one recorded at the drain (the count restarts at the
    new boot). A drain held for flapping is never due. ``clean_runs_max``: the backoff's cap (the record's
    Nth drain within the window needs ``clean_runs_needed`` x 2^(N-1) runs); None: no backoff.
    """
    rec = state.drain
    if rec is None:
        return Decision("none", "no drain of ours recorded")
    if rec.flapping:
        return Decision("none", f"held for a person: {rec.check} flapping ({rec.drains} drains); resume by hand")
    needed = (
        clean_runs_needed if clean_runs_max is None else clean_runs_needed_for(rec, clean_runs_needed, clean_runs_max)
    )
    if state.clean_runs < needed:
        return Decision(
            "none",
            f"clean run {state.clean_runs} of {needed} needed to resume"
            + (f" (drain {rec.drains} of {rec.check} in the window)" if rec.drains > 1 else ""),
        )
    if rec is not None and reboot_class(rec.action, reboot_actions):
        if rec.boot_id is None or boot_id is None:
            return Decision("none", f"{rec.check} needs a reboot (action {rec.action}); boot id unknown")
        if rec.boot_id == boot_id:
            return Decision("none", f"{rec.check} needs a reboot (action {rec.action}); not rebooted since the drain")
    return Decision("resume", f"{state.clean_runs} consecutive clean run(s)")


def clean_runs_needed_for(rec: DrainRecord, base: int, cap: int) -> int:
    return clean_runs_needed(base, rec.drains, cap)
