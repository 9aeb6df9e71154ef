"""What a face would do, without acting: ``--dry-run`` on a face, and ``nodehealth check --as``.

The same inputs and the same code as the face itself: the prolog's fast path first (the daemon's fresh
verdict), else the face's phase (``faces.table``) with its budget and the job's environment (its GPUs
scope ``gpu_processes``); then the face's own exit-code function and the real ``slurm.act`` sequence,
run against a ``RecordingClient`` (reads from the Slurm view the health check or the daemon cached,
never a slurmctld call; drain, resume and reboot recorded, not sent) and a ``MemoryStore`` (the state
dir as it is now, changed in memory only). What the sequence recorded and said is the decision;
nothing is written (no ledger record, no counters, no drain record) and nothing is logged.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Optional

from nodehealth.model import Report


@dataclass
class Preview:
    face: str
    report: Optional[Report]
    source: str  # "daemon verdict (fast path, 12 s old, round 40)" or "checks run now"
    exit_code: int
    decision: list[str] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    config: str = ""
    # What the sequence would have asked of Slurm: {"action": "drain"|"resume"|"reboot", "node", "reason"}.
    recorded: list[dict[str, Optional[str]]] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"as the {self.face} would see it: {self.source}"]
        out += [f"  {line}" for line in self.inputs]
        out += [f"{self.face} would: {self.decision[0]}" if self.decision else f"{self.face} would exit 0"]
        out += [f"  {line}" for line in self.decision[1:]]
        out.append(
            f"{self.face} exit code would be {self.exit_code} (nothing was changed: no Slurm call, no state written)"
        )
        return out


def preview(
    face: str, environ: Mapping[str, str], simulate: Optional[str] = None, probes: Optional[dict[str, Any]] = None
) -> Preview:
    """Decide as ``face`` would with ``environ`` (the job's variables, ``NODEHEALTH_CONFIG``).

    ``simulate``: a scenario file (``check --as FACE --simulate FILE``): the face's checks run now on
    those simulated GPUs (the daemon's verdict is of the real ones, so the prolog's fast path is not
    taken); a scenario that does not load raises ``ConfigError`` (a usage error by hand). ``probes``: the
    runner's probe table when the checks run now (``check --as`` watches it for its progress line)."""
    from nodehealth.faces import fast

    if simulate:
        return _run(
            face,
            environ,
            "checks run now on the simulated GPUs (--simulate: not the daemon's verdict)",
            simulate=simulate,
            probes=probes,
        )
    if face == "prolog":
        answer = fast.prolog(environ, act=False)
        if isinstance(answer, fast.Fault):
            return _run(face, environ, _verdict_source(answer.verdict), fast_report=answer.report)
        if not isinstance(answer, (str, int)):  # the daemon's verdict: healthy, the job starts
            report = Report.from_json(answer.report)
            return Preview(
                face,
                report,
                _verdict_source(answer),
                0,
                ["exit 0 from the daemon's verdict: the job starts, no NVML call, no Slurm call"],
                _inputs(report, environ),
            )
        miss = answer if isinstance(answer, str) else "fast path not taken"
        return _run(face, environ, f"checks run now (fast path not taken: {miss})", probes=probes)
    return _run(face, environ, "checks run now", probes=probes)


def _verdict_source(verdict: Any) -> str:
    return f"the daemon's verdict (fast path; {verdict.age_s:.1f} s old, round {verdict.round})"


def _run(
    face: str,
    environ: Mapping[str, str],
    source: str,
    fast_report: Optional[Report] = None,
    simulate: Optional[str] = None,
    probes: Optional[dict[str, Any]] = None,
) -> Preview:
    """The face's cold path (or the fast path's fault) through its own exit-code function, acting on nothing."""
    from nodehealth.faces.common import exit_code, healthcheck_exit, run_outcome, start
    from nodehealth.faces.table import BY_NAME
    from nodehealth.slurm import act, observe
    from nodehealth.slurm.policy import worst_failure

    started = start(face, BY_NAME[face].phase, environ, remember=False, simulate=simulate)
    if isinstance(started, int):
        return Preview(
            face, None, "the configuration could not be loaded", started, ["exit 0: not checking (see the error above)"]
        )
    run = started
    cfg = run.cfg
    store = act.MemoryStore(cfg.paths)
    client = observe.RecordingClient.from_state(run.node, store.state)
    said: list[str] = []
    actor = run.actor(client=client, store=store, log=_collect(said))
    slurm_node: Any = None
    if fast_report is not None:
        report = replace(fast_report, phase="prolog")
    else:
        report, obs = run_outcome(run, look_only=True, probes=probes)
        slurm_node = _as_read(face, obs.slurm_node, client, cfg, run.node)
    inputs = _inputs(report, environ) + _memory(cfg, store.state, client)
    if face == "healthcheck":
        code = healthcheck_exit(run, report, slurm_node, actor)
    else:
        code = exit_code(run, report, actor)
    fault = worst_failure(report, cfg.policy.unknown)
    decision = [r.describe() for r in client.recorded]
    if not decision:
        decision = [
            f"exit {code}: healthy, no Slurm call"
            if fault is None
            else f"exit {code}: no drain (the sequence's words below)"
        ]
    if fault is not None:
        decision.append(f"worst fault: {fault.name} ({fault.status.name}, action {fault.action.value})")
    if any(r.action == "drain" for r in client.recorded):
        decision.append(
            "the drain-storm breaker was counted on this node alone (a preview reads no cluster "
            "view): the real run may hold the drain back"
        )
    if face == "healthcheck" and fault is None and store.state.drain is not None and not client.recorded:
        decision.append(
            f"a clean run, {store.state.clean_runs} of {cfg.resume.clean_runs} toward resuming the "
            "node it drained (reboot-class faults resume only after a reboot)"
        )
    decision += [f"would log: {line}" for line in said]
    return Preview(
        face,
        report,
        source,
        code,
        decision,
        inputs,
        recorded=[{"action": r.action, "node": r.node, "reason": r.reason} for r in client.recorded],
    )


def _as_read(face: str, got: Any, client: Any, cfg: Any, node: str) -> Any:
    """What the ``slurm_node`` probe would have given the face: the cached view while it is fresh, else (the
    health check reads the node once its view is older than ``[slurm] reconcile_s``) the view the recording
    client holds, as a read made now (a preview asks slurmctld nothing)."""
    import time

    from nodehealth.faces.table import BY_NAME
    from nodehealth.probes.slurm import NO_CALL_PHASES
    from nodehealth.slurm.nodes import NodeInfo, reconcile_after_s

    now = time.time()
    if BY_NAME[face].phase in NO_CALL_PHASES:
        return got
    if isinstance(got, NodeInfo) and got.fresh(now, reconcile_after_s(node, cfg.slurm.reconcile_s)):
        return got
    return replace(client.view, seen_at=now)


def _collect(said: list[str]) -> Callable[..., None]:
    def log(message: str, notable: bool = False, **fields: Any) -> None:
        said.append(message)

    return log


def _memory(cfg: Any, state: Any, client: Any) -> list[str]:
    """What the sequence starts from: our drain record and the Slurm view it reads."""
    out = []
    if state.drain is not None:
        out.append(
            f"drain record of ours: {state.drain.reason!r} ({state.drain.check}, since "
            f"{_when(state.drain.time)}); clean runs {state.clean_runs} of {cfg.resume.clean_runs}"
        )
    view = client.view
    if client.assumed:
        taken = "our drain record says" if view.drained else "in service"
        out.append(f"Slurm view: none cached; {view.name} taken as {taken} ({view.state.text})")
    else:
        seen = f", read {_when(view.seen_at)}" if view.seen_at else ""
        out.append(
            f"Slurm view (cached{seen}): {view.state.text}" + (f", reason {view.reason.full!r}" if view.reason else "")
        )
    return out


def _inputs(report: Report, environ: Mapping[str, str]) -> list[str]:
    from nodehealth.slurm import jobenv

    out = []
    job, gpus = jobenv.job_id(environ), jobenv.job_gpus(environ)
    out.append(f"job: {job or 'none'}; job GPUs: {','.join(map(str, gpus)) if gpus is not None else 'all'}")
    count = next((r for r in report.results if r.name == "gpu_count"), None)
    if count is not None and "expected" in count.details:
        out.append(f"expected GPUs: {count.details.get('expected')} from {count.details.get('expected_from')}")
    return out


def _when(ts: float) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))
