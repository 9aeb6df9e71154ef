"""Benchmark: ``nccl.transport.classify`` and ``nccl.parse.parse_perf`` of this tree against another (a release).

Builds one NCCL_DEBUG=INFO input of about ``--size-mb`` MB from the real logs under
tests/fixtures/real-world/nccl_debug (repeated back to back) and one nccl-tests input from
tests/fixtures/real-world/nccl_tests, then times each parser in a fresh interpreter per run,
alternating the two trees (A, B, A, B ...) for ``--rounds`` rounds. The report gives each tree's
median, B/A, and is written to ``--out``. The other tree: ``git worktree add /tmp/v020 v0.2.0``.

    .venv/bin/python bench/nccl_transport_ab.py --other /tmp/v020 [--rounds 15] [--size-mb 20] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "real-world"

# One run in a fresh interpreter: import the tree's parsers, time each over its input, print JSON.
RUN = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
from nodehealth.nccl.transport import classify
from nodehealth.nccl.parse import parse_perf
from nodehealth.nccl.results import ParseError
debug = open(sys.argv[2], encoding="utf-8").read()
tests = [p for p in open(sys.argv[3], encoding="utf-8").read().split("\f") if p]
t0 = time.perf_counter(); classify(debug); t1 = time.perf_counter()
for text in tests:
    try:
        parse_perf(text)
    except ParseError:
        pass
t2 = time.perf_counter()
print(json.dumps({"classify_s": t1 - t0, "parse_s": t2 - t1}))
"""


def inputs(size_mb: float, where: Path) -> tuple[Path, Path, int, int]:
    logs = "".join(p.read_text(encoding="utf-8") for p in sorted((FIXTURES / "nccl_debug").glob("*.txt")))
    debug = logs * max(1, int(size_mb * 1e6 / len(logs)))
    tables = [p.read_text(encoding="utf-8") for p in sorted((FIXTURES / "nccl_tests").glob("*.txt"))]
    copies = max(1, int(size_mb * 1e6 / 4 / sum(len(t) for t in tables)))
    (where / "debug.txt").write_text(debug, encoding="utf-8")
    (where / "tests.txt").write_text("\f".join(tables * copies), encoding="utf-8")
    return where / "debug.txt", where / "tests.txt", len(debug), sum(len(t) for t in tables) * copies


def one(tree: Path, debug: Path, tests: Path) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-I", "-c", RUN, str(tree), str(debug), str(tests)],
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
    ).stdout
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--other", required=True, help="the other tree (a worktree of the release)")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--size-mb", type=float, default=20.0)
    ap.add_argument("--out", default="/tmp/nodehealth-nccl-transport-ab.md")
    args = ap.parse_args()
    trees = {"A (this tree)": ROOT, f"B ({args.other})": Path(args.other).resolve()}
    times: dict[str, dict[str, list[float]]] = {t: {"classify_s": [], "parse_s": []} for t in trees}
    with tempfile.TemporaryDirectory() as tmp:
        debug, tests, debug_len, tests_len = inputs(args.size_mb, Path(tmp))
        for _ in range(args.rounds):
            for name, tree in trees.items():
                for key, value in one(tree, debug, tests).items():
                    times[name][key].append(value)
    a, b = list(trees)
    lines = [
        f"# NCCL parsers, {a} vs {b}: median of {args.rounds} interleaved rounds",
        f"{platform.python_version()}, {platform.node()}; classify over {debug_len / 1e6:.1f} MB of the real "
        f"NCCL_DEBUG logs, parse_perf over {tests_len / 1e6:.1f} MB of the real nccl-tests outputs",
        "",
        "| parser | A median s | B median s | A MB/s | B MB/s | A/B |",
        "|---|---|---|---|---|---|",
    ]
    for key, size in (("classify_s", debug_len), ("parse_s", tests_len)):
        ma, mb = statistics.median(times[a][key]), statistics.median(times[b][key])
        lines.append(
            f"| {key[:-2]} | {ma:.3f} | {mb:.3f} | {size / 1e6 / ma:.0f} | {size / 1e6 / mb:.0f} | {ma / mb:.2f} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
