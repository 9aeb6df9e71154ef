"""Drain reasons: the codes (each check's own, read through the registry) and the reason text.

Every drain reason nodehealth sets is ``nh:<code>[ GPU<i>] <check>: <summary>``: one short code
per check first, so that the 20 characters ``sinfo -R`` shows say what and where
(``nh:rowremap GPU2 ...``). A check declares its code beside its ``Settings`` and ``evaluate``
(``REASON = (code, meaning)`` in ``checks/<name>.py``); this module reads them through the
registry (``slurm.nodes``, below the registry, keeps the shape a reason of ours has). Stable: a
code never changes meaning and is never reused for another check (tests/golden/reason-codes.txt);
the table of docs/operations.md ("Reason codes") is ``reason_codes_table()``. An XID finding's
code is ``xid`` and its number (``nh:xid79``), from the result's ``details["xid"]``.
"""

from __future__ import annotations

import functools
import re
from dataclasses import replace
from typing import Mapping, Optional

from nodehealth.model import CheckResult
from nodehealth.registry import CHECKS
from nodehealth.slurm.jobenv import sanitize
from nodehealth.slurm.nodes import PREFIX

# Codes that stand for a state of the drain instead of the check (the check's name still follows them).
STATE_CODES: Mapping[str, str] = {
    "flap": "the check drained the node too often ([resume] flap_drains within flap_window_s): held for a "
    "person, never resumed by nodehealth",
    "inspect": "[slurm] reboot_max reboots within reboot_window_s did not clear the check's fault ([slurm] reboot = "
    '"asap"): held for a person, no more reboots, never resumed by nodehealth',
}
XID_CODE_CHECKS = frozenset({"gpu_xid", "job_forensics"})  # checks whose result may name an XID number
_CODE = re.compile(r"[a-z][a-z0-9]{0,15}")


@functools.lru_cache(maxsize=1)
def reason_codes() -> Mapping[str, tuple[str, str]]:
    """check -> (code, meaning), in the registry's order: each check module's ``REASON``."""
    return {spec.name: spec.reason for spec in CHECKS}


def reason_code(check: str, xid: Optional[int] = None) -> str:
    """The code of ``check``'s drain reason: its module's, ``xid<N>`` for an XID finding.

    A check that is not registered gets its name, lower-cased and stripped to what a code may hold
    (every registered check has a code of its own: a test says so).
    """
    if check in XID_CODE_CHECKS and isinstance(xid, int) and not isinstance(xid, bool) and 0 <= xid < 100000:
        return f"xid{xid}"
    known = reason_codes().get(check)
    if known is not None:
        return known[0]
    code = "".join(ch for ch in check.lower() if ch.isascii() and ch.isalnum())[:16]
    return code if _CODE.fullmatch(code) else "check"


def reason_codes_table() -> list[str]:
    """The codes as the Markdown table of docs/operations.md ("Reason codes")."""
    rows = ["| code | check | what it means |", "|---|---|---|"]
    for check, (code, meaning) in reason_codes().items():
        shown = f"`nh:{code}`" + (" / `nh:xidN`" if check in XID_CODE_CHECKS else "")
        rows.append(f"| {shown} | `{check}` | {meaning} |")
    for code, meaning in STATE_CODES.items():
        rows.append(f"| `nh:{code}` | any | {meaning} |")
    return rows


# ----------------------------------------------------------------------------- reason text

REASON_MAX = 200


def reason_head(result: CheckResult) -> str:
    """What and where, first in the reason: ``nh:ecc GPU6``, ``nh:xid79 GPU3``, ``nh:gpucount``.

    The code is the check's (its module's ``REASON``, ``reason_codes()``), ``xid<N>`` when the result names the XID of
    its worst finding (``details["xid"]``); the GPU is the result's ``gpu`` (the NVML index of the
    worst finding's GPU), absent when the result is about the node.
    """
    xid = result.details.get("xid") if isinstance(result.details, Mapping) else None
    head = PREFIX + reason_code(result.name, xid if isinstance(xid, int) else None)
    gpu = result.gpu
    if isinstance(gpu, int) and not isinstance(gpu, bool) and 0 <= gpu < 10000:
        head += f" GPU{gpu}"
    return head


def format_reason(result: CheckResult, limit: int = REASON_MAX, more: int = 0) -> str:
    """``nh:<code>[ GPU<i>] <check>: <summary>`` (plus ``(+N more)``), sanitised and capped.

    The first 20 characters (what ``sinfo -R`` shows) are the code and the GPU. A summary of
    several findings (``; ``-separated, most severe first) keeps as many *whole* findings as fit
    and says how many were left out; only a first finding too long by itself is cut.
    """
    head = reason_head(result)
    extra = f" (+{more} more)" if more > 0 else ""
    findings = result.summary.split("; ")
    for keep in range(len(findings), 0, -1):
        left = len(findings) - keep
        tail = (f" (+{left} more finding{'s' if left > 1 else ''})" if left else "") + extra
        text = sanitize(f"{head} {result.name}: {' / '.join(findings[:keep])}", limit) + tail  # ';' is dropped
        if len(text) <= limit and not text[: len(text) - len(tail)].endswith("..."):
            return text
    body = sanitize(f"{result.name}: {' / '.join(findings)}", limit)
    text = sanitize(f"{head} {body}", limit - len(extra)) + extra
    return text[:limit]


def span(seconds: float) -> str:
    """``6 h``, ``90 min``, ``45 s``: a window as people say it."""
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:.0f} h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:g} s"


FLAP_CODE = "flap"


def flap_summary(fault: CheckResult, drains: int, window_s: float) -> str:
    return f"flapping: {drains} drains in {span(window_s)}, resume by hand; {fault.summary}"


def flap_reason(fault: CheckResult, drains: int, window_s: float, limit: int = REASON_MAX, more: int = 0) -> str:
    """The reason of a drain held for a person: ``nh:flap[ GPU<i>] <check>: flapping: N drains in W /
    resume by hand / <the fault's findings>`` (``format_reason``'s shape, the code ``flap``)."""
    text = format_reason(replace(fault, summary=flap_summary(fault, drains, window_s)), limit - len(FLAP_CODE), more)
    own = reason_head(fault).split(" ", 1)[0]  # nh:<code>
    return PREFIX + FLAP_CODE + text[len(own) :] if text.startswith(own) else text
