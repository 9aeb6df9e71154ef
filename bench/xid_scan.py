"""Benchmark: ``nodehealth xid scan --from FILE`` on a 50 MB kernel log, this tree against the previous
release and against a bare Python line loop (``for l in f: b"NVRM" in l``).

Two logs are generated in a temporary directory from real line shapes:
  quiet - a boot/runtime log with no NVRM line at all (lines of a real 8x A100 dmesg -T log),
  hits  - the same with ``--hit-share`` of the lines (default 0.1 %: a node on a bad day) replaced by
          real published Xid lines of every format.
Each round runs, for each log, three fresh processes in a rotating order (interleaved): the bare loop,
this tree's CLI and the previous release's (``--rev``, checked out with ``git worktree`` into a temp dir
and removed after), each on PYTHONPATH. A process times its own work after its imports: the loop over
the file, or ``cli.main(["xid", "scan", "--from", FILE, "--no-nvml"])`` (config, catalog, reading,
scanning, printing) after one run on an empty log (its imports); the wall time of the whole process
(interpreter start and imports included) is reported too. The two CLIs' output must be the same (the
bench fails otherwise). Medians, MB/s and ratios; a markdown report to stdout and ``--out``.

    .venv/bin/python bench/xid_scan.py [--size-mb 50] [--rounds 15] [--rev v0.2.0] [--out out/xid_scan.md]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "real-world"

LOOP = """
import json, sys, time
t = time.perf_counter()
with open(sys.argv[1], "rb") as f:
    for l in f:
        b"NVRM" in l
print(json.dumps({"s": time.perf_counter() - t, "out": "", "err": ""}))
"""

CLI = """
import contextlib, hashlib, io, json, sys, time
from nodehealth.cli import main
out, err = io.StringIO(), io.StringIO()
with open(sys.argv[2], "wb"), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    main(["xid", "scan", "--from", sys.argv[2], "--no-nvml"])  # the imports, before the clock starts
out, err = io.StringIO(), io.StringIO()
t = time.perf_counter()
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    rc = main(["xid", "scan", "--from", sys.argv[1], "--no-nvml"])
s = time.perf_counter() - t
assert rc == 0, err.getvalue()
print(json.dumps({"s": s, "out": hashlib.sha256(out.getvalue().encode()).hexdigest(), "err": err.getvalue()}))
"""


def _quiet_lines() -> list[bytes]:
    log = FIXTURES / "xid_logs" / "hf_m4logs_jeanzay_dmesg_T_no_xid.log"
    return [line for line in log.read_bytes().splitlines() if b"NVRM" not in line and b"Xid" not in line]


def _xid_lines() -> list[bytes]:
    rows = [json.loads(t) for t in (FIXTURES / "xid_lines.jsonl").read_text(encoding="utf-8").splitlines() if t]
    return [r["line"].encode() for r in rows if r["xid"] is not None]


def generate(path: Path, size_bytes: int, hit_share: float, seed: int = 1) -> int:
    """A log of about ``size_bytes`` at ``path``; the number of its lines."""
    rng = random.Random(seed)
    quiet, xids = _quiet_lines(), _xid_lines()
    written = lines = 0
    with open(path, "wb") as fh:
        buf: list[bytes] = []
        while written < size_bytes:
            line = rng.choice(xids) if rng.random() < hit_share else rng.choice(quiet)
            buf.append(line)
            written += len(line) + 1
            lines += 1
            if len(buf) >= 10000:
                fh.write(b"\n".join(buf) + b"\n")
                buf = []
        if buf:
            fh.write(b"\n".join(buf) + b"\n")
    return lines


def run_one(code: str, tree: Path, log: Path) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", code, str(log), str(log) + ".empty"],
        capture_output=True,
        text=True,
        env=env,
        cwd="/",
        check=False,
    )
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"bench process failed ({tree}):\n{proc.stderr[-2000:]}")
    got: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    got["wall"] = wall
    return got


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--size-mb", type=float, default=50.0)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--hit-share", type=float, default=0.001, help="share of lines that are Xid lines in 'hits'")
    ap.add_argument("--rev", default="v0.2.0", help="the previous release (a git revision)")
    ap.add_argument("--old-tree", help="a checkout of the previous release to use instead of a worktree")
    ap.add_argument("--out", default=str(ROOT / "out" / "xid_scan.md"))
    args = ap.parse_args()
    size = int(args.size_mb * 1e6)
    with tempfile.TemporaryDirectory(prefix="xid-bench-") as tmp:
        old_tree = Path(args.old_tree) if args.old_tree else Path(tmp) / "old"
        if not args.old_tree:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(old_tree), args.rev], check=True
            )
        try:
            text = _measure(args, size, Path(tmp), old_tree)
        finally:
            if not args.old_tree:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old_tree)], check=False)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text, encoding="utf-8")
    return 0


def _measure(args: argparse.Namespace, size: int, tmp: Path, old_tree: Path) -> str:
    logs = {"quiet": (tmp / "quiet.log", 0.0), "hits": (tmp / "hits.log", args.hit_share)}
    lines = {name: generate(path, size, share) for name, (path, share) in logs.items()}
    subjects = {"loop": (LOOP, ROOT), "tree": (CLI, ROOT), args.rev: (CLI, old_tree)}
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {(log, s): [] for log in logs for s in subjects}
    order = list(subjects)
    for rnd in range(args.rounds):
        for log, (path, _) in logs.items():
            for name in order[rnd % 3 :] + order[: rnd % 3]:
                code, tree = subjects[name]
                runs[(log, name)].append(run_one(code, tree, path))
    for log in logs:  # the same events, the same summary: the new scan changes nothing but its speed
        outs = {(r["out"], r["err"]) for name in ("tree", args.rev) for r in runs[(log, name)]}
        if len(outs) != 1:
            raise SystemExit(f"{log}: this tree's output differs from {args.rev}'s")
    rows = [
        "## `xid scan` on a 50 MB log (bench/xid_scan.py)",
        "",
        f"Python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs; {args.rounds} rounds, "
        f"each log and subject a fresh process, interleaved; medians. MB/s: the process's own work after its "
        f"imports; wall: the whole process.",
        "",
        f"| log | size | lines | events | subject | MB/s | wall | MB/s vs loop | MB/s vs {args.rev} |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for log, (path, _) in logs.items():
        mb = path.stat().st_size / 1e6
        events = runs[(log, "tree")][0]["err"].rsplit(": ", 1)[-1].strip()
        rate = {name: statistics.median(mb / r["s"] for r in runs[(log, name)]) for name in subjects}
        for name in subjects:
            wall = statistics.median(r["wall"] for r in runs[(log, name)])
            rows.append(
                f"| {log} | {mb:.1f} MB | {lines[log]:,} | {events} | {name} | {rate[name]:.0f} | {wall * 1000:.0f} ms "
                f"| {rate[name] / rate['loop']:.2f}x | {rate[name] / rate[args.rev]:.2f}x |"
            )
    rows += ["", f"Goal: the tree's MB/s on `quiet` at least the loop's (1x): {_met(rows)}."]
    return "\n".join(rows) + "\n"


def _met(rows: list[str]) -> str:
    for row in rows:
        cells = [c.strip() for c in row.split("|")]
        if len(cells) > 8 and cells[1] == "quiet" and cells[5] == "tree":
            return "met" if float(cells[8].rstrip("x")) >= 1.0 else "NOT met"
    return "unknown"


if __name__ == "__main__":
    sys.exit(main())
