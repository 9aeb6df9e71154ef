"""The prolog's fast path, this tree beside an earlier release and the interpreter's floor: wall time and imports.

    .venv/bin/python bench/fast_path_imports.py [--rev v0.2.0] [--runs 21] [--out FILE]

Three cases, each a fresh process per run, interleaved round by round (floor, earlier, this tree), so a
busy machine's drift hits all alike:

* ``python -c pass``: the floor;
* the fast-path prolog of ``--rev`` (checked out with ``git worktree`` into a temp dir, removed after);
* the fast-path prolog of this tree.

All three run the same interpreter from a bare venv made for the run (``python -m venv
--without-pip``, no site-packages: the fast path needs nothing beyond the standard library, and the
development venv's editable-install finders would add their own imports to the floor), with the tree
on ``PYTHONPATH``, bytecode written by a warm-up run, and slurmd's environment (no ``PATH``; the job's
id, user and GPUs). The prolog is started as ``python -c "from nodehealth.faces import prolog; ..."``
(a pip console script imports ``re`` of its own); the nodes' directories are on a tmpfs
(``/dev/shm``) when there is one, as ``/run`` is. Each tree's config is validated by that tree's loader
first (as its daemon does at start), the verdict is written by a process that stays alive (this one),
fresh before every round, in the form each tree reads (this tree's ``verdict.write``: the JSON and
its marshal form), with a GPU counter reading for the job baseline. Every run must exit 0 on the fast
path (its log line says so, and no "not taken"): a run that took the cold path stops the bench.

Prints (or writes to ``--out``) a markdown report: the medians, min and max, each prolog's cost over
the floor and its ratio to the earlier release, and one ``-X importtime`` run of each: the module
counts and the modules one imports that the other does not.
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

ROOT = Path(__file__).resolve().parent.parent
BOOT = "0b1c2d3e-aaaa-bbbb-cccc-000000000001"
PROLOG = "from nodehealth.faces import prolog; raise SystemExit(prolog.main())"


def bare_venv(d: Path) -> Path:
    """A venv of this interpreter's base, without pip or site-packages: the same start-up for every case."""
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(d)], check=True)
    return d / "bin" / "python"


def prepare(d: Path, tree: Path, root: Path) -> dict[str, str]:
    """A node for ``tree``: config validated by that tree's loader, boot id; the environment of its prolog."""
    state = d / "state"
    proc = d / "proc" / "sys" / "kernel" / "random"
    proc.mkdir(parents=True)
    (proc / "boot_id").write_text(BOOT + "\n")
    cfg = d / "nh.toml"
    cfg.write_text(f'[paths]\nstate_dir = "{state}"\nprocfs_root = "{d / "proc"}"\n')
    env = {
        "NODEHEALTH_CONFIG": str(cfg),
        "NODEHEALTH_DEFAULT_ROOT": str(root),
        "PYTHONPATH": str(tree),
        "SLURMD_NODENAME": "bench",
        "SLURM_JOB_USER": "bench",
        "SLURM_JOB_UID": "1000",
        "SLURM_JOB_GPUS": "0,1",
    }
    code = "import sys, nodehealth; from nodehealth.config import loader; loader.load_valid(sys.argv[1]); "
    code += "print(nodehealth.__file__)"
    got = subprocess.run(  # the development venv (the loader needs hostlist), this tree first on the path
        [sys.executable, "-c", code, str(cfg)], env=env, check=True, capture_output=True, text=True, cwd="/"
    ).stdout.strip()
    if not got.startswith(str(tree)):
        raise SystemExit(f"{tree}: the loader imported nodehealth from {got}")
    return env


def refresh(env: dict[str, str]) -> None:
    """A fresh verdict and counter reading in the node's state dir, as the daemon writes them (this
    process stands in for the daemon: it stays alive)."""
    from nodehealth.statedir import counters
    from nodehealth.statedir import verdict as daemon_state

    state = str(Path(env["NODEHEALTH_CONFIG"]).parent / "state")
    report = {
        "node": "bench",
        "phase": "daemon",
        "status": "OK",
        "duration_s": 0.1,
        "version": "0",
        "started_at": time.time(),
        "checks": [{"name": "nvml", "status": "OK", "summary": "8 GPUs", "action": "none", "gpu": None, "details": {}}],
    }
    daemon_state.write(state, daemon_state.encode(report, BOOT, time.time(), "alive", interval_s=30, round=1))
    gpus = {str(i): {"volatile_uncorrected": 0, "aggregate_uncorrected": 0} for i in range(8)}
    counters.write_latest(state, gpus, BOOT, "daemon")


def run(python: Path, env: dict[str, str], job: int, extra: tuple[str, ...] = ()) -> tuple[float, str]:
    t0 = time.perf_counter()
    res = subprocess.run(
        [str(python), *extra, "-c", PROLOG],
        env=dict(env, SLURM_JOB_ID=str(job)),
        capture_output=True,
        text=True,
        cwd="/",
        timeout=120,
    )
    dt = time.perf_counter() - t0
    if res.returncode != 0 or "fast path" not in res.stderr or "not taken" in res.stderr:
        raise SystemExit(f"{env['PYTHONPATH']}: not the fast path (exit {res.returncode}): {res.stderr[-2000:]}")
    return dt, res.stderr


def modules(stderr: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for text in stderr.splitlines():
        if text.startswith("import time:") and "|" in text and "cumulative" not in text:
            own, _, name = (x.strip() for x in text[len("import time:") :].split("|"))
            out[name] = int(own)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", default="v0.2.0")
    ap.add_argument("--runs", type=int, default=21)
    ap.add_argument("--out", help="write the report here (default: stdout)")
    args = ap.parse_args()
    # The nodes' dirs on a tmpfs when there is one, as /run is (a disk's fsync is not the prolog's cost there).
    shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    with (
        tempfile.TemporaryDirectory(prefix="nh-fastpath.") as tmp,
        tempfile.TemporaryDirectory(prefix="nh-fastpath.", dir=shm) as nodes,
    ):
        t, n = Path(tmp), Path(nodes)
        root = n / "root"  # the defaults of [paths] (where this tree keeps the fast path's settings)
        (root / "run" / "nodehealth").mkdir(parents=True, mode=0o700)
        (root / "var" / "lib").mkdir(parents=True)
        os.environ["NODEHEALTH_DEFAULT_ROOT"] = str(root)  # before nodehealth is imported here
        old_tree = t / "old"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(old_tree), args.rev], check=True
        )
        try:
            python = bare_venv(t / "venv")
            envs = {"old": prepare(n / "o", old_tree, root), "new": prepare(n / "n", ROOT, root)}
            times: dict[str, list[float]] = {"floor": [], "old": [], "new": []}
            job = 1000
            for k in ("old", "new"):  # warm-up: bytecode written, the page cache warm
                refresh(envs[k])
                run(python, envs[k], job)
                job += 1
            for _ in range(args.runs):
                for k in ("old", "new"):
                    refresh(envs[k])
                t0 = time.perf_counter()
                subprocess.run([str(python), "-c", "pass"], env={}, check=True, cwd="/")
                times["floor"].append(time.perf_counter() - t0)
                for k in ("old", "new"):
                    times[k].append(run(python, envs[k], job)[0])
                    job += 1
            mods = {}
            for k in ("old", "new"):
                refresh(envs[k])
                mods[k] = modules(run(python, envs[k], job, ("-X", "importtime"))[1])
                job += 1
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old_tree)], check=False)
    med = {k: statistics.median(v) * 1000 for k, v in times.items()}
    label = {
        "floor": "python -c pass (the floor)",
        "old": f"fast-path prolog at {args.rev}",
        "new": "fast-path prolog, this tree",
    }
    lines = [
        f"{args.runs} rounds, interleaved; {os.cpu_count()} CPUs; Python {sys.version.split()[0]}; "
        f"load average {os.getloadavg()[0]:.2f} at the end",
        "",
        "| case | median | min | max | over the floor | modules imported |",
        "|---|---|---|---|---|---|",
    ]
    for k, values in times.items():
        over = "" if k == "floor" else f"+{med[k] - med['floor']:.1f} ms"
        count = "" if k == "floor" else str(len(mods[k]))
        spread = f"{min(values) * 1000:.1f} ms | {max(values) * 1000:.1f} ms"
        lines.append(f"| {label[k]} | {med[k]:.1f} ms | {spread} | {over} | {count} |")
    lines += [
        "",
        f"this tree / {args.rev}: {med['new'] / med['old']:.2f}x; cost over the floor: "
        f"{med['new'] - med['floor']:.1f} ms (at {args.rev}: {med['old'] - med['floor']:.1f} ms)",
        f"imported at {args.rev} and not now: {' '.join(sorted(set(mods['old']) - set(mods['new']))) or '-'}",
        f"imported now and not at {args.rev}: {' '.join(sorted(set(mods['new']) - set(mods['old']))) or '-'}",
    ]
    text = "\n".join(lines) + "\n"
    if args.out:
        Path(args.out).write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
