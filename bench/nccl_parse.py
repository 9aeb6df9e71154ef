"""Benchmark: throughput of the NCCL parsers on large inputs made of real outputs.

Builds two inputs of about ``--size-mb`` MB each from the real fixtures in
tests/fixtures/real-world/: nccl-tests outputs repeated back to back (every fixture that parses,
so each copy is a table of its own) for ``parse_perf``, and the NCCL_DEBUG=INFO logs repeated for
``classify``. Times each parser over its input, median of ``--runs`` runs, and writes a markdown
report (stdout, or ``--out FILE``). Goal: 50 MB/s each (issue 12).

    .venv/bin/python bench/nccl_parse.py [--size-mb 50] [--runs 5] [--out report.md]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nodehealth.nccl.parse import parse_perf  # noqa: E402
from nodehealth.nccl.results import ParseError  # noqa: E402
from nodehealth.nccl.transport import classify  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "real-world"
GOAL_MB_S = 50.0


def _perf_unit() -> str:
    parts = []
    for path in sorted((FIXTURES / "nccl_tests").glob("*.txt")):
        body = path.read_text(encoding="utf-8")
        try:
            parse_perf(body)
        except ParseError:
            continue
        parts.append(body if body.endswith("\n") else body + "\n")
    return "".join(parts)


def _debug_unit() -> str:
    parts = [p.read_text(encoding="utf-8") for p in sorted((FIXTURES / "nccl_debug").glob("*.txt"))]
    return "".join(p if p.endswith("\n") else p + "\n" for p in parts)


def _grow(unit: str, size_mb: float) -> str:
    return unit * max(1, int(size_mb * 1e6 // len(unit.encode())) + 1)


def _time(fn: Callable[[str], object], text: str, runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn(text)
        out.append(time.perf_counter() - t0)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mb", type=float, default=50.0)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--json", action="store_true", help="print the figures as JSON instead of markdown")
    args = ap.parse_args(argv)

    results = {}
    for name, fn, unit in (("parse_perf", parse_perf, _perf_unit()), ("classify", classify, _debug_unit())):
        text = _grow(unit, args.size_mb)
        mb = len(text.encode()) / 1e6
        times = _time(fn, text, args.runs)
        med = statistics.median(times)
        results[name] = {
            "input_mb": round(mb, 1),
            "lines": text.count("\n"),
            "median_s": round(med, 3),
            "min_s": round(min(times), 3),
            "mb_per_s": round(mb / med, 1),
        }

    if args.json:
        report = json.dumps(results, indent=2) + "\n"
    else:
        lines = [
            f"NCCL parsers, {args.runs} runs each, median; Python {platform.python_version()}, "
            f"{platform.machine()}, {platform.processor() or 'cpu'}:",
            "",
            "| parser | input | lines | median | MB/s | goal |",
            "|---|---|---|---|---|---|",
        ]
        for name, r in results.items():
            ok = "met" if r["mb_per_s"] >= GOAL_MB_S else "NOT met"
            lines.append(
                f"| `{name}` | {r['input_mb']} MB | {r['lines']:,} | {r['median_s']} s | "
                f"**{r['mb_per_s']}** | {GOAL_MB_S:g} MB/s ({ok}) |"
            )
        report = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(report, encoding="utf-8")
    sys.stdout.write(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
