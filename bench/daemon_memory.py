"""Daemon memory: what holds the daemon's MiB, by tracemalloc and /proc/self/status, over its rounds.

    .venv/bin/python bench/daemon_memory.py [--rounds 30] [--out bench-daemon-memory.txt]

Runs the daemon in this process (``Daemon`` with examples' healthy-8x-h100 scenario, its endpoint
on a free loopback port, no Slurm hook) and reports:
1. RSS (VmRSS) at each step: the interpreter alone, after the daemon's imports, after start, after
   the first round, after --rounds rounds with a scrape (plain and gzip) after each;
2. the Python heap tracemalloc sees, by top-level package, after the last round (what the
   rounds keep: import-time code and tables count under their module);
3. what grew from the first round to the last (the 10 largest lines): a cache or a history kept
   too long shows here as growth that does not stop;
4. the modules loaded at start and the ones the rounds added.
The report is printed and written to --out.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--out", default="bench-daemon-memory.txt")
    ap.add_argument("--no-tracemalloc", action="store_true", help="RSS only (tracemalloc adds its own)")
    args = ap.parse_args()
    lines: list[str] = []

    def say(text: str) -> None:
        print(text)
        lines.append(text)

    steps = [("interpreter", rss_mib(), len(sys.modules))]
    import tracemalloc

    if not args.no_tracemalloc:
        tracemalloc.start(1)
    from nodehealth.config import loader
    from nodehealth.daemon.core import Daemon

    steps.append(("daemon imported", rss_mib(), len(sys.modules)))
    sys.path.insert(0, str(ROOT / "tests"))
    from test_daemon_util import free_port, write_config

    tmp = Path(tempfile.mkdtemp(prefix="nodehealth-mem-"))
    path = write_config(tmp, "healthy-8x-h100", free_port(), interval_s=30)
    cfg = loader.load(str(path))
    d = Daemon(cfg, str(path), notify=lambda s: True, use_default_hooks=False)
    d.start()
    at_start = set(sys.modules)
    steps.append(("started", rss_mib(), len(sys.modules)))
    try:
        d.round()
        d.metrics.payload(), d.metrics.payload_gzip()
        steps.append(("round 1", rss_mib(), len(sys.modules)))
        first = tracemalloc.take_snapshot() if tracemalloc.is_tracing() else None
        t0 = time.perf_counter()
        for _ in range(args.rounds - 1):
            d.round()
            d.metrics.payload(), d.metrics.payload_gzip()
        took = time.perf_counter() - t0
        steps.append((f"round {args.rounds}", rss_mib(), len(sys.modules)))
        last = tracemalloc.take_snapshot() if tracemalloc.is_tracing() else None
    finally:
        if d.server is not None:
            d.server.stop()
    say(f"daemon memory, 8 simulated GPUs (healthy-8x-h100), {args.rounds} rounds in this process")
    say(f"rounds 2..{args.rounds}: {took / max(1, args.rounds - 1) * 1000:.0f} ms each (with tracemalloc: slower)")
    say("step                 RSS MiB  modules")
    for name, mib, mods in steps:
        say(f"{name:<20} {mib:7.1f}  {mods:7d}")
    if first is not None and last is not None:
        cur, peak = tracemalloc.get_traced_memory()
        say(f"Python heap traced: {cur / 2**20:.1f} MiB now, {peak / 2**20:.1f} MiB peak")
        by: dict[str, int] = {}
        for st in last.statistics("filename"):
            name = st.traceback[0].filename
            if "site-packages/" in name:
                key = name.split("site-packages/")[1].split("/")[0]
            elif str(ROOT) in name:
                key = "/".join(Path(name).relative_to(ROOT).parts[:2])
            elif name.startswith("<"):
                key = name
            else:
                key = "stdlib " + Path(name).name
            by[key] = by.get(key, 0) + st.size
        say("largest holders (KiB):")
        for key, size in sorted(by.items(), key=lambda kv: -kv[1])[:15]:
            say(f"  {size / 1024:8.0f}  {key}")
        say(f"growth from round 1 to round {args.rounds} (KiB), largest lines:")
        for st in last.compare_to(first, "lineno")[:10]:
            frame = st.traceback[0]
            say(f"  {st.size_diff / 1024:+8.1f}  {frame.filename.replace(str(ROOT) + '/', '')}:{frame.lineno}")
    added = sorted(set(sys.modules) - at_start)
    say(f"modules the rounds added after start: {len(added)}")
    say("  " + " ".join(added))
    Path(args.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
