"""The measured windows of ``bench/slurm_rpc.py`` and what their counts mean.

A ``Window`` holds what slurmctld received between ``begin`` and ``end``: its log's RPCs by type
(``DebugFlags=Protocol``), ``sdiag``'s per-type deltas and the calls the per-node ``scontrol``/``sinfo``
wrappers logged (``slurm_rpc_cluster.Cluster`` reads all three). ``summarize_steady`` turns the
steady window into calls and RPCs per node per hour, with the extrapolation to the default
``reconcile_s`` (3600 s) and to ``TARGET_NODES`` nodes; ``summarize_event`` counts one node's fault or
resume.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from typing import Any

from slurm_rpc_cluster import Cluster  # bench/, beside this file

# The message types a node-health tool costs slurmctld: what `scontrol show node` and `scontrol update` send.
NODE_TYPES = ("REQUEST_NODE_INFO", "REQUEST_NODE_INFO_SINGLE", "REQUEST_PARTITION_INFO", "REQUEST_UPDATE_NODE")
TARGET_NODES = 10_000


def kind(call: dict[str, Any]) -> str:
    """``show <node>``, ``show all``, ``sinfo node``, ``update drain``, ``update resume`` or the argv."""
    argv = call["argv"]
    if argv[:1] == ["sinfo"]:
        return "sinfo node"
    if argv[:2] == ["show", "node"]:
        return "show all" if len([a for a in argv[2:] if a != "-o"]) == 0 else "show node"
    if argv[:1] == ["update"]:
        state = next((a.split("=", 1)[1] for a in argv if a.startswith("state=")), "?")
        return f"update {state}"
    return " ".join(argv)


def rpc_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {
        k: after.get(k, 0) - before.get(k, 0)
        for k in sorted(set(before) | set(after))
        if after.get(k, 0) - before.get(k, 0)
    }


class Window:
    """One measured window: the sdiag counts and the wrapper-log calls between ``begin`` and ``end``."""

    def __init__(self, cluster: Cluster, name: str) -> None:
        self.c, self.name = cluster, name
        self.t0 = self.t1 = 0.0
        self.sdiag0: dict[str, int] = {}
        self.rpcs: dict[str, int] = {}  # slurmctld's log, by the window's times
        self.sdiag: dict[str, int] = {}  # sdiag's counts, after minus before
        self.calls: list[dict[str, Any]] = []
        self.jobs: list[str] = []
        self.notes: list[str] = []

    def begin(self) -> Window:
        self.t0 = time.time()
        self.sdiag0 = self.c.sdiag()
        return self

    def end(self) -> Window:
        self.sdiag = rpc_delta(self.sdiag0, self.c.sdiag())
        self.t1 = time.time()
        time.sleep(0.5)  # slurmctld's log line of the last RPC
        self.rpcs = self.c.logged_rpcs(self.t0, self.t1)
        self.calls = [c for c in self.c.calls() if self.t0 <= c["time"] < self.t1]
        return self

    @property
    def seconds(self) -> float:
        return self.t1 - self.t0

    def node_rpcs(self) -> int:
        return sum(self.rpcs.get(t, 0) for t in NODE_TYPES)

    def by_node(self) -> dict[str, Counter[str]]:
        out: dict[str, Counter[str]] = {n: Counter() for n in self.c.names}
        for call in self.calls:
            out.setdefault(call["node"], Counter())[f"{call['face']}: {kind(call)}"] += 1
        return out

    def rpcs_expected(self) -> int:
        """RPCs the wrapper-log calls should cost: 2 per read (node + partition info), 1 per update."""
        return sum(2 if kind(c).startswith(("show", "sinfo")) else 1 for c in self.calls)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "seconds": round(self.seconds, 1),
            "rpcs": self.rpcs,
            "sdiag": self.sdiag,
            "jobs": len(self.jobs),
            "calls": [c["line"] for c in self.calls],
            "notes": self.notes,
        }


def summarize_steady(c: Cluster, w: Window, args: argparse.Namespace) -> dict[str, Any]:
    per_node = {n: sum(k.values()) for n, k in w.by_node().items()}
    calls = sum(per_node.values())
    hours = w.seconds / 3600
    n = len(c.names)
    reconcile = sum(1 for call in w.calls if kind(call) in ("show node", "sinfo node"))
    other = calls - reconcile
    # Reconciliation reads per node per reconcile_s period. A period lasts reconcile_s plus up to one round
    # or health-check interval (the next look after the cached view expired), so dividing by reconcile_s
    # overstates what one period costs: an upper bound.
    periods = w.seconds / args.reconcile_s
    per_period = reconcile / n / periods if periods else 0.0
    # At the default reconcile_s (3600 s) one period is an hour; the other calls are per hour already.
    calls_h_default = per_period + other / n / hours
    rpc_per_call = (w.node_rpcs() / calls) if calls else 2.0
    rpc_h_default = calls_h_default * rpc_per_call
    return {
        "seconds": round(w.seconds, 1),
        "jobs": len(w.jobs),
        "calls": calls,
        "calls_per_node": per_node,
        "reconcile_reads": reconcile,
        "other_calls": other,
        "calls_per_node_hour": round(calls / n / hours, 2),
        "node_rpcs": w.node_rpcs(),
        "node_rpcs_expected": w.rpcs_expected(),
        "node_rpcs_sdiag": sum(w.sdiag.get(t, 0) for t in NODE_TYPES),
        "node_rpcs_per_node_hour": round(w.node_rpcs() / n / hours, 2),
        "rpcs_per_call": round(rpc_per_call, 3),
        "reconcile_reads_per_node_period": round(per_period, 3),
        "default_calls_per_node_hour": round(calls_h_default, 3),
        "default_rpcs_per_node_hour": round(rpc_h_default, 3),
        "default_rpc_per_s_10k": round(rpc_h_default * TARGET_NODES / 3600, 2),
        "bench_rpc_per_s_10k": round(w.node_rpcs() / n / w.seconds * TARGET_NODES, 1),
    }


def summarize_event(w: Window, victim: str) -> dict[str, Any]:
    mine = [c for c in w.calls if c["node"] == victim]
    others = [c for c in w.calls if c["node"] != victim]
    return {
        "seconds": round(w.seconds, 1),
        "calls": len(mine),
        "kinds": dict(Counter(f"{c['face']}: {kind(c)}" for c in mine)),
        "rpcs_expected": sum(2 if kind(c).startswith(("show", "sinfo")) else 1 for c in mine),
        "other_nodes_calls": dict(Counter(f"{c['node']} {c['face']}: {kind(c)}" for c in others)),
        "node_rpcs": w.node_rpcs(),
        "node_rpcs_expected": w.rpcs_expected(),
        "node_rpcs_sdiag": sum(w.sdiag.get(t, 0) for t in NODE_TYPES),
    }
