"""What a kernel-log pattern is (``Pattern``, its ``Sample`` lines, the roles), where its samples come
from, and the regex pieces the patterns share. Pure: ``re`` only, and no regex compiled at import
(``Regex``: a pattern's regex is compiled the first time a line is matched against it). The table is
``patterns.py`` (an event or context pattern), ``payload_parts.py`` (the parts of a payload) and
``prefixes.py`` (the prefixes that carry sequence and time, and where a message starts).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Generic, Optional, TypeVar

from nodehealth.observations.record import record

# The kernel's record device; its records' format is KMSG_RECORD below.
KMSG_PATH = "/dev/kmsg"

EVENT = "event"
CONTEXT = "context"
PART = "part"
RECORD = "record"
WALL_CLOCK = "wall clock"
UPTIME = "uptime"


AnyStr = TypeVar("AnyStr", str, bytes)


class Regex(Generic[AnyStr]):
    """A regex compiled on first use: the table's entries are built at import, their regexes are not.

    The methods a pattern's users call (``match``, ``search``, ``fullmatch``, ``pattern``, ``groupindex``,
    ``flags``)
    behave as those of the ``re.Pattern`` that ``compiled()`` returns; a hot loop takes ``compiled()``
    once.
    """

    __slots__ = ("pattern", "flags", "_compiled")

    def __init__(self, pattern: AnyStr, flags: int = 0) -> None:
        self.pattern: AnyStr = pattern
        self.flags = flags
        self._compiled: Optional[re.Pattern[AnyStr]] = None

    def compiled(self) -> re.Pattern[AnyStr]:
        compiled = self._compiled
        if compiled is None:
            compiled = self._compiled = re.compile(self.pattern, self.flags)
        return compiled

    def match(self, string: AnyStr, pos: int = 0) -> Optional[re.Match[AnyStr]]:
        return self.compiled().match(string, pos)

    def search(self, string: AnyStr, pos: int = 0) -> Optional[re.Match[AnyStr]]:
        return self.compiled().search(string, pos)

    def fullmatch(self, string: AnyStr) -> Optional[re.Match[AnyStr]]:
        return self.compiled().fullmatch(string)

    @property
    def groupindex(self) -> Mapping[str, int]:
        return self.compiled().groupindex

    def __repr__(self) -> str:
        return f"Regex({self.pattern!r}, {self.flags})"


@record
class Sample:
    """A line and what its pattern must make of it.

    ``gives``: for an event pattern, fields of the ``XidEvent`` that ``parse_line`` returns;
    for the others, groups of the regex's first match. None: no event / no match at all.
    """

    line: str
    gives: Optional[Mapping[str, Any]]
    source: str


@record
class Pattern:
    name: str
    role: str
    about: str
    regex: Regex[str]
    samples: tuple[Sample, ...]
    needles: tuple[str, ...] = ()
    kind: str = ""  # event: the XidEvent kind
    xid: Optional[int] = None  # event: the XID when the regex has no ``xid`` group
    blames: bool = False  # event: the payload may start with the blamed process (PROCESS)


def gives(line: str, source: str, **gives: Any) -> Sample:
    return Sample(line, gives, source)


def no_match(line: str, source: str) -> Sample:
    return Sample(line, None, source)


# --------------------------------------------------------------------------- sources

_GPUD = "leptonai/gpud@4a8de33a3f02e207f39e9023d67125592d599731:"
GPUD_XID119_LOG = _GPUD + "components/accelerator/nvidia/xid/testdata/dmesg-with-xid-119.log"
GPUD_KMSG_TEST = _GPUD + "components/accelerator/nvidia/xid/kmsg_test.go"
GPUD_KMSG_EXTENDED_TEST = _GPUD + "components/accelerator/nvidia/xid/kmsg_extended_test.go"
GPUD_PSTORE = _GPUD + "pkg/pstore/testdata/7530486857247/dmesg.txt"
NVIDIA_GA100 = (
    "NVIDIA/open-gpu-kernel-modules@448d5cc65624d3aa69015efa0d3fb50fd9729f41:"
    "src/nvidia/src/kernel/gpu/arch/ampere/kern_gpu_ga100.c (doc comment of _gpuGenerateErrorLog_GA100)"
)
ML_ENGINEERING = "stas00/ml-engineering@744d01e18b79512572f64a6bbd8b5f4a725203a7:compute/accelerator/nvidia/debug.md"
M4_CHRONICLES = "huggingface/m4-logs@6034608cda9b5c55f55a0559bcffabc7880c1dec:tr-190-80b/chronicles.md"
M4_JEANZAY = (
    "huggingface/m4-logs@6034608cda9b5c55f55a0559bcffabc7880c1dec:tr_141-hanging/"
    "tr_141_cm409xPMD01_scale_leap_of_faith_v5_num_workers_0-try3/dmesg.txt"
)
OGKM_1150 = (
    "https://github.com/NVIDIA/open-gpu-kernel-modules/issues/1150 (comment by jed-hacker, 2026-05-18; "
    "tests/fixtures/real-world/xid_lines_prefix_forms.jsonl)"
)
NVIDIA_XID_DOC = (
    'https://docs.nvidia.com/deploy/xid-errors/index.html ("Viewing Xid Error Messages"; '
    "tests/fixtures/real-world/xid_lines_prefix_forms.jsonl)"
)
GPUD_SXID_README = _GPUD + "components/accelerator/nvidia/sxid/README.md"
GPUD_SXID_KMSG_TEST = _GPUD + "components/accelerator/nvidia/sxid/kmsg_test.go"
TESTS = "tests/test_xid_parser.py (the driver's format, written by hand)"
CATALOG_NOTES = "nodehealth/data/xid_catalog.toml (154 entry: recovery-action names per driver)"

# --------------------------------------------------------------------------- building blocks

# A PCI address as the driver prints it: domain (4 digits, 8 in NVML's spelling), bus, device.
PCI = r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}"
FALLEN_TEXT = "fallen off the bus"
# The driver's tag: every line of its messages starts with it.
DRIVER_TAG = "NVRM:"
# The NVSwitch driver's tag (``nvidia-nvswitch<N>:``, N its device instance): its SXid lines start with it.
SWITCH_TAG = r"nvidia-nvswitch\d{1,3}:"

# The clocks of the log formats (the wall clocks are also the ``t`` groups of CTIME, ISO, SYSLOG).
MONO_CLOCK = r"\[\s*\d+\.\d+(?:\s*<\s*\d+\.\d+>)?\]"  # dmesg [   94.571234], dmesg -d [ 94.57 < 0.01>]
CTIME_CLOCK = r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4}"
RELTIME_CLOCK = r"\[(?:[A-Z][a-z]{2} ?[ \d]\d \d\d:\d\d|\s*\+\s*\d+\.\d+)\]"  # dmesg -e
ISO_CLOCK = r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?"
SYSLOG_CLOCK = (
    r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) [ \d]\d \d\d:\d\d:\d\d"
    r"(?:\.\d+)?"
)
KMSG_PREFIX = r"\d{1,4},\d{1,20},\d{1,20},[^;]{0,16};"
HOST_KERNEL = r"[ \t]+\S+[ \t]+kernel:"  # syslog and journalctl: the host, then the kernel's tag
# journalctl --no-hostname (and -o short-iso --no-hostname): the kernel's tag right after the clock
MAYBE_HOST_KERNEL = r"(?:[ \t]+\S+)?[ \t]+kernel:"
# A shipper or an alert that kept only the kernel's tag: "kernel: NVRM: ...", "kernel: [ 94.57] NVRM: ..."
KERNEL_TAG = r"kernel:"
# A document's excerpt with the timestamp elided: "[…] NVRM: ...", "[...] NVRM: ..."
ELIDED_CLOCK = r"\[[ \t]*(?:\u2026|\.\.\.)[ \t]*\]"
# A PCI token the reporter redacted: "(PCI:...)", "(PCI:…)": the XID counts, the GPU is unknown
REDACTED_PCI = r"(?:\.\.\.|\u2026)"
DMESG_LEVEL = r"[a-z]{2,8}[ \t]*:[a-z]{2,8}[ \t]*:[ \t]*"  # dmesg -x: "kern  :warn  : "
# Plain words before a quoted syslog line (a monitoring alert: "Xid errors on instance: h, Error:
# "): no quote, bracket, parenthesis, "=", ";" or backslash, which every kernel record that quotes
# a name has before the name, and no clock of its own (the first clock is the line's); like every
# prefix they start the line (an indented line continues a record).
PLAIN_WORDS = r"(?:(?!" + SYSLOG_CLOCK + "|" + ISO_CLOCK + r")[^'\"`=()\[\]{}<>;\\\n])*"
KERNEL_STAMP = r"[ \t]*(?:" + MONO_CLOCK + r"[ \t]*)?"  # syslog "kernel: [ 123.4] "
# A newline inside one record: escaped by /dev/kmsg, real in the journal, "#012" from rsyslog.
NEWLINE = r"(?:\\x0a|\n|#012)"
