"""The one result type every face speaks: Status, Action, CheckResult, Report.

Pure data, no I/O: checks build these, faces (CLI, prolog, daemon) render or act on them.
"""

from __future__ import annotations

import enum
import re
from dataclasses import field
from typing import Any, Mapping, Optional, Sequence

from nodehealth.observations.action import Action as Action
from nodehealth.observations.record import record


class Status(enum.IntEnum):
    """Ordered severity: the worst result decides a node's verdict.

    SKIPPED means "not applicable here" (no such hardware, not supported by this GPU or
    driver), never "fine". UNKNOWN means nodehealth could not tell (its own failure, a probe
    error); it is worse than WARN but is not evidence of a node fault.
    """

    OK = 0
    SKIPPED = 1
    WARN = 2
    UNKNOWN = 3
    FAIL = 4

    @property
    def label(self) -> str:
        return self.name


def worst_action(actions: Sequence[Action]) -> Action:
    return max(actions, key=lambda a: a.rank, default=Action.NONE)


@record
class CheckResult:
    """The verdict of one check on this node.

    ``gpu`` is the NVML index of the (first) GPU the worst finding concerns, or None when
    the result is about the node as a whole. ``details`` is JSON-serialisable structured
    data (per-GPU findings live under ``details["gpus"]``). ``duration_s`` is wall time
    spent gathering and judging, filled in by the runner.
    """

    name: str
    status: Status
    summary: str
    action: Action = Action.NONE
    gpu: Optional[int] = None
    details: Mapping[str, Any] = field(default_factory=dict)
    duration_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status.name,
            "summary": self.summary,
            "action": self.action.value,
            "gpu": self.gpu,
            "details": dict(self.details),
            "duration_s": round(self.duration_s, 6),
        }


@record
class Finding:
    """One problem (or fact) a check found, before it is folded into a CheckResult."""

    status: Status
    message: str
    action: Action = Action.NONE
    gpu: Optional[int] = None


_GPU_MESSAGE = re.compile(r"^GPU (\d+): (.*)$", re.S)


def gpu_ranges(gpus: Sequence[int]) -> str:
    """0,1,2,3,5 -> "0-3,5"."""
    out: list[str] = []
    ordered = sorted(set(gpus))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)


def group_messages(messages: Sequence[str]) -> list[str]:
    """One line per distinct finding: "GPU 0: x", "GPU 1: x" -> "GPU 0-1: x" (first-seen order)."""
    groups: dict[str, list[int]] = {}
    order: list[tuple[str, bool]] = []
    for message in messages:
        m = _GPU_MESSAGE.match(message)
        if m is None:
            order.append((message, False))
            continue
        text = m.group(2)
        if text not in groups:
            groups[text] = []
            order.append((text, True))
        groups[text].append(int(m.group(1)))
    return [f"GPU {gpu_ranges(groups[text])}: {text}" if per_gpu else text for text, per_gpu in order]


def fold(
    name: str, findings: Sequence[Finding], ok_summary: str, details: Optional[Mapping[str, Any]] = None
) -> CheckResult:
    """Fold per-GPU findings into one result: worst status, its first GPU, all messages.

    With no findings worse than OK the result is OK with ``ok_summary``.
    """
    bad = [f for f in findings if f.status > Status.OK]
    if not bad:
        return CheckResult(name, Status.OK, ok_summary, details=dict(details or {}))
    worst = max(f.status for f in bad)
    top = [f for f in bad if f.status == worst]
    ordered = sorted(bad, key=lambda f: -f.status)  # most severe first, stable within a status
    summary = "; ".join(group_messages([f.message for f in ordered]))
    return CheckResult(
        name,
        worst,
        summary,
        action=worst_action([f.action for f in top]),
        gpu=top[0].gpu,
        details=dict(details or {}),
    )


@record
class Report:
    """The outcome of one run of the checks on one node, in registry order."""

    node: str
    phase: str
    results: tuple[CheckResult, ...]
    duration_s: float
    version: str
    started_at: float  # Unix time the run started
    # Where the GPUs were read from: "" for the real NVML, else its label (probes.source:
    # "simulated: <scenario>"), the one place a simulated run says so.
    source: str = ""

    @property
    def status(self) -> Status:
        """The node's verdict: the worst result, where "all fine or not applicable" is OK."""
        worst = max((r.status for r in self.results), default=Status.OK)
        return Status.OK if worst == Status.SKIPPED else worst

    @property
    def failures(self) -> tuple[CheckResult, ...]:
        return tuple(r for r in self.results if r.status == Status.FAIL)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Report:
        """Rebuild a ``Report`` from ``Report.to_json()`` output (the daemon's verdict file)."""
        results = []
        for c in raw.get("checks", ()):
            gpu = c.get("gpu")
            results.append(
                CheckResult(
                    name=str(c["name"]),
                    status=Status[str(c["status"])],
                    summary=str(c["summary"]),
                    action=Action(c.get("action", "none")),
                    gpu=gpu if isinstance(gpu, int) else None,
                    details=dict(c.get("details") or {}),
                    duration_s=float(c.get("duration_s", 0.0)),
                )
            )
        return cls(
            node=str(raw.get("node", "")),
            phase=str(raw.get("phase", "daemon")),
            results=tuple(results),
            duration_s=float(raw.get("duration_s", 0.0)),
            version=str(raw.get("version", "")),
            started_at=float(raw.get("started_at", 0.0)),
            source=str(raw.get("source", "")),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "phase": self.phase,
            "status": self.status.name,
            "duration_s": round(self.duration_s, 6),
            "version": self.version,
            "started_at": self.started_at,
            "source": self.source,
            "checks": [r.to_json() for r in self.results],
        }
