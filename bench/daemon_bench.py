"""Daemon benchmark: RSS and CPU with 8 simulated GPUs, /metrics latency at 50 req/s, state-file fast path.

    .venv/bin/python bench/daemon_bench.py [--minutes 10] [--interval 30] [--latency-seconds 60] [--kmsg /dev/kmsg]

Starts ``nodehealth daemon`` on a free loopback port with examples/scenarios/healthy-8x-h100.toml.
1. Steady state for --minutes: rounds every --interval seconds and a scrape every 15 s (as a
   Prometheus server would); RSS sampled every 5 s, CPU (the daemon and its reaped probe
   children) over the whole stretch.
2. Scrape latency: /metrics at 50 requests/s for --latency-seconds (a bounded, paced loop, one
   connection per request, a raw-socket client), once asking for gzip as Prometheus does
   and once plain.
3. The prolog's fast path (``python -c 'from nodehealth.statedir import verdict as state; state.read(...)'``)
   against ``python -c pass``, each as whole processes, medians of 30.
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

from _common import raw_get

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from test_daemon_util import free_port, get, start, stop, wait_for, write_config  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def proc_stats(pid: int) -> tuple[float, int]:
    """(CPU seconds user+system, RSS bytes) of the process and its live children."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = sum(int(f) for f in fields[11:15]) / TICK  # utime, stime, cutime, cstime
    with open(f"/proc/{pid}/statm") as f:
        rss = int(f.read().split()[1]) * PAGE
    return cpu, rss


def fast_path(state_dir: str, n: int = 30) -> tuple[float, float]:
    code = (
        f"from nodehealth.statedir import verdict as state; s, why = state.read({state_dir!r}, 3600); "
        "assert s is not None, why"
    )
    times = {"pass": [], "read": []}
    for _ in range(n):
        for key, c in (("pass", "pass"), ("read", code)):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", c], check=True)
            times[key].append(time.perf_counter() - t0)
    return statistics.median(times["pass"]), statistics.median(times["read"])


def scrape(url: str, gzip_ok: bool) -> tuple[int, float, int]:
    """One GET on a new connection with a minimal client (raw socket), so the figure is the
    server's and the loopback's, not a heavy HTTP client's."""
    host, port = url.split("/")[2].rsplit(":", 1)
    code, took, body = raw_get(host, int(port), gzip_ok)
    return code, took, len(body)


def latency(url: str, rate: float, seconds: float, gzip_ok: bool) -> tuple[list[float], int]:
    lat: list[float] = []
    size = 0
    period = 1.0 / rate
    next_at = time.monotonic()
    end = next_at + seconds
    while time.monotonic() < end:
        code, took, size = scrape(url, gzip_ok)
        assert code == 200
        lat.append(took)
        next_at += period
        time.sleep(max(0.0, next_at - time.monotonic()))
    return sorted(lat), size


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--interval", type=float, default=30.0)
    ap.add_argument("--rate", type=float, default=50.0)
    ap.add_argument("--latency-seconds", type=float, default=60.0)
    ap.add_argument(
        "--kmsg",
        default="",
        help="the kernel log the daemon follows (e.g. /dev/kmsg, read only, as in production); default an empty file",
    )
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="nodehealth-bench-"))
    port = free_port()
    proc = start(write_config(tmp, "healthy-8x-h100", port, interval_s=args.interval, kmsg_path=args.kmsg or None))
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        wait_for(url, lambda b: b"nodehealth_rounds_total 1.0" in b)
        cpu0, _ = proc_stats(proc.pid)
        t_start = time.monotonic()
        end = t_start + args.minutes * 60
        rss: list[int] = []
        next_scrape = t_start
        while time.monotonic() < end:
            if time.monotonic() >= next_scrape:
                get(url)
                next_scrape += 15
            rss.append(proc_stats(proc.pid)[1])
            time.sleep(5)
        elapsed = time.monotonic() - t_start
        cpu1, rss_end = proc_stats(proc.pid)
        zipped, zsize = latency(url, args.rate, args.latency_seconds, gzip_ok=True)
        plain, psize = latency(url, args.rate, args.latency_seconds, gzip_ok=False)
        base, read = fast_path(str(tmp / "state"))

        def p(lat: list[float], q: float) -> float:
            return lat[min(len(lat) - 1, int(q * len(lat)))] * 1000

        print(
            f"steady state: {elapsed:.0f} s with 8 simulated GPUs, rounds every {args.interval:g} s, "
            "a scrape every 15 s"
        )
        print(
            f"RSS: median {statistics.median(rss) / 2**20:.1f} MiB, max {max(rss) / 2**20:.1f} MiB, "
            f"end {rss_end / 2**20:.1f} MiB"
        )
        print(f"CPU: {100 * (cpu1 - cpu0) / elapsed:.3f} % of a core (daemon + probe children)")
        for name, lat, size in (("gzip (as Prometheus asks)", zipped, zsize), ("plain", plain, psize)):
            print(
                f"/metrics at {args.rate:g}/s for {args.latency_seconds:g} s, {name}: p50 {p(lat, 0.5):.2f} ms, "
                f"p99 {p(lat, 0.99):.2f} ms, max {lat[-1] * 1000:.2f} ms ({size} bytes, {len(lat)} requests)"
            )
        print(
            f"fast path: python -c pass {base * 1000:.1f} ms, state read {read * 1000:.1f} ms "
            f"(+{(read - base) * 1000:.1f} ms), medians of 30"
        )
    finally:
        stop(proc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
