"""A job's environment as data, and the job ledger's record, without heavy imports.

``sanitize`` and ``job_gpus`` are the Slurm policy's (``nodehealth.slurm.policy`` re-exports
them); they live here so the prolog's fast path can build its ledger record with ``str`` methods
alone (no ``re``, ``json``, ``dataclasses``, ``typing`` or ``nodehealth.model``; the ledger encodes it).
``record`` is the ledger's record format (``nodehealth.statedir.ledger``; docs/operations.md).
"""

from __future__ import annotations

from nodehealth.statedir.layout import valid_job_id

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Mapping, Optional

REASON_MAX = 200
LEDGER_VERSION = 1
LEDGER_FIELD_MAX = 128
# Control characters (C0, DEL, C1, line/paragraph separators) become a blank; quotes, backslash,
# "=", brackets and shell metacharacters are dropped. A translation table, not a regex: this module
# is on the prolog's fast path.
_CLEAN = {
    **{c: " " for c in (*range(0x00, 0x20), *range(0x7F, 0xA0), 0x2028, 0x2029)},
    **{ord(ch): None for ch in "\"'`\\$;|&<>=[]"},
}


def sanitize(text: str, limit: int = REASON_MAX) -> str:
    """One line of plain text ``scontrol`` takes as one argument and keeps intact.

    Control characters (newlines included) become a space, quotes, backslashes, ``=``,
    brackets and shell metacharacters are dropped, other non-ASCII characters become ``?``,
    runs of blanks collapse, and the text is cut at ``limit`` characters (with an ellipsis).
    """
    text = str(text).translate(_CLEAN)
    text = "".join(ch if " " <= ch <= "~" else "?" for ch in text)  # printable ASCII only
    text = " ".join(text.split())
    if len(text) > limit:
        text = text[: max(1, limit - 3)].rstrip() + "..."
    return text


def job_gpus(environ: Mapping[str, str]) -> Optional[tuple[int, ...]]:
    """The GPU indexes of a job from ``SLURM_JOB_GPUS`` (else ``CUDA_VISIBLE_DEVICES``).

    Data only: the value is parsed as a comma-separated list of integers; anything else
    (UUIDs, ``NoDevFiles``, junk) yields None, meaning "not known".
    """
    for var in ("SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES"):
        value = environ.get(var)
        if value is None:
            continue
        items = [v.strip() for v in value.split(",") if v.strip()]
        if items and all(v.isdigit() and len(v) <= 4 for v in items):
            return tuple(sorted({int(v) for v in items}))
        return None
    return None


def job_id(environ: Mapping[str, str]) -> Optional[str]:
    """The job id slurmd gives a prolog/epilog (``SLURM_JOB_ID``, older ``SLURM_JOBID``); None unless it is
    one (``statedir.layout.valid_job_id``: decimal, no sign, no leading zero, 1..4294967293)."""
    return valid_job_id(environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID") or "")


def _field(value: Optional[str]) -> Optional[str]:
    if value is None:
        return None
    text = sanitize(value, LEDGER_FIELD_MAX)
    return text or None


def record(
    event: str, environ: Mapping[str, str], now: float, node: Optional[str] = None, boot_id: Optional[str] = None
) -> Optional[dict[str, Any]]:
    """The ledger record (JSON object) for the job in a prolog/epilog environment; None without
    ``SLURM_JOB_ID`` or with one that is not a job id (``job_id``). Environment values are data:
    sanitised, length-capped, never interpreted."""
    job = job_id(environ)
    if job is None:
        return None
    uid_text = environ.get("SLURM_JOB_UID", "")
    uid = int(uid_text) if uid_text.isdigit() and len(uid_text) < 11 else None
    gpus = job_gpus(environ)
    return {
        "v": LEDGER_VERSION,
        "event": event,
        "job_id": job,
        "user": _field(environ.get("SLURM_JOB_USER")),
        "uid": uid,
        "gpus": list(gpus) if gpus is not None else None,
        "node": _field(node or environ.get("SLURMD_NODENAME")),
        "time": round(now, 3),
        "boot_id": boot_id,
    }
