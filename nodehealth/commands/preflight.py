"""``nodehealth preflight``: one srun step that checks the whole allocation and names the bad node.

    srun --ntasks-per-node=1 nodehealth preflight [--shared-dir DIR] [--path P ...]
         [--checkpoint-dir D ...] [--nccl [--expect-ib] [--across [--min-busbw GBPS]]]
         [--format text|json] [--drain] [--timeout S]

Runs as the user. The first rank prints one report for the allocation; every rank exits 0 when it
passes, 1 when a node failed, 2 on a usage error or when the exchange cannot be used (a name in the
shared directory held by another user: no node was judged). docs/preflight.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from nodehealth.commands.common import UsageError, fail_usage
from nodehealth.commands.options import add_config, add_format


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "preflight",
        help="check a whole allocation before a long run (srun, one task per node)",
        description="Check every node of the allocation (health, shared storage, paths, versions, "
        "optionally NCCL) and name the bad node. Run as srun --ntasks-per-node=1 "
        "nodehealth preflight. Exit 0 pass, 1 a node failed, 2 usage error or an "
        "exchange that cannot be used (a name in the shared directory held by "
        "another user; no node judged).",
    )
    p.add_argument(
        "--shared-dir",
        metavar="DIR",
        help="directory on the shared file system used as the exchange (default: the job's working directory)",
    )
    p.add_argument(
        "--path",
        metavar="P",
        action="append",
        default=[],
        help="must exist and be readable on every node (code, data, container image); may repeat",
    )
    p.add_argument(
        "--checkpoint-dir",
        metavar="D",
        action="append",
        default=[],
        help="must be writable on every node and on shared storage (checkpoints, logs); may repeat",
    )
    p.add_argument("--nccl", action="store_true", help="run the NCCL self-test on every node")
    p.add_argument("--expect-ib", action="store_true", help="with --nccl: NCCL must use InfiniBand, NET/Socket fails")
    p.add_argument(
        "--across",
        action="store_true",
        help="with --nccl: once every node passed, one all-reduce over all nodes (nccl-tests' all_reduce_perf, "
        "MPI build; start the step with srun --mpi=pmix or --mpi=pmi2); names the node whose link went over TCP",
    )
    p.add_argument(
        "--min-busbw",
        type=float,
        default=0.0,
        metavar="GBPS",
        help="with --across: the all-reduce's bus bandwidth must reach this (default 0: not judged)",
    )
    p.add_argument(
        "--nccl-timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="deadline of each node's NCCL self-test (default 60)",
    )
    p.add_argument(
        "--drain",
        action="store_true",
        help="drain nodes with hardware faults (needs Slurm operator rights; the faces' ownership rules apply)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        metavar="S",
        help="deadline for every node to report in the shared directory (default 10)",
    )
    add_config(
        p,
        help="config file; %%n is replaced by the node name (default: $NODEHEALTH_CONFIG or "
        "/etc/nodehealth/nodehealth.toml)",
    )
    add_format(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from nodehealth.commands.common import load_config
    from nodehealth.preflight import ranks
    from nodehealth.preflight.run import Options, preflight

    env = dict(os.environ)
    try:
        if not 0.5 <= args.timeout <= 3600:
            raise UsageError("--timeout: between 0.5 and 3600 seconds")
        if not 1 <= args.nccl_timeout <= 3600:
            raise UsageError("--nccl-timeout: between 1 and 3600 seconds")
        if args.expect_ib and not args.nccl:
            raise UsageError("--expect-ib goes with --nccl")
        if args.across and not args.nccl:
            raise UsageError("--across goes with --nccl")
        if not 0 <= args.min_busbw <= 10000 or (args.min_busbw and not args.across):
            raise UsageError("--min-busbw: between 0 and 10000 GB/s, with --across")
        try:
            rank = ranks.from_env(env)
        except ranks.RankError as exc:
            raise UsageError(str(exc)) from None
        config = args.config or env.get("NODEHEALTH_CONFIG")
        if config:
            config = config.replace("%n", rank.node)
            env["NODEHEALTH_CONFIG"] = config
        cfg = load_config(argparse.Namespace(config=config), host=rank.node)
        shared = os.path.abspath(args.shared_dir or os.getcwd())
        if not os.path.isdir(shared):
            raise UsageError(f"--shared-dir: {shared} is not a directory on {rank.node}")
    except UsageError as exc:
        return fail_usage(exc)
    opts = Options(
        shared_dir=shared,
        paths=tuple(args.path),
        checkpoints=tuple(args.checkpoint_dir),
        nccl=args.nccl,
        expect_ib=args.expect_ib,
        across=args.across,
        min_busbw_gbps=args.min_busbw,
        nccl_timeout_s=args.nccl_timeout,
        drain=args.drain,
        timeout_s=args.timeout,
        fmt=args.format,
    )
    if cfg.node_name and cfg.node_name != rank.node:
        cfg = dataclasses.replace(cfg, node_name=rank.node)
    return preflight(cfg, rank, opts, env, out=sys.stdout, scontrol=cfg.slurm.scontrol, slurm_conf=cfg.slurm.conf)
