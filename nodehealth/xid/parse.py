"""Kernel-log lines to XID events: pure, text in, events out, no I/O.

``parse_line`` and ``scan`` read every format a GPU worker's kernel log reaches us in, mixed
freely: raw ``/dev/kmsg`` records ``pri,seq,usec,flags;message`` (their `` KEY=value``
continuation lines ignored), ``dmesg`` (``[   94.571234] NVRM: ...``), ``dmesg -r``
(``<4>[...]``), ``dmesg -T``, ``dmesg --time-format=iso``, syslog files and ``journalctl -k``
text, and bare driver messages.

Only the driver's own records count: a line is read only when its message, right after the
prefix of its log format (``patterns.MESSAGE_START``), starts with the driver's tag ``NVRM:``.
The kernel quotes names users choose (exec's "launched '<file>' with NULL argv", audit's
``name="..."``), so a driver line inside another record is text, never an event. ``scan`` also
knows dmesg's and journalctl's continuation lines (indented, no prefix): they belong to the
record above them, and the one driver message that continues on them is the three-line
"fallen off the bus" form (``patterns.NVIDIA_GPU``); any other continuation line is skipped.

What a line may say is the pattern table, ``nodehealth.xid.patterns`` (every regex with its
real sample lines); this module applies it. The kernel log itself is read by
``nodehealth.probes.kernel_log``. Text taken from a line is made printable and bounded
(``nodehealth.xid.text``).
"""

from __future__ import annotations

import calendar
import datetime
import re
import time as _time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Optional, Union

from nodehealth.observations.record import record
from nodehealth.xid import patterns
from nodehealth.xid.events import FALLEN_OFF_BUS_XID, KIND_FALLEN_OFF_BUS, KIND_XID, XidEvent
from nodehealth.xid.pattern_kit import Regex
from nodehealth.xid.patterns import Pattern
from nodehealth.xid.text import MAX_MESSAGE_CHARS, MAX_PROCESS_CHARS, printable

# A kernel log line is at most ~1 KiB (kmsg records, with their dictionary, stay well below
# 8 KiB); anything far longer is junk or a concatenation accident and is skipped, counted.
MAX_LINE_BYTES = 64 * 1024

# Compiled on first use, as the table's regexes (importing the parser compiles nothing).
_ANCHOR_RE: Regex[str] = Regex("|".join(re.escape(a) for a in patterns.ANCHORS))
_ANCHOR_BYTES_RE: Regex[bytes] = Regex(_ANCHOR_RE.pattern.encode())
_MESSAGE_START = patterns.MESSAGE_START.regex
_TAG = patterns.DRIVER_TAG


@record
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
    head = prefix.lstrip()
    m = patterns.KMSG_RECORD.regex.match(head)
    if m:
        seq = int(m.group("seq"))
        usec = int(m.group("usec"))
        uptime_text = f"{usec // 1_000_000}.{usec % 1_000_000:06d}"
        prefix = head[m.end() :]
    mono = patterns.MONOTONIC.regex.search(prefix)
    if mono and uptime_text is None:
        uptime_text = mono.group("t")
    wall: Optional[str] = None
    for clock in patterns.WALL_CLOCKS:
        w = clock.regex.search(prefix)
        if w:
            wall = w.group("t")
            break
    uptime_s = float(uptime_text) if uptime_text is not None else None
    return _Stamp(time=wall if wall is not None else uptime_text, uptime_s=uptime_s, seq=seq)


_ISO_PARTS: Regex[str] = Regex(r"(\d{4}-\d\d-\d\d)[T ](\d\d:\d\d:\d\d)(?:[.,](\d+))?(Z|[+-]\d\d:?\d\d)?$")
_SYSLOG_FRACTION: Regex[str] = Regex(r"\.\d+$")
# A syslog stamp names no year: it is taken as the latest such moment not later than this after
# the reading (a clock a little ahead of ours is not last year's).
SYSLOG_AHEAD_S = 86400.0


def wall_clock_time(text: Optional[str], now: float) -> Optional[float]:
    """Unix time of a line's wall-clock stamp (``XidEvent.time``), None when it is none.

    ``dmesg -T`` (local time, with its year), ISO 8601 (its offset, else local time), and a
    syslog or journal stamp, which has no year: the latest moment with that date and time not
    later than ``SYSLOG_AHEAD_S`` after ``now`` (the reading). Seconds since boot are not a wall
    clock. Used to place an event in time (windows, which job ran then); the text itself is
    kept as written.
    """
    if not text:
        return None
    text = text.strip()
    try:
        st = _time.strptime(text, "%a %b %d %H:%M:%S %Y")
        return float(_time.mktime(st))
    except (ValueError, OverflowError):
        pass
    m = _ISO_PARTS.match(text)
    if m:
        date, clock, fraction, zone = m.groups()
        micro = int((fraction or "0")[:6].ljust(6, "0"))
        try:
            moment = datetime.datetime.fromisoformat(f"{date}T{clock}").replace(microsecond=micro)
        except ValueError:
            return None
        if zone is None:
            return _time.mktime(moment.timetuple()) + micro / 1e6
        if zone == "Z":
            offset = 0
        else:
            sign = -1 if zone[0] == "-" else 1
            digits = zone[1:].replace(":", "")
            offset = sign * (int(digits[:2]) * 3600 + int(digits[2:]) * 60)
        return calendar.timegm(moment.timetuple()) + micro / 1e6 - offset
    try:
        base = _time.strptime(_SYSLOG_FRACTION.compiled().sub("", text), "%b %d %H:%M:%S")
    except ValueError:
        return None
    year = _time.localtime(now).tm_year
    for candidate in (year + 1, year, year - 1, year - 2, year - 3, year - 4):
        try:
            moment = datetime.datetime(candidate, base.tm_mon, base.tm_mday, base.tm_hour, base.tm_min, base.tm_sec)
        except ValueError:  # 29 February of a year without one
            continue
        at = _time.mktime(moment.timetuple())
        if at <= now + SYSLOG_AHEAD_S:
            return at
    return None


def parse_line(line: str) -> Optional[XidEvent]:
    """The XID event one kernel-log line reports, or None.

    Never raises on any string. Non-Xid driver lines (banners, UUID lines, ``RmInitAdapter
    failed``, GSP RPC dumps, rate-limit notices) give None, and so does every line whose
    message does not start with the driver's tag (``patterns.MESSAGE_START``), among them an
    indented continuation line, which alone cannot say whose record it continues.
    """
    if _ANCHOR_RE.search(line) is None:
        return None
    if len(line) > MAX_LINE_BYTES:
        return None
    line = line.rstrip("\r\n")
    start = _MESSAGE_START.match(line)
    if start is None:
        return None
    return _driver_event(line, start.end())


def _driver_event(line: str, at: int) -> Optional[XidEvent]:
    """The event of a driver record whose tag starts at ``at``, or None."""
    for pattern in patterns.EVENTS:
        if all(needle in line for needle in pattern.needles):
            m = pattern.regex.match(line, at)
            if m:
                return _event(pattern, line, m)
    return None


def _continued_tag(line: str) -> int:
    """Where the driver's tag starts on an indented continuation line, -1 when it does not."""
    body = line.lstrip(" \t")
    return len(line) - len(body) if body.startswith(_TAG) else -1


_CONTINUED = patterns.FALLEN_OFF_BUS  # the one event a continuation line can carry


def _event(pattern: Pattern, line: str, m: re.Match[str]) -> XidEvent:
    """The event an event pattern's match describes (see ``nodehealth.xid.patterns``)."""
    groups = m.groupdict()
    payload = (groups.get("payload") or "").rstrip()
    pid: Optional[int] = None
    process: Optional[str] = None
    if pattern.blames:
        p = patterns.PROCESS.regex.match(payload)
        if p:
            if p.group("pid") is not None:
                pid = int(p.group("pid"))
            name = p.group("name")
            if name and name not in ("<unknown>", "'<unknown>'"):
                process = printable(name, MAX_PROCESS_CHARS)
            payload = payload[p.end() :]
    xid = groups.get("xid")
    pci = groups.get("pci")
    # The time is in the text before the match (the driver's "NVRM: " tag is not searched).
    stamp = _stamp(line[: m.start()])
    return XidEvent(
        xid=int(xid) if xid is not None else pattern.xid or 0,
        pci=pci.lower() if pci is not None else None,
        kind=pattern.kind,
        pid=pid,
        process=process,
        message=printable(payload.strip(), MAX_MESSAGE_CHARS),
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
_NVIDIA_GPU = patterns.NVIDIA_GPU
# The driver logs a lost GPU twice: "Xid (...): 79, GPU has fallen off the bus." and then
# "GPU <pci>: GPU has fallen off the bus.". Within this many lines after an XID 79 on the same
# GPU, the second line is the same fault and ``scan`` does not report it again.
_FALLEN_AFTER_XID79 = 10
# How far back ``scan`` remembers: lines further apart than this never change each other's events
# (``nodehealth.xid.chunk_scan`` stands in for a longer run of lines without a marker by this many).
MEMORY_LINES = max(_FALLEN_LOOKBACK, _FALLEN_AFTER_XID79, 1)
_INDENT = (" ", "\t")  # dmesg and journalctl indent the continuation lines of a record
_FALLEN_NEEDLE = patterns.FALLEN_OFF_BUS.needles[-1]


def scan(lines: Iterable[Line], stats: Optional[ScanStats] = None) -> Iterator[XidEvent]:
    """XID events from a stream of kernel-log lines (str or bytes, mixed formats).

    Unlike ``parse_line``, ``scan`` sees neighbouring lines: a bare "fallen off the bus"
    line that follows an XID 79 of the same GPU is not reported twice, the three-line
    form of that message is attributed to the GPU named on its first line, and an indented
    continuation line is read only for the lines of that form (the line before it is the
    form's first line or one of its lines, each with the driver's tag). Lines longer
    than ``MAX_LINE_BYTES``, invalid UTF-8 and binary junk are skipped and counted in
    ``stats`` (pass a ``ScanStats`` to read the counts afterwards).
    """
    st = stats if stats is not None else ScanStats()
    anchor_bytes, anchor_text = _ANCHOR_BYTES_RE.compiled().search, _ANCHOR_RE.compiled().search
    message_start = _MESSAGE_START.match
    nvidia_gpu_pci: Optional[str] = None
    nvidia_gpu_line = 0
    xid79_pci: Optional[str] = None
    xid79_line = -_FALLEN_AFTER_XID79
    form_line = -1  # the last line of a three-line "fallen off the bus" message read so far
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
                    if anchor_bytes(item) is None:
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
            if anchor_text(text) is None:
                continue
            text = text.rstrip("\r\n")
            if text.startswith(_INDENT):
                # A continuation line: its record is the line above (dmesg, journalctl).
                at = _continued_tag(text) if form_line == n - 1 else -1
                if at < 0:
                    continue
                form_line = n
                m = _CONTINUED.regex.match(text, at) if _FALLEN_NEEDLE in text else None
                if m is None:
                    continue
                event = _event(_CONTINUED, text, m)
            else:
                start = message_start(text)
                if start is None:
                    continue
                at = start.end()
                found = _driver_event(text, at)
                if found is None:
                    g = (
                        _NVIDIA_GPU.regex.match(text, at)
                        if all(needle in text for needle in _NVIDIA_GPU.needles)
                        else None
                    )
                    if g:
                        nvidia_gpu_pci = g.group("pci").lower()
                        nvidia_gpu_line = form_line = n
                    continue
                event = found
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
        for middle in parts[1:]:  # whole lines inside one chunk are capped too
            yield middle[: max_line_bytes + 1] if len(middle) > max_line_bytes else middle
        pending = tail
        if len(pending) > max_line_bytes:
            yield pending[: max_line_bytes + 1]
            pending = b""
            discarding = True
    if pending and not discarding:
        yield pending
