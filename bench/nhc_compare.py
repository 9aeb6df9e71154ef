"""Benchmark: the prolog's fast path beside LBNL NHC running a typical 11-check config.

  .venv/bin/python bench/nhc_compare.py --nhc /path/to/nhc [--runs 31]

NHC is not part of this project: install it from your distribution or check out its
public repository (mej/nhc, 1.4.3) anywhere and pass the path of its `nhc` script; when it
runs from a checkout, its `scripts/` and `helpers/` directories are used in place. The
11-check NHC config below is ours (filesystems, memory, swap, CPU, load, a file test and a
process), chosen to be what a typical compute-node config checks and to pass on any Linux box.

Every case is a whole process, run interleaved (so machine noise hits all alike), with an
empty environment apart from what each needs (slurmd gives the prolog no PATH):
  * python -c pass                      the interpreter's floor
  * NHC, 11 checks, watchdog off (-t 0) and with its default 30 s watchdog
  * nodehealth-prolog, fast path        a running `nodehealth daemon` (8 simulated GPUs)
                                        keeps a fresh verdict in the state dir; every run must
                                        say it took the fast path
  * nodehealth-prolog, cold path        no daemon state: the prolog runs its checks itself
The floor and the fast path run the same interpreter from a bare venv made for the run (no pip, no
site-packages, the tree on PYTHONPATH: the fast path needs nothing else, and the development venv's
editable-install finders would add their own imports to both); the cold path and the daemon need the
development venv's packages and run its installed scripts. The defaults of [paths] are moved under the
run's temp dir (NODEHEALTH_DEFAULT_ROOT), where the fast path's settings are kept.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
NHC_CONF = """\
* || check_fs_mount_rw -f /
* || check_fs_mount_rw -f /dev/shm
* || check_fs_free / 1%
* || check_fs_ifree / 1k
* || check_hw_cpuinfo 1
* || check_hw_physmem 1gb 4tb
* || check_hw_swap 0kb 4tb
* || check_hw_mem_free 100mb
* || check_ps_loadavg 1000
* || check_file_test -r /etc/passwd
* || check_ps_service -u root -S {process}
"""


def timed(argv: list[str], env: dict[str, str], want: int = 0, says: str = "") -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, check=False)
    elapsed = time.perf_counter() - t0
    err = proc.stderr.decode(errors="replace")
    if proc.returncode != want or (says and (says not in err or "not taken" in err)):
        raise SystemExit(f"{argv[0]}: exit {proc.returncode}: {err[-400:]}")
    return elapsed


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nhc", required=True, help="path of NHC's nhc script")
    ap.add_argument("--runs", type=int, default=31)
    args = ap.parse_args()
    nhc = Path(args.nhc).resolve()
    # On a tmpfs when there is one, as /run (the state dir) is: a disk's fsync is not the prolog's cost there.
    shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    tmp = Path(tempfile.mkdtemp(prefix="nh-nhc.", dir=shm))
    daemon = None
    root = tmp / "root"  # the defaults of [paths]: the fast path's settings are kept in its run/nodehealth
    (root / "run" / "nodehealth").mkdir(parents=True, mode=0o700)
    (root / "var" / "lib").mkdir(parents=True)
    moved = {"NODEHEALTH_DEFAULT_ROOT": str(root)}
    try:
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", "--without-pip", str(tmp / "venv")], check=True)
        bare = str(tmp / "venv" / "bin" / "python")
        # NHC: our config; its check scripts from the checkout (or /etc/nhc/scripts when installed).
        (tmp / "nhc").mkdir()
        pid1 = Path("/proc/1/comm").read_text().strip()
        (tmp / "nhc" / "nhc.conf").write_text(NHC_CONF.format(process=pid1))
        incdir = nhc.parent / "scripts" if (nhc.parent / "scripts").is_dir() else Path("/etc/nhc/scripts")
        helpers = nhc.parent / "helpers" if (nhc.parent / "helpers").is_dir() else Path("/usr/libexec/nhc")
        nhc_env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "NHC_RM": "none"}
        nhc_base = [
            str(nhc),
            "-D",
            str(tmp / "nhc"),
            "-c",
            str(tmp / "nhc" / "nhc.conf"),
            "-l",
            "/dev/null",
            f"INCDIR={incdir}",
            f"HELPERDIR={helpers}",
            "MARK_OFFLINE=0",
        ]

        # nodehealth: a daemon with simulated GPUs keeps the verdict fresh.
        state, cold_state = tmp / "state", tmp / "cold-state"
        state.mkdir()
        cold_state.mkdir()
        kmsg = tmp / "kmsg"
        kmsg.write_text("")
        common = (
            f'[nvml]\nsimulate = "{ROOT / "examples/scenarios/healthy-8x-h100.toml"}"\n'
            f'[checks.gpu_xid]\nkmsg_path = "{kmsg}"\n'
            "[checks.host_infiniband]\nenabled = false\n"
        )
        warm = tmp / "fast.toml"
        warm.write_text(
            f'[paths]\nstate_dir = "{state}"\n'
            + common
            + f'[daemon]\nlisten = "127.0.0.1:{free_port()}"\ninterval_s = 30\nslurm_actions = false\n'
        )
        cold = tmp / "cold.toml"
        cold.write_text(f'[paths]\nstate_dir = "{cold_state}"\n' + common)
        daemon = subprocess.Popen(
            [str(BIN / "nodehealth"), "daemon", "--config", str(warm)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=dict(os.environ, **moved),
        )
        deadline = time.monotonic() + 30
        while not (state / "daemon-state.json").exists():
            if time.monotonic() > deadline:
                raise SystemExit("the daemon wrote no state within 30 s")
            time.sleep(0.1)
        job = {"SLURM_JOB_ID": "4242", "SLURM_JOB_USER": "alice", "SLURM_JOB_GPUS": "0,1", "SLURMD_NODENAME": "gpu001"}
        fast = [bare, "-c", "from nodehealth.faces import prolog; raise SystemExit(prolog.main())"]
        prolog = [str(BIN / "nodehealth-prolog")]
        cases = {
            "python -c pass": ([bare, "-c", "pass"], {}, ""),
            "NHC 11 checks, -t 0": ([*nhc_base, "-t", "0"], nhc_env, ""),
            "NHC 11 checks, default watchdog": (nhc_base, nhc_env, ""),
            "nodehealth-prolog, fast path": (
                fast,
                {**job, **moved, "NODEHEALTH_CONFIG": str(warm), "PYTHONPATH": str(ROOT)},
                "fast path",
            ),
            "nodehealth-prolog, cold path": (prolog, {**job, **moved, "NODEHEALTH_CONFIG": str(cold)}, ""),
        }
        for argv, env, says in cases.values():
            timed(argv, env, says=says)
        times: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(args.runs):
            for name, (argv, env, says) in cases.items():
                times[name].append(timed(argv, env, says=says))
    finally:
        if daemon is not None:
            daemon.terminate()
            daemon.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)
    med = {name: statistics.median(v) * 1000 for name, v in times.items()}
    print(f"{args.runs} runs each, interleaved; {os.cpu_count()} CPUs; Python {sys.version.split()[0]}\n")
    print("| case | median | min | max |")
    print("|---|---|---|---|")
    for name, values in times.items():
        print(f"| {name} | {med[name]:.1f} ms | {min(values) * 1000:.1f} ms | {max(values) * 1000:.1f} ms |")
    fast = med["nodehealth-prolog, fast path"]
    print(
        f"\nfast path / NHC (-t 0): {fast / med['NHC 11 checks, -t 0']:.2f}x; "
        f"fast path / NHC (default watchdog): {fast / med['NHC 11 checks, default watchdog']:.2f}x; "
        f"fast path - python start-up: {fast - med['python -c pass']:.1f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
