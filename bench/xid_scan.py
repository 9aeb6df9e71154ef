"""Benchmark: kernel-log XID scanning throughput.

Generates two ~50 MB kernel logs in a temporary directory from real line shapes:
  quiet  - a boot/runtime log with no NVRM line at all (lines of a real 8x A100 dmesg -T log),
  xid10  - the same with 10 % of the lines replaced by real published Xid lines (all formats),
then times ``scan`` over each, median of 5 runs, two ways: the CLI path (1 MiB chunks through
``split_lines``) and plain binary line iteration of the file. Prints a markdown section.

    .venv/bin/python bench/xid_scan.py [--size-mb 50] [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nodehealth.xid.parse import ScanStats, scan, split_lines  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "real-world"
GOALS = {"quiet": 100.0, "xid10": 20.0}


def _quiet_lines() -> list[bytes]:
    log = FIXTURES / "xid_logs" / "hf_m4logs_jeanzay_dmesg_T_no_xid.log"
    return [line for line in log.read_bytes().splitlines() if b"NVRM" not in line and b"Xid" not in line]


def _xid_lines() -> list[bytes]:
    rows = [json.loads(t) for t in (FIXTURES / "xid_lines.jsonl").read_text(encoding="utf-8").splitlines() if t]
    return [r["line"].encode() for r in rows if r["xid"] is not None]


def generate(path: Path, size_bytes: int, xid_share: float, seed: int = 1) -> int:
    rng = random.Random(seed)
    quiet, xids = _quiet_lines(), _xid_lines()
    written = lines = 0
    with open(path, "wb") as fh:
        buf: list[bytes] = []
        while written < size_bytes:
            line = rng.choice(xids) if rng.random() < xid_share else rng.choice(quiet)
            buf.append(line)
            written += len(line) + 1
            lines += 1
            if len(buf) >= 10000:
                fh.write(b"\n".join(buf) + b"\n")
                buf = []
        if buf:
            fh.write(b"\n".join(buf) + b"\n")
    return lines


def _chunks(fh: IO[bytes]) -> Iterator[bytes]:
    while True:
        chunk = fh.read(1 << 20)
        if not chunk:
            return
        yield chunk


def via_chunks(path: Path) -> ScanStats:
    stats = ScanStats()
    with open(path, "rb") as fh:
        for _ in scan(split_lines(_chunks(fh)), stats):
            pass
    return stats


def via_lines(path: Path) -> ScanStats:
    stats = ScanStats()
    with open(path, "rb") as fh:
        for _ in scan(fh, stats):
            pass
    return stats


def median_mb_s(path: Path, runs: int, fn: Callable[[Path], ScanStats]) -> tuple[float, ScanStats]:
    size_mb = path.stat().st_size / 1e6
    rates = []
    stats = ScanStats()
    for _ in range(runs):
        start = time.perf_counter()
        stats = fn(path)
        rates.append(size_mb / (time.perf_counter() - start))
    return statistics.median(rates), stats


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=float, default=50.0)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    size = int(args.size_mb * 1e6)
    rows = []
    with tempfile.TemporaryDirectory(prefix="xid-bench-") as tmp:
        for name, share in (("quiet", 0.0), ("xid10", 0.10)):
            path = Path(tmp) / f"{name}.log"
            lines = generate(path, size, share)
            chunk_rate, stats = median_mb_s(path, args.runs, via_chunks)
            line_rate, _ = median_mb_s(path, args.runs, via_lines)
            rows.append((name, path.stat().st_size / 1e6, lines, stats.events, chunk_rate, line_rate))
    ok = all(r[4] >= GOALS[r[0]] for r in rows)
    print("## XID scan throughput (bench/xid_scan.py)\n")
    print(
        f"Python {platform.python_version()} on {platform.machine()}, {platform.processor() or 'cpu'}; "
        f"median of {args.runs} runs; single thread.\n"
    )
    print("| log | size | lines | events | CLI path (1 MiB chunks) | line iteration | goal |")
    print("|---|---|---|---|---|---|---|")
    for name, mb, lines, events, chunk_rate, line_rate in rows:
        print(
            f"| {name} | {mb:.1f} MB | {lines:,} | {events:,} | {chunk_rate:.0f} MB/s | {line_rate:.0f} MB/s "
            f"| >= {GOALS[name]:.0f} MB/s |"
        )
    print(f"\nGoals met: {'yes' if ok else 'NO'}.")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
