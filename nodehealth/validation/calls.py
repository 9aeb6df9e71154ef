"""A recording read back: ``calls.jsonl`` (``validation.record`` writes it and documents its records)
as one ``Call`` per call, its start merged with its return, the meta, the mapped libraries and the end.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Optional

from nodehealth.platform import ground

__all__ = ["CALLS_FILE", "MAX_RECORDING_BYTES", "Call", "Recording", "load", "parse", "read", "read_at"]

CALLS_FILE = "calls.jsonl"
MAX_RECORDING_BYTES = 256 << 20  # a node's whole reading is a few MiB


@dataclass
class Call:
    """One NVML call: its start record merged with its return (``returned`` False: it never did)."""

    seq: int
    fn: str
    gpu: Optional[int]
    args: list[str]
    argv: list[Any]
    returned: bool = False
    rc: Any = None
    error: Optional[str] = None
    value: Any = None
    value_type: Optional[str] = None
    out: list[Any] = field(default_factory=list)
    us: Optional[int] = None


@dataclass
class Recording:
    meta: dict[str, Any] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    libraries: list[str] = field(default_factory=list)
    end: dict[str, Any] = field(default_factory=dict)


def read(path: str) -> Recording:
    """The whole recording: meta, calls in order, mapped libraries, end."""
    with open(path, encoding="utf-8") as fh:
        return parse(fh.read())


def read_at(dir_fd: int, name: str = CALLS_FILE) -> Recording:
    """``read`` through our own directory's descriptor: a regular file of ours with one name, bounded."""
    data = ground.read_regular(name, MAX_RECORDING_BYTES, dir_fd=dir_fd, owner=os.geteuid())
    return parse(data.decode("utf-8", errors="replace"))


def parse(text: str) -> Recording:
    """A recording from the text of its calls.jsonl."""
    rec = Recording()
    by_seq: dict[int, Call] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        item = json.loads(line)
        kind = item.get("type")
        if kind == "meta":
            rec.meta = item
        elif kind == "start":
            call = Call(item["seq"], item["fn"], item.get("gpu"), item.get("args", []), item.get("argv", []))
            by_seq[call.seq] = call
            rec.calls.append(call)
        elif kind == "return" and item.get("seq") in by_seq:
            call = by_seq[item["seq"]]
            call.returned = True
            for key in ("rc", "error", "value", "value_type", "out", "us"):
                setattr(call, key, item.get(key))
        elif kind == "library":
            rec.libraries += [p for p in item.get("paths", []) if p not in rec.libraries]
        elif kind == "end":
            rec.end = item
    return rec


def load(path: str) -> list[Call]:
    return read(path).calls
