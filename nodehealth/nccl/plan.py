"""The NCCL self-test's plan: which program runs, with which arguments and environment.

Two runners. ``nccl-tests``: NVIDIA's ``all_reduce_perf`` at a configured absolute path (root's
own when nodehealth runs as root, ``config.trust``), with ``-J <file>`` JSON output when the
binary's usage lists it (nccl-tests 2.17.3 and later) and ``NCCL_TESTS_MIN_BW`` when configured.
``builtin``: ``python -I -m nodehealth.nccl.builtin`` (nccl4py or torch.distributed), which prints
nccl-tests' table, so one parser reads both.

Two modes, each one run: ``nvlink`` (NCCL chooses every path) and ``ib_loopback``
(``NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1``: every byte between two GPUs of the node goes out
through a NIC and back, as Azure's azurehpc-health-checks does). Both run with
``NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET``, whose lines prove the transport.

A run's environment is ``proc.BASE_ENV`` plus exactly what the self-test sets: the mode's
variables (``OWN_ENV``) and the configured ``env`` (``NAME=value``, root's config); nothing of the
caller's or a job's environment (no ``LD_*``, ``PYTHON*``, ``PATH``, ``NCCL_*``, ``CUDA_*``).
``nccl.runner`` runs the plan under its deadline.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

MODES = ("nvlink", "ib_loopback")
RUNNERS = ("auto", "nccl-tests", "builtin")
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


# What each binary said of -J (``supports_json``), per file and environment; the runner's child hands it back.
json_cache: dict[tuple[Any, ...], bool] = {}


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
    if key not in json_cache:
        from nodehealth.platform.proc import CommandError

        try:
            res = execute([path, "-h"], timeout_s, env=env, max_output=1 << 16, allow=tuple(env))
        except CommandError:
            return False
        json_cache[key] = "output_file" in res.stdout + res.stderr
    return json_cache[key]


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
