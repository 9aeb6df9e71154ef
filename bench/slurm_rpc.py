"""Benchmark: what nodehealth costs slurmctld, on a private multi-node Slurm cluster.

  .venv/bin/python bench/slurm_rpc.py [--nodes 4] [--minutes 6] [--jobs 20] [--mode daemon|faces|both|scale]

Needs root and Debian's ``slurmctld slurmd slurm-client munge`` (Slurm 22.05). The cluster is the
tests' harness (``tests/multinode.py``'s ``MultiNode`` on ``tests/slurm_daemons.py``'s ``PrivateSlurm``; run
the bench from the repository root): munged, slurmctld and one slurmd per node, each slurmd in its
own UTS namespace with its own node name (``n1``..``nN``, all on 127.0.0.1 with their own ports),
8 fake GPUs per node, and nodehealth's
installed entry points as ``Prolog``, ``Epilog`` and ``HealthCheckProgram`` (``PrologFlags=Alloc``,
``HealthCheckNodeState=ANY``). Each node has its own nodehealth config, state dir and simulated
GPUs; in ``daemon`` mode one ``nodehealth daemon`` per node runs beside its slurmd. Time is
compressed: a short ``HealthCheckInterval``, short daemon rounds and ``[slurm] reconcile_s`` at
its minimum (60 s), so that reconciliations show up in a run of minutes.

Every ``scontrol`` and ``sinfo`` call nodehealth makes goes through ``[slurm] scontrol`` = a
per-node wrapper (and the ``sinfo`` wrapper beside it) that appends the time, the node, the caller
(prolog, epilog, healthcheck, daemon: from its parent's command line) and the argv to a log, then
execs ``/usr/bin/scontrol`` or ``/usr/bin/sinfo``. slurmctld logs every RPC it receives
(``DebugFlags=Protocol``): the RPCs of a window are counted from that log by time, and
``sdiag``'s per-message-type counts, read before and after each window, are shown beside them.
The benchmark makes no node or partition query of its own inside a window: it submits jobs
with ``sbatch`` and waits for their epilogs' records in the nodes' job ledgers (``squeue`` would
add a ``REQUEST_PARTITION_INFO``), so the node-info and update RPCs of a window are nodehealth's.

Windows (per mode):

* steady: every node healthy, ``--minutes`` long, ``--jobs`` short jobs
  (``sbatch -w NODE --wrap hostname``, round robin over the nodes) spread over it;
* fault: one node's simulated GPUs switched to a faulty scenario (GPU 1 with a row remap
  pending) until nodehealth has drained it, then held for two health-check intervals;
* resume: the scenario switched back to healthy until nodehealth has resumed the node.

Then (``--scale``, default 10,000) a cluster of one registered node and that many nodes
declared: what one call costs slurmctld there (sdiag's time per RPC type): ``scontrol show node
-o n1`` (nodehealth's one-node read before: the whole node table), ``sinfo -n n1 -O ...``
(its read now: that node alone), the whole cluster (the breaker's view) and a drain.

The report (stdout and ``--report``) gives the calls and RPCs per node per hour in steady state,
per fault and per resume, the extrapolation to the default ``reconcile_s`` (3600 s) and to
10,000 nodes, the cost of one call at that size, and every wrapper-log line of each window.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any, Optional

from slurm_rpc_cluster import FIXTURES, SCONTROL, SINFO, Cluster, missing, wait_for  # bench/, beside this file
from slurm_rpc_window import NODE_TYPES, TARGET_NODES, Window, summarize_event, summarize_steady

from nodehealth.slurm.nodes import sinfo_format


def spread_jobs(c: Cluster, w: Window, jobs: int, seconds: float) -> None:
    """``jobs`` short jobs spread evenly over ``seconds`` and over the nodes; then wait for their epilogs."""
    start = time.monotonic()
    for i in range(jobs):
        due = start + (i + 0.5) * seconds / max(jobs, 1)
        time.sleep(max(0.0, due - time.monotonic()))
        w.jobs.append(c.sbatch(c.names[i % len(c.names)]))
    time.sleep(max(0.0, start + seconds - time.monotonic()))
    # Not squeue: it costs slurmctld a REQUEST_PARTITION_INFO besides REQUEST_JOB_INFO. The epilog's ledger record.
    wait_for(lambda: set(w.jobs) <= c.ended_jobs(), 120, "every job's epilog", every=0.5)
    time.sleep(2)  # the epilog's completion message


def run_mode(root: Path, args: argparse.Namespace, daemons: bool) -> dict[str, Any]:
    c = Cluster(root, args.nodes, args.hc_interval, args.daemon_interval, args.reconcile_s, args.clean_runs, daemons)
    mode = "daemon" if daemons else "faces"
    result: dict[str, Any] = {"mode": mode, "nodes": c.names, "windows": []}
    print(f"[{mode}] starting {len(c.names)} nodes in {root}", flush=True)
    c.start()
    try:
        # Warm-up: the first health check and daemon rounds read the node once and cache it.
        warm = Window(c, "warm-up").begin()
        wait_for(lambda: all(c.nh_state(n).get("slurm_node") for n in c.names), 120, "every node's cached view")
        if daemons:
            wait_for(
                lambda: all((c.state_dir(n) / "daemon-state.json").exists() for n in c.names),
                60,
                "every daemon's first verdict",
            )
        time.sleep(max(args.hc_interval, 2 * args.daemon_interval) + 2)
        result["windows"].append(warm.end().to_json())

        print(f"[{mode}] steady state: {args.minutes:g} min, {args.jobs} jobs", flush=True)
        steady = Window(c, "steady").begin()
        spread_jobs(c, steady, args.jobs, args.minutes * 60)
        steady.end()
        outs = sorted((root / "out").glob("slurm-*.out"))
        steady.notes.append(
            f"{len(outs)} job output files, hosts: {dict(Counter(p.read_text().strip() for p in outs))}"
        )
        result["windows"].append(steady.to_json())
        result["steady"] = summarize_steady(c, steady, args)

        victim = c.names[1 % len(c.names)]
        print(f"[{mode}] fault on {victim}", flush=True)
        fault = Window(c, "fault").begin()
        c.use_scenario(victim, FIXTURES / args.fault_scenario)
        t_fault = time.time()
        wait_for(lambda: bool(c.nh_state(victim).get("drain")), 300, f"{victim} drained by nodehealth", every=0.1)
        fault.notes.append(
            f"drain recorded {time.time() - t_fault:.1f} s after the scenario switch, "
            f"by the {c.nh_state(victim)['drain'].get('phase')}"
        )
        time.sleep(2 * args.hc_interval + 2)  # the drained node's health checks and rounds go on
        fault.end()
        fault.notes.append(f"Slurm: {c.show(victim)}")
        result["windows"].append(fault.to_json())

        print(f"[{mode}] resume on {victim}", flush=True)
        resume = Window(c, "resume").begin()
        c.use_scenario(victim, FIXTURES / "healthy.toml")
        t_back = time.time()
        wait_for(lambda: not c.nh_state(victim).get("drain"), 600, f"{victim} resumed by nodehealth", every=0.2)
        resume.notes.append(f"drain record cleared {time.time() - t_back:.1f} s after the switch back")
        time.sleep(5)
        resume.end()
        resume.notes.append(f"Slurm: {c.show(victim)}")
        result["windows"].append(resume.to_json())
        result["victim"] = victim
        result["fault"] = summarize_event(fault, victim)
        result["resume"] = summarize_event(resume, victim)
    finally:
        c.stop()
    return result


def measure_scale(root: Path, ghosts: int, calls: int) -> dict[str, Any]:
    """What one call costs slurmctld when the cluster has ``ghosts`` + 1 nodes.

    ``scontrol show node NODE`` loads every node and every partition (``scontrol_load_nodes``
    and ``scontrol_load_partitions`` in src/scontrol/info_node.c, 22.05 to 25.11) and filters
    on the client, so a one-node read costs what the whole cluster's view costs. Measured: the
    wall time of the command and the time slurmctld spent in each RPC type (sdiag's total_time).
    """
    c = Cluster(root, 1, 0, 30, 3600, 3, daemons=False, ghosts=ghosts)
    print(f"[scale] one node + {ghosts} declared nodes in {root}", flush=True)
    c.start()
    out: dict[str, Any] = {"nodes": ghosts + 1, "calls": calls}
    try:
        cases = {
            "show node -o n1": [SCONTROL, "show", "node", "-o", "n1"],
            "show node -o (all)": [SCONTROL, "show", "node", "-o"],
            "update drain": [SCONTROL, "update", "nodename=g1", "state=drain", "reason=nh:bench bench"],
            # nodehealth's read of one node: sinfo asks for that node alone (REQUEST_NODE_INFO_SINGLE).
            "sinfo -n n1 -O (nodehealth's read)": [
                SINFO,
                "-h",
                "-N",
                "-n",
                "n1",
                "-O",
                sinfo_format("@nh0123456789abcdef@"),
            ],
            "sinfo -n n1 -o": [SINFO, "-h", "-N", "-n", "n1", "-o", "%N|%T|%E|%G"],
        }
        for name, argv in cases.items():
            n0, t0 = c.sdiag(), c.sdiag(3)
            walls, own, size = [], [], 0
            for _ in range(1 if name.startswith("update") else calls):
                before = c.sdiag_time_us()  # per call too: the median of slurmctld's time for one call
                start = time.perf_counter()
                res = c.run(*argv)
                walls.append(time.perf_counter() - start)
                own.append((c.sdiag_time_us() - before) / 1000)
                size = len(res.stdout)
            n1, t1 = c.sdiag(), c.sdiag(3)
            per_type = {}
            for t in sorted(set(n1) - {"REQUEST_STATS_INFO"}):  # sdiag's own RPC is not the command's
                k = n1.get(t, 0) - n0.get(t, 0)
                if k:
                    per_type[t] = {"count": k, "ms_each": round((t1.get(t, 0) - t0.get(t, 0)) / k / 1000, 2)}
            walls.sort()
            own.sort()
            out[name] = {
                "wall_ms_median": round(walls[len(walls) // 2] * 1000, 1),
                "stdout_bytes": size,
                "slurmctld_ms_median": round(own[len(own) // 2], 2),
                "rpcs": per_type,
                "slurmctld_ms_per_call": round(
                    sum(v["count"] * v["ms_each"] for v in per_type.values()) / len(walls), 2
                ),
            }
    finally:
        c.stop()
    return out


def report(results: list[dict[str, Any]], sc: Optional[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        f"# nodehealth's slurmctld cost (bench/slurm_rpc.py), {datetime.date.today().isoformat()}",
        f"{slurm_version()}, {platform.node()}, {os.cpu_count()} CPUs; {args.nodes} nodes, "
        f"HealthCheckInterval={args.hc_interval} s, [daemon] interval_s={args.daemon_interval:g} s, "
        f"[slurm] reconcile_s={args.reconcile_s:g} s, [resume] clean_runs={args.clean_runs}",
        "calls: the scontrol wrapper's log; node RPCs: "
        + ", ".join(NODE_TYPES)
        + " received by slurmctld in the window (its log, DebugFlags=Protocol; sdiag's deltas beside)",
        "",
    ]
    for res in results:
        s = res["steady"]
        lines += [
            f"## mode: {res['mode']}"
            + (
                " (one nodehealth daemon per node)"
                if res["mode"] == "daemon"
                else " (prolog, epilog, health check; no daemon)"
            ),
            "",
        ]
        lines += [
            f"steady state, {s['seconds']:.0f} s, {s['jobs']} jobs, every node healthy:",
            f"  scontrol calls: {s['calls']} ({s['reconcile_reads']} reconciliation reads "
            f"of one node, `sinfo -n NODE`, {s['other_calls']} other); per node: {s['calls_per_node']}",
            f"  node RPCs: {s['node_rpcs']} (sdiag: {s['node_rpcs_sdiag']}); the calls account for "
            f"{s['node_rpcs_expected']} (2 per read, 1 per update)",
            f"  per node per hour at reconcile_s={args.reconcile_s:g}: {s['calls_per_node_hour']} calls, "
            f"{s['node_rpcs_per_node_hour']} node RPCs ({s['bench_rpc_per_s_10k']} RPC/s at "
            f"{TARGET_NODES:,} nodes)",
            f"  reconciliation reads per node per reconcile_s period: {s['reconcile_reads_per_node_period']}",
            f"  extrapolated to reconcile_s=3600 (the default): {s['default_calls_per_node_hour']} calls and "
            f"{s['default_rpcs_per_node_hour']} RPCs per node per hour -> {s['default_rpc_per_s_10k']} RPC/s "
            f"at {TARGET_NODES:,} nodes (goal: <= 1 call per node per hour, <= 10 RPC/s)",
            "",
        ]
        for ev in ("fault", "resume"):
            e = res[ev]
            lines += [
                f"{ev} on {res['victim']} ({e['seconds']:.0f} s window): {e['calls']} calls "
                f"{e['kinds']} = {e['rpcs_expected']} RPCs; all node RPCs in the window: {e['node_rpcs']} "
                f"(sdiag: {e['node_rpcs_sdiag']}), other nodes' calls in it: {e['other_nodes_calls'] or 'none'}"
                f" = {e['node_rpcs_expected'] - e['rpcs_expected']} RPCs"
            ]
        lines.append("")
        for w in res["windows"]:
            lines.append(f"### window {w['name']} ({w['seconds']} s, {w['jobs']} jobs)")
            lines.append(f"  RPCs received (slurmctld's log): {w['rpcs']}")
            lines.append(f"  sdiag deltas: {w['sdiag']}")
            lines += [f"  note: {n}" for n in w["notes"]]
            lines += [f"  call: {line}" for line in w["calls"]]
            lines.append("")
    if sc:
        lines += [f"## one call's cost with {sc['nodes']:,} nodes declared (1 registered), median of {sc['calls']}", ""]
        for name in (
            "show node -o n1",
            "show node -o (all)",
            "update drain",
            "sinfo -n n1 -O (nodehealth's read)",
            "sinfo -n n1 -o",
        ):
            v = sc[name]
            cmd = name if name.startswith("sinfo") else f"scontrol {name}"
            lines.append(
                f"  {cmd}: wall {v['wall_ms_median']} ms, output {v['stdout_bytes']:,} bytes, "
                f"slurmctld median {v['slurmctld_ms_median']} ms, mean {v['slurmctld_ms_per_call']} ms "
                f"per call {v['rpcs']}"
            )
        lines.append("")
    return "\n".join(lines)


def slurm_version() -> str:
    try:
        return subprocess.run(["/usr/sbin/slurmctld", "-V"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--minutes", type=float, default=6.0, help="steady-state window")
    ap.add_argument("--jobs", type=int, default=20, help="short jobs in the steady-state window")
    ap.add_argument("--hc-interval", type=int, default=30, help="HealthCheckInterval, s")
    ap.add_argument("--daemon-interval", type=float, default=10.0, help="[daemon] interval_s")
    ap.add_argument("--reconcile-s", type=float, default=60.0, help="[slurm] reconcile_s (minimum 60)")
    ap.add_argument("--clean-runs", type=int, default=3, help="[resume] clean_runs")
    ap.add_argument("--fault-scenario", default="remap-pending.toml", help="under tests/fixtures/slurm")
    ap.add_argument(
        "--mode",
        choices=("daemon", "faces", "both", "scale"),
        default="both",
        help="scale: only the one-call cost with --scale nodes",
    )
    ap.add_argument(
        "--scale", type=int, default=10_000, help="also time one call with this many nodes declared (0: skip)"
    )
    ap.add_argument("--report", default="/tmp/nodehealth-slurm-rpc.txt")
    ap.add_argument("--keep", action="store_true", help="keep the cluster's directory (logs, state dirs)")
    args = ap.parse_args()
    why = missing()
    if why:
        print(f"cannot run: {why}", file=sys.stderr)
        return 2
    if args.keep:  # the harness removes its directory at stop unless told
        os.environ["NODEHEALTH_KEEP_SLURM"] = "1"
    results = []
    for daemons in {"daemon": (True,), "faces": (False,), "both": (True, False), "scale": ()}[args.mode]:
        root = Path(tempfile.mkdtemp(prefix="nh-rpc."))  # munged wants every directory above it searchable
        try:
            results.append(run_mode(root, args, daemons))
        finally:
            if args.keep:
                print(f"kept {root}", file=sys.stderr)
            else:
                shutil.rmtree(root, ignore_errors=True)
    scale = None
    if args.scale > 1:
        root = Path(tempfile.mkdtemp(prefix="nh-rpc-scale."))
        try:
            scale = measure_scale(root, args.scale - 1, 21)
        finally:
            if not args.keep:
                shutil.rmtree(root, ignore_errors=True)
    text = report(results, scale, args)
    print(text)
    Path(args.report).write_text(text + "\n")
    Path(args.report).with_suffix(".json").write_text(json.dumps({"modes": results, "scale": scale}, indent=1) + "\n")
    print(f"report: {args.report} (+ .json)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
