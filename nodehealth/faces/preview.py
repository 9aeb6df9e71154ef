"""What a face would decide, without acting: ``--dry-run`` on a face, and ``nodehealth check --as``.

The same inputs as the face itself: the prolog's fast path first (the daemon's fresh verdict), else
the face's phase with its budget, the job's environment (its GPUs scope ``gpu_processes``), the
Slurm view the face reads (the cached one: the prolog and epilog never ask slurmctld). Nothing is
written (no ledger record, no counters, no drain record) and no Slurm call is made; the decision
is worded for a person, with where each expectation came from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from nodehealth.model import Report

PHASE = {"prolog": "prolog", "epilog": "epilog", "healthcheck": "healthcheck"}


@dataclass
class Preview:
    face: str
    report: Optional[Report]
    source: str  # "daemon verdict (fast path, 12 s old, round 40)" or "checks run now"
    exit_code: int
    decision: list[str] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    config: str = ""

    def lines(self) -> list[str]:
        out = [f"as the {self.face} would see it: {self.source}"]
        out += [f"  {line}" for line in self.inputs]
        out += [f"{self.face} would: {self.decision[0]}" if self.decision else f"{self.face} would exit 0"]
        out += [f"  {line}" for line in self.decision[1:]]
        out.append(f"{self.face} exit code would be {self.exit_code} (nothing was changed: no Slurm call, no "
                   "state written)")
        return out


def preview(face: str, environ: Mapping[str, str]) -> Preview:
    """Decide as ``face`` would with ``environ`` (the job's variables, ``NODEHEALTH_CONFIG``)."""
    from nodehealth.faces import fast

    if face == "prolog":
        answer = fast.prolog(environ, act=False)
        if isinstance(answer, fast.Fault):
            return _decide(face, answer.report, _verdict_source(answer.verdict), environ)
        if not isinstance(answer, (str, int)):  # the daemon's verdict: healthy, the job starts
            report = Report.from_json(answer.report)
            return Preview(face, report, _verdict_source(answer), 0,
                           ["exit 0 from the daemon's verdict: the job starts, no NVML call, no Slurm call"],
                           _inputs(report, environ))
        miss = answer if isinstance(answer, str) else "fast path not taken"
        return _cold(face, environ, f"checks run now (fast path not taken: {miss})")
    return _cold(face, environ, "checks run now")


def _verdict_source(verdict: Any) -> str:
    return f"the daemon's verdict (fast path; {verdict.age_s:.1f} s old, round {verdict.round})"


def _cold(face: str, environ: Mapping[str, str], source: str) -> Preview:
    from nodehealth.faces.common import run_outcome, start

    started = start(face, PHASE[face], environ, remember=False)
    if isinstance(started, int):
        return Preview(face, None, "the configuration could not be loaded", started,
                       ["exit 0: not checking (see the error above)"])
    report, _ = run_outcome(started, look_only=True)
    return _decide(face, report, source, environ, started.cfg)


def _decide(face: str, report: Report, source: str, environ: Mapping[str, str], cfg: Any = None) -> Preview:
    from nodehealth.config.loader import load_safe
    from nodehealth.slurm import policy
    from nodehealth.statedir import slurmstate

    if cfg is None:
        cfg = load_safe(environ=environ, remember=False).cfg
    inputs = _inputs(report, environ)
    state = slurmstate.load(cfg.paths)
    if state.drain is not None:
        inputs.append(f"drain record of ours: {state.drain.reason!r} ({state.drain.check}, since "
                      f"{_when(state.drain.time)}); clean runs {state.clean_runs} of {cfg.resume.clean_runs}")
    fault = policy.worst_failure(report, cfg.policy.unknown)
    if fault is None:
        if face == "healthcheck" and state.drain is not None:
            return Preview(face, report, source, 0, [
                f"exit 0: a clean run, {state.clean_runs + 1} of {cfg.resume.clean_runs} toward resuming the "
                "node it drained (reboot-class faults resume only after a reboot)"], inputs)
        return Preview(face, report, source, 0, ["exit 0: healthy, no Slurm call"], inputs)
    reason = policy.format_reason(fault, cfg.drain.reason_max_len, policy.fault_count(report, cfg.policy.unknown) - 1)
    lines = [f"drain the node with reason {reason!r}" if cfg.drain.enabled
             else "not drain ([drain] enabled = false)"]
    lines.append(f"worst fault: {fault.name} ({fault.status.name}, action {fault.action.value})")
    if cfg.drain.enabled:
        lines.append("unless the drain-storm breaker holds it back, or a drain of ours already holds the node "
                     "for a fault at least as severe (its reason stays)")
    return Preview(face, report, source, 1, lines, inputs)


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
