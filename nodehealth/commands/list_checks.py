"""``nodehealth list-checks``: the registry, as a table."""

from __future__ import annotations

import argparse
import json
from typing import Any

from nodehealth.commands.options import add_format
from nodehealth.registry import CHECKS, PHASES


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("list-checks", help="list the checks nodehealth knows")
    add_format(p)
    p.set_defaults(func=run)


def rows() -> list[dict[str, Any]]:
    from nodehealth.config.schema import default_checks

    defaults = default_checks()
    out = []
    for spec in CHECKS:
        phases = [p for p in PHASES if p in spec.phases]
        out.append(
            {
                "name": spec.name,
                "default": spec.default_enabled,
                "cost": spec.cost,
                "phases": phases,
                "needs": list(spec.needs),
                "uses": list(spec.uses),
                "timeout_s": defaults[spec.name].timeout_s,
                "description": spec.summary,
            }
        )
    return out


def run(args: argparse.Namespace) -> int:
    table = rows()
    if args.format == "json":
        print(json.dumps(table, indent=2))
        return 0
    width = max(len(str(r["name"])) for r in table)
    print(f"{'NAME':<{width}}  {'DEFAULT':<7} {'COST':<5} {'TIMEOUT':<7} {'PHASES':<22} {'PROBES':<28} DESCRIPTION")
    for r in table:
        phases = r["phases"]
        where = "all" if len(phases) == len(PHASES) else ",".join(phases)
        probes = ",".join(map(str, r["needs"])) + (f" (+{','.join(map(str, r['uses']))})" if r["uses"] else "")
        print(
            f"{r['name']:<{width}}  {'on' if r['default'] else 'off':<7} {r['cost']:<5} "
            f"{r['timeout_s']:<7g} {where:<22} {probes:<28} {r['description']}"
        )
    return 0
