"""Kernel-log lines to XID events.

``parse_line`` and ``scan`` are pure: text in, events out, no I/O. They accept every format
a GPU worker's kernel log reaches us in, mixed freely:

- raw ``/dev/kmsg`` records ``pri,seq,usec,flags;message`` and their continuation lines
  (`` KEY=value``, ignored),
- ``dmesg`` (``[   94.571234] NVRM: ...``), ``dmesg -r`` (``<4>[...]``), ``dmesg -T``
  (``[Sun Feb 23 16:24:18 2025] NVRM: ...``), ``dmesg --time-format=iso``,
- syslog files and ``journalctl -k`` text (``May 19 07:08:57 host kernel: ...``, ISO dates too),
- bare driver messages (``NVRM: Xid (...): 94, ...``), also when quoted inside other text.

The one function here that touches the OS is ``read_kmsg_backlog``; it lives in the probe
layer for that reason and only hands lines to the pure functions.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Optional, Union

from nodehealth.xid.events import FALLEN_OFF_BUS_XID, KIND_FALLEN_OFF_BUS, KIND_XID, XidEvent

# A kernel log line is at most ~1 KiB (kmsg records, with their dictionary, stay well below
# 8 KiB); anything far longer is junk or a concatenation accident and is skipped, counted.
MAX_LINE_BYTES = 64 * 1024

_PCI = r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}"

# The Xid line. The driver prints "NVRM: Xid (<gpu>): <xid>, <payload>" where <gpu> is
#   PCI:0000:3b:00             current drivers
#   0000:03:00                 old drivers (no "PCI:" tag)
#   PCI:0000:01:00 GPU-I:05    a MIG GPU instance
#   PCI:0009:01:00             non-zero domains (Grace systems)
#   PCI:0000:b3:00.0           with a function number (seen in third-party samples)
# Samples:
#   NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, name=nvidia-smi, Timeout after 6s of waiting for
#       RPC response from GPU4 GSP! Expected function 103 (GSP_RM_ALLOC) (0x2081 0x4).
#   NVRM: Xid (PCI:0009:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 01 (0x021425c6 0x00000000 ...)
#   NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9). RST: No, D-RST: No
#   NVRM: Xid (PCI:0018:01:00): 145, pid=876767, name=ray::WorkerDict, RLW_RXPIPE Nonfatal XC0 i0 Link 13
#   NVRM: Xid (0000:03:00): 13, 0003 00000000 0000a097 00001b0c 00000001 00000000
# Only the first match counts: payloads mention other XIDs ("caused by previous Xid 149").
# The XID number must be followed by a comma or the end: "Xid (PCI:0000:66:00): abc" is not one.
_XID_RE = re.compile(
    r"Xid\s*\((?:PCI:)?(?P<pci>" + _PCI + r")(?:\.[0-7])?(?:\s[^)]*)?\):\s*"
    r"(?P<xid>\d{1,5})(?:\s*,\s*(?P<payload>.*)|\s*$)",
    re.DOTALL,
)

# The blamed process at the start of the payload:
#   pid=2024380, name=nvidia-smi, Timeout after 6s ...
#   pid=876767, name=ray::WorkerDict, RLW_RXPIPE Nonfatal ...
#   pid=7194, Contained: CE User Channel (0x9). ...          (no name)
#   pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0) ...
_PID_RE = re.compile(
    r"pid=(?:'?<unknown>'?|(?P<pid>\d+))\s*(?:,\s*|$)(?:name=(?P<name>[^,]*?)\s*(?:,\s*|$))?"
)

# "GPU has fallen off the bus" without an Xid line (reported as XID 79):
#   NVRM: GPU 0000:01:00.0: GPU has fallen off the bus.
#   NVRM: GPU at 0000:01:00.0 has fallen off the bus
#   NVRM: The NVIDIA GPU 0000:b3:00.0 (PCI ID: 10de:26b5) installed in this system has fallen off the bus
#       and is not responding to commands.     (one kmsg record; dmesg splits it in three lines:)
#   NVRM: The NVIDIA GPU 0000:b3:00.0
#   NVRM: (PCI ID: 10de:26b5) installed in this system has
#   NVRM: fallen off the bus and is not responding to commands.
_FALLEN_TEXT = "fallen off the bus"
_GPU_PCI_RE = re.compile(r"(?:PCI:)?(?P<pci>" + _PCI + r")(?:\.[0-7])?\b")
# First line of the three-line form, remembered by ``scan`` to name the GPU of the third.
_NVIDIA_GPU_RE = re.compile(r"NVRM: The NVIDIA GPU (?P<pci>" + _PCI + r")(?:\.[0-7])?")

# Prefixes that carry time and sequence. Each is searched only in the text before the match.
#   6,1234,94571234,-;NVRM: Xid (PCI:0000:3b:00): 79, ...      raw /dev/kmsg record
_KMSG_RE = re.compile(r"^\s*(?P<pri>\d{1,4}),(?P<seq>\d{1,20}),(?P<usec>\d{1,20}),[^;]{0,16};")
#    SUBSYSTEM=pci        continuation (dictionary) line of a /dev/kmsg record
_KMSG_DICT_RE = re.compile(r"^ [A-Z0-9_]+=")
#   [Sun Feb 23 16:24:18 2025] NVRM: ...        dmesg -T (day space-padded: "Wed Mar  1")
_CTIME_RE = re.compile(
    r"\[(?P<t>(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4})\]"
)
#   2025-02-23T16:24:18,123456+00:00 NVRM: ...            dmesg --time-format=iso
#   2025-02-23T16:24:18.123456+00:00 gpu01 kernel: ...    rsyslog RFC 3339, journalctl -o short-iso
_ISO_RE = re.compile(r"(?P<t>\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?)")
#   May 19 07:08:57 ip-26-0-146-100 kernel: [680111.646286] NVRM: Xid (PCI:0000:10:1c): 63, ...
#   Feb 23 16:24:18 gpu01 kernel: NVRM: Xid ...           journalctl -k (year not given: kept so)
_SYSLOG_RE = re.compile(
    r"(?P<t>(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) [ \d]\d \d\d:\d\d:\d\d(?:\.\d+)?)"
    r" \S+ kernel:"
)
#   [171167.620236] NVRM: ...     <4>[ 1126.635824] NVRM: ...     dmesg (seconds since boot)
_MONO_RE = re.compile(r"\[\s*(?P<t>\d+\.\d+)\]")


@dataclass(frozen=True)
class _Stamp:
    time: Optional[str] = None
    uptime_s: Optional[float] = None
    seq: Optional[int] = None


_NO_STAMP = _Stamp()


def _stamp(prefix: str) -> _Stamp:
    """Timestamp and kmsg sequence from the text before the driver message."""
    if not prefix.strip():
        return _NO_STAMP
    seq: Optional[int] = None
    uptime_text: Optional[str] = None
    m = _KMSG_RE.match(prefix)
    if m:
        seq = int(m.group("seq"))
        usec = int(m.group("usec"))
        uptime_text = f"{usec // 1_000_000}.{usec % 1_000_000:06d}"
        prefix = prefix[m.end():]
    mono = _MONO_RE.search(prefix)
    if mono and uptime_text is None:
        uptime_text = mono.group("t")
    wall: Optional[str] = None
    for regex in (_CTIME_RE, _ISO_RE, _SYSLOG_RE):
        w = regex.search(prefix)
        if w:
            wall = w.group("t")
            break
    uptime_s = float(uptime_text) if uptime_text is not None else None
    return _Stamp(time=wall if wall is not None else uptime_text, uptime_s=uptime_s, seq=seq)


def _is_candidate(line: str) -> bool:
    return "Xid" in line or "NVRM" in line


def parse_line(line: str) -> Optional[XidEvent]:
    """The XID event one kernel-log line reports, or None.

    Never raises on any string. Non-Xid driver lines (banners, UUID lines, ``RmInitAdapter
    failed``, GSP RPC dumps, rate-limit notices) give None.
    """
    if not _is_candidate(line):
        return None
    if len(line) > MAX_LINE_BYTES:
        return None
    line = line.rstrip("\r\n")
    if line.startswith(" ") and _KMSG_DICT_RE.match(line):
        return None
    m = _XID_RE.search(line)
    if m:
        return _xid_event(line, m)
    if _FALLEN_TEXT in line and "NVRM" in line:
        return _fallen_off_bus_event(line)
    return None


def _xid_event(line: str, m: re.Match[str]) -> XidEvent:
    payload = (m.group("payload") or "").rstrip()
    pid: Optional[int] = None
    process: Optional[str] = None
    p = _PID_RE.match(payload)
    if p:
        if p.group("pid") is not None:
            pid = int(p.group("pid"))
        name = p.group("name")
        if name and name not in ("<unknown>", "'<unknown>'"):
            process = name
        payload = payload[p.end():]
    # The driver's "NVRM: " tag is part of the prefix, not of the timestamp search.
    stamp = _stamp(line[: m.start()])
    return XidEvent(
        xid=int(m.group("xid")),
        pci=m.group("pci").lower(),
        kind=KIND_XID,
        pid=pid,
        process=process,
        message=payload,
        time=stamp.time,
        uptime_s=stamp.uptime_s,
        seq=stamp.seq,
        raw=line,
    )


def _fallen_off_bus_event(line: str) -> XidEvent:
    start = line.find("NVRM")
    body = line[start:]
    fallen_at = body.find(_FALLEN_TEXT)
    if fallen_at < 0:
        fallen_at = len(body)
    pci_match = _GPU_PCI_RE.search(body, 0, fallen_at)
    stamp = _stamp(line[:start])
    message = body[5:].strip() if body.startswith("NVRM:") else body.strip()
    return XidEvent(
        xid=FALLEN_OFF_BUS_XID,
        pci=pci_match.group("pci").lower() if pci_match else None,
        kind=KIND_FALLEN_OFF_BUS,
        message=message,
        time=stamp.time,
        uptime_s=stamp.uptime_s,
        seq=stamp.seq,
        raw=line,
    )


@dataclass
class ScanStats:
    """What ``scan`` saw: lines read, events found, lines skipped and why.

    ``too_long``: lines over ``MAX_LINE_BYTES``. ``invalid``: lines that are not text
    (invalid UTF-8 or NUL bytes). Skipped lines never raise.
    """

    lines: int = 0
    events: int = 0
    too_long: int = 0
    invalid: int = 0

    @property
    def skipped(self) -> int:
        return self.too_long + self.invalid


Line = Union[str, bytes, bytearray]

# How many lines after "NVRM: The NVIDIA GPU <pci>" a bare "fallen off the bus" line may
# come and still be attributed to that GPU (the driver prints the message as three lines).
_FALLEN_LOOKBACK = 3
# The driver logs a lost GPU twice: "Xid (...): 79, GPU has fallen off the bus." and then
# "GPU <pci>: GPU has fallen off the bus.". Within this many lines after an XID 79 on the same
# GPU, the second line is the same fault and ``scan`` does not report it again.
_FALLEN_AFTER_XID79 = 10


def scan(lines: Iterable[Line], stats: Optional[ScanStats] = None) -> Iterator[XidEvent]:
    """XID events from a stream of kernel-log lines (str or bytes, mixed formats).

    Unlike ``parse_line``, ``scan`` sees neighbouring lines: a bare "fallen off the bus"
    line that follows an XID 79 of the same GPU is not reported twice, and the three-line
    form of that message is attributed to the GPU named on its first line. Lines longer
    than ``MAX_LINE_BYTES``, invalid UTF-8 and binary junk are skipped and counted in
    ``stats`` (pass a ``ScanStats`` to read the counts afterwards).
    """
    st = stats if stats is not None else ScanStats()
    nvidia_gpu_pci: Optional[str] = None
    nvidia_gpu_line = 0
    xid79_pci: Optional[str] = None
    xid79_line = -_FALLEN_AFTER_XID79
    n = 0
    try:
        for item in lines:
            n += 1
            if isinstance(item, (bytes, bytearray)):
                if len(item) > MAX_LINE_BYTES:
                    st.too_long += 1
                    continue
                if b"\0" in item:
                    st.invalid += 1
                    continue
                if item.isascii():
                    # The cheap pre-filter: most kernel-log lines stop here, undecoded.
                    if b"Xid" not in item and b"NVRM" not in item:
                        continue
                    text = item.decode("ascii")
                else:
                    try:
                        text = item.decode("utf-8")
                    except UnicodeDecodeError:
                        st.invalid += 1
                        continue
            elif isinstance(item, str):
                if len(item) > MAX_LINE_BYTES:
                    st.too_long += 1
                    continue
                if "\0" in item:
                    st.invalid += 1
                    continue
                text = item
            else:
                st.invalid += 1
                continue
            if "Xid" not in text and "NVRM" not in text:
                continue
            event = parse_line(text)
            if event is None:
                g = _NVIDIA_GPU_RE.search(text) if "The NVIDIA GPU" in text else None
                if g:
                    nvidia_gpu_pci = g.group("pci").lower()
                    nvidia_gpu_line = n
                continue
            if (
                event.pci is None
                and event.kind == KIND_FALLEN_OFF_BUS
                and nvidia_gpu_pci is not None
                and n - nvidia_gpu_line <= _FALLEN_LOOKBACK
            ):
                event = _with_pci(event, nvidia_gpu_pci)
            if event.xid == FALLEN_OFF_BUS_XID:
                if event.kind == KIND_XID:
                    xid79_pci, xid79_line = event.pci, n
                elif n - xid79_line <= _FALLEN_AFTER_XID79 and event.pci in (xid79_pci, None):
                    continue
            st.events += 1
            yield event
    finally:
        st.lines += n


def _with_pci(event: XidEvent, pci: str) -> XidEvent:
    return replace(event, pci=pci)


def split_lines(chunks: Iterable[bytes], max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[bytes]:
    """Lines from a stream of byte chunks, without ever holding an over-long line.

    A line longer than ``max_line_bytes`` is yielded as its first ``max_line_bytes + 1``
    bytes, so ``scan`` counts it as too long; the rest of it is dropped as it arrives.
    """
    pending = b""
    discarding = False
    for chunk in chunks:
        if not chunk:
            continue
        parts = chunk.split(b"\n")
        if len(parts) == 1:
            if discarding:
                continue
            pending += chunk
            if len(pending) > max_line_bytes:
                yield pending[: max_line_bytes + 1]
                pending = b""
                discarding = True
            continue
        first = parts[0]
        if discarding:
            discarding = False
        else:
            first = pending + first
            yield first[: max_line_bytes + 1] if len(first) > max_line_bytes else first
        tail = parts.pop()
        yield from parts[1:]
        pending = tail
        if len(pending) > max_line_bytes:
            yield pending[: max_line_bytes + 1]
            pending = b""
            discarding = True
    if pending and not discarding:
        yield pending


class KernelLogUnavailable(Exception):
    """The kernel log could not be read; the message names the path and the reason."""


KMSG_PATH = "/dev/kmsg"
_KMSG_READ_SIZE = 64 * 1024  # a read shorter than the record fails with EINVAL


def read_kmsg_backlog(path: str = KMSG_PATH) -> Iterator[bytes]:
    """Lines of the kernel ring buffer as it is now, without waiting for new records.

    Opens ``path`` non-blocking and reads records until EAGAIN (or end of file, so a plain
    file of records works too). Records overwritten while reading (EPIPE) are skipped.
    Raises ``KernelLogUnavailable`` when the log cannot be opened or read.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise KernelLogUnavailable(_reason(path, exc)) from None
    try:
        # /dev/kmsg returns one whole record per read; a plain file returns arbitrary chunks.
        records = stat.S_ISCHR(os.fstat(fd).st_mode)
        yield from split_lines(_kmsg_chunks(fd, path, records))
    finally:
        os.close(fd)


def _kmsg_chunks(fd: int, path: str, records: bool) -> Iterator[bytes]:
    while True:
        try:
            chunk = os.read(fd, _KMSG_READ_SIZE)
        except BlockingIOError:
            return
        except OSError as exc:
            if exc.errno == errno.EPIPE:
                continue
            if exc.errno == errno.EAGAIN:
                return
            raise KernelLogUnavailable(_reason(path, exc)) from None
        if not chunk:
            return
        if records and not chunk.endswith(b"\n"):
            chunk += b"\n"
        yield chunk


def _reason(path: str, exc: OSError) -> str:
    reason = exc.strerror or str(exc)
    if exc.errno in (errno.EACCES, errno.EPERM):
        reason += " (reading the kernel log needs root or CAP_SYSLOG)"
    return f"cannot read {path}: {reason}"
