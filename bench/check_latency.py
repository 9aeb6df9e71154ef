"""Benchmark: whole-process wall time of `nodehealth check` on simulated GPUs.

  .venv/bin/python bench/check_latency.py [--runs 21] [--out FILE]

Measures, side by side in one run (interleaved, so machine noise hits all alike):
  * python -c pass                              (the interpreter's floor)
  * nodehealth check, 8 healthy simulated GPUs, every prolog check, --phase prolog
  * nodehealth check with a hung NVML call, with the GPU checks' deadline set to 2 s:
    the verdict must arrive within budget + 0.5 s.
Prints a markdown report (medians, min, max) to stdout or --out.
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
SCEN = ROOT / "examples" / "scenarios"
NODEHEALTH = [sys.executable, "-m", "nodehealth"]


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, int]:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=False)
    return time.perf_counter() - t0, proc.returncode


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=21)
    ap.add_argument("--out")
    args = ap.parse_args()
    env = dict(os.environ, NO_COLOR="1")
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
        cases = {
            "python -c pass": ([sys.executable, "-c", "pass"], 0),
            "check, healthy 8x H100, prolog checks": (
                [
                    *NODEHEALTH,
                    "check",
                    "--config",
                    str(empty_cfg),
                    "--phase",
                    "prolog",
                    "--simulate",
                    str(SCEN / "healthy-8x-h100.toml"),
                ],
                0,
            ),
            "check, hung NVML call, GPU deadline 2 s": (
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
            ),
        }
        times: dict[str, list[float]] = {name: [] for name in cases}
        for argv, _ in cases.values():  # warm the page cache and .pyc files
            timed(argv, env)
        for _ in range(args.runs):
            for name, (argv, want) in cases.items():
                if "hung" in name and len(times[name]) >= 5:
                    continue  # each run costs the full deadline; 5 are enough
                elapsed, code = timed(argv, env)
                if code != want:
                    print(f"{name}: exit {code}, expected {want}", file=sys.stderr)
                    return 1
                times[name].append(elapsed)
    lines = [
        f"Runs: {args.runs} (hung case: 5), interleaved; Python {sys.version.split()[0]}, {os.cpu_count()} CPUs.",
        "",
        "| case | median | min | max |",
        "|---|---|---|---|",
    ]
    for name, values in times.items():
        lines.append(
            f"| {name} | {statistics.median(values) * 1000:.0f} ms | {min(values) * 1000:.0f} ms "
            f"| {max(values) * 1000:.0f} ms |"
        )
    base = statistics.median(times["python -c pass"])
    healthy = statistics.median(times["check, healthy 8x H100, prolog checks"])
    lines += ["", f"healthy check minus interpreter start: {(healthy - base) * 1000:.0f} ms"]
    text = "\n".join(lines) + "\n"
    if args.out:
        Path(args.out).write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
