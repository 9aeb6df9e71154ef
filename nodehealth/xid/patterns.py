"""Every kernel-log pattern the XID watch knows: one table, each entry with its real sample lines.

An entry (``Pattern``) is a regex, what it is for (``role``), the literal text every line it
matches contains (``needles``; the scanner decodes only lines holding the first needle of an
event or context pattern), and sample lines with what each must give. Samples are published
kernel logs where one exists (the source names repository@commit:path, the same lines as
tests/fixtures/real-world/), else the driver's format as the tests spell it.
tests/test_xid_patterns.py checks every sample against its entry, and docs/xid.md's pattern
table is generated from this one (``pytest tests/test_xid_patterns.py --update-golden``).

Roles, in the order a line is read:

- ``event``: a line that reports a GPU fault. ``nodehealth.xid.parse`` tries them in table
  order, each anchored where the message starts (``MESSAGE_START``: right after the log
  format's prefix, and only when the message starts with the driver's tag, so that driver text
  quoted inside another record is never an event); the first that matches gives the event:
  the XID from the regex's ``xid`` group (else the entry's ``xid``), the GPU from ``pci``, the
  driver's text from ``payload`` (with the blamed process taken off its start when
  ``blames``), the time from the text before the match.
- ``context``: a line that reports nothing itself but names the GPU of a line that follows.
- ``part``: a piece of a payload (the blamed process, XID 154's recovery action, "Fatal").
- ``record``, ``wall clock``, ``uptime``: the prefixes that carry a line's sequence number and
  time (``/dev/kmsg`` records, dmesg, dmesg -T, syslog, journalctl), and where a message starts.

Pure: ``re`` only; no regex is compiled at import (``pattern_kit.Regex``: on first use). Adding a
kernel-log pattern is one entry here and its name in ``EVENTS_AND_CONTEXT``, or one entry in
``payload_parts.py`` (a part) or ``prefixes.py`` (a prefix; see docs/xid.md). What a pattern is and the
shared regex pieces: ``pattern_kit.py``.
"""

from __future__ import annotations

import re

from nodehealth.xid.events import FALLEN_OFF_BUS_XID, KIND_FALLEN_OFF_BUS, KIND_XID
from nodehealth.xid.pattern_kit import CATALOG_NOTES as CATALOG_NOTES
from nodehealth.xid.pattern_kit import CONTEXT as CONTEXT
from nodehealth.xid.pattern_kit import DRIVER_TAG as DRIVER_TAG
from nodehealth.xid.pattern_kit import EVENT as EVENT
from nodehealth.xid.pattern_kit import (
    FALLEN_TEXT,
    GPUD_KMSG_EXTENDED_TEST,
    GPUD_KMSG_TEST,
    GPUD_PSTORE,
    GPUD_XID119_LOG,
    M4_CHRONICLES,
    ML_ENGINEERING,
    NEWLINE,
    NVIDIA_GA100,
    NVIDIA_XID_DOC,
    OGKM_1150,
    PCI,
    REDACTED_PCI,
    TESTS,
    Regex,
    gives,
    no_match,
)
from nodehealth.xid.pattern_kit import KMSG_PATH as KMSG_PATH
from nodehealth.xid.pattern_kit import PART as PART
from nodehealth.xid.pattern_kit import RECORD as RECORD
from nodehealth.xid.pattern_kit import UPTIME as UPTIME
from nodehealth.xid.pattern_kit import WALL_CLOCK as WALL_CLOCK
from nodehealth.xid.pattern_kit import Pattern as Pattern
from nodehealth.xid.pattern_kit import Sample as Sample
from nodehealth.xid.payload_parts import FATAL as FATAL
from nodehealth.xid.payload_parts import PARTS
from nodehealth.xid.payload_parts import PROCESS as PROCESS
from nodehealth.xid.payload_parts import RECOVERY_ACTION as RECOVERY_ACTION
from nodehealth.xid.prefixes import CLOCKS, RECORDS
from nodehealth.xid.prefixes import CTIME as CTIME
from nodehealth.xid.prefixes import ISO as ISO
from nodehealth.xid.prefixes import KMSG_CONTINUATION as KMSG_CONTINUATION
from nodehealth.xid.prefixes import KMSG_RECORD as KMSG_RECORD
from nodehealth.xid.prefixes import MESSAGE_START as MESSAGE_START
from nodehealth.xid.prefixes import MONOTONIC as MONOTONIC
from nodehealth.xid.prefixes import SYSLOG as SYSLOG
from nodehealth.xid.sxid import SXID_LINE

# --------------------------------------------------------------------------- events

XID_LINE = Pattern(
    name="xid",
    role=EVENT,
    about="the Xid line `NVRM: Xid (<gpu>): <xid>, <payload>`, right at the message's start "
    "(`message_start`); the GPU is `PCI:dddd:bb:dd` (old drivers: "
    "no `PCI:`; MIG: a `GPU-I:nn` suffix; some samples: a function number; redacted by a reporter: "
    "`PCI:...` or `PCI:…`, the XID with the GPU unknown). Only the first Xid counts: "
    'payloads name other XIDs ("caused by previous Xid 149"); the number must end at a comma or the line',
    regex=Regex(
        DRIVER_TAG
        + r"[ \t]*Xid[ \t]*\((?:PCI:)?(?:(?P<pci>"
        + PCI
        + r")(?:\.[0-7])?(?:\s[^)]*)?|"
        + REDACTED_PCI
        + r")\):\s*"
        r"(?P<xid>\d{1,5})(?:\s*,\s*(?P<payload>.*)|\s*$)",
        re.DOTALL,
    ),
    needles=(DRIVER_TAG, "Xid"),
    kind=KIND_XID,
    blames=True,
    samples=(
        gives(
            "[Sun Feb 23 16:24:18 2025] NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, name=nvidia-smi, "
            "Timeout after 6s of waiting for RPC response from GPU4 GSP! Expected function 103 (GSP_RM_ALLOC) "
            "(0x2081 0x4).",
            GPUD_XID119_LOG + " (line 3)",
            xid=119,
            pci="0000:9b:00",
            pid=2024380,
            process="nvidia-smi",
            time="Sun Feb 23 16:24:18 2025",
        ),
        gives(
            "[Sun Feb 23 16:27:12 2025] NVRM: Xid (PCI:0000:9b:00): 119, pid=1263500, name=cache_mgr_main, "
            "Timeout after 6s of waiting for RPC response from GPU4 GSP! Expected function 76 (GSP_RM_CONTROL) "
            "(0x20801813 0x4c).",
            GPUD_XID119_LOG + " (line 42)",
            xid=119,
            pci="0000:9b:00",
            pid=1263500,
            process="cache_mgr_main",
        ),
        gives(
            "[171167.620236] NVRM: Xid (PCI:0009:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 01 "
            "(0x021425c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
            GPUD_KMSG_TEST,
            xid=149,
            pci="0009:01:00",
            pid=None,
            uptime_s=171167.620236,
            message="NETIR_LINK_EVT  Fatal   XC0 i0 Link 01 (0x021425c6 0x00000000 0x00000000 0x00000000 "
            "0x00000000 0x00000000)",
        ),
        gives(
            "[171167.621162] NVRM: Xid (PCI:0009:01:00): 154, GPU recovery action changed from 0x0 (None) "
            "to 0x4 (Drain and Reset)",
            GPUD_KMSG_TEST,
            xid=154,
            pci="0009:01:00",
            message="GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)",
        ),
        gives(
            "NVRM: Xid (PCI:0018:01:00): 145, pid=876767, name=ray::WorkerDict, RLW_RXPIPE Nonfatal XC0 i0 "
            "Link 13 (0x0409a0c2 0x00000008 0x00000001 0x00000000 0x00100000 0x00000004)",
            GPUD_KMSG_EXTENDED_TEST,
            xid=145,
            pci="0018:01:00",
            pid=876767,
            process="ray::WorkerDict",
            time=None,
        ),
        gives(
            "NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9). RST: No, D-RST: No",
            NVIDIA_GA100,
            xid=94,
            pci="0000:01:00",
            pid=7194,
            process=None,
            message="Contained: CE User Channel (0x9). RST: No, D-RST: No",
        ),
        gives(
            "NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu "
            "to activate.",
            ML_ENGINEERING + " (line 25)",
            xid=63,
            pci="0000:10:1c",
            pid=1896,
        ),
        gives(
            "Xid errors on instance: ip-26-0-146-100, Error: May 19 07:08:57 ip-26-0-146-100 kernel: "
            "[680111.646286] NVRM: Xid (PCI:0000:10:1c): 63, pid=1850, Row Remapper: New row marked for "
            "remapping, reset gpu to activate",
            M4_CHRONICLES + " (line 80)",
            xid=63,
            pci="0000:10:1c",
            time="May 19 07:08:57",
            uptime_s=680111.646286,
        ),
        gives(
            "[  123.456789] NVRM: Xid (0000:03:00): 13, 0003 00000000 0000a097 00001b0c 00000001 00000000",
            TESTS,
            xid=13,
            pci="0000:03:00",
            pid=None,
        ),
        gives(
            "NVRM: Xid (PCI:0000:b3:00.0): 79, pid=12345, GPU has fallen off the bus.",
            TESTS,
            xid=79,
            pci="0000:b3:00",
            kind=KIND_XID,
        ),
        gives(
            "NVRM: Xid (PCI:0009:0A:00): 74, pid=55, name=nccl, NVLink: fatal error detected on link 3",
            TESTS,
            xid=74,
            pci="0009:0a:00",
        ),
        gives(
            "[171167.9] NVRM: Xid (PCI:0009:01:00): 155, pid=1, name=x, NVLink SW error caused by previous Xid 149",
            TESTS,
            xid=155,
        ),
        gives("NVRM: Xid (PCI:0000:01:00): 62", TESTS, xid=62, message=""),
        gives(
            "kernel: NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001 caused by previous Xid 149",
            OGKM_1150,
            xid=45,
            pci="0000:dc:00",
            pid=1818990,
            process="python3",
            time=None,
        ),
        gives(
            "[\u2026] NVRM: Xid (0000:03:00): 14, Channel 00000001",
            NVIDIA_XID_DOC,
            xid=14,
            pci="0000:03:00",
            time=None,
            message="Channel 00000001",
        ),
        gives(
            "Feb 23 16:24:18 kernel: NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, name=nvidia-smi, Timeout",
            TESTS,
            xid=119,
            pci="0000:9b:00",
            time="Feb 23 16:24:18",
        ),
        gives(
            "[...] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.",
            TESTS,
            xid=79,
            pci="0000:3b:00",
        ),
        gives(
            "[  123.456789] NVRM: Xid (PCI:...): 79, pid=1234, name=python3, GPU has fallen off the bus.",
            TESTS,
            xid=79,
            pci=None,
            pid=1234,
        ),
        gives("NVRM: Xid (PCI:\u2026): 48, pid=7, name=a.out, DBE", TESTS, xid=48, pci=None),
        no_match("NVRM: Xid (PCI:redacted): 79, pid=1", TESTS),
        no_match("NVRM: Xid (PCI:0000:66:00): abc, pid=2280636", TESTS),
        no_match("[  94.5] NVRM: Xid (PCI:0000:3b", TESTS),
        no_match("kernel_failure_pattern='NVRM: Xid|CTX SWITCH TIMEOUT|NV_ERR_NO_MEMORY'", TESTS),
        no_match("The Xid 79 means the GPU has fallen off the bus; reboot the node.", TESTS),
        # Driver lines quoted inside other kernel records: a name the user chose (docs/xid.md).
        no_match(
            "4,2211,5123456789,-;process 'python3' launched 'NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, "
            "GPU has fallen off the bus.' with NULL argv: empty string added",
            TESTS,
        ),
        no_match(
            "May 19 07:08:57 gpu017 kernel: [ 5123.456789] audit: type=1400 audit(1716102537.123:412): "
            'apparmor="DENIED" operation="open" profile="/usr/bin/man" '
            'name="/tmp/NVRM:Xid(PCI:0000:1a:00):48,DBE" pid=2411 comm="man" requested_mask="r" '
            'denied_mask="r" fsuid=1000 ouid=1000',
            TESTS,
        ),
        no_match(
            "[ 5123.456789] EXT4-fs warning (device nvme0n1p1): ext4_dx_add_entry:2604: inode #1835009: comm "
            "python3: Directory index full! name 'NVRM: Xid (PCI:0000:3b:00): 79, x'",
            TESTS,
        ),
        no_match(
            "[Sun Feb 23 16:24:18 2025] audit: type=1326 audit(1740327858.123:77): auid=1000 uid=1000 gid=1000 "
            'ses=3 pid=4242 comm="python3" exe="/home/u/NVRM: Xid (PCI:0000:3b:00): 79, x" sig=31 '
            "arch=c000003e syscall=165 compat=0 ip=0x7f5e4d1e0b3a code=0x0",
            TESTS,
        ),
        no_match(
            "process 'python3' launched 'May 19 07:08:57 gpu017 kernel: NVRM: Xid (PCI:0000:3b:00): 79, x' "
            "with NULL argv: empty string added",
            TESTS,
        ),
        no_match(
            "[   12.345678] NVRM: API mismatch: the client has the version Xid (PCI:0000:3b:00): 79, x, but", TESTS
        ),
        no_match(
            "May 19 07:08:57 gpu017 root: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.",
            TESTS,
        ),
        no_match("               NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.", TESTS),
    ),
)

FALLEN_OFF_BUS = Pattern(
    name="fallen_off_bus",
    role=EVENT,
    about='"GPU has fallen off the bus" without an Xid line, reported as XID 79: the driver\'s message '
    "starts with those words or with the GPU they are about (`GPU <pci>:`, `GPU at PCI:<pci>:`, the "
    "three-line `The NVIDIA GPU <pci>` form in one record; dmesg prints that form as three lines: "
    "`nvidia_gpu` below), after at most a function name",
    # After the tag (its colon is not part of the payload): a function name, the GPU, the words.
    regex=Regex(
        DRIVER_TAG + r"[ \t]*(?P<payload>(?:[A-Za-z_]\w*:[ \t]+)?"
        r"(?:(?:The[ \t]+NVIDIA[ \t]+)?GPU[ \t]+(?:at[ \t]+)?(?:PCI:)?(?P<pci>" + PCI + r")(?:\.[0-7])?"
        r"(?::?[ \t]+(?:GPU[ \t]+)?has[ \t]+"
        r"|"
        + NEWLINE
        + DRIVER_TAG
        + r"[ \t]*\(PCI ID:[^)\\\n]{0,40}\)[^\\\n]{0,80}?has"
        + NEWLINE
        + DRIVER_TAG
        + r"[ \t]*))?"
        + FALLEN_TEXT
        + r".*)",
        re.DOTALL,
    ),
    needles=(DRIVER_TAG, FALLEN_TEXT),
    kind=KIND_FALLEN_OFF_BUS,
    xid=FALLEN_OFF_BUS_XID,
    samples=(
        gives(
            "[ 1843.308145] NVRM: GPU 0000:01:00.0: GPU has fallen off the bus.",
            TESTS,
            xid=79,
            pci="0000:01:00",
            kind=KIND_FALLEN_OFF_BUS,
            uptime_s=1843.308145,
            message="GPU 0000:01:00.0: GPU has fallen off the bus.",
        ),
        gives("NVRM: GPU at PCI:0000:3b:00: GPU has fallen off the bus.", TESTS, xid=79, pci="0000:3b:00"),
        gives("NVRM: GPU at 0000:01:00.0 has fallen off the bus", TESTS, xid=79, pci="0000:01:00"),
        # One /dev/kmsg record of the driver's three-line message (newlines escaped as \x0a).
        gives(
            "2,512,1843308145,-;NVRM: The NVIDIA GPU 0000:b3:00.0\\x0aNVRM: (PCI ID: 10de:26b5) installed in "
            "this system has\\x0aNVRM: fallen off the bus and is not responding to commands.",
            TESTS,
            xid=79,
            pci="0000:b3:00",
            seq=512,
            uptime_s=1843.308145,
        ),
        # The journal keeps the record's newlines.
        gives(
            "[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0\nNVRM: (PCI ID: 10de:26b5) installed in this "
            "system has\nNVRM: fallen off the bus and is not responding to commands.",
            TESTS,
            xid=79,
            pci="0000:b3:00",
            uptime_s=1843.308145,
        ),
        gives(
            "NVRM: fallen off the bus and is not responding to commands.",
            TESTS,
            xid=79,
            pci=None,
            message="fallen off the bus and is not responding to commands.",
        ),
        # A continuation line alone: dmesg's third line of the three-line form (``scan`` reads it
        # after its first line), or a newline in a name another record quoted.
        no_match("               NVRM: fallen off the bus and is not responding to commands.", TESTS),
        no_match("usb 1-1: device has fallen off the bus", TESTS),
        no_match(
            "6,2212,5123456790,-;process 'python3' launched 'NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.' "
            "with NULL argv: empty string added",
            TESTS,
        ),
        no_match(
            "[   12.345678] NVRM: API mismatch: the client has the version GPU has fallen off the bus, but", TESTS
        ),
        no_match("NVRM: Xid 79, GPU has fallen off the bus.", TESTS),
        no_match(
            "[Sun Feb 23 16:24:18 2025] NVRM: GPU at PCI:0000:9b:00: GPU-509665ad-b600-ac93-3616-d754b23d636d",
            GPUD_XID119_LOG + " (line 1)",
        ),
        no_match(
            "[Sun Feb 23 16:24:36 2025] NVRM: Rate limiting GSP RPC error prints for GPU at PCI:0000:9b:00 "
            "(printing 1 of every 30).  The GPU likely needs to be reset.",
            GPUD_XID119_LOG + " (line 41)",
        ),
        no_match(
            "[Sun Feb 23 16:24:18 2025] NVRM: GPU4 GSP RPC buffer contains function 103 (GSP_RM_ALLOC) and data "
            "0x0000000000002081 0x0000000000000004.",
            GPUD_XID119_LOG + " (line 4)",
        ),
        no_match(
            "<4>[ 1126.635824] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.144.03  Mon Dec 30 17:44:08 "
            "UTC 2024",
            GPUD_PSTORE + " (line 341)",
        ),
        no_match("[   12.345678] NVRM: GPU 0000:3b:00.0: RmInitAdapter failed! (0x26:0xffff:1489)", TESTS),
    ),
)

# --------------------------------------------------------------------------- context

NVIDIA_GPU = Pattern(
    name="nvidia_gpu",
    role=CONTEXT,
    about='first line of the three-line "fallen off the bus" message in dmesg; `scan` gives its GPU to a '
    "`fallen_off_bus` line without one that follows within 3 lines",
    regex=Regex(DRIVER_TAG + r" The NVIDIA GPU (?P<pci>" + PCI + r")(?:\.[0-7])?"),
    needles=(DRIVER_TAG + " The NVIDIA GPU",),
    samples=(
        gives("[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0", TESTS, pci="0000:b3:00"),
        no_match("               NVRM: (PCI ID: 10de:26b5) installed in this system has", TESTS),
    ),
)

# --------------------------------------------------------------------------- the table

# A new event or context pattern: its entry above and its name here (events are tried in this order).
# A new part of a payload: payload_parts.py; a new prefix: prefixes.py.
EVENTS_AND_CONTEXT: tuple[Pattern, ...] = (
    XID_LINE,
    FALLEN_OFF_BUS,
    SXID_LINE,
    NVIDIA_GPU,
)
PATTERNS: tuple[Pattern, ...] = EVENTS_AND_CONTEXT + PARTS + RECORDS + (MESSAGE_START,) + CLOCKS

EVENTS = tuple(p for p in PATTERNS if p.role == EVENT)  # tried in this order; the first match wins
WALL_CLOCKS = tuple(p for p in PATTERNS if p.role == WALL_CLOCK)  # likewise


def _anchors() -> tuple[str, ...]:
    """The pre-filter: a line can matter only if it holds one of these (redundant ones dropped)."""
    firsts = sorted({p.needles[0] for p in PATTERNS if p.role in (EVENT, CONTEXT)}, key=len)
    out: list[str] = []
    for text in firsts:
        if not any(a in text for a in out):
            out.append(text)
    return tuple(out)


ANCHORS = _anchors()


def markdown() -> str:
    """The pattern table of docs/xid.md (generated; a test keeps the document in step)."""
    rows = ["| pattern | role | what it reads | samples (published) |", "|---|---|---|---|"]
    for p in PATTERNS:
        real = sum(1 for s in p.samples if s.source not in (TESTS, CATALOG_NOTES))
        about = p.about.replace("|", "\\|")  # a table cell
        rows.append(f"| `{p.name}` | {p.role} | {about} | {len(p.samples)} ({real}) |")
    return "\n".join(rows) + "\n"
