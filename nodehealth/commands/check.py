"""``nodehealth check``: run the checks now and print the verdict."""

from __future__ import annotations

import argparse
import sys

from nodehealth import render
from nodehealth.commands.common import UsageError, fail_usage, load_config, use_color
from nodehealth.model import Status
from nodehealth.registry import BY_NAME


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check", help="run the health checks and print the verdict",
                       description="Run the health checks. Exit 0 healthy (warnings allowed), 1 a check "
                                   "failed, 2 usage or config error, 3 internal error.")
    p.add_argument("--config", metavar="FILE", help="config file (default: $NODEHEALTH_CONFIG or "
                   "/etc/nodehealth/nodehealth.toml)")
    p.add_argument("--simulate", metavar="FILE", help="use simulated GPUs from this scenario file")
    p.add_argument("--only", metavar="NAME", nargs="+", default=[], help="run only these checks")
    p.add_argument("--phase", choices=("prolog", "epilog", "healthcheck", "manual"), default="manual",
                   help="which phase's checks and budget to use (default: manual)")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from nodehealth import runner

    unknown = [n for n in args.only if n not in BY_NAME]
    if unknown:
        return fail_usage(UsageError(f"--only: unknown check(s) {', '.join(unknown)} "
                                     "(see: nodehealth list-checks)"))
    try:
        cfg = load_config(args)
    except UsageError as exc:
        return fail_usage(exc)
    report = runner.run(cfg, phase=args.phase, only=tuple(args.only))
    if args.format == "json":
        sys.stdout.write(render.as_json(report))
    else:
        sys.stdout.write(render.text(report, color=use_color(sys.stdout)))
    return exit_code(report.status, cfg.policy.unknown)


def exit_code(status: Status, unknown_policy: str) -> int:
    if status == Status.FAIL or (status == Status.UNKNOWN and unknown_policy == "fail"):
        return 1
    return 0
