"""The XID event: what one kernel-log line says about a GPU fault, plus what we make of it.

Pure data, no I/O. The parser (``nodehealth.xid.parse``) fills in what the line says;
``nodehealth.xid.catalog.enrich`` adds what the catalog and the node's GPU map say about it.
``nodehealth.xid.events`` re-exports it.
"""

from __future__ import annotations

import enum
from typing import Any, Optional

from nodehealth.observations.action import Action
from nodehealth.observations.record import record
from nodehealth.observations.text import MAX_FIELD_CHARS, MAX_MESSAGE_CHARS, MAX_PROCESS_CHARS, printable

KIND_XID = "xid"
KIND_FALLEN_OFF_BUS = "fallen_off_bus"

# "GPU has fallen off the bus" logged without an Xid line is the same fault as XID 79.
FALLEN_OFF_BUS_XID = 79


class Severity(str, enum.Enum):
    """How much an XID matters to the node, in increasing order.

    APPLICATION: the fault belongs to the job that caused it (bad kernel, illegal address);
    the node stays in service unless such faults repeat above the configured rate.
    WARNING: worth a look or a scheduled remedy, not a reason to stop taking jobs.
    DRAIN: the GPU cannot be trusted with the next job until the action is done.
    """

    APPLICATION = "application"
    WARNING = "warning"
    DRAIN = "drain"

    @classmethod
    def parse(cls, text: str) -> Severity:
        try:
            return cls(text)
        except ValueError:
            allowed = ", ".join(s.value for s in cls)
            raise ValueError(f"unknown severity {text!r} (expected one of: {allowed})") from None


@record
class XidEvent:
    """One GPU fault reported in the kernel log.

    Parsed from the line:
      ``xid``: the XID number (79 for a bare "GPU has fallen off the bus" line).
      ``pci``: the GPU's PCI address as ``dddd:bb:dd`` in lower case (domain, bus, device;
      no function), or None when the line does not name the GPU.
      ``kind``: ``"xid"`` or ``"fallen_off_bus"``.
      ``pid`` / ``process``: the process the driver blamed, None when absent or
      ``'<unknown>'``.
      ``message``: the payload after the XID number (or the whole driver message for
      ``fallen_off_bus``), as written.
      ``time``: the line's own timestamp text, exactly as given: the ``dmesg -T`` ctime, the
      syslog/journal date, an ISO stamp, or, when the line only has one, the monotonic
      seconds since boot (``/dev/kmsg`` microseconds are written as seconds, like dmesg).
      Never completed with a guessed year or date. None when the line has no timestamp.
      ``uptime_s``: seconds since boot when the line carries them (kmsg record or
      ``[ 94.57]`` prefix), else None.
      ``seq``: the ``/dev/kmsg`` sequence number of a raw record, else None.
      ``raw``: the line as read (trailing newline removed).

    Filled in by enrichment (None until then):
      ``gpu``: NVML index of the GPU at ``pci``; ``gpu_uuid``: its NVML UUID. ``job_id``: the Slurm job that was running
      the blamed process or on that GPU. ``severity`` / ``action``: our verdict from the
      catalog (for XID 154, from the recovery action the driver names). ``mnemonic``: the
      catalog's short name for the XID.
    """

    xid: int
    pci: Optional[str]
    kind: str = KIND_XID
    pid: Optional[int] = None
    process: Optional[str] = None
    message: str = ""
    time: Optional[str] = None
    uptime_s: Optional[float] = None
    seq: Optional[int] = None
    raw: str = ""
    gpu: Optional[int] = None
    job_id: Optional[str] = None
    gpu_uuid: Optional[str] = None
    severity: Optional[Severity] = None
    action: Optional[Action] = None
    mnemonic: Optional[str] = None

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable dict; stable keys, None where unknown; text printable and bounded
        (``nodehealth.xid.text``), whoever reads the JSON and prints a value of it."""
        return {
            "xid": self.xid,
            "pci": _text(self.pci),
            "gpu": self.gpu,
            "gpu_uuid": _text(self.gpu_uuid),
            "pid": self.pid,
            "process": _text(self.process, MAX_PROCESS_CHARS),
            "job_id": _text(self.job_id),
            "kind": printable(self.kind),
            "severity": self.severity.value if self.severity is not None else None,
            "action": self.action.value if self.action is not None else None,
            "mnemonic": _text(self.mnemonic),
            "message": printable(self.message, MAX_MESSAGE_CHARS),
            "time": _text(self.time),
            "uptime_s": self.uptime_s,
            "seq": self.seq,
        }


def _text(value: Optional[str], limit: int = MAX_FIELD_CHARS) -> Optional[str]:
    return printable(value, limit) if value is not None else None
