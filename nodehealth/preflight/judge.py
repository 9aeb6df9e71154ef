"""Rank 0's judgement (pure): the reports and peer views become findings that each name a node.

A finding is FAIL or WARN, names the node (or ``job`` for the allocation) and says why. The
allocation fails when any finding is a FAIL. Consistency: for each fact, the value most nodes
report is the reference and every other node is named with its value (a tie names them all).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

# Facts that must agree (FAIL) and those where a difference is worth a look (WARN).
MUST_AGREE = ("driver", "cuda", "gpu_model", "gpu_count", "torch", "nccl")
SHOULD_AGREE = ("kernel",)
LABEL = {
    "driver": "NVIDIA driver",
    "cuda": "CUDA (driver API)",
    "gpu_model": "GPU model",
    "gpu_count": "GPU count",
    "torch": "torch",
    "nccl": "NCCL",
    "kernel": "kernel",
}


@dataclass(frozen=True)
class Finding:
    severity: str  # "FAIL" or "WARN"
    node: str  # a node name, or "job"
    text: str

    def line(self) -> str:
        return f"{self.severity} {self.node}: {self.text}"

    def to_json(self) -> dict[str, str]:
        return {"severity": self.severity, "node": self.node, "text": self.text}


def visibility(
    nodes: Sequence[str],
    reports: Mapping[int, Mapping[str, Any]],
    views: Mapping[int, Mapping[str, Any]],
    shared_dir: str,
    timeout_s: float,
) -> list[Finding]:
    """Who never reported, and who cannot see peers whose reports rank 0 read."""
    out = []
    n = len(nodes)
    others_seen = [r for r in reports if r != 0]
    if n > 1 and not others_seen:
        out.append(
            Finding(
                "FAIL",
                nodes[0],
                f"sees no other node's report in {shared_dir} within {timeout_s:g} s: "
                f"the directory is not shared with {nodes[0]}, or no other node ran",
            )
        )
    for r in range(n):
        if r not in reports and (others_seen or r == 0):
            watchers = sorted(w for w, v in views.items() if str(r) in (v.get("peers") or {}))
            seen_by = f"; not seen by {', '.join(nodes[w] for w in watchers)} either" if watchers else ""
            out.append(
                Finding(
                    "FAIL",
                    nodes[r],
                    f"no report in {shared_dir} within {timeout_s:g} s: "
                    f"{shared_dir} is not visible from {nodes[r]} (not the shared "
                    f"directory there), or {nodes[r]} is unreachable{seen_by}",
                )
            )
    for r, view in sorted(views.items()):
        if r not in reports:
            continue
        blind = [int(p) for p, got in (view.get("peers") or {}).items() if got != "ok" and int(p) in reports]
        if blind:
            names = ", ".join(nodes[p] for p in blind)
            out.append(
                Finding(
                    "FAIL", nodes[r], f"cannot see the files {names} wrote in {shared_dir} (visible to the first node)"
                )
            )
    for r in range(n):
        if r in reports and r not in views and r != 0:
            out.append(Finding("FAIL", nodes[r], f"reported, then stopped before its peer check ({shared_dir})"))
    return out


def local(node: str, rep: Mapping[str, Any]) -> list[Finding]:
    """A node's own results: health, paths, NCCL, a drain."""
    out = []
    h = rep.get("health") or {}
    for res in h.get("results") or ():
        sev = "FAIL" if res.get("fails") else "WARN"
        out.append(Finding(sev, node, f"{res.get('name')} {res.get('status')}: {res.get('summary')}"))
    d = rep.get("daemon_fault")
    if d:
        for res in d.get("results") or ():
            out.append(
                Finding(
                    "FAIL",
                    node,
                    f"{res.get('name')} FAIL in the daemon's verdict ({d.get('age_s')} s old): {res.get('summary')}",
                )
            )
    for p in rep.get("paths") or ():
        if not p.get("ok"):
            out.append(Finding("FAIL", node, f"{p['path']} not visible ({p.get('error')})"))
        elif p.get("local"):
            if p.get("kind") == "checkpoint":
                out.append(
                    Finding(
                        "FAIL",
                        node,
                        f"checkpoint/log dir {p['path']} is on node-local storage "
                        f"({p['local']}): lost with the node, not seen by the others",
                    )
                )
            else:
                out.append(
                    Finding(
                        "WARN",
                        node,
                        f"{p['path']} is on node-local storage ({p['local']}): each node reads its own copy",
                    )
                )
    nccl = rep.get("nccl")
    if nccl:
        if nccl.get("status") in ("FAIL", "UNKNOWN"):
            sev = "FAIL" if nccl.get("status") == "FAIL" else "WARN"
            out.append(Finding(sev, node, f"NCCL self-test {nccl['status']}: {nccl.get('summary')}"))
        elif nccl.get("status") == "SKIPPED":
            out.append(Finding("WARN", node, f"NCCL self-test not run: {nccl.get('summary')}"))
        for run in nccl.get("runs") or ():
            if rep.get("expect_ib") and run.get("transport") == "socket":
                out.append(
                    Finding(
                        "FAIL",
                        node,
                        f"NCCL {run.get('mode')} ({node}<->{node}) went over NET/Socket, "
                        f"not InfiniBand ({', '.join(run.get('paths') or [])})",
                    )
                )
    if rep.get("drain"):
        out.append(Finding("WARN" if rep["drain"].get("ok") else "FAIL", node, f"--drain: {rep['drain'].get('text')}"))
    if rep.get("error"):
        out.append(Finding("FAIL", node, f"preflight could not check this node: {rep['error']}"))
    return out


def consistency(reports: Mapping[int, Mapping[str, Any]], nodes: Sequence[str]) -> list[Finding]:
    out: list[Finding] = []
    if len(reports) < 2:
        return out
    for key in MUST_AGREE + SHOULD_AGREE:
        values = {r: (rep.get("facts") or {}).get(key) for r, rep in reports.items()}
        if key in ("torch", "nccl") and all(v is None for v in values.values()):
            continue
        count = Counter(str(v) for v in values.values())
        if len(count) < 2:
            continue
        (top, top_n), *rest = count.most_common()
        tie = rest and rest[0][1] == top_n
        sev = "FAIL" if key in MUST_AGREE else "WARN"
        for r, v in sorted(values.items()):
            if str(v) == top and not tie:
                continue
            shown = "not known" if v is None else str(v)
            ref = "no majority" if tie else f"{top_n} other node(s): {top}"
            out.append(Finding(sev, nodes[r], f"{LABEL[key]} {shown} ({ref})"))
    return out


def verdict(findings: Sequence[Finding]) -> dict[str, Any]:
    failed = sorted({f.node for f in findings if f.severity == "FAIL"})
    return {"ok": not failed, "failed_nodes": failed}


def render_text(
    nodes: Sequence[str], findings: Sequence[Finding], head: Mapping[str, Any], extras: Optional[Sequence[str]] = None
) -> str:
    lines = [
        f"nodehealth preflight: job {head.get('job')} step {head.get('step')}, {len(nodes)} node(s), "
        f"shared dir {head.get('shared_dir')}, {head.get('elapsed_s', 0):.2f} s"
    ]
    order = {n: i for i, n in enumerate(nodes)}
    groups: dict[tuple[str, str], list[str]] = {}
    for f in sorted(findings, key=lambda f: (f.severity != "FAIL", order.get(f.node, -1), f.text)):
        groups.setdefault((f.severity, f.text), []).append(f.node)
    for (sev, text), who in groups.items():  # the same finding on many nodes is one line
        lines.append(f"{sev} {_compress(who)}: {text}")
    named = {f.node for f in findings}
    for n in nodes:
        if n not in named:
            lines.append(f"OK   {n}")
    lines.extend(extras or ())
    v = verdict(findings)
    if v["ok"]:
        warns = sum(f.severity == "WARN" for f in findings)
        lines.append(f"verdict: PASS ({len(nodes)} node(s)" + (f", {warns} warning(s))" if warns else ")"))
    else:
        lines.append(f"verdict: FAIL ({len(v['failed_nodes'])} of {len(nodes)}: {', '.join(v['failed_nodes'])})")
    return "\n".join(lines) + "\n"


def _compress(names: Sequence[str]) -> str:
    if len(names) == 1:
        return names[0]
    import hostlist

    try:
        return str(hostlist.collect_hostlist(list(names)))
    except Exception:  # noqa: BLE001 - names hostlist cannot fold are listed as they are
        return ",".join(names)
