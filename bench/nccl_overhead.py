"""Benchmark: the NCCL self-test's own overhead beyond its runner's time.

  .venv/bin/python bench/nccl_overhead.py [--runs 21] [--out FILE]

The runner is the all_reduce_perf test double (tests/fakes/all_reduce_perf) replaying the
published 8x A100 run instantly, so nearly all of a run's time is nodehealth's own. Side by side
in one run (interleaved, so machine noise hits all alike), medians of ``--runs``:

  * the double alone, as the runner starts it (one process: the runner's time)
  * the nccl_selftest check in process, as the daemon runs it (runner.execute, the -J probe
    cached after the first run), nvlink mode: one runner process
  * the same, both modes: two runner processes
  * ``nodehealth nccl run --mode nvlink`` as a command, and ``python -c pass`` (the interpreter's
    floor): the command pays interpreter start, imports and config each time, and starts the
    runner twice (the -J probe, ``all_reduce_perf -h``, is cached only within a process)

Overhead = the self-test's time minus its runner processes' time (the double alone, times the
number of runs). Goal: at most 200 ms. Prints a markdown report to stdout or --out.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
FAKE = ROOT / "tests" / "fakes" / "all_reduce_perf"
FIXTURE = ROOT / "tests" / "fixtures" / "nccl_selftest" / "gcm_single_node_8xA100.txt"
GOAL_MS = 200.0


def _ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.1f} ms"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=21)
    ap.add_argument("--out")
    args = ap.parse_args()
    os.environ.update(FAKE_NCCL="replay", FAKE_NCCL_FIXTURE=str(FIXTURE), NO_COLOR="1")
    fake_env = ["FAKE_NCCL=replay", f"FAKE_NCCL_FIXTURE={FIXTURE}"]  # the runner inherits no environment

    from nodehealth import runner
    from nodehealth.config.loader import resolve
    from nodehealth.model import Status

    tmp = Path(tempfile.mkdtemp(prefix="nccl-bench-"))
    settings = {"all_reduce_perf": str(FAKE), "gpus": 8, "gpu_model": "NVIDIA A100-SXM4-80GB", "env": fake_env}
    cfgs = {
        mode: resolve(
            {
                "paths": {"state_dir": str(tmp / "state")},
                "gpu": {"expected_count": 8},
                "checks": {"nccl_selftest": {**settings, "modes": list(modes)}},
            },
            "<bench>",
        )
        for mode, modes in (("nvlink", ("nvlink",)), ("both", ("nvlink", "ib_loopback")))
    }
    cfg_file = tmp / "nodehealth.toml"
    cfg_file.write_text(
        f'[paths]\nstate_dir = "{tmp}/state"\n[gpu]\nexpected_count = 8\n[checks.nccl_selftest]\n'
        + "".join(f"{k} = {v!r}\n".replace("'", '"') for k, v in settings.items())
    )
    env = dict(os.environ)
    from nodehealth.platform.proc import BASE_ENV

    runner_env = {**BASE_ENV, **dict(e.split("=", 1) for e in fake_env)}  # what proc.run gives the double
    double = [str(FAKE), "-b", "8M", "-e", "1G", "-f", "2", "-c", "1", "-g", "8", "-J", str(tmp / "j.json")]

    def alone() -> float:
        (tmp / "j.json").unlink(missing_ok=True)
        t0 = time.perf_counter()
        subprocess.run(
            double, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=runner_env, cwd="/", check=True
        )
        return time.perf_counter() - t0

    def in_process(mode: str) -> float:
        t0 = time.perf_counter()
        report = runner.run(cfgs[mode], phase="manual", only=("nccl_selftest",), node="bench")
        took = time.perf_counter() - t0
        assert report.results[0].status == Status.OK, report.results[0].summary
        return took

    def command(argv: list[str]) -> float:
        t0 = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=True)
        return time.perf_counter() - t0

    cli = [sys.executable, "-m", "nodehealth", "nccl", "run", "--config", str(cfg_file), "--mode", "nvlink"]
    cases = {
        "the double alone (one runner process)": alone,
        "nccl_selftest in process, nvlink (1 runner process)": lambda: in_process("nvlink"),
        "nccl_selftest in process, both modes (2 runner processes)": lambda: in_process("both"),
        "python -c pass": lambda: command([sys.executable, "-c", "pass"]),
        "nodehealth nccl run --mode nvlink (command)": lambda: command(cli),
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    for fn in cases.values():  # warm-up: page cache, the -J probe's cache
        fn()
    for _ in range(args.runs):
        for name, fn in cases.items():
            times[name].append(fn())
    names = list(cases)
    one = statistics.median(times[names[0]])
    nv = statistics.median(times[names[1]]) - one
    both = statistics.median(times[names[2]]) - 2 * one
    cmd = statistics.median(times[names[4]]) - 2 * one  # the -J probe (-h) and the run: two runner processes
    cmd_less_python = cmd - statistics.median(times[names[3]])
    lines = [
        f"Runs: {args.runs}, interleaved; Python {sys.version.split()[0]}, {os.cpu_count()} CPUs.",
        "",
        "| case | median | min | max |",
        "|---|---|---|---|",
    ]
    for name in names:
        v = times[name]
        lines.append(f"| {name} | {_ms(v)} | {min(v) * 1000:.1f} ms | {max(v) * 1000:.1f} ms |")
    lines += [
        "",
        "| overhead beyond the runner's time | median | goal |",
        "|---|---|---|",
        f"| in process (the daemon), nvlink | {nv * 1000:.1f} ms | {GOAL_MS:.0f} ms |",
        f"| in process, both modes | {both * 1000:.1f} ms | {GOAL_MS:.0f} ms |",
        f"| the command (2 runner processes: the -J probe, the run), with interpreter start | {cmd * 1000:.1f} ms | |",
        f"| the command, less `python -c pass` | {cmd_less_python * 1000:.1f} ms | {GOAL_MS:.0f} ms |",
    ]
    text = "\n".join(lines) + "\n"
    if args.out:
        Path(args.out).write_text(text)
    sys.stdout.write(text)
    worst = max(nv, both, cmd_less_python) * 1000
    return 0 if worst <= GOAL_MS else 1


if __name__ == "__main__":
    sys.exit(main())
