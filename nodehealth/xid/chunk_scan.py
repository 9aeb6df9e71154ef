"""Kernel-log events from byte chunks at the speed of ``bytes.find``: what ``nodehealth xid scan`` reads
a recorded log (a file, standard input) with.

``scan_chunks(chunks)`` gives the events and the counts of ``parse.scan(parse.split_lines(chunks))``,
the line-by-line reader it stands in for (and which stays the reader of live sources). It searches
each run of whole lines for the markers (``MARKERS``: the pattern table's anchors, ``patterns.ANCHORS``,
the text every event or context line holds) and hands ``scan`` only the lines that hold one: a run
with no marker is counted and skipped whole. ``scan`` remembers the lines before a hit (the three-line
"fallen off the bus" record, the XID 79 it follows): it is given the hit lines with their distances,
a run of more than ``parse.MEMORY_LINES`` skipped lines standing in as that many empty lines. A marker
split across two chunks is found: only whole lines are searched, the cut line waits for its end.

The counts ``scan`` keeps for the lines it skips are kept here for the skipped runs: every line
(``lines``), lines over ``MAX_LINE_BYTES`` (``too_long``), and lines that are not text (``invalid``:
NUL bytes or invalid UTF-8). A run that has one of those (or a window of ``MAX_LINE_BYTES // 2`` bytes
without a newline, which every over-long line holds) goes to ``scan`` line by line, as before.
Pure: bytes in, events out.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Optional

from nodehealth.xid import patterns
from nodehealth.xid.events import XidEvent
from nodehealth.xid.parse import MAX_LINE_BYTES, MEMORY_LINES, ScanStats, scan

MARKERS: tuple[bytes, ...] = tuple(a.encode("utf-8") for a in patterns.ANCHORS)
# Every line longer than MAX_LINE_BYTES holds a whole window of this size, aligned to it, without a newline.
_WINDOW = MAX_LINE_BYTES // 2
_SPACERS = [b""] * MEMORY_LINES


class _Skipped:
    """The counts of what the chunk scanner read itself (``scan`` counts what it is handed)."""

    __slots__ = ("lines", "too_long", "invalid")

    def __init__(self) -> None:
        self.lines = 0  # every line read, handed on or not
        self.too_long = 0  # over-long lines cut at a chunk's end, never handed on
        self.invalid = 0


def scan_chunks(chunks: Iterable[bytes], stats: Optional[ScanStats] = None) -> Iterator[XidEvent]:
    """The events of the kernel log that ``chunks`` (bytes, cut anywhere) hold, in order.

    The same events as ``scan(split_lines(chunks), stats)``, and the same counts in ``stats`` once the
    chunks are read to their end.
    """
    st = stats if stats is not None else ScanStats()
    handed = ScanStats()
    own = _Skipped()
    try:
        for event in scan(_lines_that_matter(chunks, own), handed):
            st.events += 1
            yield event
    finally:
        st.lines += own.lines
        st.too_long += own.too_long + handed.too_long
        st.invalid += own.invalid + handed.invalid


def _next_marker(buf: bytes, start: int, found: list[int]) -> int:
    """Where the first marker at or after ``start`` is in ``buf``, -1 when there is none.

    ``found`` holds each marker's next place in ``buf`` (-2: not searched yet, -1: none left) and is kept
    up to date: a marker is searched for again only once ``start`` has passed it, so a marker that is
    absent costs one search of ``buf``, not one per hit of another marker.
    """
    first = -1
    for i, marker in enumerate(MARKERS):
        at = found[i]
        if at == -2 or 0 <= at < start:
            at = found[i] = buf.find(marker, start)
        if at >= 0 and (first < 0 or at < first):
            first = at
    return first


def _plain(buf: bytes) -> bool:
    """Whether every line of ``buf`` (whole lines) is text ``scan`` would read: no NUL byte, valid UTF-8,
    none over ``MAX_LINE_BYTES`` (a window without a newline sends the run line by line)."""
    if b"\0" in buf:
        return False
    if not buf.isascii():
        try:
            buf.decode("utf-8")
        except UnicodeDecodeError:
            return False
    if len(buf) > _WINDOW:
        find = buf.find
        for start in range(0, len(buf), _WINDOW):
            if find(b"\n", start, start + _WINDOW) < 0:
                return False
    return True


def _lines_that_matter(chunks: Iterable[bytes], own: _Skipped) -> Iterator[bytes]:
    """The lines ``scan`` must see, each after the empty lines that keep its distance to the last one."""
    carry = b""  # the start of a line whose end has not come yet
    dropping = False  # inside a line over MAX_LINE_BYTES, counted already; the rest of it is dropped
    n = 0  # lines read so far
    fed = 0  # the number of the last line handed to scan

    def run(buf: bytes) -> Iterator[bytes]:
        nonlocal n, fed
        if not _plain(buf):
            for line in buf.split(b"\n")[:-1]:
                n += 1
                gap = n - 1 - fed
                if gap:
                    yield from _SPACERS[: min(gap, MEMORY_LINES)]
                fed = n
                yield line[: MAX_LINE_BYTES + 1] if len(line) > MAX_LINE_BYTES else line
            return
        pos = 0
        found = [-2] * len(MARKERS)
        while True:
            hit = _next_marker(buf, pos, found)
            if hit < 0:
                n += buf.count(b"\n", pos)
                return
            newline = buf.rfind(b"\n", pos, hit)
            start = newline + 1 if newline >= 0 else pos
            end = buf.find(b"\n", hit)
            n += buf.count(b"\n", pos, start) + 1
            gap = n - 1 - fed
            if gap:
                yield from _SPACERS[: min(gap, MEMORY_LINES)]
            fed = n
            yield buf[start:end]
            pos = end + 1

    try:
        for chunk in chunks:
            if not chunk:
                continue
            if dropping:
                cut = chunk.find(b"\n")
                if cut < 0:
                    continue
                dropping = False
                n += 1  # the over-long line ends here
                chunk = chunk[cut + 1 :]
            last = chunk.rfind(b"\n")
            if last < 0:
                carry += chunk
            else:
                whole = chunk if last == len(chunk) - 1 else chunk[: last + 1]
                yield from run(carry + whole if carry else whole)
                carry = chunk[last + 1 :]
            if len(carry) > MAX_LINE_BYTES:
                own.too_long += 1
                carry, dropping = b"", True
        if dropping:
            n += 1  # the over-long last line, without its newline
        elif carry:
            yield from run(carry + b"\n")
    finally:
        own.lines = n
