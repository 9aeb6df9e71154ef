"""The chunk scanner (``nodehealth.xid.chunk_scan``) gives what the line-by-line reader gives.

The reference is the reader it stands in for, ``scan(split_lines(chunks))`` (still the reader of the live
sources): the same events and the same counts on every recorded fixture, on every sample line of the
pattern table, on every cut of a real record into two chunks, and on fuzzed logs (real lines spliced with
noise, CRLF, invalid UTF-8, NUL bytes, over-long lines, indented continuation lines), at many chunk sizes.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodehealth.xid import chunk_scan, patterns
from nodehealth.xid.chunk_scan import MARKERS, scan_chunks
from nodehealth.xid.events import XidEvent
from nodehealth.xid.parse import MAX_LINE_BYTES, MEMORY_LINES, ScanStats, scan, split_lines

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "real-world"
SHARED = Path("/work/shared/fixtures/real-world")

Result = tuple[list[XidEvent], ScanStats]


def cut(data: bytes, size: int) -> Iterator[bytes]:
    for at in range(0, len(data), size):
        yield data[at : at + size]


def reference(chunks: list[bytes]) -> Result:
    stats = ScanStats()
    return list(scan(split_lines(iter(chunks)), stats)), stats


def chunked(chunks: list[bytes]) -> Result:
    stats = ScanStats()
    return list(scan_chunks(iter(chunks), stats)), stats


def assert_same(data: bytes, sizes: tuple[int, ...] = (1, 7, 64, 4096, 1 << 20)) -> Result:
    want = reference([data])
    for size in sizes:
        if size < 16 and len(data) > 20000:
            continue  # byte-sized chunks of a long log: the cut tests cover small chunks
        chunks = list(cut(data, size))
        assert chunked(chunks) == want, f"chunks of {size} bytes"
        assert reference(chunks) == want, f"the reference itself differs at chunks of {size} bytes"
    return want


def _jsonl_lines(path: Path) -> list[bytes]:
    return [json.loads(t)["line"].encode() for t in path.read_text(encoding="utf-8").splitlines() if t.strip()]


def fixture_logs() -> list[tuple[str, bytes]]:
    out = []
    for root in (FIXTURES, SHARED):
        if not root.is_dir():
            continue
        for path in sorted((root / "xid_logs").glob("*.log")):
            out.append((f"{root.parent.parent.name}/{path.name}", path.read_bytes()))
        for path in sorted(root.glob("*.jsonl")):
            out.append((f"{root.parent.parent.name}/{path.name}", b"\n".join(_jsonl_lines(path)) + b"\n"))
    return out


def sample_lines() -> list[bytes]:
    return [s.line.encode("utf-8") for p in patterns.PATTERNS for s in p.samples]


@pytest.mark.parametrize(("name", "data"), fixture_logs(), ids=[n for n, _ in fixture_logs()])
def test_every_fixture_gives_the_same_events(name: str, data: bytes) -> None:
    events, stats = assert_same(data)
    assert stats.lines == data.count(b"\n") + (0 if data.endswith(b"\n") else 1)


def test_the_fixture_with_events_gives_them() -> None:
    data = (FIXTURES / "xid_logs" / "gpud_dmesg_T_xid119_gsp_timeouts.log").read_bytes()
    events, _ = assert_same(data)
    assert events and all(e.xid == 119 for e in events)


def test_every_sample_line_of_the_table_gives_the_same_events() -> None:
    lines = sample_lines()
    events, _ = assert_same(b"\n".join(lines) + b"\n", sizes=(1, 5, 100, 1 << 16))
    assert events  # the table's samples hold events
    for line in lines:  # each alone, also without its newline
        assert_same(line, sizes=(3, 1 << 16))
        assert_same(line + b"\r\n", sizes=(3, 1 << 16))


# The three-line "fallen off the bus" record as dmesg prints it (its GPU on the first line), after an
# XID 79 of another GPU, with noise around: every cut of it into two chunks gives its events.
RECORD = (
    b"[ 1842.000001] eth0: link up\n"
    b"[ 1843.000000] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.\n"
    b"[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0\n"
    b"               NVRM: (PCI ID: 10de:26b5) installed in this system has\n"
    b"               NVRM: fallen off the bus and is not responding to commands.\n"
    b"[ 1843.400000] usb 1-1: device has fallen off the bus\n"
    b"[ 1844.000000] NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.\n"
)


def test_every_cut_of_a_real_record_gives_its_events() -> None:
    want = reference([RECORD])
    assert [(e.xid, e.pci) for e in want[0]] == [(79, "0000:3b:00"), (79, "0000:b3:00")]
    for at in range(len(RECORD) + 1):
        chunks = [RECORD[:at], RECORD[at:]]
        assert chunked(chunks) == want, f"cut at byte {at}"


def test_every_cut_of_a_marker_finds_it() -> None:
    line = b"4,1834,94571234,-;NVRM: Xid (PCI:0000:3b:00): 48, pid=9, name=a.out, DBE\n"
    data = b"x" * 100 + b"\n" + line + b"y" * 50 + b"\n"
    at = data.index(b"NVRM:")
    for first in range(at - 2, at + 7):
        for second in range(first, at + 8):
            chunks = [data[:first], data[first:second], data[second:]]
            events, _ = chunked(chunks)
            assert [e.xid for e in events] == [48], (first, second)


@pytest.mark.parametrize("gap", range(0, MEMORY_LINES + 6))
def test_the_distance_between_hits_is_kept(gap: int) -> None:
    # scan reports a bare "fallen off the bus" line within MEMORY_LINES lines of an XID 79 of the same
    # GPU once: the lines without a marker between them count, however many the scanner skips.
    noise = b"".join(b"[  10.%06d] eth0: noise\n" % i for i in range(gap))
    data = (
        b"[   1.0] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.\n"
        + noise
        + b"[   2.0] NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.\n"
    )
    events, _ = assert_same(data, sizes=(1 << 16, 9))
    assert len(events) == (1 if gap + 1 <= MEMORY_LINES else 2)


def test_the_three_line_form_after_skipped_lines_keeps_its_gpu() -> None:
    noise = b"[   1.5] eth0: noise\n" * 500
    data = (
        noise
        + b"[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0\n"
        + b"               NVRM: (PCI ID: 10de:26b5) installed in this system has\n"
        + b"               NVRM: fallen off the bus and is not responding to commands.\n"
        + noise
    )
    events, _ = assert_same(data, sizes=(1 << 16, 4096, 333))
    assert [e.pci for e in events] == ["0000:b3:00"]


NOISE = [
    b"[   12.345678] eth0: renamed from veth1234",
    b"[Sun Feb 23 16:24:18 2025] usb 1-1: new high-speed USB device number 2 using xhci_hcd",
    b"6,2212,5123456790,-;systemd[1]: Started Session 3 of user root.",
    b" SUBSYSTEM=pci",
    b"               continued text",
    b"\tindented with a tab",
    b"",
    b"Feb 23 16:24:18 gpu017 kernel: audit: type=1400",
    "[   13.0] caf\u00e9 ok \u2026 utf-8".encode(),
    b"[   13.1] invalid \xff\xfe utf-8",
    b"[   13.2] a NUL \x00 byte",
    b"[   13.3] NVRM with no colon",
    b"NVRM",
    b"[   13.4] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.144.03",
    b"[   13.5] NVRM: \xff invalid after the marker",
    b"[   13.6] NVRM: \x00 NUL after the marker",
]


def fuzz_log(rng: random.Random, real: list[bytes]) -> bytes:
    lines = []
    for _ in range(rng.randint(0, 120)):
        roll = rng.random()
        if roll < 0.35:
            line = rng.choice(real)
        elif roll < 0.9:
            line = rng.choice(NOISE)
        elif roll < 0.95:
            a, b = rng.choice(real), rng.choice(real + NOISE)  # a splice of two lines
            line = a[: rng.randint(0, len(a))] + b[rng.randint(0, len(b)) :]
        else:
            line = bytes(rng.randrange(256) for _ in range(rng.randint(1, 40)))
        if rng.random() < 0.15:
            line += b"\r"
        lines.append(line)
    if rng.random() < 0.08:  # an over-long line, with or without a marker in it
        filler = b"z" * (MAX_LINE_BYTES + rng.randint(-2, 3 * MAX_LINE_BYTES))
        marker = rng.choice(real) if rng.random() < 0.5 else b""
        lines.insert(rng.randint(0, len(lines)), filler[: rng.randint(0, len(filler))] + marker + filler)
    data = b"\n".join(lines)
    return data if rng.random() < 0.2 else data + b"\n"


def test_fuzzed_logs_give_the_same_events_and_counts() -> None:
    rng = random.Random(20260523)
    real = sample_lines() + [line for _, data in fixture_logs() for line in data.splitlines() if b"NVRM" in line]
    real += [line.replace(b"\\x0a", b"\n") for line in real if b"\\x0a" in line]  # the journal's real newlines
    seen = ScanStats()
    for case in range(300):
        data = fuzz_log(rng, real)
        want = reference([data])
        sizes = [rng.choice((1, 2, 5, 17, 64, 1000)), rng.randint(1, 70000), 1 << 20]
        for size in sizes:
            if size < 16 and len(data) > 20000:
                continue
            assert chunked(list(cut(data, size))) == want, f"case {case}, chunks of {size} bytes"
        for name in ("events", "too_long", "invalid"):
            setattr(seen, name, getattr(seen, name) + getattr(want[1], name))
    # the fuzz reaches what it is for: events, over-long lines and lines that are not text
    assert seen.events > 100 and seen.too_long > 5 and seen.invalid > 100, seen


def test_lines_without_a_marker_are_not_handed_to_the_line_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    handed: list[bytes] = []
    real_scan = chunk_scan.scan

    def counting(lines, stats=None):  # type: ignore[no-untyped-def]
        def spy():  # type: ignore[no-untyped-def]
            for line in lines:
                handed.append(line)
                yield line

        return real_scan(spy(), stats)

    monkeypatch.setattr(chunk_scan, "scan", counting)
    quiet = b"[   12.345678] eth0: renamed from veth1234\n" * 20000
    hit = b"[   13.0] NVRM: Xid (PCI:0000:3b:00): 48, pid=9, name=a.out, DBE\n"
    stats = ScanStats()
    events = list(scan_chunks(cut(quiet + hit + quiet, 1 << 16), stats))
    assert [e.xid for e in events] == [48]
    assert stats.lines == 40001
    assert handed == [b""] * MEMORY_LINES + [hit.rstrip(b"\n")]


def test_the_markers_are_the_tables_anchors() -> None:
    assert MARKERS == tuple(a.encode() for a in patterns.ANCHORS) and b"NVRM:" in MARKERS


IMPORTS = """
import re, sys
import calendar, datetime  # the standard library's (locale compiles one of its own)
import nodehealth.model, nodehealth.xid.events, nodehealth.xid.text  # what the modules build on
compiled = []
real = re._compile
def counting(pattern, flags):
    compiled.append(pattern)
    return real(pattern, flags)
re._compile = counting
import nodehealth.xid.patterns, nodehealth.xid.catalog, nodehealth.xid.parse, nodehealth.xid.history
import nodehealth.xid.chunk_scan, nodehealth.probes.kernel_log
print(len(compiled), compiled[:5], sorted(m for m in sys.modules if m.startswith("tomli")))
"""


@pytest.mark.skipif(
    sys.version_info < (3, 10), reason="Python 3.9's standard library loads typing and tokenize's regexes itself"
)
def test_importing_the_xid_modules_compiles_no_regex_and_reads_no_catalog() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", IMPORTS], capture_output=True, text=True, cwd=ROOT, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "0 [] []", proc.stdout


def test_a_regex_is_compiled_on_first_use() -> None:
    from nodehealth.xid.pattern_kit import Regex

    regex = Regex(r"(?P<a>x+)y")
    assert regex._compiled is None
    assert regex.search("zzxxy").group("a") == "xx"  # type: ignore[union-attr]
    assert regex._compiled is not None and regex.groupindex == {"a": 1}
    assert regex.match("xy") and regex.fullmatch("xxy") and not regex.fullmatch("xyz")
