"""``nodehealth daemon``: the continuous watch under systemd (docs/daemon.md).

Exit codes: 0 stopped by SIGTERM/SIGINT, 1 cannot start (listen address in use, state dir
not writable, textfile dir missing), 2 usage or config error.
"""

from __future__ import annotations

import argparse
import sys

from nodehealth.commands.common import UsageError, fail_usage, load_config


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("daemon", help="watch continuously: periodic checks, XID follower, /metrics, state for "
                       "the prolog", description="Run periodic checks, follow the kernel log for XIDs, serve "
                       "Prometheus metrics and keep the verdict the prolog reads. SIGHUP reloads the config, "
                       "SIGTERM stops. Exit 1: cannot start; 2: usage or config error.")
    p.add_argument("--config", metavar="FILE", help="config file (default: $NODEHEALTH_CONFIG or "
                   "/etc/nodehealth/nodehealth.toml)")
    p.add_argument("--simulate", metavar="FILE", help="use simulated GPUs from this scenario file")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from nodehealth.daemon.core import Daemon, StartError

    try:
        cfg = load_config(args)
    except UsageError as exc:
        return fail_usage(exc)
    daemon = Daemon(cfg, config_path=args.config)
    try:
        daemon.start()
    except StartError as exc:
        print(f"nodehealth daemon: cannot start: {exc}", file=sys.stderr)
        daemon.log(f"cannot start: {exc}", "err")
        return 1
    return daemon.run()
