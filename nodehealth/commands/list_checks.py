"""``nodehealth list-checks``: the registry, as a table."""

from __future__ import annotations

import argparse

from nodehealth.registry import CHECKS, PHASES


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("list-checks", help="list the checks nodehealth knows")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    width = max(len(s.name) for s in CHECKS)
    print(f"{'NAME':<{width}}  {'DEFAULT':<8} {'COST':<6} {'PHASES':<40} DESCRIPTION")
    for spec in CHECKS:
        phases = ",".join(p for p in PHASES if p in spec.phases)
        default = "on" if spec.default_enabled else "off"
        print(f"{spec.name:<{width}}  {default:<8} {spec.cost:<6} {phases:<40} {spec.summary}")
    return 0
