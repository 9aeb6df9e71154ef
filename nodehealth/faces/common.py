"""What the prolog, epilog and health-check faces share: one run, then the Slurm decisions.

Every face: load the config (``NODEHEALTH_CONFIG`` or the default path), run the phase's
checks under the phase budget, then act through ``scontrol`` with short deadlines that
stay inside the same budget. A bug or a config error in nodehealth is its own failure
(UNKNOWN): by default it exits 0 with a loud log line, so it never drains a cluster.

Logs go to stderr (slurmd keeps a failing prolog's output in its log) and, for drain,
resume and breaker decisions, to syslog.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import traceback
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Optional, Union

from nodehealth.config.loader import Config, ConfigError, load, node_name, phase_budget
from nodehealth.faces.fast import (
    COUNTERS_FILE,
    Log,
    job_file,
    notable_miss,
    read_small,
    write_job_baseline,
    write_small,
)
from nodehealth.model import CheckResult, Report, Status
from nodehealth.observations import NvmlSnapshot, Observations, ProbeError, SlurmNode
from nodehealth.slurm.policy import (
    Breaker,
    DrainRecord,
    NodeInfo,
    State,
    after_run,
    breaker,
    counters_record,
    decide_drain,
    decide_resume,
    fault_count,
    format_reason,
    gpu_counters,
    job_forensics,
    job_gpus,
    scope_processes,
    worst_failure,
)

STATE_FILE = "slurm-state.json"
MIN_CALL_S = 0.25  # the shortest deadline worth giving an scontrol call


class Deadline:
    def __init__(self, budget_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.end = clock() + budget_s

    def left(self) -> float:
        return self.end - self.clock()

    def call_timeout(self, per_call: float) -> float:
        """A Slurm call's deadline: at most ``per_call``, within the budget, never below MIN_CALL_S."""
        return max(MIN_CALL_S, min(per_call, self.left()))


class Slurm:
    """This node's conversation with slurmctld, every call bounded by the face's deadline."""

    def __init__(self, cfg: Config, node: str, deadline: Deadline, log: Log,
                 environ: Optional[Mapping[str, str]] = None) -> None:
        from nodehealth.slurm import client as slurmctl

        self.cfg, self.node, self.deadline, self.log = cfg, node, deadline, log
        self._ctl = slurmctl
        self.env = slurmctl.environment(cfg.slurm.conf, environ)
        self.calls = 0

    def _timeout(self) -> float:
        return self.deadline.call_timeout(self.cfg.slurm.timeout_s)

    def show(self, everyone: bool = False) -> Union[list[NodeInfo], ProbeError]:
        self.calls += 1
        return self._ctl.show_nodes(self.cfg.slurm.scontrol, None if everyone else self.node,
                                    self._timeout(), self.env)

    def me(self) -> Union[NodeInfo, ProbeError]:
        nodes = self.show()
        if isinstance(nodes, ProbeError):
            return nodes
        return next(n for n in nodes if n.name == self.node)

    def drain(self, reason: str) -> Any:
        self.calls += 1
        return self._ctl.drain(self.cfg.slurm.scontrol, self.node, reason, self._timeout(), self.env)

    def resume(self) -> Any:
        self.calls += 1
        return self._ctl.resume(self.cfg.slurm.scontrol, self.node, self._timeout(), self.env)


@dataclass
class Run:
    """One face invocation: its config, node, state and what happened."""

    face: str
    phase: str
    cfg: Config
    node: str
    log: Log
    deadline: Deadline
    environ: Mapping[str, str]
    state_path: str
    boot_id: Optional[str]
    state: State
    job_id: Optional[str] = None


def state_path(cfg: Config) -> str:
    return os.path.join(cfg.paths.state_dir, STATE_FILE)


def load_state(path: str) -> State:
    from nodehealth.statedir import files as statefile

    return State.from_json(statefile.read_json(path))


def save_state(run: Run, update: Callable[[State], State]) -> State:
    """Re-read the state under its lock, apply ``update``, write it atomically."""
    from nodehealth.statedir import files as statefile

    try:
        with statefile.locked(run.state_path, timeout_s=min(1.0, max(0.1, run.deadline.left()))) as got:
            if not got:
                run.log(f"state lock {run.state_path}.lock busy; writing anyway")
            current = load_state(run.state_path)
            new = update(current)
            statefile.write_json(run.state_path, new.to_json())
            run.state = new
            return new
    except OSError as exc:
        run.log(f"cannot write state {run.state_path}: {exc}", notable=True)
        return run.state


def cached_slurm_probe(state: State) -> Any:
    """The ``slurm_node`` probe for the prolog/epilog: the health check's cached view, no Slurm call."""
    from nodehealth.probes import PROBES, Probe

    def gather(ctx: Any, timeout_s: float) -> Any:
        if ctx.config.gpu.expected_count != "auto":
            return ProbeError("slurm_node", "unavailable", "not needed: [gpu] expected_count is set")
        cached = state.slurm_node
        if not cached or cached.get("name") != ctx.node:
            return ProbeError("slurm_node", "unavailable", "no cached Slurm view of this node yet "
                              "(the health check writes it)")
        gres = cached.get("gres_gpus")
        return SlurmNode(name=ctx.node, gres_gpus=gres if isinstance(gres, int) else None,
                         state=str(cached.get("state", "")), reason=cached.get("reason"))

    table = dict(PROBES)
    table["slurm_node"] = Probe("slurm_node", gather)
    return table


def fixed_slurm_probe(me: Union[NodeInfo, ProbeError]) -> Any:
    """The ``slurm_node`` probe for the health check: the view it has just read (one call)."""
    from nodehealth.probes import PROBES, Probe

    def gather(ctx: Any, timeout_s: float) -> Any:
        if ctx.config.gpu.expected_count != "auto":
            return ProbeError("slurm_node", "unavailable", "not needed: [gpu] expected_count is set")
        if isinstance(me, ProbeError):
            return ProbeError("slurm_node", me.kind, me.message)
        from nodehealth.probes.slurm import as_slurm_node

        return as_slurm_node(me)

    table = dict(PROBES)
    table["slurm_node"] = Probe("slurm_node", gather)
    return table


def run_checks(run: Run, probes: Any) -> Report:
    return run_outcome(run, probes)[0]


def run_outcome(run: Run, probes: Any) -> tuple[Report, Observations]:
    """The phase's checks (``gpu_processes`` scoped to the job's GPUs) and what they judged."""
    from nodehealth import runner

    outcome = runner.execute(run.cfg, phase=run.phase, probes=probes, node=run.node)
    return scope_processes(outcome.report, job_gpus(run.environ)), outcome.observations


# ----------------------------------------------------------------------------- GPU counters, job forensics


def write_counters(state_dir: str, obs: Observations, boot_id: Optional[str],
                   source: str) -> Optional[dict[str, Any]]:
    """Write the per-GPU ECC/remap counters of ``obs`` as the latest reading (OSError if that fails).

    Returns them, or None when there is no NVML reading. Every face that reads NVML (and the
    daemon, each round) keeps this file current: a fast-path prolog copies it as its job's baseline.
    """
    if not isinstance(obs.nvml, NvmlSnapshot):
        return None
    counters = gpu_counters(obs.nvml.gpus)
    rec = counters_record(counters, time.time(), boot_id, source)
    write_small(os.path.join(state_dir, COUNTERS_FILE), json.dumps(rec, separators=(",", ":")))
    return counters


def save_counters(run: Run, obs: Observations) -> Optional[dict[str, Any]]:
    """``write_counters`` for a face: a failure is logged, the counters still returned."""
    try:
        return write_counters(run.cfg.paths.state_dir, obs, run.boot_id, run.face)
    except OSError as exc:
        run.log(f"cannot write the GPU counter reading: {exc}")
        return gpu_counters(obs.nvml.gpus) if isinstance(obs.nvml, NvmlSnapshot) else None


def save_job_baseline(run: Run, counters: Optional[dict[str, Any]]) -> None:
    """The prolog's counters of the job's GPUs, for the epilog to compare against."""
    if run.job_id is None:
        return
    if counters is None:
        run.log("no ECC baseline for the epilog: NVML was not read")
        return
    rec = counters_record(counters, time.time(), run.boot_id, "prolog", job_gpus(run.environ), run.job_id)
    try:
        write_job_baseline(run.cfg.paths.state_dir, run.job_id, rec)
    except OSError as exc:
        run.log(f"cannot write the job baseline: {exc}")


def job_start_time(run: Run) -> Optional[float]:
    """The job's start from the ledger (its latest ``start`` record on this boot)."""
    from nodehealth.statedir import files as statefile
    from nodehealth.statedir import ledger

    text = statefile.read_text(os.path.join(run.cfg.paths.state_dir, ledger.FILE_NAME))
    starts = [r.time for r in ledger.parse(text) if r.event == "start" and r.job_id == run.job_id
              and (r.boot_id is None or r.boot_id == run.boot_id)]
    return starts[-1] if starts else None


def forensics(run: Run, obs: Observations) -> CheckResult:
    """The epilog's job forensics: XIDs and ECC increments during the job (consumes the baseline)."""
    assert run.job_id is not None
    path = job_file(run.cfg.paths.state_dir, run.job_id)
    baseline = read_small(path) if path else None
    start = job_start_time(run)
    if start is None and baseline is not None and isinstance(baseline.get("time"), (int, float)):
        start = float(baseline["time"])
    res = job_forensics(run.job_id, job_gpus(run.environ), baseline, obs.nvml, obs.xid, start, time.time(),
                        run.boot_id)
    if path:
        with contextlib.suppress(OSError):
            os.unlink(path)
    return res


def log_report(run: Run, report: Report) -> None:
    for r in report.results:
        if r.status >= Status.WARN:
            run.log(f"{r.status.name} {r.name}: {r.summary}")
    run.log(f"{report.status.name}: {len(report.results)} checks in {report.duration_s:.2f} s")
    if report.status == Status.UNKNOWN and run.cfg.policy.unknown == "pass":
        run.log("nodehealth could not tell (UNKNOWN); policy.unknown = pass: treating the node as healthy",
                notable=True)


def act_on_fault(run: Run, report: Report, slurm: Slurm, me: Optional[NodeInfo] = None) -> str:
    """Drain for the worst fault unless ownership or the breaker says no.

    Returns ``drained``, ``already`` (ours already), ``other`` (another reason holds the
    node), ``held`` (breaker), ``disabled`` or ``unreachable`` (slurmctld did not answer).
    """
    fault = worst_failure(report, run.cfg.policy.unknown)
    assert fault is not None
    reason = format_reason(fault, run.cfg.drain.reason_max_len, fault_count(report, run.cfg.policy.unknown) - 1)
    now = time.time()

    def record(state: State) -> State:
        rec = DrainRecord(reason=reason, check=fault.name, action=fault.action.value, boot_id=run.boot_id,
                          time=now, phase=run.phase, job_id=run.job_id)
        return replace(state, clean_runs=0, drain=rec, last_status=report.status.name, last_run=now,
                       boot_id=run.boot_id)

    def note_fault() -> None:
        """A fault this run did not drain for: the clean-run count starts again."""
        save_state(run, lambda s: replace(s, clean_runs=0, last_status=report.status.name, last_run=now))

    if not run.cfg.drain.enabled:
        run.log(f"fault ({reason}); [drain] enabled = false: not draining", notable=True)
        note_fault()
        return "disabled"
    if me is None:
        everyone = slurm.show(everyone=True)
        if isinstance(everyone, ProbeError):
            run.log(f"fault ({reason}); slurmctld did not answer ({everyone.message}): cannot set the reason",
                    notable=True)
            note_fault()
            return "unreachable"
        me = next((n for n in everyone if n.name == run.node), None)
        nodes: Optional[list[NodeInfo]] = everyone
    else:
        nodes = None
    decision = decide_drain(me, fault, reason)
    if decision.action != "drain":
        run.log(f"fault ({reason}); {decision.why}", notable=True)
        if me is not None and me.drained_by_us:
            # Keep the first record of this drain (its phase, job and boot id).
            save_state(run, lambda s: replace(s, clean_runs=0) if s.drain and s.drain.reason == reason
                       else record(s))
            return "already"
        note_fault()
        return "other"
    if nodes is None:
        everyone = slurm.show(everyone=True)
        if isinstance(everyone, ProbeError):
            run.log(f"fault ({reason}); cannot count drained nodes ({everyone.message}): not draining",
                    notable=True)
            note_fault()
            return "unreachable"
        nodes = everyone
    br: Breaker = breaker(nodes, run.cfg.drain.max_share, run.cfg.drain.breaker_min_drained, exclude=run.node)
    if br.tripped:
        run.log(f"fault ({reason}); NOT draining: {br.describe()}", notable=True)
        held = {"time": now, "ours": br.ours, "total": br.total, "share": round(br.share, 4),
                "limit": br.limit, "reason": reason, "phase": run.phase}
        save_state(run, lambda s: replace(s, clean_runs=0, breaker_held=held, last_status=report.status.name,
                                          last_run=now))
        return "held"
    out = slurm.drain(reason)
    if not out.ok:
        run.log(f"fault ({reason}); drain failed: {out.message}", notable=True)
        note_fault()
        return "unreachable"
    run.log(f"drained {run.node}: {reason}", notable=True)
    save_state(run, lambda s: replace(record(s), breaker_held=None))
    return "drained"


def start(face: str, phase: str, environ: Optional[Mapping[str, str]] = None) -> Union[Run, int]:
    """Load config and state; an int is the exit code when that already failed."""
    env = os.environ if environ is None else environ
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    log = Log(face, job if job and job.isdigit() else None)
    try:
        cfg = load(environ=env)
        from nodehealth.probes import ProbeSetupError, validate

        try:
            validate(cfg)
        except ProbeSetupError as exc:
            raise ConfigError(str(exc)) from None
    except ConfigError as exc:
        log(f"configuration error, not checking: {exc}", notable=True)
        return 0
    from nodehealth.statedir import files as statefile

    node = node_name(cfg.node_name, env)
    deadline = Deadline(phase_budget(cfg, phase))
    path = state_path(cfg)
    boot = statefile.read_boot_id(cfg.resume.boot_id_path)
    return Run(face=face, phase=phase, cfg=cfg, node=node, log=log, deadline=deadline, environ=env,
               state_path=path, boot_id=boot, state=load_state(path),
               job_id=job if job and job.isdigit() else None)


def append_ledger(run: Run, event: str) -> None:
    if not run.cfg.ledger.enabled:
        return
    from nodehealth.statedir import files as statefile
    from nodehealth.statedir import ledger

    rec = ledger.from_environ(event, run.environ, time.time(), node=run.node, boot_id=run.boot_id)
    if rec is None:
        return
    try:
        statefile.ledger_append(os.path.join(run.cfg.paths.state_dir, ledger.FILE_NAME), rec.line(),
                                run.cfg.ledger.max_bytes)
    except OSError as exc:
        run.log(f"cannot append to the job ledger: {exc}")


def guarded(face: str, body: Callable[[], int]) -> int:
    """Run a face; an unexpected exception is nodehealth's own failure: log it, exit 0."""
    try:
        return body()
    except Exception as exc:  # noqa: BLE001 - a bug in nodehealth must not drain the cluster
        log = Log(face)
        log(f"internal error, treating the node as healthy: {type(exc).__name__}: {exc}", notable=True)
        for line in traceback.format_exc().splitlines()[-6:]:
            log(line)
        return 0


def job_face(face: str, phase: str, event: str, fast_miss: Optional[str] = None) -> int:
    """Prolog and epilog: ledger, checks on the job's GPUs, drain on a fault, exit 1 on a fault.

    ``fast_miss``: why the prolog's fast path was not taken (logged). The prolog records the
    job GPUs' ECC counters (the job baseline); the epilog adds its job forensics (XIDs and
    ECC increments during the job) as the report's first result.
    """
    started = start(face, phase)
    if isinstance(started, int):
        return started
    run = started
    if fast_miss:
        run.log(f"fast path not taken: {fast_miss}; running the checks", notable=notable_miss(fast_miss))
    if event == "start":
        append_ledger(run, event)
    report, obs = run_outcome(run, cached_slurm_probe(run.state))
    counters = save_counters(run, obs)
    if event == "start":
        save_job_baseline(run, counters)
    if event == "end" and run.job_id is not None:
        report = replace(report, results=(forensics(run, obs),) + report.results)
    if event == "end":
        append_ledger(run, event)
    log_report(run, report)
    if worst_failure(report, run.cfg.policy.unknown) is None:
        return 0
    slurm = Slurm(run.cfg, run.node, run.deadline, run.log, run.environ)
    outcome = act_on_fault(run, report, slurm)
    if outcome == "held":
        return 0
    return 1


def fast_fault(report: Report, environ: Mapping[str, str], verdict: Any, log: Log) -> int:
    """A fault in the daemon's fresh verdict (prolog fast path): ledger, then the cold path's drain."""
    started = start("prolog", "prolog", environ)
    if isinstance(started, int):
        return started
    run = started
    run.log(f"daemon verdict {verdict.status} ({verdict.age_s:.1f} s old, round {verdict.round}): fast path, "
            "no NVML call")
    append_ledger(run, "start")
    report = replace(report, phase="prolog")
    log_report(run, report)
    slurm = Slurm(run.cfg, run.node, run.deadline, run.log, run.environ)
    outcome = act_on_fault(run, report, slurm)
    return 0 if outcome == "held" else 1


def healthcheck_face() -> int:
    started = start("healthcheck", "healthcheck")
    if isinstance(started, int):
        return started
    run = started
    slurm = Slurm(run.cfg, run.node, run.deadline, run.log, run.environ)
    me = slurm.me()
    if isinstance(me, ProbeError):
        run.log(f"slurmctld: {me.message}")
    report, obs = run_outcome(run, fixed_slurm_probe(me))
    save_counters(run, obs)
    log_report(run, report)
    now = time.time()
    node_cache: Optional[dict[str, Any]] = None
    if isinstance(me, NodeInfo):
        node_cache = {"name": me.name, "gres_gpus": me.gres_gpus, "state": me.state.text,
                      "reason": me.reason.full if me.reason else None, "time": now}

    def advance(s: State) -> State:
        s = after_run(s, report, run.cfg.policy.unknown, now, run.boot_id)
        if node_cache is not None:
            s = replace(s, slurm_node=node_cache)
        return s

    fault = worst_failure(report, run.cfg.policy.unknown)
    if fault is not None:
        save_state(run, advance)
        if isinstance(me, ProbeError):
            run.log("fault, but slurmctld did not answer: cannot drain now", notable=True)
            return 1
        act_on_fault(run, report, slurm, me=me)
        return 1
    state = save_state(run, advance)
    if not isinstance(me, NodeInfo):
        return 0
    if state.drain is not None and not me.drained_by_us:
        # Resumed or re-reasoned by someone else: forget our drain.
        run.log(f"our drain record is stale (node {me.state.text}, reason "
                f"{me.reason.full if me.reason else None!r}); forgetting it")
        state = save_state(run, lambda s: replace(s, drain=None))
    if not run.cfg.resume.enabled:
        return 0
    decision = decide_resume(me, state, run.cfg.resume.clean_runs, run.boot_id, run.cfg.resume.reboot_actions)
    if decision.action != "resume":
        if me.drained:
            run.log(f"not resuming: {decision.why}")
        return 0
    out = slurm.resume()
    if out.ok:
        run.log(f"resumed {run.node}: {decision.why} (was: {me.reason.full if me.reason else ''})", notable=True)
        save_state(run, lambda s: replace(s, drain=None, breaker_held=None))
    else:
        run.log(f"resume failed: {out.message}", notable=True)
    return 0
