"""The cold path of the prolog, epilog and health check: start a run, run the phase's checks, act.

Every face: load the config (``NODEHEALTH_CONFIG`` or the default path), run the phase's
checks under what is left of the phase budget, then hand the Report to the one drain/resume
sequence (``nodehealth.slurm.act``) with the same deadline. The deadline starts when the
process started, so config load, checks and every Slurm call fit in the one budget. A config
file that does not validate is reported at error level and the checks run with the last
configuration that validated on this node, else the built-in defaults (``config.use.use``):
a bad edit never turns the checks off. A bug in nodehealth is its own failure (UNKNOWN): by
default it exits 0 with a loud log line, so it never drains a cluster.
"""

from __future__ import annotations

import os
import time
import traceback
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Optional, Union

from nodehealth.config.lean import node_name
from nodehealth.config.loader import phase_budget
from nodehealth.config.schema import Config
from nodehealth.config.use import ConfigError, use
from nodehealth.faces.log import Log, notable_miss
from nodehealth.model import Report, Status
from nodehealth.observations import NvmlSnapshot, Observations, gpu_counters
from nodehealth.platform.deadline import Deadline
from nodehealth.slurm import act, jobenv, observe
from nodehealth.slurm.client import Scontrol, SlurmClient
from nodehealth.slurm.policy import scope_processes, worst_failure
from nodehealth.statedir import counters, layout, ledger

PROLOG_RECORD_SLACK_S = 60.0


@dataclass
class Run:
    """One face invocation: its config, node, deadline and job."""

    face: str
    phase: str
    cfg: Config
    node: str
    log: Log
    deadline: Deadline
    environ: Mapping[str, str]
    boot_id: Optional[str]
    job_id: Optional[str] = None

    def actor(
        self, client: Optional[SlurmClient] = None, store: Any = None, log: Optional[Callable[..., None]] = None
    ) -> act.Actor:
        """The act sequence's actor for this run: through ``scontrol`` (observe mode: ``observe.client``),
        or, for a preview, through ``client`` with ``store`` and ``log`` of its own."""
        if client is None:
            real = Scontrol(
                self.cfg.slurm.scontrol, self.cfg.slurm.timeout_s, self.deadline, self.cfg.slurm.conf, self.environ
            )
            client = observe.client(self.cfg, self.node, real, self.log)  # [slurm] mode = "observe": no update
        # The prolog's job was just allocated on a node Slurm held schedulable: a drain recorded more
        # than a minute ago (before the allocation; the daemon may drain while it is under way) was
        # lifted since and is read back rather than trusted.
        after = time.time() - PROLOG_RECORD_SLACK_S if self.phase == "prolog" else None
        return act.Actor(
            cfg=self.cfg,
            node=self.node,
            phase=self.phase,
            client=client,
            deadline=self.deadline,
            log=log or self.log,
            boot_id=self.boot_id,
            job_id=self.job_id,
            record_trusted_after=after,
            store=store,
        )


def start(
    face: str,
    phase: str,
    environ: Optional[Mapping[str, str]] = None,
    remember: bool = True,
    simulate: Optional[str] = None,
) -> Union[Run, int]:
    """Load the config; an int is the exit code when that already failed.

    ``simulate``: a scenario file for a preview by hand (``check --as FACE --simulate FILE``), applied
    as ``--simulate`` is everywhere (``config.use``); a scenario that does not load raises ConfigError.

    A config file that does not validate does not stop the checks: the run uses the last
    configuration that validated on this node, else the built-in defaults, and says so at
    error level (stderr and syslog).
    """
    env = os.environ if environ is None else environ
    job = jobenv.job_id(env)
    log = Log(face, job)
    try:
        loaded = use(environ=env, remember=remember, simulate=simulate)
    except ConfigError as exc:
        if simulate:
            raise
        log(
            "error: configuration error, and the built-in defaults do not validate either, not checking: "
            + exc.oneline(),
            notable=True,
        )
        return 0
    if loaded.error is not None:
        using = (
            loaded.note
            if loaded.using == "last_validated"
            else ("the built-in defaults" + (f" ({loaded.note})" if loaded.note else ""))
        )
        log(f"error: configuration error: {loaded.error.oneline()}; checking with {using}", notable=True)
    elif loaded.note:
        log(loaded.note)
    cfg = loaded.cfg
    deadline = Deadline.from_process_start(phase_budget(cfg, phase))
    return Run(
        face=face,
        phase=phase,
        cfg=cfg,
        node=node_name(cfg.node_name, env),
        log=log,
        deadline=deadline,
        environ=env,
        boot_id=layout.read_boot_id(cfg.paths.procfs_root),
        job_id=job,
    )


def run_outcome(
    run: Run, look_only: bool = False, probes: Optional[dict[str, Any]] = None
) -> tuple[Report, Observations]:
    """The phase's checks (``gpu_processes`` scoped to the job's GPUs) and what they judged.

    The ``slurm_node`` probe makes no Slurm call from the prolog or epilog (it reads the view the
    health check or the daemon cached) and at most one an hour from the health check.
    """
    from nodehealth import runner

    outcome = runner.execute(
        run.cfg,
        phase=run.phase,
        node=run.node,
        environ=run.environ,
        budget_s=run.deadline.left(),
        look_only=look_only,
        probes=probes,
    )
    return scope_processes(outcome.report, jobenv.job_gpus(run.environ)), outcome.observations


def save_counters(run: Run, obs: Observations, source: str) -> Optional[dict[str, Any]]:
    """Keep the latest per-GPU counters current (a fast-path prolog copies them); returns them."""
    if not isinstance(obs.nvml, NvmlSnapshot):
        return None
    now = gpu_counters(obs.nvml.gpus)
    try:
        counters.write_latest(run.cfg.paths.state_dir, now, run.boot_id, source)
    except OSError as exc:
        run.log(f"cannot write the GPU counter reading: {exc}")
    return now


def save_job_baseline(run: Run, now: Optional[dict[str, Any]]) -> None:
    """The prolog's counters of the job's GPUs, for the epilog to compare against."""
    if run.job_id is None:
        return
    if now is None:
        run.log("no ECC baseline for the epilog: NVML was not read")
        return
    rec = counters.counters_record(now, time.time(), run.boot_id, "prolog", jobenv.job_gpus(run.environ), run.job_id)
    try:
        counters.write_baseline(run.cfg.paths.state_dir, run.job_id, rec)
    except OSError as exc:
        run.log(f"cannot write the job baseline: {exc}")


def append_ledger(run: Run, event: str) -> None:
    if not run.cfg.ledger.enabled:
        return
    rec = jobenv.record(event, run.environ, time.time(), node=run.node, boot_id=run.boot_id)
    if rec is None:
        return
    try:
        ledger.append(run.cfg.paths.state_dir, rec, run.cfg.ledger.max_bytes)
    except OSError as exc:
        run.log(f"cannot append to the job ledger: {exc}")


def log_report(run: Run, report: Report) -> None:
    for r in report.results:
        if r.status >= Status.WARN:
            run.log(f"{r.status.name} {r.name}: {r.summary}", check=r.name, gpu=r.gpu, status=r.status.name)
    run.log(f"{report.status.name}: {len(report.results)} checks in {report.duration_s:.2f} s")
    if report.status == Status.UNKNOWN and run.cfg.policy.unknown == "pass":
        run.log(
            "nodehealth could not tell (UNKNOWN); policy.unknown = pass: treating the node as healthy", notable=True
        )


def log_changes(run: Run, report: Report) -> None:
    """The health check's findings, said when one appears, changes or clears, not every run.

    A drained faulty node is checked every ``HealthCheckInterval`` (5 s on some sites): the same
    FAIL line each time says nothing new. What was last said lives in the Slurm state file
    (``logged``), so it holds across the short-lived runs.
    """
    from nodehealth.slurm.policy import changed_lines, result_lines
    from nodehealth.statedir import slurmstate

    now = result_lines(report)
    before = (slurmstate.load(run.cfg.paths).logged or {}).get(run.phase, {})
    lines = changed_lines(before, now)
    if not lines:
        return
    by_name = {r.name: r for r in report.results}
    for line in lines:
        r = by_name.get(line.split(" ", 2)[1].rstrip(":")) if line.count(" ") >= 2 else None
        if r is not None and r.status >= Status.WARN:
            run.log(line, check=r.name, gpu=r.gpu, status=r.status.name)
        else:
            run.log(line)
    run.log(f"{report.status.name}: {len(report.results)} checks in {report.duration_s:.2f} s")
    if report.status == Status.UNKNOWN and run.cfg.policy.unknown == "pass":
        run.log(
            "nodehealth could not tell (UNKNOWN); policy.unknown = pass: treating the node as healthy", notable=True
        )
    memory = {k: v[: slurmstate.MAX_LOGGED_CHARS] for k, v in now.items()}
    slurmstate.update(
        run.cfg.paths,
        lambda s: replace(s, logged=dict(s.logged or {}, **{run.phase: memory})),
        min(1.0, max(0.1, run.deadline.left())),
        run.log,
    )


def exit_code(run: Run, report: Report, actor: Optional[act.Actor] = None) -> int:
    """0 healthy; else the one drain sequence, then 1 (0 when the breaker held the drain back).
    ``actor``: a preview's (``faces.preview``); None: the run's own."""
    if worst_failure(report, run.cfg.policy.unknown) is None:
        return 0
    actor = actor or run.actor()
    code = 0 if act.on_fault(actor, report).outcome == act.ActOutcome.HELD else 1
    return observe.exit_code(run.cfg, code, actor.log)


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
    job GPUs' ECC counters (the job baseline); the epilog's ``job_forensics`` check compares
    against it (and the baseline is then removed).
    """
    started = start(face, phase)
    if isinstance(started, int):
        return started
    run = started
    if fast_miss:
        run.log(f"fast path not taken: {fast_miss}; running the checks", notable=notable_miss(fast_miss))
    if event == "start":
        append_ledger(run, event)
    report, obs = run_outcome(run)
    now = save_counters(run, obs, face)
    if event == "start":
        save_job_baseline(run, now)
    else:
        if run.job_id is not None:
            counters.take_baseline(run.cfg.paths.state_dir, run.job_id)
        append_ledger(run, event)
    log_report(run, report)
    return exit_code(run, report)


def fast_fault(report: Report, environ: Mapping[str, str], verdict: Any) -> int:
    """A fault in the daemon's fresh verdict (prolog fast path): ledger, then the cold path's drain."""
    started = start("prolog", "prolog", environ)
    if isinstance(started, int):
        return started
    run = started
    run.log(
        f"daemon verdict {verdict.status} ({verdict.age_s:.1f} s old, round {verdict.round}): fast path, no NVML call"
    )
    append_ledger(run, "start")
    report = replace(report, phase="prolog")
    log_report(run, report)
    return exit_code(run, report)


def healthcheck_face() -> int:
    """Judge, then drain, forget or resume (``act.after_check``); no Slurm call on a healthy node."""
    started = start("healthcheck", "healthcheck")
    if isinstance(started, int):
        return started
    run = started
    report, obs = run_outcome(run)
    save_counters(run, obs, "healthcheck")
    log_changes(run, report)
    return healthcheck_exit(run, report, obs.slurm_node)


def healthcheck_exit(run: Run, report: Report, slurm_node: Any, actor: Optional[act.Actor] = None) -> int:
    """The health check's sequence (``act.after_check``) on ``report`` and its exit code; ``actor``: a
    preview's (``faces.preview``), None: the run's own."""
    actor = actor or run.actor()
    acted = act.after_check(actor, report, slurm_node)
    fault = worst_failure(report, run.cfg.policy.unknown)
    if fault is None:
        return 0
    # slurmd only logs a health check's exit status ("error: health_check failed: rc:1"), it acts on
    # none: once our own drain holds the node for this very fault, exit 1 on every run is noise.
    if acted.outcome == act.ActOutcome.ALREADY:
        rec = actor.load().drain
        if rec is not None and rec.check == fault.name:
            return 0
    return observe.exit_code(run.cfg, 1, actor.log)
