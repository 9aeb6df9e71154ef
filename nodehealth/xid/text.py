"""Kernel-log text made safe to print and bounded: ``nodehealth.observations.text`` (the XID event
type needs it, and observations import nothing of ours)."""

from __future__ import annotations

from nodehealth.observations.text import MAX_FIELD_CHARS as MAX_FIELD_CHARS
from nodehealth.observations.text import MAX_MESSAGE_CHARS as MAX_MESSAGE_CHARS
from nodehealth.observations.text import MAX_PROCESS_CHARS as MAX_PROCESS_CHARS
from nodehealth.observations.text import printable as printable
from nodehealth.observations.text import printable_or_none as printable_or_none
