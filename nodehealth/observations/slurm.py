"""This node as Slurm describes it: the one shape of a Slurm node (``NodeInfo``), with its state
split into a base state and flags and its reason split from the ``[user@time]`` suffix Slurm adds.

The ``slurm_node`` probe's observation, the Slurm client's answer, the policy's input and, through
``to_json``/``from_json``, the cached copy in the Slurm state file. ``nodehealth.slurm.nodes`` parses
``scontrol``/``sinfo`` output into it. Pure; standard library only.
"""

from __future__ import annotations

import re
from dataclasses import field
from typing import Any, Mapping, Optional

from nodehealth.observations.record import record

# Regexes as strings, compiled by `re` on first use (and kept in its cache), not at import.
_OURS = r"\s*(?:nh:[a-z][a-z0-9]{0,15}(?: |$)|nodehealth:)"

# Suffix characters sinfo and old scontrol append to a state word (man sinfo, NODE STATE CODES).
_SUFFIX_FLAGS = {
    "*": "NOT_RESPONDING",
    "~": "POWERED_DOWN",
    "#": "POWERING_UP",
    "!": "POWER_DOWN",
    "%": "POWERING_DOWN",
    "$": "MAINTENANCE",
    "@": "REBOOT_REQUESTED",
    "^": "REBOOT_ISSUED",
    "-": "PLANNED",
}
# sinfo's compound words (long and short forms) -> (base state, flags).
_SINFO_WORDS = {
    "drained": ("IDLE", ("DRAIN",)),
    "drain": ("IDLE", ("DRAIN",)),
    "draining": ("MIXED", ("DRAIN",)),
    "drng": ("MIXED", ("DRAIN",)),
    "alloc": ("ALLOCATED", ()),
    "allocated": ("ALLOCATED", ()),
    "mix": ("MIXED", ()),
    "comp": ("COMPLETING", ()),
    "maint": ("IDLE", ("MAINTENANCE",)),
    "resv": ("IDLE", ("RESERVED",)),
    "reserved": ("IDLE", ("RESERVED",)),
    "boot": ("IDLE", ("REBOOT_ISSUED",)),
    "npc": ("IDLE", ("NOT_RESPONDING",)),
    "down": ("DOWN", ()),
    "fail": ("DOWN", ("FAIL",)),
    "failg": ("ALLOCATED", ("FAIL",)),
    "failing": ("ALLOCATED", ("FAIL",)),
    "unk": ("UNKNOWN", ()),
    "pow_dn": ("IDLE", ("POWERED_DOWN",)),
    "pow_up": ("IDLE", ("POWERING_UP",)),
    "inval": ("UNKNOWN", ("INVALID_REG",)),
    "plnd": ("IDLE", ("PLANNED",)),
}
_BASE_STATES = {
    "IDLE",
    "ALLOCATED",
    "MIXED",
    "DOWN",
    "ERROR",
    "FUTURE",
    "UNKNOWN",
    "COMPLETING",
    "FAIL",
    "DRAIN",
    "DRAINED",
    "DRAINING",
    "RESERVED",
    "MAINT",
    "PLANNED",
    "INVAL",
}
# Flags that mean a person or Slurm itself is working on the node: never resume it.
# Slurm is rebooting the node (scontrol reboot): it returns the node to service by itself when slurmd
# registers (nextstate=RESUME) or after a timed-out boot (ReturnToService), whatever our record says.
REBOOT_FLAGS = frozenset({"REBOOT_REQUESTED", "REBOOT_ISSUED"})
HANDS_OFF_FLAGS = frozenset(
    {
        "REBOOT_REQUESTED",
        "REBOOT_ISSUED",
        "MAINTENANCE",
        "POWERED_DOWN",
        "POWERING_DOWN",
        "POWER_DOWN",
        "POWERING_UP",
        "INVALID_REG",
    }
)
_REASON_SUFFIX = r"(?s)^(?P<text>.*?)\s*\[(?P<user>[^\[\]@]*)@(?P<time>[^\[\]]*)\]\s*$"


@record
class NodeState:
    """A Slurm node state split into its base state and its flags (upper case)."""

    text: str
    base: str
    flags: frozenset[str] = frozenset()

    @property
    def drained(self) -> bool:
        """The DRAIN flag is set (IDLE+DRAIN, MIXED+DRAIN, DOWN+DRAIN, drained, draining)."""
        return "DRAIN" in self.flags

    @property
    def responding(self) -> bool:
        return "NOT_RESPONDING" not in self.flags

    @property
    def hands_off(self) -> bool:
        """Reboot pending or issued, maintenance, power saving, invalid registration."""
        return bool(self.flags & HANDS_OFF_FLAGS)


def parse_state(text: str) -> NodeState:
    """``IDLE+DRAIN``, ``MIXED+DRAIN+NOT_RESPONDING``, ``DOWN*``, ``drained``, ``idle~``, ``DRAINED``."""
    raw = (text or "").strip()
    word = raw
    flags: set[str] = set()
    while word and word[-1] in _SUFFIX_FLAGS:
        flags.add(_SUFFIX_FLAGS[word[-1]])
        word = word[:-1]
    parts = [p for p in word.split("+") if p]
    if not parts:
        return NodeState(raw, "UNKNOWN", frozenset(flags))
    head = parts[0]
    lowered = head.lower()
    if head.islower() and lowered in _SINFO_WORDS:
        base, extra = _SINFO_WORDS[lowered]
        flags.update(extra)
    else:
        base = head.upper()
    flags.update(p.upper() for p in parts[1:])
    # Old and sinfo spellings of a drained node: DRAINED/DRAINING/DRAIN as the base word.
    if base in ("DRAIN", "DRAINED"):
        base, flags = "IDLE", flags | {"DRAIN"}
    elif base == "DRAINING":
        base, flags = "MIXED", flags | {"DRAIN"}
    elif base == "MAINT":
        base, flags = "IDLE", flags | {"MAINTENANCE"}
    elif base == "INVAL":
        base, flags = "UNKNOWN", flags | {"INVALID_REG"}
    elif base not in _BASE_STATES and base.lower() in _SINFO_WORDS:
        b, extra = _SINFO_WORDS[base.lower()]
        base, flags = b, flags | set(extra)
    return NodeState(raw, base, frozenset(flags))


@record
class Reason:
    """A Slurm node reason: free text and the ``[user@time]`` suffix Slurm adds."""

    full: str
    text: str
    user: Optional[str] = None
    time: Optional[str] = None

    @property
    def ours(self) -> bool:
        return is_ours(self.text)


def parse_reason(full: Optional[str]) -> Optional[Reason]:
    if full is None:
        return None
    full = full.strip()
    if not full or full in ("(null)", "none", "None"):
        return None
    m = re.match(_REASON_SUFFIX, full)
    if m:
        return Reason(full, m.group("text").strip(), m.group("user") or None, m.group("time") or None)
    return Reason(full, full)


@record
class NodeInfo:
    """One node as ``scontrol show node -o`` (or sinfo) describes it."""

    name: str
    state: NodeState
    reason: Optional[Reason] = None
    gres_gpus: Optional[int] = None
    fields: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)
    seen_at: Optional[float] = field(default=None, compare=False)  # Unix time slurmctld said so

    @property
    def drained(self) -> bool:
        return self.state.drained

    @property
    def drained_by_us(self) -> bool:
        return self.state.drained and self.reason is not None and self.reason.ours

    @property
    def drained_by_others(self) -> bool:
        return self.state.drained and not self.drained_by_us

    def fresh(self, now: float, max_age_s: float) -> bool:
        """slurmctld said so less than ``max_age_s`` ago (a view with no time is never fresh)."""
        return self.seen_at is not None and 0 <= now - self.seen_at < max_age_s

    def to_json(self) -> dict[str, Any]:
        """What the Slurm state file caches of this node (the prolog and epilog read it, no Slurm call)."""
        return {
            "name": self.name,
            "gres_gpus": self.gres_gpus,
            "state": self.state.text,
            "reason": self.reason.full if self.reason else None,
            "time": self.seen_at,
        }

    @classmethod
    def from_json(cls, raw: Any) -> Optional[NodeInfo]:
        if not isinstance(raw, Mapping) or not isinstance(raw.get("name"), str) or not raw["name"]:
            return None
        gres = raw.get("gres_gpus")
        reason = raw.get("reason")
        seen = raw.get("time")
        return cls(
            name=raw["name"],
            state=parse_state(str(raw.get("state") or "")),
            reason=parse_reason(reason if isinstance(reason, str) else None),
            gres_gpus=gres if isinstance(gres, int) and not isinstance(gres, bool) else None,
            seen_at=float(seen)
            if isinstance(seen, (int, float)) and not isinstance(seen, bool) and seen == seen and abs(seen) < 1e12
            else None,
        )


def is_ours(reason: Optional[str]) -> bool:
    """A reason starts like ours: ``nh:<code>`` then a blank or the end, or the old ``nodehealth:``.

    Leading blanks are allowed. This is the shape only (the breaker's count of other nodes);
    a drain is ours only when the reason is exactly the one recorded (``policy.owns``).
    """
    return bool(reason) and re.match(_OURS, reason) is not None  # type: ignore[arg-type]
