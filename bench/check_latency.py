"""Benchmark: whole-process wall time of `nodehealth check` on simulated GPUs, and of `import nodehealth.cli`.

  .venv/bin/python bench/check_latency.py [--runs 21] [--out FILE] [--previous DIR]

Measures, side by side in one run (interleaved, so machine noise hits all alike):
  * python -c pass                              (the interpreter's floor)
  * nodehealth check, 8 healthy simulated GPUs, every prolog check, --phase prolog
  * python -c "import nodehealth.cli"
  * with --previous DIR (a checkout of the previous release with its simulator built, e.g.
    `git worktree add /tmp/v020 v0.2.0` and `python -m nodehealth_sim.fakenvml_build` in its sim/):
    the same two cases with that tree first on PYTHONPATH
  * nodehealth check with a hung NVML call, with the GPU checks' deadline set to 2 s:
    the verdict must arrive within budget + 0.5 s.
Prints a markdown report (medians, min, max, each case's ratio to the floor, and this tree's to the
previous release's) to stdout or --out.
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

from _common import emit

ROOT = Path(__file__).resolve().parent.parent
SCEN = ROOT / "examples" / "scenarios"
NODEHEALTH = [sys.executable, "-m", "nodehealth"]


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, int]:
    t0 = time.perf_counter()
    # From the root directory: `python -c` and `-m` put the working directory first on sys.path, where a
    # source tree would shadow the one PYTHONPATH names.
    proc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=False, cwd="/")
    return time.perf_counter() - t0, proc.returncode


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=21)
    ap.add_argument("--out")
    ap.add_argument("--previous", help="a checkout of the previous release (its simulator built in its sim/)")
    args = ap.parse_args()
    # As an installed package runs: with bytecode (the warm-up run writes it), this tree's own modules.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE")}
    env["NO_COLOR"] = "1"
    envs = {"this tree": env}
    if args.previous:
        prev = Path(args.previous).resolve()
        envs["previous"] = dict(env, PYTHONPATH=f"{prev}{os.pathsep}{prev / 'sim'}")
    with tempfile.TemporaryDirectory() as tmp:
        hang_cfg = Path(tmp) / "hang.toml"
        gpu_checks = (
            "nvml",
            "gpu_count",
            "gpu_driver",
            "gpu_temperature",
            "gpu_ecc",
            "gpu_retired_pages",
            "gpu_remapped_rows",
            "gpu_pcie",
            "gpu_nvlink",
            "gpu_fabric",
            "gpu_recovery_action",
            "gpu_persistence",
            "gpu_processes",
        )
        hang_cfg.write_text("".join(f"[checks.{n}]\ntimeout_s = 2.0\n" for n in gpu_checks))
        empty_cfg = Path(tmp) / "empty.toml"
        empty_cfg.write_text("")
        prolog = [
            *NODEHEALTH,
            "check",
            "--config",
            str(empty_cfg),
            "--phase",
            "prolog",
            "--simulate",
            str(SCEN / "healthy-8x-h100.toml"),
        ]
        cases: dict[str, tuple[list[str], int, dict[str, str]]] = {
            "python -c pass": ([sys.executable, "-c", "pass"], 0, env)
        }
        for tree, tree_env in envs.items():
            cases[f"check, healthy 8x H100, prolog checks ({tree})"] = (prolog, 0, tree_env)
            cases[f"import nodehealth.cli ({tree})"] = ([sys.executable, "-c", "import nodehealth.cli"], 0, tree_env)
        cases["check, hung NVML call, GPU deadline 2 s"] = (
            [
                *NODEHEALTH,
                "check",
                "--config",
                str(hang_cfg),
                "--phase",
                "prolog",
                "--simulate",
                str(SCEN / "hung-nvml-call.toml"),
            ],
            1,
            env,
        )
        times: dict[str, list[float]] = {name: [] for name in cases}
        for argv, _, case_env in cases.values():  # warm the page cache and .pyc files
            timed(argv, case_env)
        for _ in range(args.runs):
            for name, (argv, want, case_env) in cases.items():
                if "hung" in name and len(times[name]) >= 5:
                    continue  # each run costs the full deadline; 5 are enough
                elapsed, code = timed(argv, case_env)
                if code != want:
                    print(f"{name}: exit {code}, expected {want}", file=sys.stderr)
                    return 1
                times[name].append(elapsed)
    base = statistics.median(times["python -c pass"])
    lines = [
        f"Runs: {args.runs} (hung case: 5), interleaved; Python {sys.version.split()[0]}, {os.cpu_count()} CPUs"
        + (f"; previous release: {args.previous}" if args.previous else "")
        + ".",
        "",
        "| case | median | min | max | x floor |",
        "|---|---|---|---|---|",
    ]
    for name, values in times.items():
        med = statistics.median(values)
        lines.append(
            f"| {name} | {med * 1000:.0f} ms | {min(values) * 1000:.0f} ms | {max(values) * 1000:.0f} ms "
            f"| {med / base:.1f}x |"
        )
    healthy = statistics.median(times["check, healthy 8x H100, prolog checks (this tree)"])
    lines += ["", f"healthy check minus interpreter start: {(healthy - base) * 1000:.0f} ms"]
    if args.previous:
        for what in ("check, healthy 8x H100, prolog checks", "import nodehealth.cli"):
            now, before = (statistics.median(times[f"{what} ({tree})"]) for tree in ("this tree", "previous"))
            lines.append(f"{what}: this tree / previous = {now / before:.2f}")
    return emit("\n".join(lines) + "\n", args.out)


if __name__ == "__main__":
    sys.exit(main())
