"""The NCCL self-test's runs under one deadline, in a killable child.

What runs (the program, its arguments and environment, the modes) is ``nccl.plan``'s. Every run
goes through ``nodehealth.platform.proc.run``: argv list, absolute trusted path, Python isolated
(``-I``), ``cwd="/"``, output capped while reading, its whole process group killed on every way
out, with the plan's environment and nothing else.

The probe runs the self-test in a killable child (``start``: ``platform.child``), so the
agent's memory never holds the output and the probe's deadline can end it: the runs end
``MARGIN_S`` before that deadline (their own "hung" verdict comes first); the parent's kill at
the deadline ends the child and the runner's process group with it (``platform.reap.end_tree``:
the runner is the child's child until the child dies, so it is found through /proc); a child
whose parent died (the agent killed by a signal) kills its runner's group at its next check
(``proc.POLL_S``) and leaves. The runs of one self-test share its deadline: each gets an equal
share of what is left.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

from nodehealth.nccl.plan import (
    EXIT_NO_BACKEND,
    HELP_TIMEOUT_S,
    MODES,
    Execute,
    Plan,
    argv_for,
    child_env,
    choose_runner,
    json_cache,
    mode_env,
    supports_json,
)
from nodehealth.nccl.results import PerfResult, TransportResult
from nodehealth.observations import NcclObservation, NcclRun

MAX_OUTPUT = 8 << 20  # NCCL_DEBUG=INFO of 8 GPUs is a few hundred KiB; the table comes last
TAIL_CHARS = 4000
# The runs end this much before the probe's deadline: the group's kill, the leader's reaping, the
# parsing and the child's answer fit in it, so the verdict is the run's own (hung), not the probe's.
MARGIN_S = 0.5


def parse_outputs(
    stdout: str, stderr: str, json_text: Optional[str]
) -> tuple[Optional[PerfResult], Optional[str], Optional[TransportResult], bool]:
    """(perf, perf error, transport, perf came from the JSON file) with the NCCL parsers."""
    try:
        from nodehealth.nccl import parse as perf_parser
        from nodehealth.nccl import transport as transport_parser
    except ImportError as exc:  # pragma: no cover - the parsers ship with the package
        return None, f"the NCCL parsers are not available: {exc}", None, False
    from nodehealth.nccl.results import ParseError

    perf: Optional[PerfResult] = None
    error: Optional[str] = None
    from_json = False
    if json_text and json_text.strip():
        try:
            perf, from_json = perf_parser.parse_perf(json_text), True
        except (ParseError, ValueError) as exc:
            error = f"-J file: {exc}"
    if perf is None and stdout.strip():
        try:
            perf, error = perf_parser.parse_perf(stdout), None
        except (ParseError, ValueError) as exc:
            error = str(exc)
    text = stdout + ("\n" + stderr if stderr else "")
    try:
        tr: Optional[TransportResult] = transport_parser.classify(text)
    except (ParseError, ValueError):
        tr = None
    return perf, error, tr, from_json


def _not_run(
    mode: str,
    runner: str,
    gpus: int,
    error: str,
    kind: str,
    argv: Sequence[str] = (),
    env: Optional[Mapping[str, str]] = None,
    elapsed_s: float = 0.0,
) -> NcclRun:
    """A run that could not be set up: ``kind`` "missing" (SKIPPED) or "config" (UNKNOWN), and why."""
    return NcclRun(
        mode=mode,
        runner=runner,
        argv=tuple(argv),
        env=env if env is not None else {},
        gpus=gpus,
        elapsed_s=elapsed_s,
        setup_error=error,
        setup_kind=kind,
        finished_at=time.time(),
    )


def run_mode(
    mode: str,
    plan: Plan,
    gpus: int,
    timeout_s: float,
    execute: Optional[Execute] = None,
    check: Optional[Callable[[], None]] = None,
) -> NcclRun:
    """One run of the self-test in ``mode``, ended at ``timeout_s`` with its process group.

    ``check``: ``proc.run``'s, called while the runner runs (the probe child's parent watch)."""
    from nodehealth.platform import proc

    run = execute or proc.run
    runner, problem, kind = choose_runner(plan)
    if problem:
        return _not_run(mode, runner, gpus, problem, kind)
    t0 = time.monotonic()
    tmp = tempfile.mkdtemp(prefix="nodehealth-nccl-")
    try:
        want_json = (
            runner == "nccl-tests"
            and plan.json != "off"
            and (
                plan.json == "on"
                or supports_json(plan.all_reduce_perf, run, min(HELP_TIMEOUT_S, timeout_s / 4), child_env({}, plan.env))
            )
        )
        json_path = os.path.join(tmp, "all_reduce_perf.json") if want_json else None
        own = mode_env(mode, plan.nccl_net_ib, plan.min_bw_gbps if runner == "nccl-tests" else 0.0)
        argv = argv_for(runner, plan, gpus, json_path)
        left = max(0.05, timeout_s - (time.monotonic() - t0))
        try:
            env = child_env(own, plan.env)
            res = run(argv, left, env=env, max_output=MAX_OUTPUT, allow=tuple(env), check=check)
        except proc.CommandError as exc:
            return _not_run(mode, runner, gpus, str(exc), "config", argv, own)
        json_text = _read_json(tmp) if json_path else None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    elapsed = time.monotonic() - t0
    if runner == "builtin" and res.returncode == EXIT_NO_BACKEND:
        why = _last_line(res.stderr) or "no backend for the built-in runner"
        return _not_run(mode, runner, gpus, why, "missing", argv, own, elapsed)
    perf, perf_error, tr, from_json = parse_outputs(res.stdout, res.stderr, json_text)
    text = res.stdout + res.stderr
    return NcclRun(
        mode=mode,
        runner=runner,
        argv=tuple(argv),
        env=own,
        gpus=gpus,
        returncode=res.returncode,
        timed_out=res.timed_out,
        truncated=res.truncated,
        timeout_s=left,
        elapsed_s=elapsed,
        finished_at=time.time(),
        output_bytes=len(res.stdout.encode("utf-8", "replace")) + len(res.stderr.encode("utf-8", "replace")),
        output_tail=text[-TAIL_CHARS:],
        json_output=from_json,
        perf=perf,
        perf_error=perf_error,
        transport=tr,
    )


def gather(
    plan: Plan,
    gpus: Optional[int],
    timeout_s: float,
    execute: Optional[Execute] = None,
    check: Optional[Callable[[], None]] = None,
    clock: Callable[[], float] = time.monotonic,
) -> NcclObservation:
    """Every configured mode in turn; together they end ``MARGIN_S`` before ``timeout_s``."""
    if not gpus:
        return NcclObservation(
            runs=tuple(
                NcclRun(
                    mode=m,
                    runner=plan.runner,
                    gpus=gpus or 0,
                    setup_error="no NVIDIA GPU found on this node",
                    setup_kind="missing",
                    finished_at=time.time(),
                )
                for m in plan.modes
            )
        )
    end = clock() + max(0.1, timeout_s - MARGIN_S)
    runs = []
    modes = [m for m in plan.modes if m in MODES]
    for i, mode in enumerate(modes):
        share = max(0.05, (end - clock()) / (len(modes) - i))
        runs.append(run_mode(mode, plan, gpus, share, execute, check))
    return NcclObservation(runs=tuple(runs))


def _read_json(tmp: str) -> Optional[str]:
    """The -J file nccl-tests wrote (``name.json``, or ``name.json.<n>`` when the name was taken)."""
    try:
        names = sorted(n for n in os.listdir(tmp) if n.startswith("all_reduce_perf.json"))
    except OSError:
        return None
    for name in names:
        try:
            with open(os.path.join(tmp, name), "rb") as f:
                return f.read(MAX_OUTPUT).decode("utf-8", "replace")
        except OSError:
            continue
    return None


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


class ParentGone(Exception):
    """The probe child's parent (the agent) is gone: nobody waits for the self-test any more."""


@dataclass
class PendingSelftest:
    """The self-test running in a killable child (``platform.child``); ``collect`` waits for it."""

    plan: Plan
    gpus: int
    timeout_s: float
    child: Any  # platform.child.Child

    def collect(self) -> NcclObservation:
        from nodehealth.platform import child

        (outcome,) = child.wait_all([self.child], self.timeout_s)
        if outcome.ok and isinstance(outcome.value, tuple) and isinstance(outcome.value[0], NcclObservation):
            obs, learnt = outcome.value
            json_cache.update(learnt)  # what the child learnt of -J, for the next child
            return obs
        modes = [m for m in self.plan.modes if m in MODES]
        if outcome.timed_out:
            # The child and the runner's process group were killed at the probe's deadline
            # (child.abandon): the run did not end within it, which is what a hung run is.
            return NcclObservation(
                runs=tuple(
                    NcclRun(
                        mode=m,
                        runner=self.plan.runner,
                        gpus=self.gpus,
                        timed_out=True,
                        timeout_s=self.timeout_s,
                        elapsed_s=outcome.elapsed_s,
                        finished_at=time.time(),
                    )
                    for m in modes
                )
            )
        why = f"the self-test's child failed: {outcome.value}"
        return NcclObservation(runs=tuple(_not_run(m, self.plan.runner, self.gpus, why, "config") for m in modes))


def start(plan: Plan, gpus: Optional[int], timeout_s: float) -> Any:
    """Start the self-test in a child (see the module's docstring); its ``collect`` gives the observation.

    Without a GPU nothing is forked (the observation says so at once)."""
    if not gpus:
        return _Ready(gather(plan, gpus, timeout_s))
    # Imported before the fork, not in the child.
    from nodehealth.config import trust  # noqa: F401
    from nodehealth.nccl import parse, transport  # noqa: F401
    from nodehealth.platform import child, proc  # noqa: F401

    parent = os.getpid()

    def watch() -> None:
        if os.getppid() != parent:
            raise ParentGone(f"the agent (pid {parent}) is gone")

    def body() -> tuple[NcclObservation, dict[tuple[Any, ...], bool]]:
        return gather(plan, gpus, timeout_s, check=watch), dict(json_cache)

    started = child.start(body, parent_gone="raise")  # its cleanup ends the runner's group
    return PendingSelftest(plan, gpus, timeout_s, started)


@dataclass(frozen=True)
class _Ready:
    value: NcclObservation

    def collect(self) -> NcclObservation:
        return self.value
