"""``nodehealth list-checks``: the registry, as a table."""

from __future__ import annotations

import argparse
import json
from typing import Any

from nodehealth.commands.options import add_format
from nodehealth.registry import CHECKS, PHASES


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "list-checks",
        help="list the checks nodehealth knows",
        description="Every check of this version: whether it runs by default, its cost, the phases it runs in, "
        "its probes and its timeout, then one line of what it judges. Reads no config and probes nothing. "
        "Exit 0, 2 usage error.",
    )
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


WIDTH = 100  # the text table's lines, at most (a terminal's 80 columns wrap; 100 is the project's limit)
COLUMNS = (("NAME", 20), ("DEFAULT", 8), ("COST", 6), ("TIMEOUT", 8), ("PHASES", 15))


def text(table: list[dict[str, Any]], width: int = WIDTH) -> str:
    """Each check as a row (name, default, cost, timeout, phases, then its probes, wrapped at commas)
    and its description on the lines below, indented; no line longer than ``width``."""
    import textwrap

    lead = sum(w for _, w in COLUMNS)
    lines = ["".join(f"{h:<{w}}" for h, w in COLUMNS) + "PROBES (+optional)"]
    for r in table:
        phases = r["phases"]
        where = "all" if len(phases) == len(PHASES) else ",".join(phases)
        cells = (r["name"], "on" if r["default"] else "off", r["cost"], f"{r['timeout_s']:g} s", where)
        row = "".join(f"{str(c):<{w - 1}} " for c, (_, w) in zip(cells, COLUMNS))
        probes = ", ".join(map(str, r["needs"])) + (f" (+{','.join(map(str, r['uses']))})" if r["uses"] else "")
        wrapped = textwrap.wrap(probes, width - lead, break_on_hyphens=False, break_long_words=False) or [""]
        lines.append(row + wrapped[0])
        lines += [" " * lead + more for more in wrapped[1:]]
        lines += textwrap.wrap(str(r["description"]), width, initial_indent="    ", subsequent_indent="    ")
    return "\n".join(line.rstrip() for line in lines)


def run(args: argparse.Namespace) -> int:
    table = rows()
    if args.format == "json":
        print(json.dumps(table, indent=2))
        return 0
    print(text(table))
    return 0
