"""``nodehealth daemon``: the continuous watch under systemd (docs/daemon.md).

Exit codes: 0 stopped by SIGTERM/SIGINT, 1 cannot start (listen address in use, state dir
not writable, textfile dir missing), 2 usage or config error.

A config file that does not validate at start: the daemon runs with the last configuration
that validated on this node (kept in the state dir), says so at error level and shows
``nodehealth_config_valid 0``; with none to fall back on it exits 2 (the unit's
``RestartPreventExitStatus=2``: restarting would not help). The faces meanwhile check with
that same last configuration, or the built-in defaults.
"""

from __future__ import annotations

import argparse
import os
import sys

from nodehealth.commands.common import UsageError, fail_usage
from nodehealth.commands.options import ExitCode, add_config, add_simulate


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "daemon",
        help="watch continuously: periodic checks, XID follower, /metrics, state for the prolog",
        description="Run periodic checks, follow the kernel log for XIDs, serve "
        "Prometheus metrics and keep the verdict the prolog reads. SIGHUP reloads the config, "
        "SIGTERM stops. Exit 1: cannot start; 2: usage or config error.",
    )
    add_config(p)
    add_simulate(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from nodehealth.config.use import ConfigError, use
    from nodehealth.daemon.core import Daemon, StartError

    try:
        loaded = use(args.config, fallback="last_good", simulate=args.simulate)
    except ConfigError as exc:
        if exc.kind == "setup" and args.simulate:  # the scenario given on the command line
            return fail_usage(UsageError(str(exc)))
        print(
            f"nodehealth daemon: configuration error, and no configuration has validated on this node to fall "
            f"back on: {exc}",
            file=sys.stderr,
        )
        return ExitCode.USAGE
    cfg = loaded.cfg
    daemon = Daemon(
        cfg, config_path=args.config, loaded=loaded, simulate=os.path.abspath(args.simulate) if args.simulate else None
    )
    if loaded.error is not None:
        daemon.log(f"configuration error: {loaded.error}; running with {loaded.note}", "err", config=loaded.file)
    elif loaded.note:
        daemon.log(loaded.note, "warning")
    try:
        daemon.start()
    except StartError as exc:
        print(f"nodehealth daemon: cannot start: {exc}", file=sys.stderr)
        daemon.log(f"cannot start: {exc}", "err")
        return ExitCode.FAULT
    return daemon.run()
