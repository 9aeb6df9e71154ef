"""Prolog latency: ``nodehealth-prolog`` as slurmd starts it (no PATH, slurmd's environment).

Two cases, each as a fresh process per run (the cold path: interpreter start, imports, the
simulated NVML child, the checks, the ledger append):

1. healthy simulated 8-GPU node: no Slurm call at all (target: median <= 300 ms);
2. faulty node (row remap pending) with slurmctld unreachable (SLURM_CONF pointing at a
   controller port nothing listens on): the prolog must still end within its budget
   (target: <= budget + 0.5 s).

Prints medians. Needs the venv with nodehealth installed; Slurm's ``scontrol`` for case 2
(skipped when /usr/bin/scontrol is missing).

    .venv/bin/python bench/prolog_latency.py [--runs 20]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROLOG = Path(sys.executable).parent / "nodehealth-prolog"
SCENARIOS = ROOT / "tests" / "fixtures" / "slurm"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def write_config(d: Path, scenario: str, budget: float, slurm_timeout: float) -> Path:
    from nodehealth.registry import CHECKS

    conf = d / "slurm.conf"
    conf.write_text(f"ClusterName=bench\nSlurmctldHost=bench(127.0.0.1)\nSlurmctldPort={free_port()}\n"
                    "AuthType=auth/none\nNodeName=bench NodeAddr=127.0.0.1 CPUs=1\n"
                    "PartitionName=p Nodes=ALL Default=YES\n")
    lines = ['node_name = "bench"', "[phases.prolog]", f"budget_s = {budget}",
             "[nvml]", f'simulate = "{SCENARIOS / scenario}"', "[paths]", f'state_dir = "{d / "state"}"',
             "[slurm]", f"timeout_s = {slurm_timeout}", f'conf = "{conf}"']
    for spec in CHECKS:
        lines += [f"[checks.{spec.name}]", f"timeout_s = {min(budget, 10.0)}"]
    cfg = d / f"{scenario}.nodehealth.toml"
    cfg.write_text("\n".join(lines) + "\n")
    return cfg


def run_once(cfg: Path, conf: Path, job: int) -> tuple[float, int]:
    env = {"NODEHEALTH_CONFIG": str(cfg), "SLURM_CONF": str(conf), "SLURMD_NODENAME": "bench",
           "SLURM_JOB_ID": str(job), "SLURM_JOB_USER": "bench", "SLURM_JOB_UID": "1000",
           "SLURM_JOB_GPUS": "0,1", "CUDA_VISIBLE_DEVICES": "0,1", "SLURM_SCRIPT_CONTEXT": "prolog_slurmd"}
    t0 = time.perf_counter()
    res = subprocess.run([str(PROLOG)], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, timeout=120)
    return time.perf_counter() - t0, res.returncode


def case(name: str, d: Path, scenario: str, budget: float, slurm_timeout: float, runs: int) -> None:
    cfg = write_config(d, scenario, budget, slurm_timeout)
    times, codes = [], set()
    for i in range(runs):
        dt, rc = run_once(cfg, d / "slurm.conf", 1000 + i)
        times.append(dt)
        codes.add(rc)
    times.sort()
    print(f"{name}: runs={runs} median={statistics.median(times) * 1000:.0f} ms "
          f"min={times[0] * 1000:.0f} ms max={times[-1] * 1000:.0f} ms exit codes={sorted(codes)}"
          + (f" (budget {budget:g} s, scontrol deadline {slurm_timeout:g} s)" if "unreachable" in name else ""))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--budget", type=float, default=3.0, help="prolog budget for the unreachable case")
    args = ap.parse_args()
    if not PROLOG.exists():
        print(f"{PROLOG} missing: pip install -e .", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="nh-bench.") as tmp:
        d = Path(tmp)
        os.chmod(d, 0o755)
        case("healthy node, cold path", d, "healthy.toml", 20.0, 3.0, args.runs)
        if os.access("/usr/bin/scontrol", os.X_OK):
            n = max(3, args.runs // 4)
            case("faulty node, slurmctld unreachable", d, "remap-pending.toml", args.budget, 10.0, n)
        else:
            print("faulty node, slurmctld unreachable: skipped (/usr/bin/scontrol not installed)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
