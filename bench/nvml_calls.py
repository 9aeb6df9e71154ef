"""Benchmark: the NVML read through the real pynvml over the simulated driver.

  .venv/bin/python bench/nvml_calls.py [--runs 21] [--out FILE]

Measures, interleaved in one run (machine noise hits every case alike), whole-process wall time of
  * python -c pass                                   (the interpreter's floor)
  * nodehealth check --phase prolog, 8 healthy simulated H100 (driver 570)
  * the same node with a driver that takes 10 ms per NVML call (a loaded or slow driver)
  * a hung NVML call on GPU 4 with [nvml] call_timeout_s = 2
  * the same hang with every GPU check's timeout_s = 2 (the read's budget) and the default
    call_timeout_s: the verdict must come within the budget, not after gpu_xid's deadline
and counts the NVML calls the probe makes per GPU (the simulated driver's call log).
Prints a markdown report.
"""

from __future__ import annotations

import argparse
import collections
import json
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
sys.path.insert(0, str(ROOT))

from nodehealth_sim import driver  # noqa: E402

from nodehealth.registry import CHECKS  # noqa: E402

NODEHEALTH = [sys.executable, "-m", "nodehealth"]
GPU_CHECKS = [s.name for s in CHECKS if "nvml" in s.needs]


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, int, str]:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, check=False, text=True)
    return time.perf_counter() - t0, proc.returncode, proc.stdout


def calls_per_gpu(argv: list[str], env: dict[str, str], log: Path) -> tuple[dict[int, int], collections.Counter]:
    log.unlink(missing_ok=True)
    subprocess.run(
        argv,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,
        env=dict(env, **{driver.LOG_ENV: str(log)}),
    )
    per_gpu: dict[int, int] = collections.Counter()
    by_fn: collections.Counter = collections.Counter()
    for call in driver.read_log(str(log)):
        if call.gpu >= 0:
            per_gpu[call.gpu] += 1
            by_fn[call.symbol] += 1
    return dict(per_gpu), by_fn


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=21)
    ap.add_argument("--out")
    args = ap.parse_args()
    env = dict(os.environ, NO_COLOR="1")
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        (t / "empty.toml").write_text("")
        (t / "call2.toml").write_text("[nvml]\ncall_timeout_s = 2.0\n")
        (t / "budget2.toml").write_text("".join(f"[checks.{n}]\ntimeout_s = 2.0\n" for n in GPU_CHECKS))
        slow = t / "slow.toml"
        slow.write_text(
            (SCEN / "healthy-8x-h100.toml")
            .read_text()
            .replace("cuda_driver_version = 12080", "cuda_driver_version = 12080\ncall_delay_ms = 10", 1)
        )
        check = [*NODEHEALTH, "check", "--phase", "prolog", "--format", "json"]
        cases = {
            "python -c pass": ([sys.executable, "-c", "pass"], 0),
            "check --phase prolog, healthy 8x H100": (
                [*check, "--config", str(t / "empty.toml"), "--simulate", str(SCEN / "healthy-8x-h100.toml")],
                0,
            ),
            "same, driver at 10 ms per call": ([*check, "--config", str(t / "empty.toml"), "--simulate", str(slow)], 0),
            "hung call on GPU 4, call_timeout_s = 2": (
                [*check, "--config", str(t / "call2.toml"), "--simulate", str(SCEN / "hung-nvml-call.toml")],
                1,
            ),
            "hung call on GPU 4, GPU checks' timeout_s = 2": (
                [*check, "--config", str(t / "budget2.toml"), "--simulate", str(SCEN / "hung-nvml-call.toml")],
                -1,
            ),
        }
        per_gpu, by_fn = calls_per_gpu(cases["check --phase prolog, healthy 8x H100"][0], env, t / "calls.log")
        times: dict[str, list[float]] = {name: [] for name in cases}
        verdicts: dict[str, str] = {}
        for argv, _ in cases.values():  # warm the page cache and .pyc files
            timed(argv, env)
        for _ in range(args.runs):
            for name, (argv, want) in cases.items():
                if "hung" in name and len(times[name]) >= 5:
                    continue  # each run costs the full deadline; 5 are enough
                elapsed, code, out = timed(argv, env)
                if want >= 0 and code != want:
                    print(f"{name}: exit {code}, expected {want}\n{out[:2000]}", file=sys.stderr)
                    return 1
                if '"status"' in out:
                    doc = json.loads(out)
                    nv = next((c for c in doc["checks"] if c["name"] == "nvml"), None)
                    verdicts[name] = f"{doc['status']} (nvml: {nv['status']}: {nv['summary']})" if nv else doc["status"]
                times[name].append(elapsed)
    lines = [
        f"Runs: {args.runs} (hung cases: 5), interleaved; Python {sys.version.split()[0]}, {os.cpu_count()} CPUs.",
        "",
        "| case | median | min | max | verdict |",
        "|---|---|---|---|---|",
    ]
    for name, values in times.items():
        lines.append(
            f"| {name} | {statistics.median(values) * 1000:.0f} ms | {min(values) * 1000:.0f} ms "
            f"| {max(values) * 1000:.0f} ms | {verdicts.get(name, '')} |"
        )
    counts = sorted(per_gpu.values())
    lines += [
        "",
        f"NVML calls per GPU (healthy 8x H100, driver 570): {counts[0]}..{counts[-1]} "
        f"(max {max(counts)}), by function over all GPUs:",
        "",
    ]
    lines += [f"- `{fn}`: {n}" for fn, n in sorted(by_fn.items(), key=lambda kv: (-kv[1], kv[0]))]
    return emit("\n".join(lines) + "\n", args.out)


if __name__ == "__main__":
    sys.exit(main())
