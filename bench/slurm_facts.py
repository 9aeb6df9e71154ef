"""Check on a private Slurm the facts docs/operations.md ("Slurm settings") states about it.

  .venv/bin/python bench/slurm_facts.py [--only prolog|healthcheck]

Needs root and Debian's ``slurmctld slurmd slurm-client munge``; uses the cluster of
``bench/slurm_rpc_cluster.py`` (the tests' harness: one slurmd per node, nodehealth's faces, a logging
scontrol wrapper).

* prolog: nodehealth's prolog fails on a node whose simulated GPU 1 has a row remap pending.
  The batch job's state is printed as it changes, first with Slurm's default (requeued *held*:
  ``launch_failed_requeued_held``, priority 0), then, after ``scontrol reconfigure``, with
  ``SchedulerParameters=nohold_on_prolog_fail`` (requeued, not held, run on another node once
  it is eligible again: ``cred_expire``, 120 s, after the requeue). Also prints the scontrol
  calls the failing prolog made and the slurmctld log lines about the requeue.
* healthcheck: a ``HealthCheckProgram`` that sleeps 90 s, started every 10 s: when slurmd kills
  it (60 s), with which signal, and whether runs overlap.

About 6 minutes for both.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))

from slurm_rpc_cluster import FIXTURES, SCONTROL, Cluster, missing, wait_for  # noqa: E402

FIELDS = ("JobState", "Reason", "Priority", "Restarts", "NodeList", "EligibleTime")


def job(c: Cluster, job_id: str) -> dict[str, str]:
    out = c.run(SCONTROL, "show", "job", "-o", job_id).stdout
    fields = dict(t.partition("=")[::2] for t in out.split() if "=" in t)
    return {k: fields.get(k, "") for k in FIELDS}


def watch(c: Cluster, job_id: str, seconds: float, until: Callable[[dict[str, str]], bool]) -> dict[str, str]:
    """Print the job's state on each change until ``until`` holds (or ``seconds`` pass)."""
    last: Optional[tuple[str, ...]] = None
    start = time.monotonic()
    state = job(c, job_id)
    while time.monotonic() - start < seconds:
        state = job(c, job_id)
        key = tuple(state[k] for k in ("JobState", "Reason", "Priority", "NodeList"))
        if key != last:
            print(
                f"  +{time.monotonic() - start:6.1f} s  job {job_id}: "
                + " ".join(f"{k}={v}" for k, v in state.items()),
                flush=True,
            )
            last = key
        if until(state):
            break
        time.sleep(0.5)
    return state


def submit(c: Cluster) -> str:
    return (
        c.run("/usr/bin/sbatch", "--parsable", "-N1", "-o", f"{c.root}/out/%j.out", "--wrap", "hostname")
        .stdout.strip()
        .split(";")[0]
    )


def prolog(root: Path) -> None:
    # No health check during the run (HealthCheckInterval=300): the prolog is the first to see the fault.
    c = Cluster(root, 3, 300, 10, 3600, 3, daemons=False)
    c.start()
    try:
        # Slurm gives a job the first idle node: n1 fails the prolog, the job can run on n2.
        c.use_scenario("n1", FIXTURES / "remap-pending.toml")
        print(f"SchedulerParameters={c.sched_params} (Slurm's default for held requeues)")
        first = submit(c)
        watch(c, first, 30, lambda s: s["Reason"] == "launch_failed_requeued_held")
        print("  n1:", re.sub(r".* (State=\S+).* (Reason=.*)", r"\1 \2", c.show("n1")))
        print("  the failing prolog's scontrol calls:")
        for call in c.calls():
            if call["face"] == "prolog":
                print("   ", call["line"])
        conf = c.conf.read_text().replace(
            f"SchedulerParameters={c.sched_params}", f"SchedulerParameters={c.sched_params},nohold_on_prolog_fail"
        )
        c.conf.write_text(conf)
        print("scontrol reconfigure ->", c.run(SCONTROL, "reconfigure").returncode)
        time.sleep(3)
        print(
            " ",
            next(
                line.strip()
                for line in c.run(SCONTROL, "show", "config").stdout.splitlines()
                if line.startswith("SchedulerParameters")
            ),
        )
        # A person resumes n1 while its fault is still there: the next job lands on it again.
        print(
            "scontrol update nodename=n1 state=resume ->",
            c.run(SCONTROL, "update", "nodename=n1", "state=resume").returncode,
        )
        wait_for(lambda: c.states().get("n1") == "IDLE", 30, "n1 idle")
        second = submit(c)
        watch(c, second, 200, lambda s: s["JobState"] in ("COMPLETED", "FAILED", "CANCELLED"))
        print("  n1:", re.sub(r".* (State=\S+).* (Reason=.*)", r"\1 \2", c.show("n1")))
        print(f"  job {first} (still held, released now):", job(c, first)["Reason"])
        c.run(SCONTROL, "release", first)
        outs = {p.name: p.read_text().strip() for p in sorted((root / "out").glob("*.out"))}
        print("  job outputs (hostname):", outs)
        log = (root / "log" / "slurmctld.log").read_text(errors="replace")
        print("  slurmctld:")
        for line in log.splitlines():
            if re.search(r"Requeuing|Prolog launch failure|draining the node", line):
                print("   ", line)
    finally:
        c.stop()


def healthcheck(root: Path) -> None:
    c = Cluster(root, 1, 10, 10, 3600, 3, daemons=False)
    c._write()
    flag, log = root / "slow", root / "hc.log"
    # Quick at slurmd's start (it runs before registration), then 90 s long once the flag exists.
    (root / "bin" / "nodehealth-healthcheck").write_text(
        "#!/bin/sh\n"
        f'echo "$(/bin/date +%s.%N) start $$" >> {log}\n'
        f"trap 'echo \"$(/bin/date +%s.%N) got SIGTERM $$\" >> {log}; exit 143' TERM\n"
        f"if [ -e {flag} ]; then /bin/sleep 90 & wait $!; fi\n"
        f'echo "$(/bin/date +%s.%N) end $$" >> {log}\n'
    )
    c._write = lambda: None  # type: ignore[method-assign]  # keep the program written above
    c.start()
    try:
        flag.write_text("")
        time.sleep(95)
        starts: dict[str, float] = {}
        running: set[str] = set()
        for line in log.read_text().splitlines():
            parts = line.split()
            when, what, pid = float(parts[0]), " ".join(parts[1:-1]), parts[-1]
            if what == "start":
                starts[pid] = when
                running.add(pid)
                print(f"  {when:.3f} run {pid} started ({len(running)} running)")
            else:
                running.discard(pid)
                print(f"  {when:.3f} run {pid}: {what} after {when - starts.get(pid, when):.2f} s")
        print("  slurmd:")
        for line in (root / "log" / "slurmd-n1.log").read_text(errors="replace").splitlines():
            if "health" in line.lower():
                print("   ", line)
    finally:
        c.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", choices=("prolog", "healthcheck"))
    ap.add_argument("--keep", action="store_true", help="keep the clusters' directories (logs, state dirs)")
    args = ap.parse_args()
    why = missing()
    if why:
        print(f"cannot run: {why}", file=sys.stderr)
        return 2
    checks: dict[str, Any] = {"prolog": prolog, "healthcheck": healthcheck}
    for name, fn in checks.items():
        if args.only in (None, name):
            root = Path(tempfile.mkdtemp(prefix=f"nh-facts-{name}."))
            print(f"== {name} ({root})", flush=True)
            try:
                fn(root)
            finally:
                if not args.keep:
                    shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
