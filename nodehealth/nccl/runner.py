"""The NCCL self-test's runs: which program, with which arguments and environment, under which deadline.

Two runners. ``nccl-tests``: NVIDIA's ``all_reduce_perf`` at a configured absolute path (root's
own when nodehealth runs as root, ``config.trust``), with ``-J <file>`` JSON output when the
binary's usage lists it (nccl-tests 2.17.3 and later) and ``NCCL_TESTS_MIN_BW`` when configured.
``builtin``: ``python -I -m nodehealth.nccl.builtin`` (nccl4py or torch.distributed), which prints
nccl-tests' table, so one parser reads both.

Two modes, each one run: ``nvlink`` (NCCL chooses every path) and ``ib_loopback``
(``NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1``: every byte between two GPUs of the node goes out
through a NIC and back, as Azure's azurehpc-health-checks does). Both run with
``NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET``, whose lines prove the transport.

Every run goes through ``nodehealth.platform.proc.run``: argv list, absolute trusted path, Python
isolated (``-I``), ``cwd="/"``, output capped while reading, its whole process group killed on
every way out. Its environment is ``proc.BASE_ENV`` plus exactly what the self-test sets: the
mode's variables (``OWN_ENV``) and the configured ``env`` (``NAME=value``, root's config); nothing
of the caller's or a job's environment (no ``LD_*``, ``PYTHON*``, ``PATH``, ``NCCL_*``, ``CUDA_*``).

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
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

from nodehealth.nccl.results import PerfResult, TransportResult
from nodehealth.observations import NcclObservation, NcclRun

MODES = ("nvlink", "ib_loopback")
RUNNERS = ("auto", "nccl-tests", "builtin")
MAX_OUTPUT = 8 << 20  # NCCL_DEBUG=INFO of 8 GPUs is a few hundred KiB; the table comes last
TAIL_CHARS = 4000
# The runs end this much before the probe's deadline: the group's kill, the leader's reaping, the
# parsing and the child's answer fit in it, so the verdict is the run's own (hung), not the probe's.
MARGIN_S = 0.5
HELP_TIMEOUT_S = 3.0
# Exit status of the built-in runner when no backend (nccl4py, torch) can be imported: nothing is installed.
EXIT_NO_BACKEND = 69
# Variables the self-test sets itself: an inherited value would change what a mode measures.
OWN_ENV = (
    "NCCL_P2P_DISABLE",
    "NCCL_SHM_DISABLE",
    "NCCL_DEBUG",
    "NCCL_DEBUG_SUBSYS",
    "NCCL_DEBUG_FILE",
    "NCCL_NET",
    "NCCL_TESTS_MIN_BW",
)

Execute = Callable[..., Any]  # platform.proc.run's signature


@dataclass(frozen=True)
class Plan:
    """What the self-test runs, from ``[checks.nccl_selftest]`` (the check's Settings)."""

    modes: tuple[str, ...] = ("nvlink",)
    runner: str = "auto"
    all_reduce_perf: str = "/usr/local/bin/all_reduce_perf"
    args: tuple[str, ...] = ("-b", "8M", "-e", "1G", "-f", "2", "-c", "1")
    json: str = "auto"  # "auto", "on", "off"
    min_bw_gbps: float = 0.0
    nccl_net_ib: bool = False
    env: tuple[str, ...] = ()  # NAME=value
    builtin_backend: str = "auto"
    python: str = ""

    @classmethod
    def from_settings(cls, s: Any) -> Plan:
        return cls(
            modes=tuple(s.modes),
            runner=s.runner,
            all_reduce_perf=s.all_reduce_perf,
            args=tuple(s.args),
            json=s.json_output,
            min_bw_gbps=s.min_bw_gbps,
            nccl_net_ib=s.nccl_net_ib,
            env=tuple(s.env),
            builtin_backend=s.builtin_backend,
            python=s.python,
        )


def mode_env(mode: str, nccl_net_ib: bool = False, min_bw_gbps: float = 0.0) -> dict[str, str]:
    """The NCCL variables of one mode (always the transport proof: NCCL_DEBUG=INFO, INIT,NET)."""
    env = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}
    if mode == "ib_loopback":
        env.update(NCCL_P2P_DISABLE="1", NCCL_SHM_DISABLE="1")
        if nccl_net_ib:
            env["NCCL_NET"] = "IB"  # init fails instead of falling back to sockets
    if min_bw_gbps > 0:
        env["NCCL_TESTS_MIN_BW"] = f"{min_bw_gbps:g}"
    return env


def child_env(own: Mapping[str, str], extra: Sequence[str]) -> dict[str, str]:
    """The variables the runner gets on top of ``proc.BASE_ENV``: the mode's, then the configured
    ``NAME=value`` extras. Nothing is inherited from this process or a job."""
    env = dict(own)
    for item in extra:
        name, _, value = item.partition("=")
        env[name] = value
    return env


def with_gpus(args: Sequence[str], gpus: int) -> list[str]:
    """``args`` with ``-g <gpus>`` unless they set ``-g``/``--ngpus`` themselves."""
    out = list(args)
    if not any(a in ("-g", "--ngpus") or a.startswith("--ngpus=") for a in out):
        out += ["-g", str(gpus)]
    return out


_json_cache: dict[tuple[Any, ...], bool] = {}


def supports_json(
    path: str, execute: Execute, timeout_s: float = HELP_TIMEOUT_S, env: Optional[Mapping[str, str]] = None
) -> bool:
    """Whether this ``all_reduce_perf`` takes ``-J`` (its usage lists ``--output_file``), cached per file
    and environment (``env``: the configured variables, e.g. the LD_LIBRARY_PATH it needs to start)."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    env = dict(env or {})
    key = (path, st.st_ino, st.st_size, st.st_mtime_ns, tuple(sorted(env.items())))
    if key not in _json_cache:
        from nodehealth.platform.proc import CommandError

        try:
            res = execute([path, "-h"], timeout_s, env=env, max_output=1 << 16, allow=tuple(env))
        except CommandError:
            return False
        _json_cache[key] = "output_file" in res.stdout + res.stderr
    return _json_cache[key]


def builtin_available(backend: str) -> bool:
    """Whether this Python can import a backend of the built-in runner (without importing it)."""
    import importlib.util

    if backend == "cpu":  # the test backend: the standard library only
        return True
    names = {"torch": ("torch",), "nccl4py": ("nccl",), "auto": ("nccl", "torch")}.get(backend, ())
    for name in names:
        try:
            if importlib.util.find_spec(name) is not None:
                return True
        except (ImportError, ValueError):
            continue
    return False


def choose_runner(plan: Plan) -> tuple[str, str, str]:
    """(runner, setup problem, its kind): which runner runs, or why none can ("missing"/"config")."""
    from nodehealth.config import trust

    if plan.runner in ("auto", "nccl-tests"):
        path = plan.all_reduce_perf
        if not os.path.isabs(path):
            return "nccl-tests", f"all_reduce_perf = {path!r} is not an absolute path", "config"
        if os.path.isfile(path) and os.access(path, os.X_OK):
            why = trust.problem(path)
            if why:
                return (
                    "nccl-tests",
                    (
                        f"{path} not trusted: {why} (running as root, nodehealth runs only programs "
                        "root owns and nobody else can write)"
                    ),
                    "config",
                )
            return "nccl-tests", "", ""
        if plan.runner == "nccl-tests":
            return "nccl-tests", f"{path}: no such executable (nccl-tests' all_reduce_perf)", "config"
    python = plan.python or sys.executable
    if not python:
        return "builtin", "no Python to run the built-in runner (set [checks.nccl_selftest] python)", "config"
    if plan.python:
        why = trust.problem(plan.python)
        if why:
            return "builtin", f"{plan.python} not trusted: {why}", "config"
    elif not builtin_available(plan.builtin_backend):
        where = f"no nccl-tests at {plan.all_reduce_perf} and " if plan.runner == "auto" else ""
        return (
            "builtin",
            (
                f"{where}no backend for the built-in runner ({plan.builtin_backend}): install "
                "nccl-tests, or nodehealth[nccl] (nccl4py) or torch"
            ),
            "missing",
        )
    return "builtin", "", ""


def argv_for(runner: str, plan: Plan, gpus: int, json_path: Optional[str]) -> list[str]:
    args = with_gpus(plan.args, gpus)
    if runner == "nccl-tests":
        return [plan.all_reduce_perf, *args, *(["-J", json_path] if json_path else [])]
    from nodehealth.platform.proc import python_argv

    return python_argv(
        plan.python or sys.executable, "nodehealth.nccl.builtin", ["--backend", plan.builtin_backend, *args]
    )


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
        return NcclRun(
            mode=mode, runner=runner, gpus=gpus, setup_error=problem, setup_kind=kind, finished_at=time.time()
        )
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
            return NcclRun(
                mode=mode,
                runner=runner,
                argv=tuple(argv),
                env=own,
                gpus=gpus,
                setup_error=str(exc),
                setup_kind="config",
                finished_at=time.time(),
            )
        json_text = _read_json(tmp) if json_path else None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    elapsed = time.monotonic() - t0
    if runner == "builtin" and res.returncode == EXIT_NO_BACKEND:
        return NcclRun(
            mode=mode,
            runner=runner,
            argv=tuple(argv),
            env=own,
            gpus=gpus,
            elapsed_s=elapsed,
            setup_error=_last_line(res.stderr) or "no backend for the built-in runner",
            setup_kind="missing",
            finished_at=time.time(),
        )
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
            _json_cache.update(learnt)  # what the child learnt of -J, for the next child
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
        return NcclObservation(
            runs=tuple(
                NcclRun(
                    mode=m,
                    runner=self.plan.runner,
                    gpus=self.gpus,
                    finished_at=time.time(),
                    setup_error=f"the self-test's child failed: {outcome.value}",
                    setup_kind="config",
                )
                for m in modes
            )
        )


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
        return gather(plan, gpus, timeout_s, check=watch), dict(_json_cache)

    started = child.start(body, parent_gone="raise")  # its cleanup ends the runner's group
    return PendingSelftest(plan, gpus, timeout_s, started)


@dataclass(frozen=True)
class _Ready:
    value: NcclObservation

    def collect(self) -> NcclObservation:
        return self.value
