"""Benchmark: what each module costs on the cold path (`python -X importtime`, medians of several runs).

  .venv/bin/python bench/import_budget.py [--runs 9] [--top 30] [--out FILE]

Two cases, interleaved: `import nodehealth.cli`, and a healthy `nodehealth check --phase prolog` on 8
simulated GPUs (run in-process after the import, so its imports are timed too; the NVML probe's child
is forked and its own imports, pynvml first, are in the same stream, marked "(child)" when they
come after the fork). Prints a markdown report: the case's total import time (the sum of every
module's own time), each group's (our packages, then the third-party and standard-library modules
by top-level name) and the modules costing most, all as medians. tests/test_import_budget.py holds
the names these runs may load; this script says what they cost.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import emit

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "examples" / "scenarios" / "healthy-8x-h100.toml"

RUN = """
import contextlib, io, sys
import nodehealth.cli as cli
if len(sys.argv) > 1:
    with contextlib.redirect_stdout(io.StringIO()):
        cli.main(sys.argv[1:])
"""


def import_times(argv: list[str]) -> dict[str, float]:
    """module -> its own import time in ms, from one run (a name seen twice: the child's is suffixed)."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", RUN, *argv],
        capture_output=True,
        text=True,
        check=False,
        env={**{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}, "NO_COLOR": "1"},  # bytecode
        cwd="/",  # not a source tree's directory, which `-c` would put first on sys.path
    )
    if proc.returncode != 0:
        raise SystemExit(f"{argv}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    out: dict[str, float] = {}
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        name = line.rsplit("|", 1)[1].strip()
        self_us = line.split("|")[0].replace("import time:", "").strip()
        key = name if name not in out else f"{name} (child)"
        out[key] = max(0.0, int(self_us) / 1000)
    return out


def group(name: str) -> str:
    base = name.replace(" (child)", "")
    parts = base.split(".")
    if parts[0] == "nodehealth" and len(parts) > 1:
        return "nodehealth." + parts[1]
    return parts[0] + (" (child)" if name.endswith("(child)") else "")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--out")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        empty = Path(tmp) / "empty.toml"
        empty.write_text("")
        cases = {
            "import nodehealth.cli": [],
            "check --phase prolog, 8 simulated GPUs": [
                "check",
                "--config",
                str(empty),
                "--phase",
                "prolog",
                "--simulate",
                str(SCENARIO),
            ],
        }
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in cases}
        for argv in cases.values():  # warm the .pyc files
            import_times(argv)
        for _ in range(args.runs):
            for name, argv in cases.items():
                runs[name].append(import_times(argv))
    lines = [
        f"Runs: {args.runs}, interleaved; Python {sys.version.split()[0]}, {os.cpu_count()} CPUs; medians in ms.",
        "",
    ]
    for name, samples in runs.items():
        totals = [sum(s.values()) for s in samples]
        grouped: dict[str, list[float]] = collections.defaultdict(list)
        for s in samples:
            sums: dict[str, float] = collections.defaultdict(float)
            for module, ms in s.items():
                sums[group(module)] += ms
            for g in set(sums) | set(grouped):
                grouped[g].append(sums.get(g, 0.0))
        modules = {m for s in samples for m in s}
        per_module = {m: statistics.median([s.get(m, 0.0) for s in samples]) for m in modules}
        lines += [
            f"### {name}: {len(modules)} modules, {statistics.median(totals):.1f} ms of imports",
            "",
            "| group | ms |",
            "|---|---|",
        ]
        for g, values in sorted(grouped.items(), key=lambda kv: -statistics.median(kv[1]))[: args.top]:
            lines.append(f"| {g} | {statistics.median(values):.1f} |")
        lines += ["", "| module (its own time) | ms |", "|---|---|"]
        for m, ms in sorted(per_module.items(), key=lambda kv: -kv[1])[: args.top]:
            lines.append(f"| {m} | {ms:.1f} |")
        lines.append("")
    return emit("\n".join(lines), args.out)


if __name__ == "__main__":
    sys.exit(main())
