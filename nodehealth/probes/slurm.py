"""This node as Slurm sees it, through ``scontrol show node -o`` (one line per node)."""

from __future__ import annotations

import re
import shlex
from typing import Optional, Union

from nodehealth.observations import ProbeError, SlurmNode
from nodehealth.probes.proc import CommandError, run

# Gres=gpu:8 | gpu:h100:8 | gpu:h100:8(S:0-1) | gpu:8,nic:1 ; GresUsed is a different key.
_GRES_GPU = re.compile(r"(?:^|,)gpu(?::[A-Za-z0-9_.-]+)?:(\d+)")


def parse_node_line(line: str) -> dict[str, str]:
    """``Key=Value`` pairs of one ``scontrol show node -o`` line; Reason runs to its end."""
    out: dict[str, str] = {}
    reason_at = line.find(" Reason=")
    head, reason = (line, None) if reason_at < 0 else (line[:reason_at], line[reason_at + 8:])
    for token in head.split():
        key, sep, value = token.partition("=")
        if sep:
            out[key] = value
    if reason is not None:
        out["Reason"] = reason.strip()
    return out


def gres_gpu_count(gres: Optional[str]) -> Optional[int]:
    if not gres or gres == "(null)":
        return None
    total = 0
    found = False
    for match in _GRES_GPU.finditer(gres):
        total += int(match.group(1))
        found = True
    return total if found else None


def show_node(scontrol: str, node: str, timeout_s: float) -> Union[SlurmNode, ProbeError]:
    try:
        res = run([scontrol, "show", "node", "-o", node], timeout_s)
    except CommandError as exc:
        return ProbeError("slurm_node", "unavailable", str(exc))
    if res.timed_out:
        return ProbeError("slurm_node", "timeout", f"{shlex.join(res.argv)} did not answer within {timeout_s:g} s")
    if res.returncode != 0:
        first = (res.stderr or res.stdout).strip().splitlines()
        return ProbeError("slurm_node", "error", f"scontrol exit {res.returncode}: {first[0] if first else ''}")
    for line in res.stdout.splitlines():
        fields = parse_node_line(line)
        if fields.get("NodeName") == node:
            reason = fields.get("Reason")
            return SlurmNode(name=node, gres_gpus=gres_gpu_count(fields.get("Gres")),
                             state=fields.get("State", ""), reason=reason or None)
    return ProbeError("slurm_node", "invalid", f"scontrol did not describe node {node}")
