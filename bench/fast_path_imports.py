"""What the prolog's fast path imports, in this tree and at an earlier revision, side by side.

    python bench/fast_path_imports.py [--rev 95dc6dc] [--runs 15]

For each tree: a fresh daemon verdict in a temp state dir, then a fast-path prolog run under
``python -S -X importtime`` with only that tree on ``sys.path`` (the fast path needs nothing
outside the standard library). Prints the modules each imports that the other does not, the
module counts, and the median of the summed import times over ``--runs`` runs, alternating.
The earlier revision is checked out with ``git worktree`` into a temp dir and removed after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from nodehealth.statedir.verdict import start_ticks  # the bench process stands in for the daemon

ROOT = Path(__file__).resolve().parent.parent
BOOT = "0b1c2d3e-aaaa-bbbb-cccc-000000000001"


def prepare(d: Path, old_style: bool) -> dict[str, str]:
    """A config and a fresh verdict; the verdict is rewritten before each run (fresh = under 90 s)."""
    state = d / "state"
    state.mkdir(parents=True)
    proc = d / "proc" / "sys" / "kernel" / "random"
    proc.mkdir(parents=True)
    (proc / "boot_id").write_text(BOOT + "\n")
    cfg = d / "nh.toml"
    if old_style:
        cfg.write_text(f'[paths]\nstate_dir = "{state}"\n[resume]\nboot_id_path = "{proc / "boot_id"}"\n')
    else:
        cfg.write_text(f'[paths]\nstate_dir = "{state}"\nprocfs_root = "{d / "proc"}"\n')
        # As the daemon does at start: the fast path answers only for the config file that last validated.
        subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; from nodehealth.config import loader; loader.load_valid(sys.argv[1])",
                str(cfg),
            ],
            check=True,
            cwd=str(ROOT),
        )
    report = {
        "node": "bench",
        "phase": "daemon",
        "status": "OK",
        "duration_s": 0.1,
        "version": "0",
        "started_at": time.time(),
        "checks": [{"name": "nvml", "status": "OK", "summary": "8 GPUs", "action": "none", "gpu": None, "details": {}}],
    }
    (state / "daemon-state.json").write_text(
        json.dumps(
            {
                "v": 1,
                "kind": "nodehealth-daemon-state",
                "boot_id": BOOT,
                "written_at": time.time(),
                "interval_s": 30.0,
                "pid": os.getpid(),
                "pid_start": start_ticks(os.getpid()),
                "round": 1,
                "xid": {"follower": "alive", "since": None},
                "report": report,
            }
        )
    )
    return {"NODEHEALTH_CONFIG": str(cfg), "SLURMD_NODENAME": "bench", "SLURM_JOB_ID": "1", "SLURM_JOB_GPUS": "0,1"}


def run(tree: Path, env: dict[str, str]) -> tuple[int, dict[str, int]]:
    res = subprocess.run(
        [
            sys.executable,
            "-S",
            "-X",
            "importtime",
            "-c",
            "from nodehealth.faces import prolog; raise SystemExit(prolog.main())",
        ],
        env=dict(env, PYTHONPATH=str(tree)),
        capture_output=True,
        text=True,
        cwd=str(tree),
    )
    if res.returncode != 0 or "fast path not taken" in res.stderr:
        raise SystemExit(f"{tree}: fast-path prolog exit {res.returncode}: {res.stderr[-2000:]}")
    mods: dict[str, int] = {}
    for text in res.stderr.splitlines():
        if text.startswith("import time:") and "|" in text and "cumulative" not in text:
            own, _, name = (x.strip() for x in text[len("import time:") :].split("|"))
            mods[name] = int(own)
    return res.returncode, mods


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rev", default="95dc6dc")
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        old_tree = t / "old"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(old_tree), args.rev], check=True
        )
        try:
            # The old tree reads the boot id from [resume] boot_id_path; this one from [paths] procfs_root.
            envs = {"old": prepare(t / "o", old_style=True), "new": prepare(t / "n", old_style=False)}
            trees = {"old": old_tree, "new": ROOT}
            totals: dict[str, list[float]] = {"old": [], "new": []}
            mods: dict[str, dict[str, int]] = {}
            codes: dict[str, set[int]] = {"old": set(), "new": set()}
            for _ in range(args.runs):
                for k in ("old", "new"):
                    rc, m = run(trees[k], envs[k])
                    codes[k].add(rc)
                    mods[k] = m
                    totals[k].append(sum(m.values()) / 1000)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old_tree)], check=False)
    for k, label in (("old", f"at {args.rev}"), ("new", "this tree")):
        ours = sorted(n for n in mods[k] if n.startswith("nodehealth"))
        print(
            f"{label}: exit codes {sorted(codes[k])}, {len(mods[k])} modules "
            f"({len(ours)} of nodehealth), summed import time median "
            f"{statistics.median(totals[k]):.2f} ms (min {min(totals[k]):.2f}, max {max(totals[k]):.2f})"
        )
        print("   nodehealth modules:", " ".join(ours))
    only_new = sorted(set(mods["new"]) - set(mods["old"]))
    only_old = sorted(set(mods["old"]) - set(mods["new"]))
    print("imported now and not before:", " ".join(only_new) or "-")
    print("imported before and not now:", " ".join(only_old) or "-")


if __name__ == "__main__":
    main()
