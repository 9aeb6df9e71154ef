"""Benchmark: the ``infiniband`` probe of this tree against the previous release's, on a fake sysfs tree.

The previous release (v0.2.0) read each port's state, phys_state, rate and link_layer in-process
(``probes.host.infiniband``, unchanged in this tree: the bench checks that its source is the tag's).
This tree's probe reads the same files and eight error counters per port in a killable child
(``probes.infiniband``) and adds the round to the ports' history in a state dir (``probes.ib_history``:
read, merge, write atomically under its lock). Two trees: ``hca`` (8 ports x 400 Gb/s, the counters
in the kernel's format, as on an 8x H100 node) and ``none`` (no ``class/infiniband``: a CPU node).
Each round times, in a rotating order (interleaved), ``--calls`` calls of each probe on each tree,
in one process, after one warm-up call of each. Medians per call and the ratio new / old; a
markdown report to stdout and ``--out``.

    .venv/bin/python bench/ib_probe.py [--rounds 15] [--calls 20] [--out out/ib_probe.md]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nodehealth.probes import host, infiniband  # noqa: E402

PORT = {"state": "4: ACTIVE", "phys_state": "5: LinkUp", "rate": "400 Gb/sec (4X NDR)", "link_layer": "InfiniBand"}


def make_tree(root: Path, ports: int) -> None:
    for i in range(ports):
        d = root / "class" / "infiniband" / f"mlx5_{i}" / "ports" / "1"
        (d / "counters").mkdir(parents=True)
        for name, text in PORT.items():
            (d / name).write_text(text + "\n")
        for n, name in enumerate(infiniband.COUNTERS):
            (d / "counters" / name).write_text(f"{n * 7}\n")


def same_as_release(rev: str) -> bool:
    old = subprocess.run(["git", "show", f"{rev}:nodehealth/probes/host.py"], cwd=ROOT, capture_output=True, text=True)
    tail = (ROOT / "nodehealth" / "probes" / "host.py").read_text().split("\ndef infiniband(", 1)[1]
    return old.returncode == 0 and old.stdout.split("\ndef infiniband(", 1)[1] == tail


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--rev", default="v0.2.0")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="nh-ib-bench-") as tmp:
        hca, none, state = Path(tmp, "hca"), Path(tmp, "none"), Path(tmp, "state")
        make_tree(hca, 8)
        none.mkdir()
        cases: dict[str, Callable[[], object]] = {
            "old hca": lambda: host.infiniband(str(hca)),
            "new hca": lambda: infiniband.start(str(hca), str(state), 10.0).collect(),
            "old none": lambda: host.infiniband(str(none)),
            "new none": lambda: infiniband.start(str(none), str(state), 10.0).collect(),
        }
        got = cases["new hca"]()
        assert isinstance(got, tuple) and len(got) == 8 and all(len(p.counters) == 8 for p in got), got
        for fn in cases.values():
            fn()
        times: dict[str, list[float]] = {k: [] for k in cases}
        order = list(cases)
        for r in range(args.rounds):
            for name in order[r % len(order) :] + order[: r % len(order)]:
                t = time.perf_counter()
                for _ in range(args.calls):
                    cases[name]()
                times[name].append((time.perf_counter() - t) / args.calls * 1000)
    med = {k: statistics.median(v) for k, v in times.items()}
    lines = [
        f"# infiniband probe: this tree vs {args.rev}",
        "",
        f"{platform.python_implementation()} {platform.python_version()}, {args.rounds} rounds x {args.calls} calls, "
        f"interleaved; the old probe's source is {args.rev}'s: {same_as_release(args.rev)}",
        "",
        "| tree | old (ms/call) | new (ms/call) | new / old |",
        "|---|---|---|---|",
    ]
    for tree in ("hca", "none"):
        old, new = med[f"old {tree}"], med[f"new {tree}"]
        lines.append(f"| {tree} | {old:.3f} | {new:.3f} | {new / old:.1f}x |")
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
