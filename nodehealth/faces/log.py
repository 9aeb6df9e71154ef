"""The faces' log is ``nodehealth.platform.log.Log`` (``Log(face, job)``: stderr for slurmd, the journal with
structured fields, syslog for notable events without it); what is the faces' own here: which fast-path
misses an administrator should hear about."""

from __future__ import annotations

from nodehealth.platform.log import Log as Log

_NOTABLE = ("corrupt", "partial", "incomplete", "empty", "future", "unreadable", "larger than", "not a nodehealth")


def notable_miss(why: str) -> bool:
    """A reason the fast path was not taken that an administrator should hear about (syslog)."""
    return any(word in why for word in _NOTABLE)
