"""Daemon benchmark: RSS and CPU with 8 simulated GPUs, /metrics latency at 50 req/s, state-file fast path.

    .venv/bin/python bench/daemon_bench.py [--minutes 10] [--interval 30]

Starts ``nodehealth daemon`` on a free loopback port with examples/scenarios/healthy-8x-h100.toml,
samples its RSS and CPU time from /proc over the run, scrapes /metrics at 50 requests/s for
the whole run (a bounded, paced loop on one connection per request), and times the prolog's
fast path (``python -c 'from nodehealth import state; state.read(...)'``) against
``python -c pass``, each as whole processes, medians of 30.
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from test_daemon_util import free_port, get, start, stop, wait_for, write_config  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def proc_stats(pid: int) -> tuple[float, int]:
    """(CPU seconds user+system, RSS bytes) of the process and its live children."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / TICK
    with open(f"/proc/{pid}/statm") as f:
        rss = int(f.read().split()[1]) * PAGE
    return cpu, rss


def fast_path(state_dir: str, n: int = 30) -> tuple[float, float]:
    code = f"from nodehealth import state; s, why = state.read({state_dir!r}, 3600); assert s is not None, why"
    times = {"pass": [], "read": []}
    for _ in range(n):
        for key, c in (("pass", "pass"), ("read", code)):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", c], check=True)
            times[key].append(time.perf_counter() - t0)
    return statistics.median(times["pass"]), statistics.median(times["read"])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--interval", type=float, default=30.0)
    ap.add_argument("--rate", type=float, default=50.0)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="nodehealth-bench-"))
    port = free_port()
    proc = start(write_config(tmp, "healthy-8x-h100", port, interval_s=args.interval))
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        wait_for(url, lambda b: b"nodehealth_rounds_total 1.0" in b)
        cpu0, _ = proc_stats(proc.pid)
        t_start = time.monotonic()
        end = t_start + args.minutes * 60
        lat: list[float] = []
        rss: list[int] = []
        period = 1.0 / args.rate
        next_at = time.monotonic()
        while time.monotonic() < end:
            code, body, took = get(url)
            assert code == 200
            lat.append(took)
            if len(lat) % int(args.rate) == 0:
                rss.append(proc_stats(proc.pid)[1])
            next_at += period
            time.sleep(max(0.0, next_at - time.monotonic()))
        elapsed = time.monotonic() - t_start
        cpu1, _ = proc_stats(proc.pid)
        # CPU without the scrape load: a quiet stretch after the loaded one.
        quiet = min(60.0, args.minutes * 60 / 2)
        c0 = proc_stats(proc.pid)[0]
        time.sleep(quiet)
        c1, rss_end = proc_stats(proc.pid)
        lat.sort()
        p = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1000  # noqa: E731
        base, read = fast_path(str(tmp / "state"))
        print(f"run: {elapsed:.0f} s with 8 simulated GPUs, interval {args.interval:g} s, {len(lat)} scrapes "
              f"at {args.rate:g}/s")
        print(f"RSS: median {statistics.median(rss) / 2**20:.1f} MiB, max {max(rss) / 2**20:.1f} MiB, "
              f"end {rss_end / 2**20:.1f} MiB")
        print(f"CPU under 50 req/s: {100 * (cpu1 - cpu0) / elapsed:.2f} % of a core; quiet ({quiet:.0f} s, "
              f"rounds only): {100 * (c1 - c0) / quiet:.2f} %")
        print(f"/metrics latency: p50 {p(0.5):.2f} ms, p99 {p(0.99):.2f} ms, max {lat[-1] * 1000:.2f} ms "
              f"({len(body)} bytes)")
        print(f"fast path: python -c pass {base * 1000:.1f} ms, state read {read * 1000:.1f} ms "
              f"(+{(read - base) * 1000:.1f} ms), medians of 30")
    finally:
        stop(proc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
