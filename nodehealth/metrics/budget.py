"""The series budget: how many series the page carries, counted from the table (families.py).

docs/metrics.md's "Series budget" table is ``doc_table()``'s (tests/test_metrics.py checks it,
and checks a rendered 8-GPU round against ``count``). The count is for a healthy node: a
``quiet`` family (family.py) adds series only for what is not healthy, an ``event`` family only
after its events; with ``detail`` every sample is counted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from nodehealth.metrics.families import FAMILIES, INFO, Family

PROCESS_SERIES = 6  # ProcessCollector's process_* (CPU seconds, RSS, VSZ, fds, max fds, start time)
BUDGET = 200  # series of a default 8-GPU node (DESIGN.md: cardinality is a budget)
BUDGET_BYTES = 40_000  # bytes of its page


@dataclass(frozen=True)
class Node:
    """What a node has of each unit a family's series stand for (``Family.per``)."""

    gpus: int = 8
    links: int = 18  # NVLink links per GPU
    checks: int = -1  # checks of the daemon phase on by default (-1: counted from the registry)
    probes: int = -1  # probes those checks need or use (-1: counted from the registry)

    def __post_init__(self) -> None:
        if self.checks < 0 or self.probes < 0:
            from nodehealth.registry import CHECKS

            daemon = [c for c in CHECKS if c.default_enabled and "daemon" in c.phases]
            probes = {p for c in daemon for p in (*c.needs, *c.uses)}
            object.__setattr__(self, "checks", len(daemon) if self.checks < 0 else self.checks)
            object.__setattr__(self, "probes", len(probes) if self.probes < 0 else self.probes)

    modes: int = 0  # NCCL self-test modes (0: the self-test is off, the default)


REFERENCE = Node()  # an 8x H100 SXM5 node with the default configuration


def series(f: Family, node: Node, detail: bool = False) -> int:
    """Series of one family on a healthy ``node`` (per GPU for a per-GPU family)."""
    if not detail and (f.detail or f.quiet is not None):
        return 0
    units: Mapping[str, int] = {
        "": 1,
        "one": 1,
        "check": node.checks,
        "probe": node.probes,
        "link": node.links,
        "mode": node.modes,
        "event": 0,
    }
    n = units[f.per]
    if f.type != INFO and f.per != "one":
        for label, values in f.values.items():
            if label != f.per:
                n *= len(values if detail else f.default_values.get(label, values))
    return n


def count(node: Node = REFERENCE, detail: bool = False) -> tuple[int, int]:
    """(series per GPU, series of the whole node with its GPUs and process_*)."""
    per_gpu = sum(series(f, node, detail) for f in FAMILIES if f.per_gpu)
    rest = sum(series(f, node, detail) for f in FAMILIES if not f.per_gpu)
    return per_gpu, per_gpu * node.gpus + rest + PROCESS_SERIES


def _per(unit: str, detail: bool) -> int:
    """Series one more of ``unit`` adds (per GPU for ``link``)."""
    none = Node(gpus=1, links=0, checks=0, probes=0, modes=0)
    more = Node(
        gpus=1,
        links=int(unit == "link"),
        checks=int(unit == "check"),
        probes=int(unit == "probe"),
        modes=int(unit == "mode"),
    )
    return sum(series(f, more, detail) - series(f, none, detail) for f in FAMILIES if f.per == unit)


def doc_table(node: Node = REFERENCE) -> str:
    """The markdown table docs/metrics.md shows."""
    base = Node(gpus=1, links=0, checks=0, probes=0, modes=0)
    rows = ["| series | default | `metrics_detail = true` |", "|---|---|---|"]
    gpu = [count(base, d)[0] for d in (False, True)]
    link = [_per("link", d) for d in (False, True)]
    rows.append(f"| per GPU | {gpu[0]} | {gpu[1]} + {link[1]} per NVLink link |")
    for unit, what in (("check", "per check"), ("probe", "per probe"), ("mode", "per NCCL self-test mode")):
        rows.append(f"| {what} | {_per(unit, False)} | {_per(unit, True)} |")
    fixed = [count(Node(gpus=0, links=0, checks=0, probes=0, modes=0), d)[1] for d in (False, True)]
    rows.append(f"| the node's own (with {PROCESS_SERIES} `process_*`) | {fixed[0]} | {fixed[1]} |")
    total = [count(node, d)[1] for d in (False, True)]
    rows.append(
        f"| a node of {node.gpus} GPUs, {node.links} NVLink links each, {node.checks} checks, {node.probes} "
        f"probes, the NCCL self-test off | **{total[0]}** (budget {BUDGET}) | {total[1]} |"
    )
    return "\n".join(rows) + "\n"
