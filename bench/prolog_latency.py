"""Prolog latency: ``nodehealth-prolog`` as slurmd starts it (no PATH, slurmd's environment).

Each case is a fresh process per run, as slurmd starts it:

0. ``python -c pass`` with the same interpreter (the floor: bare start-up, site, the venv);
1. healthy node, fast path: a fresh daemon verdict in the state dir (written with the
   daemon's own writer), decided without NVML (target: <= bare start-up + 20 ms, median);
2. healthy simulated 8-GPU node, cold path (interpreter start, imports, the simulated NVML
   child, the checks, the ledger append): no Slurm call at all (target: median <= 300 ms);
3. faulty node (row remap pending) with slurmctld unreachable (SLURM_CONF pointing at a
   controller port nothing listens on): the prolog must still end within its budget
   (target: <= budget + 0.5 s).

The fast and cold cases alternate run by run, so a machine's drift hits both alike. For the
import cost of the fast path alone: ``python -X importtime -c "from nodehealth.faces import
prolog, fast"`` (the rest is imported inside ``main``) or ``--importtime``, which runs one
fast-path prolog under ``-X importtime`` and prints the slowest imports.

Prints medians. Needs the venv with nodehealth installed; Slurm's ``scontrol`` for case 2
(skipped when /usr/bin/scontrol is missing).

    .venv/bin/python bench/prolog_latency.py [--runs 20]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROLOG = Path(sys.executable).parent / "nodehealth-prolog"
SCENARIOS = ROOT / "tests" / "fixtures" / "slurm"
ROOT_ENV = "NODEHEALTH_DEFAULT_ROOT"  # nodehealth.config.lean.DEFAULT_ROOT_ENV


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def write_config(d: Path, scenario: str, budget: float, slurm_timeout: float) -> Path:
    from nodehealth.registry import CHECKS

    conf = d / "slurm.conf"
    conf.write_text(
        f"ClusterName=bench\nSlurmctldHost=bench(127.0.0.1)\nSlurmctldPort={free_port()}\n"
        "AuthType=auth/none\nNodeName=bench NodeAddr=127.0.0.1 CPUs=1\n"
        "PartitionName=p Nodes=ALL Default=YES\n"
    )
    lines = [
        'node_name = "bench"',
        "[phases.prolog]",
        f"budget_s = {budget}",
        "[nvml]",
        f'simulate = "{SCENARIOS / scenario}"',
        "[paths]",
        f'state_dir = "{d / "state"}"',
        "[slurm]",
        f"timeout_s = {slurm_timeout}",
        f'conf = "{conf}"',
    ]
    for spec in CHECKS:
        lines += [f"[checks.{spec.name}]", f"timeout_s = {min(budget, 10.0)}"]
    cfg = d / f"{scenario}.nodehealth.toml"
    cfg.write_text("\n".join(lines) + "\n")
    return cfg


def write_daemon_state(cfg: Path) -> None:
    """A fresh daemon verdict for the config's node, with the daemon's own writer."""
    from nodehealth import runner
    from nodehealth.config.loader import load_valid
    from nodehealth.statedir import layout
    from nodehealth.statedir import verdict as daemon_state

    c, _ = load_valid(str(cfg))  # as the daemon at start: the config recorded, the fast path's settings kept
    report = runner.run(c, phase="daemon", node="bench").to_json()
    boot = layout.read_boot_id(c.paths.procfs_root) or "unknown"
    daemon_state.write(  # the JSON and its marshal form, as the daemon writes them
        c.paths.state_dir, daemon_state.encode(report, boot, time.time(), "alive", interval_s=30, round=1)
    )


def bare(runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], env={}, check=True)
        out.append(time.perf_counter() - t0)
    return out


def line(name: str, times: list[float], codes: set[int], extra: str = "") -> str:
    times = sorted(times)
    return (
        f"{name}: runs={len(times)} median={statistics.median(times) * 1000:.1f} ms "
        f"min={times[0] * 1000:.1f} ms max={times[-1] * 1000:.1f} ms exit codes={sorted(codes)}{extra}"
    )


def side_by_side(d: Path, runs: int) -> None:
    """Bare start-up, fast path and cold path on the same healthy node, alternating."""
    fast_dir, cold_dir = d / "fast", d / "cold"
    fast_dir.mkdir()
    cold_dir.mkdir()
    fast_cfg = write_config(fast_dir, "healthy.toml", 20.0, 3.0)
    cold_cfg = write_config(cold_dir, "healthy.toml", 20.0, 3.0)
    fast_t: list[float] = []
    cold_t: list[float] = []
    fast_c: set[int] = set()
    cold_c: set[int] = set()
    for i in range(runs):
        if i % 10 == 0:  # keep the verdict fresh (state_max_age_s = 90 s)
            write_daemon_state(fast_cfg)
        dt, rc = run_once(fast_cfg, fast_dir / "slurm.conf", 2000 + i)
        fast_t.append(dt)
        fast_c.add(rc)
        dt, rc = run_once(cold_cfg, cold_dir / "slurm.conf", 3000 + i)
        cold_t.append(dt)
        cold_c.add(rc)
    base = bare(runs)
    floor = statistics.median(base)
    print(line("python -c pass (bare start-up)", base, {0}))
    print(
        line(
            "healthy node, fast path (daemon verdict)",
            fast_t,
            fast_c,
            f" (+{(statistics.median(fast_t) - floor) * 1000:.1f} ms over bare start-up)",
        )
    )
    print(
        line(
            "healthy node, cold path",
            cold_t,
            cold_c,
            f" (+{(statistics.median(cold_t) - floor) * 1000:.1f} ms over bare start-up)",
        )
    )


def importtime(d: Path) -> None:
    cfg = write_config(d, "healthy.toml", 20.0, 3.0)
    write_daemon_state(cfg)
    env = {"NODEHEALTH_CONFIG": str(cfg), "SLURMD_NODENAME": "bench", "SLURM_JOB_ID": "1", "SLURM_JOB_GPUS": "0,1"}
    env[ROOT_ENV] = os.environ[ROOT_ENV]
    res = subprocess.run(
        [
            sys.executable,
            "-X",
            "importtime",
            "-c",
            "from nodehealth.faces import prolog; raise SystemExit(prolog.main())",
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    rows = []
    for text in res.stderr.splitlines():
        if text.startswith("import time:") and "|" in text and "cumulative" not in text:
            self_us, cum_us, name = (x.strip() for x in text[len("import time:") :].split("|"))
            rows.append((int(cum_us), int(self_us), name))
    print(f"fast-path prolog exit code {res.returncode}; {len(rows)} modules imported; slowest (cumulative us):")
    for cum, own, name in sorted(rows, reverse=True)[:15]:
        print(f"  {cum:8d} {own:8d}  {name}")


def run_once(cfg: Path, conf: Path, job: int) -> tuple[float, int]:
    env = {
        "NODEHEALTH_CONFIG": str(cfg),
        "SLURM_CONF": str(conf),
        "SLURMD_NODENAME": "bench",
        "SLURM_JOB_ID": str(job),
        "SLURM_JOB_USER": "bench",
        "SLURM_JOB_UID": "1000",
        "SLURM_JOB_GPUS": "0,1",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "SLURM_SCRIPT_CONTEXT": "prolog_slurmd",
        ROOT_ENV: os.environ[ROOT_ENV],
    }
    t0 = time.perf_counter()
    res = subprocess.run(
        [str(PROLOG)],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=120,
    )
    return time.perf_counter() - t0, res.returncode


def case(name: str, d: Path, scenario: str, budget: float, slurm_timeout: float, runs: int) -> None:
    cfg = write_config(d, scenario, budget, slurm_timeout)
    times, codes = [], set()
    for i in range(runs):
        dt, rc = run_once(cfg, d / "slurm.conf", 1000 + i)
        times.append(dt)
        codes.add(rc)
    times.sort()
    print(
        f"{name}: runs={runs} median={statistics.median(times) * 1000:.0f} ms "
        f"min={times[0] * 1000:.0f} ms max={times[-1] * 1000:.0f} ms exit codes={sorted(codes)}"
        + (f" (budget {budget:g} s, scontrol deadline {slurm_timeout:g} s)" if "unreachable" in name else "")
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--budget", type=float, default=3.0, help="prolog budget for the unreachable case")
    ap.add_argument("--importtime", action="store_true", help="only: the fast path's imports, slowest first")
    args = ap.parse_args()
    if not PROLOG.exists():
        print(f"{PROLOG} missing: pip install -e .", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="nh-bench.") as tmp:
        d = Path(tmp)
        os.chmod(d, 0o755)
        # The defaults of [paths] under the temp dir (before nodehealth is imported): the fast path's
        # settings are kept in its run/nodehealth, as the unit's RuntimeDirectory makes it.
        (d / "root" / "run" / "nodehealth").mkdir(parents=True, mode=0o700)
        (d / "root" / "var" / "lib").mkdir(parents=True)
        os.environ[ROOT_ENV] = str(d / "root")
        if args.importtime:
            importtime(d)
            return 0
        side_by_side(d, args.runs)
        if os.access("/usr/bin/scontrol", os.X_OK):
            n = max(3, args.runs // 4)
            case("faulty node, slurmctld unreachable", d, "remap-pending.toml", args.budget, 10.0, n)
        else:
            print("faulty node, slurmctld unreachable: skipped (/usr/bin/scontrol not installed)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
