"""Slurm's view of a node, parsed (pure): ``scontrol show node`` records and ``sinfo`` state words.

``scontrol show node -o`` lines (22.05 and later, and the old ``DOWN*`` layout) and ``sinfo``
state words become a ``NodeInfo`` with a base state and flags, the reason split from the
``[user@time]`` suffix Slurm adds, and the Gres GPU count. ``NodeInfo`` is the one shape of a
Slurm node in nodehealth: the ``slurm_node`` probe's observation, the client's answer, the
policy's input and (``to_json``/``from_json``) the cached copy in the Slurm state file.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Union

PREFIX = "nh:"  # the start of every drain reason nodehealth sets: ``nh:<code>[ GPU<i>] <check>: <summary>``
OLD_PREFIX = "nodehealth:"  # the start of the reasons of versions before the codes: still recognised as ours

# ----------------------------------------------------------------------------- reason codes

# One short code per check, first in the drain reason, so that the 20 characters ``sinfo -R`` shows
# say what and where (``nh:rowremap GPU2 ...``). Stable: a code never changes meaning and is never
# reused for another check; a new check gets a new code. The table of docs/operations.md ("Reason
# codes") is this one (tests/test_slurm_policy.py compares them). An XID finding's code is ``xid``
# and its number (``nh:xid79``), from the result's ``details["xid"]``.
REASON_CODES: Mapping[str, tuple[str, str]] = {
    "job_forensics": ("jobecc", "an uncorrectable ECC increment during the job that just ended; xidN: XID N during it"),
    "nvml": ("nvml", "NVML missing, failing or not answering in time"),
    "gpu_count": ("gpucount", "not the GPUs the node should have (config, Slurm's Gres or the PCI bus)"),
    "gpu_driver": ("driver", "an NVIDIA driver the site does not allow"),
    "gpu_temperature": ("temp", "GPU or memory temperature past NVML's thresholds, slowdowns in force"),
    "gpu_ecc": ("ecc", "ECC off, uncorrectable errors, or error totals over thresholds"),
    "gpu_retired_pages": ("retired", "page retirement pending or over its limit (before Ampere)"),
    "gpu_remapped_rows": ("rowremap", "row remapping pending (reset) or failed (inspect)"),
    "gpu_pcie": ("pcie", "PCIe link below its width or generation"),
    "gpu_nvlink": ("nvlink", "NVLink links inactive or error counters over thresholds"),
    "gpu_fabric": ("fabric", "the GPU not registered with the NVSwitch fabric"),
    "gpu_recovery_action": ("recovery", "the driver's own recovery verdict (reset, reboot, drain)"),
    "gpu_persistence": ("persist", "persistence mode off"),
    "gpu_processes": ("procs", "a compute process no job owns (a stray), or one where the GPUs must be idle"),
    "gpu_xid": ("xid", "xidN: a drain-class XID number N; xid alone: the kernel log not read (policy.unknown = fail)"),
    "host_memory": ("memory", "less physical or available memory than the node should have"),
    "host_mounts": ("mount", "a required file system missing, of the wrong type, read-only or full"),
    "host_shared_dir": ("shareddir", "a shared directory not answering its round trip in time"),
    "host_infiniband": ("ib", "an InfiniBand port not active, down or below its rate"),
    "nccl_selftest": ("nccl", "the NCCL self-test below its bandwidth floor or on the wrong transport"),
}
# Codes that stand for a state of the drain instead of the check (the check's name still follows them).
STATE_CODES: Mapping[str, str] = {
    "flap": "the check drained the node too often ([resume] flap_drains within flap_window_s): held for a "
            "person, never resumed by nodehealth",
    "inspect": "[slurm] reboot_max reboots within reboot_window_s did not clear the check's fault ([slurm] reboot = "
               "\"asap\"): held for a person, no more reboots, never resumed by nodehealth",
}
XID_CODE_CHECKS = frozenset({"gpu_xid", "job_forensics"})  # checks whose result may name an XID number
_CODE = re.compile(r"[a-z][a-z0-9]{0,15}")
_OURS = re.compile(r"\s*(?:nh:[a-z][a-z0-9]{0,15}(?: |$)|nodehealth:)")


def reason_code(check: str, xid: Optional[int] = None) -> str:
    """The code of ``check``'s drain reason: the table's, ``xid<N>`` for an XID finding.

    A check missing from the table (none is: a test says so) gets its name, lower-cased and
    stripped to what a code may hold.
    """
    if check in XID_CODE_CHECKS and isinstance(xid, int) and not isinstance(xid, bool) and 0 <= xid < 100000:
        return f"xid{xid}"
    known = REASON_CODES.get(check)
    if known is not None:
        return known[0]
    code = "".join(ch for ch in check.lower() if ch.isascii() and ch.isalnum())[:16]
    return code if _CODE.fullmatch(code) else "check"


def reason_codes_table() -> list[str]:
    """The codes as the Markdown table of docs/operations.md ("Reason codes")."""
    rows = ["| code | check | what it means |", "|---|---|---|"]
    for check, (code, meaning) in REASON_CODES.items():
        shown = f"`nh:{code}`" + (" / `nh:xidN`" if check in XID_CODE_CHECKS else "")
        rows.append(f"| {shown} | `{check}` | {meaning} |")
    for code, meaning in STATE_CODES.items():
        rows.append(f"| `nh:{code}` | any | {meaning} |")
    return rows


# ----------------------------------------------------------------------------- node states

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
_BASE_STATES = {"IDLE", "ALLOCATED", "MIXED", "DOWN", "ERROR", "FUTURE", "UNKNOWN", "COMPLETING",
                "FAIL", "DRAIN", "DRAINED", "DRAINING", "RESERVED", "MAINT", "PLANNED", "INVAL"}
# Flags that mean a person or Slurm itself is working on the node: never resume it.
# Slurm is rebooting the node (scontrol reboot): it returns the node to service by itself when slurmd
# registers (nextstate=RESUME) or after a timed-out boot (ReturnToService), whatever our record says.
REBOOT_FLAGS = frozenset({"REBOOT_REQUESTED", "REBOOT_ISSUED"})
HANDS_OFF_FLAGS = frozenset({"REBOOT_REQUESTED", "REBOOT_ISSUED", "MAINTENANCE", "POWERED_DOWN",
                             "POWERING_DOWN", "POWER_DOWN", "POWERING_UP", "INVALID_REG"})
_REASON_SUFFIX = re.compile(r"^(?P<text>.*?)\s*\[(?P<user>[^\[\]@]*)@(?P<time>[^\[\]]*)\]\s*$", re.S)
_GRES_GPU = re.compile(r"(?:^|,)gpu(?::[A-Za-z0-9_.-]+)?:(\d+)")


@dataclass(frozen=True)
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


@dataclass(frozen=True)
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
    m = _REASON_SUFFIX.match(full)
    if m:
        return Reason(full, m.group("text").strip(), m.group("user") or None, m.group("time") or None)
    return Reason(full, full)


@dataclass(frozen=True)
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
        return {"name": self.name, "gres_gpus": self.gres_gpus, "state": self.state.text,
                "reason": self.reason.full if self.reason else None, "time": self.seen_at}

    @classmethod
    def from_json(cls, raw: Any) -> Optional[NodeInfo]:
        if not isinstance(raw, Mapping) or not isinstance(raw.get("name"), str) or not raw["name"]:
            return None
        gres = raw.get("gres_gpus")
        reason = raw.get("reason")
        seen = raw.get("time")
        return cls(name=raw["name"], state=parse_state(str(raw.get("state") or "")),
                   reason=parse_reason(reason if isinstance(reason, str) else None),
                   gres_gpus=gres if isinstance(gres, int) and not isinstance(gres, bool) else None,
                   seen_at=float(seen) if isinstance(seen, (int, float)) and not isinstance(seen, bool)
                   and seen == seen and abs(seen) < 1e12 else None)


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
    head, reason = (line, None) if at < 0 else (line[:at], line[at + len("Reason="):])
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
        nodes.append(NodeInfo(name=name, state=parse_state(fields.get("State", "")),
                              reason=parse_reason(fields.get("Reason")),
                              gres_gpus=gres_gpu_count(fields.get("Gres")), fields=fields))
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
        info = NodeInfo(name=name, state=parse_state(state.upper()),
                        reason=None if full is None else Reason(full, reason, user if full != reason else None,
                                                                when if full != reason else None),
                        gres_gpus=gres_gpu_count(gres),
                        fields={"NodeName": name, "State": state.upper(), "Gres": gres, "Reason": full or ""})
        if found is not None and (found.state, found.reason, found.gres_gpus) != (info.state, info.reason,
                                                                                    info.gres_gpus):
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
    digest = hashlib.blake2b(node.encode("utf-8", "surrogateescape"), digest_size=8,
                             person=b"nh-reconcile").digest()
    share = int.from_bytes(digest, "big") / float(1 << 64)  # [0, 1)
    return reconcile_s * (1.0 + jitter * (2.0 * share - 1.0))


def is_ours(reason: Optional[str]) -> bool:
    """A reason starts like ours: ``nh:<code>`` then a blank or the end, or the old ``nodehealth:``.

    Leading blanks are allowed. This is the shape only (the breaker's count of other nodes);
    a drain is ours only when the reason is exactly the one recorded (``policy.owns``).
    """
    return bool(reason) and _OURS.match(reason) is not None  # type: ignore[arg-type]
