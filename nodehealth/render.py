"""Reports for people (text, colour on a terminal unless NO_COLOR) and programs (JSON)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from nodehealth import SCHEMA_VERSION
from nodehealth.hints import hint
from nodehealth.model import CheckResult, Report, Status

_COLORS = {Status.OK: "32", Status.SKIPPED: "2", Status.WARN: "33", Status.UNKNOWN: "35", Status.FAIL: "1;31"}


def text(report: Report, color: bool = False, quiet: bool = False, verbose: bool = False) -> str:
    """One line per check (``quiet``: only those not OK or SKIPPED; ``verbose``: with details).

    Checks that say the same thing (WARN or worse, or SKIPPED, with the same status, summary, GPU and
    action: one cause, e.g. NVML not answering, or no GPU on this host) are one line at the first one's
    place, naming them all, with the part of their hints they share; ``verbose`` keeps one line per check.
    """
    width = max((len(r.name) for r in report.results), default=10)
    lines = [report.source] if report.source else []  # the header: where the GPUs were read from
    groups = {} if verbose else _groups(report.results)
    for r in report.results:
        if quiet and r.status < Status.WARN:
            continue
        same = groups.get(_cause(r), [r])
        if same[0] is not r:
            continue  # said on the first one's line
        label = _paint(f"{r.status.name:<7}", r.status, color)
        gpu = f"GPU {r.gpu}: " if r.gpu is not None and f"GPU {r.gpu}" not in r.summary else ""
        action = f"  [action: {r.action.value}]" if r.status >= Status.WARN else ""
        name = r.name if len(same) == 1 else f"{len(same)} checks"
        lines.append(f"{label} {name:<{width}}  {gpu}{r.summary}{action}")
        if len(same) > 1:
            lines.append(f"{'':7} {'':<{width}}  checks: {', '.join(x.name for x in same)}")
        tip = hint(r) if len(same) == 1 else _shared_hint(same)
        if tip:
            lines.append(f"{'':7} {'':<{width}}  -> {tip}")
        if verbose and r.details:
            lines.append(f"{'':7} {'':<{width}}  details: {json.dumps(r.details, default=_default)}")
    lines.append(verdict_line(report, color))
    return "\n".join(lines) + "\n"


def _cause(r: CheckResult) -> tuple[Any, ...]:
    return (r.status, r.summary, r.gpu, r.action)


def _groups(results: Iterable[CheckResult]) -> dict[tuple[Any, ...], list[CheckResult]]:
    """The results of WARN or worse, and the SKIPPED ones, by what they say; only causes two or more
    checks share (OK lines stay one per check: each says what it measured)."""
    by: dict[tuple[Any, ...], list[CheckResult]] = {}
    for r in results:
        if r.status >= Status.WARN or r.status == Status.SKIPPED:
            by.setdefault(_cause(r), []).append(r)
    return {k: v for k, v in by.items() if len(v) > 1}


def _shared_hint(same: list[CheckResult]) -> str:
    """The parts (``; ``-separated) every one of the checks' hints has, in the first one's order."""
    tips = [hint(r) or "" for r in same]
    common = set.intersection(*(set(t.split("; ")) for t in tips))
    return "; ".join(p for p in tips[0].split("; ") if p in common)


def verdict_line(report: Report, color: bool = False) -> str:
    status = report.status
    counts = {s: sum(1 for r in report.results if r.status == s) for s in Status}
    n = len(report.results)
    tail = f"{n} check{'' if n == 1 else 's'} in {report.duration_s:.2f} s"
    if status == Status.FAIL:
        first = report.failures[0]
        head = _paint("FAIL", status, color)
        more = f" (+{counts[Status.FAIL] - 1} more)" if counts[Status.FAIL] > 1 else ""
        return f"{report.node}: {head}: {first.name}: {first.summary} -> action {first.action.value}{more}; {tail}"
    word = status.name  # one word per status, as in JSON: OK, WARN, UNKNOWN (FAIL above)
    extra = []
    for s in (Status.UNKNOWN, Status.WARN, Status.SKIPPED):
        if counts[s]:
            extra.append(f"{counts[s]} {s.name.lower()}")
    detail = f" ({', '.join(extra)})" if extra else ""
    return f"{report.node}: {_paint(word, status, color)}{detail}; {tail}"


def as_json(report: Report) -> str:
    doc = {"schema_version": SCHEMA_VERSION, **report.to_json()}
    for entry, result in zip(doc.get("checks", []), report.results):
        tip = hint(result)
        if tip:
            entry["hint"] = tip
    return json.dumps(doc, indent=2, sort_keys=False, default=_default) + "\n"


def _default(obj: Any) -> Any:
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    return str(obj)


def _paint(word: str, status: Status, color: bool) -> str:
    return f"\033[{_COLORS[status]}m{word}\033[0m" if color else word
