"""The pre-flight's coordination at scale: N ranks as local processes on one machine, no Slurm.

Each rank gets the SLURM_* environment srun would give it and runs the exchange only (no local
checks), so what is measured is the protocol: wall time from the first start to the last exit,
and the shared-file-system operations of each rank (rank 0 apart: it lists and reads O(N)).

    python bench/preflight_scale.py [--ranks 3,50,200,400] [--dir DIR] [--timeout S] [--kill RANK]
    python bench/preflight_scale.py --worker DIR TIMEOUT OPSFILE   (one rank; internal)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Optional


def worker(shared: str, timeout: float, ops_file: str) -> int:
    from nodehealth.preflight import ranks
    from nodehealth.preflight.run import Options, preflight

    rank = ranks.from_env(os.environ)
    opts = Options(shared_dir=shared, timeout_s=timeout, local_checks=False, ops_file=ops_file)
    with open(os.devnull, "w") as quiet:
        out = sys.stdout if rank.leader else quiet
        return preflight(None, rank, opts, os.environ, out=out)


def run(
    n: int, shared: str, timeout: float = 10.0, kill: Optional[int] = None, skip: Optional[int] = None
) -> dict[str, Any]:
    """Start ``n`` ranks (``skip``: never started; ``kill``: SIGKILLed once its report is written)."""
    ops_dir = tempfile.mkdtemp(prefix="nh-pf-ops.")
    nodes = f"node[{0:04d}-{n - 1:04d}]" if n > 1 else "node0000"
    procs: dict[int, subprocess.Popen[str]] = {}
    t0 = time.monotonic()

    def start(r: int) -> None:
        env = dict(
            os.environ,
            SLURM_PROCID=str(r),
            SLURM_NTASKS=str(n),
            SLURM_NODEID=str(r),
            SLURMD_NODENAME=f"node{r:04d}",
            SLURM_JOB_ID="4242",
            SLURM_STEP_ID="0",
            SLURM_JOB_NODELIST=nodes,
            SLURM_NNODES=str(n),
        )
        procs[r] = subprocess.Popen(
            [sys.executable, __file__, "--worker", shared, str(timeout), os.path.join(ops_dir, f"{r}.json")],
            env=env,
            stdout=subprocess.PIPE if r == 0 else subprocess.DEVNULL,
            text=True,
        )

    # The killed rank must die between its report and what it saw of its peers: its next peer in
    # the ring starts only after the kill, so the killed rank cannot have finished first.
    held = None if kill is None or n < 2 else (kill + 1) % n
    for r in range(n):
        if r != skip and r != held:
            start(r)
    if kill is not None:
        end = time.monotonic() + timeout
        while not _report_written(shared, kill) and time.monotonic() < end:
            time.sleep(0.005)
        procs[kill].kill()
        if held is not None and held != skip:
            start(held)
    report = procs[0].communicate(timeout=timeout + 60)[0] if 0 in procs else ""
    codes = {r: p.wait(timeout=timeout + 60) for r, p in procs.items()}
    wall = time.monotonic() - t0
    ops = {}
    for name in os.listdir(ops_dir):
        with open(os.path.join(ops_dir, name)) as fh:
            doc = json.load(fh)
        ops[doc["rank"]] = doc
    shutil.rmtree(ops_dir, ignore_errors=True)
    others = [d for r, d in ops.items() if r != 0]
    return {
        "ranks": n,
        "wall_s": round(wall, 3),
        "codes": codes,
        "report": report,
        "left": sorted(os.listdir(shared)),
        "rank0_ops": ops.get(0),
        "other_ops_max": max((d["total"] - d["polls"] for d in others), default=0),
        "other_polls_max": max((d["polls"] for d in others), default=0),
        "other_ops_total_max": max((d["total"] for d in others), default=0),
    }


def _report_written(shared: str, rank: int) -> bool:
    """Whether ``rank`` wrote its report yet (the exchange directory is the one rank 0's pointer names)."""
    try:
        with open(os.path.join(shared, ".nodehealth-preflight-4242-0.name"), "rb") as fh:
            name = json.loads(fh.read())["dir"]
    except (OSError, ValueError, KeyError):
        return False
    return os.path.exists(os.path.join(shared, name, f"r{rank}.json"))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", nargs=3, metavar=("DIR", "TIMEOUT", "OPSFILE"))
    ap.add_argument("--ranks", default="3,50,200,400")
    ap.add_argument("--dir", help="the shared directory (default: a new one under /tmp)")
    ap.add_argument("--timeout", type=float, default=20.0)
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker[0], float(args.worker[1]), args.worker[2])
    print("| ranks | wall s | rank 0 ops (polls) | other ranks: ops excl. polls (max) | polls (max) | left |")
    print("|---|---|---|---|---|---|")
    for n in (int(x) for x in args.ranks.split(",")):
        shared = args.dir or tempfile.mkdtemp(prefix="nh-pf-shared.")
        res = run(n, shared, args.timeout)
        r0 = res["rank0_ops"] or {}
        print(
            f"| {n} | {res['wall_s']:.2f} | {r0.get('total')} ({r0.get('polls')}) | {res['other_ops_max']} | "
            f"{res['other_polls_max']} | {len(res['left'])} |",
            flush=True,
        )
        if not args.dir:
            shutil.rmtree(shared, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
