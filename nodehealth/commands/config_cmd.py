"""``nodehealth config check [FILE] [--host NAME]``: validate and print the effective config."""

from __future__ import annotations

import argparse
import json

from nodehealth import SCHEMA_VERSION
from nodehealth.commands.common import UsageError, fail_usage
from nodehealth.commands.options import add_format
from nodehealth.config.lean import node_name
from nodehealth.config.loader import ConfigError, load, to_toml_dict
from nodehealth.config.sample import document


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "config",
        help="validate configuration",
        description="Validate a configuration file (config check) or print every key at its default (config "
        "defaults). Acts on nothing.",
    )
    inner = p.add_subparsers(dest="config_command", metavar="SUBCOMMAND")
    c = inner.add_parser(
        "check",
        help="validate a config file and print the effective config for a host",
        description="Validate a config file, every error at once with its file:line, then print the effective "
        "config for a host (its [[override]] blocks applied). Exit 0 valid, 2 invalid or usage error.",
    )
    c.add_argument(
        "file", nargs="?", help="config file (default: $NODEHEALTH_CONFIG or /etc/nodehealth/nodehealth.toml)"
    )
    c.add_argument("--host", help="node name to resolve overrides for (default: this node)")
    add_format(c, choices=("toml", "json"))
    c.set_defaults(func=run)
    d = inner.add_parser(
        "defaults",
        help="print a sample config: every key at its default, documented",
        description="Print a sample config: every key at its default, each with what it does. Exit 0.",
    )
    d.set_defaults(func=lambda args: print(document(), end="") or 0)
    p.set_defaults(func=lambda args: fail_usage(UsageError("config: missing subcommand (try: config check)")))


def run(args: argparse.Namespace) -> int:
    try:
        cfg = load(args.file, host=args.host)
    except ConfigError as exc:
        return fail_usage(exc)
    host = args.host or node_name(cfg.node_name)
    data = to_toml_dict(cfg)
    if args.format == "json":
        print(
            json.dumps({"schema_version": SCHEMA_VERSION, "source": cfg.source, "host": host, "config": data}, indent=2)
        )
        return 0
    print(f"# {cfg.source}: valid; effective configuration for host {host}")
    print(_toml(data))
    return 0


def _toml(data: dict, prefix: str = "") -> str:
    scalars = []
    tables = []
    for key, value in data.items():
        if isinstance(value, dict):
            tables.append((key, value))
        elif value is None:
            scalars.append(f"# {key} = (unset)")
        else:
            scalars.append(f"{key} = {_value(value)}")
    out = []
    if scalars:
        if prefix:
            out.append(f"\n[{prefix}]")
        out.extend(scalars)
    for key, value in tables:
        out.append(_toml(value, f"{prefix}.{key}" if prefix else key))
    return "\n".join(out)


def _value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_value(v)}" for k, v in value.items()) + " }"
    return json.dumps(str(value))
