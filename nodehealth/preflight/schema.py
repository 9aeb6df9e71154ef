"""What rank 0 accepts from the other ranks' files: bounded, typed, printable (pure).

A rank's report, its peer view and rank 0's verdict come from another node over a shared file
system. Before anything of them is judged or printed, each goes through here: only JSON types,
nesting at most ``MAX_DEPTH``, at most ``MAX_ITEMS`` entries per list or object, every string
through the one ``printable()`` rule (``xid/text.py``: terminal escapes written as ``\\x1b``) and cut
(node names and facts at ``MAX_NAME``, texts at ``MAX_TEXT``), numbers finite. The fields the
judgement reads are checked for their type; a document that is not what a rank writes raises
``Invalid`` with the reason, and rank 0 names it as a finding instead of judging its content.
"""

from __future__ import annotations

import math
from typing import Any, Optional

from nodehealth.xid.text import printable

MAX_DEPTH = 8
MAX_ITEMS = 256
MAX_KEY = 64
MAX_NAME = 128  # a node name, a fact (a GPU model, a driver version)
MAX_TEXT = 1000  # a summary, an error
FACTS = ("driver", "cuda", "gpu_model", "gpu_count", "torch", "nccl", "kernel")


class Invalid(ValueError):
    """Not a document a rank writes; the message says what is wrong."""


def bounded(value: Any, depth: int = 0, limit: int = MAX_TEXT) -> Any:
    """``value`` with only JSON types, bounded in depth, size and text, every string printable."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value if abs(value) < 1 << 63 else None
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return printable(value, limit)
    if depth >= MAX_DEPTH:
        return None
    if isinstance(value, list):
        return [bounded(v, depth + 1, limit) for v in value[:MAX_ITEMS]]
    if isinstance(value, dict):
        out = {}
        for k, v in list(value.items())[:MAX_ITEMS]:
            if isinstance(k, str):
                out[printable(k, MAX_KEY)] = bounded(v, depth + 1, limit)
        return out
    return None


def _want(doc: dict[str, Any], key: str, kind: Any, what: str, required: bool = False) -> None:
    if key not in doc or doc[key] is None:
        if required:
            raise Invalid(f"no {key}")
        return
    if not isinstance(doc[key], kind) or (kind is int and isinstance(doc[key], bool)):
        raise Invalid(f"{key} is not {what}")


def _rank_of(doc: dict[str, Any], rank: int) -> None:
    _want(doc, "rank", int, "a number", required=True)
    if doc["rank"] != rank:
        raise Invalid(f"holds rank {doc['rank']}, not {rank}")


def report(doc: Any, rank: int) -> dict[str, Any]:
    """A rank's report (``r<rank>.json``), bounded and with the judged fields typed."""
    if not isinstance(doc, dict):
        raise Invalid("not a JSON object")
    out: dict[str, Any] = bounded(doc)
    _rank_of(out, rank)
    _want(out, "node", str, "a name")
    if out.get("node") is not None:
        out["node"] = printable(doc["node"], MAX_NAME)
    facts = out.get("facts")
    if facts is not None:
        if not isinstance(facts, dict):
            raise Invalid("facts is not an object")
        clean: dict[str, Any] = {}
        for key in FACTS:
            v = facts.get(key)
            if isinstance(v, str):
                clean[key] = printable(doc["facts"][key], MAX_NAME)
            elif isinstance(v, (int, float)) and not isinstance(v, bool) or v is None:
                clean[key] = v
            else:
                raise Invalid(f"facts.{key} is not a value")
        out["facts"] = clean
    for key, kind, what in (
        ("health", dict, "an object"),
        ("daemon_fault", dict, "an object"),
        ("paths", list, "a list"),
        ("nccl", dict, "an object"),
        ("drain", dict, "an object"),
        ("error", str, "a text"),
        ("expect_ib", bool, "true or false"),
    ):
        _want(out, key, kind, what)
    for key in ("health", "daemon_fault"):
        part = out.get(key) or {}
        _want(part, "results", list, "a list")
        if not all(isinstance(r, dict) for r in part.get("results") or ()):
            raise Invalid(f"{key}.results holds something else than results")
    nccl = out.get("nccl") or {}
    _want(nccl, "runs", list, "a list")
    for run in nccl.get("runs") or ():
        if not isinstance(run, dict) or not all(isinstance(p, str) for p in run.get("paths") or ()):
            raise Invalid("nccl.runs holds something else than runs")
    if not all(isinstance(p, dict) and isinstance(p.get("path"), str) for p in out.get("paths") or ()):
        raise Invalid("paths holds something else than paths")
    return out


def peer_view(doc: Any, rank: int) -> dict[str, Any]:
    """What a rank saw of its ring peers (``p<rank>.json``): ``peers`` maps a rank number to a text."""
    if not isinstance(doc, dict):
        raise Invalid("not a JSON object")
    out: dict[str, Any] = bounded(doc)
    _rank_of(out, rank)
    peers = out.get("peers")
    if not isinstance(peers, dict) or not all(
        k.isdigit() and len(k) < 10 and isinstance(v, str) for k, v in peers.items()
    ):
        raise Invalid("peers is not a map of rank numbers to what was seen")
    return out


def verdict(doc: Any) -> Optional[dict[str, Any]]:
    """Rank 0's verdict as a rank reads it: ``ok`` must be true or false (None: not a verdict);
    ``across`` true: every node passed, each now runs its part of the all-reduce."""
    if not isinstance(doc, dict) or not isinstance(doc.get("ok"), bool):
        return None
    return {"ok": doc["ok"], "across": True} if doc.get("across") is True else {"ok": doc["ok"]}


def across_part(doc: Any, rank: int) -> dict[str, Any]:
    """A rank's all-reduce summary (``a<rank>.json``, ``preflight.across``), bounded and typed."""
    if not isinstance(doc, dict):
        raise Invalid("not a JSON object")
    out: dict[str, Any] = bounded(doc)
    _rank_of(out, rank)
    for key, kind, what in (
        ("pairs", dict, "an object"),
        ("perf", dict, "an object"),
        ("errors", list, "a list"),
        ("gpus", int, "a number"),
        ("returncode", int, "a number"),
        ("timed_out", bool, "true or false"),
        ("truncated", bool, "true or false"),
        ("fatal", bool, "true or false"),
        ("setup_error", str, "a text"),
    ):
        _want(out, key, kind, what)
    if not all(isinstance(v, dict) for v in (out.get("pairs") or {}).values()):
        raise Invalid("pairs holds something else than links")
    if not 0 <= (out.get("gpus") or 0) <= 4096:
        raise Invalid("gpus is out of range")
    return out
