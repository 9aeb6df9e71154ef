"""Slurm's view of a node, parsed (pure): ``scontrol show node`` records and ``sinfo`` state words.

``scontrol show node -o`` lines (22.05 and later, and the old ``DOWN*`` layout) and ``sinfo``
state words become a ``NodeInfo`` with a base state and flags, the reason split from the
``[user@time]`` suffix Slurm adds, and the Gres GPU count. ``NodeInfo`` is the one shape of a
Slurm node in nodehealth: the ``slurm_node`` probe's observation, the client's answer, the
policy's input and (``to_json``/``from_json``) the cached copy in the Slurm state file.
"""

from __future__ import annotations

import re
from typing import Optional, Union

from nodehealth.observations.slurm import HANDS_OFF_FLAGS as HANDS_OFF_FLAGS
from nodehealth.observations.slurm import REBOOT_FLAGS as REBOOT_FLAGS
from nodehealth.observations.slurm import NodeInfo as NodeInfo
from nodehealth.observations.slurm import NodeState as NodeState
from nodehealth.observations.slurm import Reason as Reason
from nodehealth.observations.slurm import is_ours as is_ours
from nodehealth.observations.slurm import parse_reason as parse_reason
from nodehealth.observations.slurm import parse_state as parse_state

PREFIX = "nh:"  # the start of every drain reason nodehealth sets: ``nh:<code>[ GPU<i>] <check>: <summary>``
OLD_PREFIX = "nodehealth:"  # the start of the reasons of versions before the codes: still recognised as ours

# Drain-reason codes are the checks' own (``REASON`` in each check module), read through the registry
# by ``nodehealth.slurm.reasons``, which is above the registry; this module only knows their shape.

# ----------------------------------------------------------------------------- node states

_GRES_GPU = re.compile(r"(?:^|,)gpu(?::[A-Za-z0-9_.-]+)?:(\d+)")


def gres_gpu_count(gres: Optional[str]) -> Optional[int]:
    """``gpu:8``, ``gpu:h100:8(S:0-1)``, ``gpu:quadro:1(S:0),vmem:2G`` -> GPU count; None if no GPU gres."""
    if not gres or gres in ("(null)", "N/A"):
        return None
    found = [int(m.group(1)) for m in _GRES_GPU.finditer(gres)]
    return sum(found) if found else None


def node_fields(line: str) -> dict[str, str]:
    """``Key=Value`` pairs of a node record; ``Reason`` runs to the end of the record."""
    out: dict[str, str] = {}
    at = line.find("Reason=")
    while at > 0 and not line[at - 1].isspace():
        at = line.find("Reason=", at + 1)
    head, reason = (line, None) if at < 0 else (line[:at], line[at + len("Reason=") :])
    for token in head.split():
        key, sep, value = token.partition("=")
        if sep and key not in out:
            out[key] = value
    if reason is not None:
        out["Reason"] = reason.strip()
    return out


def parse_nodes(text: str) -> list[NodeInfo]:
    """All node records of ``scontrol show node`` output, one-line (``-o``) or multi-line.

    A record starts at ``NodeName=``; with the multi-line layout its continuation lines are
    joined (a ``Reason=`` line runs to its own end of line).
    """
    records: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith("NodeName="):
            records.append(line)
        elif records:
            if line.startswith("Reason="):
                # Multi-line layout: keep Reason last so it can run to the end.
                records[-1] = records[-1] + "\n" + line
            else:
                records[-1] = records[-1] + " " + line
    nodes = []
    for rec in records:
        head, _, reason_line = rec.partition("\nReason=")
        fields = node_fields(head)
        if reason_line:
            first, _, rest = reason_line.partition("\n")
            fields["Reason"] = first.strip()
            if rest:  # fields after the Reason line (rare): keep those we do not have yet
                for k, v in node_fields(rest.replace("\n", " ")).items():
                    fields.setdefault(k, v)
        name = fields.get("NodeName", "")
        if not name:
            continue
        nodes.append(
            NodeInfo(
                name=name,
                state=parse_state(fields.get("State", "")),
                reason=parse_reason(fields.get("Reason")),
                gres_gpus=gres_gpu_count(fields.get("Gres")),
                fields=fields,
            )
        )
    return nodes


# ``sinfo -h -N -n NODE -O <SINFO_FIELDS><end>``: one record per partition the node is in, the
# fields separated by ``|`` (none of the first five can hold one: a host name, a state word, the Gres
# string, a user name, a time) and the reason last, run to ``end``, a fresh random token per call:
# a reason may hold ``|`` and newlines (a forged record after a newline never ends with the token).
SINFO_FIELDS = "NodeList:|,StateComplete:|,Gres:|,User:|,Timestamp:|,Reason:"


def sinfo_format(end: str) -> str:
    """The ``-O`` argument for ``parse_sinfo_node``'s answer ending every record with ``end``."""
    return SINFO_FIELDS + end


def parse_sinfo_node(text: str, node: str, end: str) -> Union[NodeInfo, None, str]:
    """``node``'s record in ``sinfo -h -N -n NODE -O sinfo_format(end)`` output.

    A ``NodeInfo`` as ``parse_nodes`` gives it for ``scontrol show node -o NODE`` (the state
    upper-cased as scontrol writes it, the reason with its ``[user@time]`` suffix); None: no
    record of the node (sinfo lists only nodes in a partition); a string: why the answer is
    not one (a record that does not end with ``end``, too few fields, records that disagree).
    """
    if not end or not text.endswith(end + "\n") and not text.endswith(end):
        return "the answer does not end with its record end" if text.strip() else None
    found: Optional[NodeInfo] = None
    for rec in text[: text.rindex(end)].split(end + "\n"):
        parts = rec.split("|", 5)
        if len(parts) != 6:
            return f"a record of {len(parts)} field(s), not 6"
        name, state, gres, user, when, reason = (p.strip() for p in parts)
        if name != node:
            continue
        full: Optional[str] = reason
        if reason in ("", "none", "(null)"):
            full = None
        elif user and user not in ("(null)", "Unknown"):
            full = f"{reason} [{user}@{when}]"
        info = NodeInfo(
            name=name,
            state=parse_state(state.upper()),
            reason=None
            if full is None
            else Reason(full, reason, user if full != reason else None, when if full != reason else None),
            gres_gpus=gres_gpu_count(gres),
            fields={"NodeName": name, "State": state.upper(), "Gres": gres, "Reason": full or ""},
        )
        if found is not None and (found.state, found.reason, found.gres_gpus) != (
            info.state,
            info.reason,
            info.gres_gpus,
        ):
            return f"records of {node} that disagree"
        found = found or info
    return found


# ----------------------------------------------------------------------------- reconciliation jitter

RECONCILE_JITTER = 0.1  # a node's reconciliation falls due within ±10 % of [slurm] reconcile_s


def reconcile_after_s(node: str, reconcile_s: float, jitter: float = RECONCILE_JITTER) -> float:
    """How old this node's cached Slurm view may grow before the reconciliation reads it again.

    ``reconcile_s`` shifted by a per-node fraction in [-jitter, +jitter) of it, from a hash of the
    node name: stable for a node (across runs, faces and the daemon, and across Python processes:
    no ``hash()`` salt), spread uniformly over the nodes, so that nodes whose reads once fell due
    together drift apart instead of asking slurmctld at the same tick every period.
    """
    try:
        from _blake2 import blake2b  # hashlib's blake2b, without hashlib's OpenSSL (_hashlib)
    except ImportError:  # pragma: no cover - another interpreter
        from hashlib import blake2b

    digest = blake2b(node.encode("utf-8", "surrogateescape"), digest_size=8, person=b"nh-reconcile").digest()
    share = int.from_bytes(digest, "big") / float(1 << 64)  # [0, 1)
    return reconcile_s * (1.0 + jitter * (2.0 * share - 1.0))
