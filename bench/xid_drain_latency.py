"""Benchmark: a fatal XID line in the kernel log -> the node DRAINED in a real slurmctld.

  .venv/bin/python bench/xid_drain_latency.py [--runs 20]

Starts the private Slurm cluster of the integration tests (munge + slurmctld + slurmd from
Debian's packages, in a temp dir; needs root and those packages), runs `nodehealth daemon`
on it with simulated GPUs and the XID follower reading a kmsg-format file, then, per run:
appends one real-format `Xid 79` record, polls slurmctld (`scontrol show node -o`, every
5 ms) until the node is drained with nodehealth's reason, records the latency, clears the
XID store (`nodehealth xid clear`), runs Slurm's health check once (clean) and resumes the node by
hand (nodehealth's drain record stays: the next XID reads the node back). Prints p50/p90/p99/max.

The latency measured is end to end as an administrator sees it: follower wake-up, judging,
the state file and metrics, the `scontrol update` and slurmctld's own processing, plus up
to 5 ms of polling granularity.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from slurm_cluster import SlurmCluster, _free_port, slurm_missing  # noqa: E402

BIN = Path(sys.executable).parent
LINE = "NVRM: Xid (PCI:0000:9a:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    why = slurm_missing()
    if why:
        print(f"cannot run: {why}", file=sys.stderr)
        return 2
    tmp = tempfile.mkdtemp(prefix="nh-xid-drain.")  # munged wants every directory above it searchable
    os.chmod(tmp, 0o755)
    latencies = measure(Path(tmp), args.runs)
    shutil.rmtree(tmp, ignore_errors=True)
    ms = sorted(x * 1000 for x in latencies)

    def pct(p: float) -> float:
        return ms[min(len(ms) - 1, int(round(p / 100 * (len(ms) - 1))))]

    print(f"runs: {len(ms)}; XID 79 line -> node drained in slurmctld")
    print(f"p50 {statistics.median(ms):.0f} ms, p90 {pct(90):.0f} ms, p99 {pct(99):.0f} ms, max {ms[-1]:.0f} ms")
    return 0


def measure(tmp: Path, runs: int) -> list[float]:
    cluster = SlurmCluster(tmp, scenario="healthy.toml")
    cluster.start()
    daemon = None
    try:
        kmsg = tmp / "kmsg"
        kmsg.write_text("")
        port = _free_port()
        cfg = cluster.nh_config
        cfg.write_text(
            cfg.read_text()
            + "\n".join(
                [
                    "[daemon]",
                    f'listen = "127.0.0.1:{port}"',
                    "interval_s = 600",
                    "slurm_actions = true",
                    "xid_follow = true",
                    "[checks.gpu_xid]",
                    f'kmsg_path = "{kmsg}"',
                ]
            )
            + "\n"
        )
        cluster.wait_node(lambda n: n["state"] == "idle", what="idle")
        daemon = subprocess.Popen(
            [str(BIN / "nodehealth"), "daemon", "--config", str(cfg)],
            stdout=subprocess.DEVNULL,
            stderr=open(tmp / "daemon.log", "w"),
        )
        time.sleep(3)  # first round and the follower's backlog
        latencies = []
        seq = 1000
        for _ in range(runs):
            seq += 1
            record = f"4,{seq},{int(time.monotonic() * 1e6)},-;{LINE}\n"
            t0 = time.perf_counter()
            with open(kmsg, "a") as fh:
                fh.write(record)
            while True:
                line = cluster.run("/usr/bin/scontrol", "show", "node", "-o", cluster.host).stdout
                if "DRAIN" in line and " Reason=nh:" in line:
                    break
                if time.perf_counter() - t0 > 10:
                    raise SystemExit(f"no drain within 10 s: {line}")
                time.sleep(0.005)
            latencies.append(time.perf_counter() - t0)
            subprocess.run(
                [str(BIN / "nodehealth"), "xid", "clear", "--config", str(cfg)],
                check=True,
                stdout=subprocess.DEVNULL,
                env=dict(os.environ),
            )
            # Slurm's health check runs once, clean (it reads the node: still our drain), then a person
            # resumes the node by hand while our record stays: the next XID must read the node back
            # rather than trust the record ("already drained") and leave the node taking jobs.
            env = {"SLURM_CONF": str(cluster.conf), "SLURMD_NODENAME": cluster.host, "NODEHEALTH_CONFIG": str(cfg)}
            hc = subprocess.run([str(BIN / "nodehealth-healthcheck")], env=env, capture_output=True, timeout=60)
            if hc.returncode != 0:
                raise SystemExit(f"the health check after the clear exited {hc.returncode}: {hc.stderr[-500:]!r}")
            cluster.run("/usr/bin/scontrol", "update", f"nodename={cluster.host}", "state=resume")
            cluster.wait_node(lambda n: "DRAIN" not in n["scontrol_state"], what="resumed")
            time.sleep(0.2)
    finally:
        if daemon is not None:
            daemon.terminate()
            daemon.wait(10)
        cluster.stop()
    return latencies


if __name__ == "__main__":
    sys.exit(main())
