"""The kernel-log parser: real published lines, every format by hand, bad input, fuzzing.

The parser is pure; reading the kernel log (``KmsgReader``) is tested in test_xid_watch.py."""

from __future__ import annotations

import json
from collections.abc import Generator
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodehealth.xid.events import KIND_FALLEN_OFF_BUS, KIND_XID, XidEvent
from nodehealth.xid.parse import MAX_LINE_BYTES, ScanStats, parse_line, scan, split_lines

FIXTURES = Path(__file__).parent / "fixtures" / "real-world"


# Every file of published lines: the copy of shared/fixtures/real-world, and the prefix forms it lacks.
REAL_LINE_FILES = ("xid_lines.jsonl", "xid_lines_prefix_forms.jsonl")


def real_rows() -> list[tuple[str, int, dict[str, Any]]]:
    """(file, line number, row) of every published line in the fixtures."""
    rows = []
    for name in REAL_LINE_FILES:
        with open(FIXTURES / name, encoding="utf-8") as fh:
            for number, text in enumerate(fh, 1):
                if text.strip():
                    rows.append((name, number, json.loads(text)))
    return rows


def _real_lines() -> list[Any]:
    cases = []
    for name, number, row in real_rows():
        what = f"xid{row['xid']}" if row["xid"] is not None else "none"
        fmt = row["format"].split(" (")[0].replace(" ", "_")
        cases.append(pytest.param(row, id=f"{name.split('.')[0]}-line{number:02d}-{what}-{fmt}"))
    return cases


@pytest.mark.parametrize("row", _real_lines())
def test_real_published_line(row: dict[str, Any]) -> None:
    event = parse_line(row["line"])
    if row["xid"] is None:
        assert event is None, f"look-alike line gave an event: {event}"
        return
    assert event is not None
    assert (event.xid, event.pci) == (row["xid"], row["pci"])
    assert event.kind == KIND_XID


def _real_logs() -> list[Any]:
    expected = json.loads((FIXTURES / "xid_logs" / "expected.json").read_text(encoding="utf-8"))
    return [pytest.param(name, spec, id=name.removesuffix(".log")) for name, spec in sorted(expected.items())]


@pytest.mark.parametrize(("name", "spec"), _real_logs())
def test_real_published_log(name: str, spec: dict[str, Any]) -> None:
    stats = ScanStats()
    with open(FIXTURES / "xid_logs" / name, "rb") as fh:
        events = list(scan(fh, stats))
    assert [(e.xid, e.pci) for e in events] == [(x["xid"], x["pci"]) for x in spec["xid_events"]]
    assert stats.events == len(events)
    assert stats.lines == len((FIXTURES / "xid_logs" / name).read_bytes().splitlines())
    assert stats.skipped == 0


def test_xid119_log_details() -> None:
    with open(FIXTURES / "xid_logs" / "gpud_dmesg_T_xid119_gsp_timeouts.log", "rb") as fh:
        events = list(scan(fh))
    assert [e.process for e in events] == ["nvidia-smi"] * 3 + ["cache_mgr_main", "gpud"]
    assert events[0].pid == 2024380
    assert events[0].time == "Sun Feb 23 16:24:18 2025"
    assert events[0].message.startswith("Timeout after 6s of waiting for RPC response from GPU4 GSP!")


def _bare(name: str, line: str, xid: int, pci: str, kind: str = KIND_XID) -> tuple[Any, ...]:
    """A case whose line names no pid, process, time or record number: only its XID, PCI address and kind."""
    return (name, line, xid, pci, None, None, None, None, None, kind)


# Hand-made lines, one per format and shape the parser must know.
# (id, line, xid, pci, pid, process, time, uptime_s, seq, kind)
HAND_MADE = [
    (
        "kmsg-record",
        "4,1834,94571234,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.",
        79,
        "0000:3b:00",
        1234,
        "python3",
        "94.571234",
        94.571234,
        1834,
        KIND_XID,
    ),
    (
        "kmsg-record-continuation-flag",
        "3,77,5000000,c;NVRM: Xid (PCI:0000:3b:00): 48, pid=9, name=a.out, An uncorrectable double bit error",
        48,
        "0000:3b:00",
        9,
        "a.out",
        "5.000000",
        5.0,
        77,
        KIND_XID,
    ),
    (
        "dmesg-monotonic",
        "[   94.571234] NVRM: Xid (PCI:0000:3b:00): 13, pid=4242, name=train.py, Graphics Exception: ESR 0x50",
        13,
        "0000:3b:00",
        4242,
        "train.py",
        "94.571234",
        94.571234,
        None,
        KIND_XID,
    ),
    (
        "dmesg-raw-priority",
        "<4>[ 1126.635824] NVRM: Xid (PCI:0000:65:00): 31, pid=2280636, name=python, Ch 00000008, intr 00000000.",
        31,
        "0000:65:00",
        2280636,
        "python",
        "1126.635824",
        1126.635824,
        None,
        KIND_XID,
    ),
    (
        "dmesg-T-padded-day",
        "[Wed Mar  1 17:38:27 2023] NVRM: Xid (PCI:0000:ca:00): 64, pid=77, name=x, Row Remapper failure",
        64,
        "0000:ca:00",
        77,
        "x",
        "Wed Mar  1 17:38:27 2023",
        None,
        None,
        KIND_XID,
    ),
    (
        "dmesg-iso",
        "2025-02-23T16:24:18,123456+00:00 NVRM: Xid (PCI:0000:9b:00): 119, Timeout after 6s of waiting",
        119,
        "0000:9b:00",
        None,
        None,
        "2025-02-23T16:24:18,123456+00:00",
        None,
        None,
        KIND_XID,
    ),
    (
        "syslog-host",
        "May 19 07:08:57 ip-26-0-146-100 kernel: [680111.646286] NVRM: Xid (PCI:0000:10:1c): 63, pid=1850, "
        "Row Remapper: New row marked for remapping, reset gpu to activate",
        63,
        "0000:10:1c",
        1850,
        None,
        "May 19 07:08:57",
        680111.646286,
        None,
        KIND_XID,
    ),
    (
        "journalctl-k",
        "Feb 23 16:24:18 gpu017 kernel: NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, name=nvidia-smi, Timeout",
        119,
        "0000:9b:00",
        2024380,
        "nvidia-smi",
        "Feb 23 16:24:18",
        None,
        None,
        KIND_XID,
    ),
    (
        "journalctl-k-short-iso",
        "2025-02-23T16:24:18+0000 gpu017 kernel: NVRM: Xid (PCI:0000:9b:00): 120, pid=1, name=x, GSP error",
        120,
        "0000:9b:00",
        1,
        "x",
        "2025-02-23T16:24:18+0000",
        None,
        None,
        KIND_XID,
    ),
    (
        "mig-instance",
        "NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9). RST: No, D-RST: No",
        94,
        "0000:01:00",
        7194,
        None,
        None,
        None,
        None,
        KIND_XID,
    ),
    (
        "old-pci-form",
        "[  123.456789] NVRM: Xid (0000:03:00): 13, 0003 00000000 0000a097 00001b0c 00000001 00000000",
        13,
        "0000:03:00",
        None,
        None,
        "123.456789",
        123.456789,
        None,
        KIND_XID,
    ),
    (
        "non-zero-domain-upper-case",
        "NVRM: Xid (PCI:0009:0A:00): 74, pid=55, name=nccl, NVLink: fatal error detected on link 3",
        74,
        "0009:0a:00",
        55,
        "nccl",
        None,
        None,
        None,
        KIND_XID,
    ),
    (
        "pci-with-function",
        "NVRM: Xid (PCI:0000:b3:00.0): 79, pid=12345, GPU has fallen off the bus.",
        79,
        "0000:b3:00",
        12345,
        None,
        None,
        None,
        None,
        KIND_XID,
    ),
    _bare(
        "pid-unknown",
        "NVRM: Xid (PCI:0000:3b:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on (GPC 0)",
        13,
        "0000:3b:00",
    ),
    _bare("no-pid", "NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.", 79, "0000:01:00"),
    (
        "payload-names-other-xid",
        "[171167.9] NVRM: Xid (PCI:0009:01:00): 155, pid=1, name=x, NVLink SW error caused by previous Xid 149",
        155,
        "0009:01:00",
        1,
        "x",
        "171167.9",
        171167.9,
        None,
        KIND_XID,
    ),
    _bare(
        "xid-154-recovery-action",
        "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
        154,
        "0000:01:00",
    ),
    _bare("xid-without-payload", "NVRM: Xid (PCI:0000:01:00): 62", 62, "0000:01:00"),
    (
        "fallen-off-bus-gpu-line",
        "[ 1843.308145] NVRM: GPU 0000:01:00.0: GPU has fallen off the bus.",
        79,
        "0000:01:00",
        None,
        None,
        "1843.308145",
        1843.308145,
        None,
        KIND_FALLEN_OFF_BUS,
    ),
    _bare(
        "fallen-off-bus-gpu-at",
        "NVRM: GPU at PCI:0000:3b:00: GPU has fallen off the bus.",
        79,
        "0000:3b:00",
        KIND_FALLEN_OFF_BUS,
    ),
    (
        "fallen-off-bus-kmsg-one-record",
        "2,512,1843308145,-;NVRM: The NVIDIA GPU 0000:b3:00.0\\x0aNVRM: (PCI ID: 10de:26b5) installed in this "
        "system has\\x0aNVRM: fallen off the bus and is not responding to commands.",
        79,
        "0000:b3:00",
        None,
        None,
        "1843.308145",
        1843.308145,
        512,
        KIND_FALLEN_OFF_BUS,
    ),
    # The prefix forms of recorded logs beyond dmesg's and syslog's (issue 19's classes; journalctl's
    # without the hostname are made below).
    (
        "kernel-tag-only-with-uptime",
        "kernel: [16450076.435595] NVRM: Xid (PCI:0000:17:00): 94, pid=789012, name=process, Contained ECC error.",
        94,
        "0000:17:00",
        789012,
        "process",
        "16450076.435595",
        16450076.435595,
        None,
        KIND_XID,
    ),
    (
        "doc-elided-ascii",
        "[...] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.",
        79,
        "0000:3b:00",
        1,
        "x",
        None,
        None,
        None,
        KIND_XID,
    ),
    (
        "doc-elided-unicode-spaced",
        "[ … ] NVRM: Xid (PCI:0000:3b:00): 48, pid=7, name=a.out, DBE",
        48,
        "0000:3b:00",
        7,
        "a.out",
        None,
        None,
        None,
        KIND_XID,
    ),
    (
        "redacted-pci",
        "[  123.456789] NVRM: Xid (PCI:...): 79, pid=1234, name=python3, GPU has fallen off the bus.",
        79,
        None,
        1234,
        "python3",
        "123.456789",
        123.456789,
        None,
        KIND_XID,
    ),
    (
        "redacted-pci-unicode",
        "Feb 23 16:24:18 gpu017 kernel: NVRM: Xid (PCI:…): 154, GPU recovery action changed from 0x0 (None) to "
        "0x2 (Node Reboot Required)",
        154,
        None,
        None,
        None,
        "Feb 23 16:24:18",
        None,
        None,
        KIND_XID,
    ),
]

# journalctl's prefix without the hostname: the line of each journalctl case with its hostname dropped, the same event.
HAND_MADE += [
    (name.replace("journalctl-k", "journalctl-no-hostname"), line.replace(" gpu017 kernel:", " kernel:"), *expected)
    for name, line, *expected in HAND_MADE
    if name in ("journalctl-k", "journalctl-k-short-iso")
]


@pytest.mark.parametrize(("line", "expected"), [pytest.param(c[1], c[2:], id=c[0]) for c in HAND_MADE])
def test_hand_made_line(line: str, expected: tuple[Any, ...]) -> None:
    xid, pci, pid, process, time, uptime_s, seq, kind = expected
    event = parse_line(line)
    assert event is not None
    assert (event.xid, event.pci, event.kind) == (xid, pci, kind)
    assert (event.pid, event.process) == (pid, process)
    assert (event.time, event.uptime_s, event.seq) == (time, uptime_s, seq)
    assert event.raw == line


NOT_XID = [
    ("driver-banner", "<4>[ 1126.635824] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.144.03  Mon"),
    ("uuid-line", "[Sun Feb 23 16:24:18 2025] NVRM: GPU at PCI:0000:9b:00: GPU-509665ad-b600-ac93-3616"),
    ("rm-init-failed", "[   12.345678] NVRM: GPU 0000:3b:00.0: RmInitAdapter failed! (0x26:0xffff:1489)"),
    ("rm-init-failed-bare", "NVRM: RmInitAdapter failed! (0x31:0xffff:867)"),
    ("gsp-dump", "[Sun Feb 23 16:24:18 2025] NVRM: GPU4 GSP RPC buffer contains function 103 (GSP_RM_ALLOC)"),
    ("rate-limit", "NVRM: Rate limiting GSP RPC error prints for GPU at PCI:0000:9b:00 (printing 1 of every"),
    ("xid-not-a-number", "NVRM: Xid (PCI:0000:66:00): abc, pid=2280636"),
    ("xid-truncated", "[  94.5] NVRM: Xid (PCI:0000:3b"),
    ("grep-pattern", "kernel_failure_pattern='NVRM: Xid|CTX SWITCH TIMEOUT|NV_ERR_NO_MEMORY'"),
    ("mentions-xid-in-prose", "The Xid 79 means the GPU has fallen off the bus; reboot the node."),
    ("usb-fallen-off", "usb 1-1: device has fallen off the bus"),
    ("kmsg-dict-continuation", " SUBSYSTEM=pci"),
    ("kmsg-dict-continuation-device", " DEVICE=+pci:0000:3b:00.0"),
    ("nvidia-module-line", "[    5.1] nvidia: module license 'NVIDIA' taints kernel."),
    ("empty", ""),
    # Known prefixes only: the tag of another program, an elision inside a name, a bare "kernel"
    ("journalctl-no-hostname-other-program", "Feb 23 16:24:18 root[311]: NVRM: Xid (PCI:0000:3b:00): 79, x"),
    ("kernel-tag-after-another-program", "Feb 23 16:24:18 gpu017 logger: kernel: NVRM: Xid (PCI:0000:3b:00): 79, x"),
    ("kernel-tag-indented", "   kernel: NVRM: Xid (PCI:0000:3b:00): 79, x"),
    ("kernel-tag-in-words", "user kernel: NVRM: Xid (PCI:0000:3b:00): 79, x"),
    ("elided-inside-a-name", "[ 5.1] EXT4-fs: name '[...] NVRM: Xid (PCI:0000:3b:00): 79, x'"),
    ("redacted-pci-other-words", "NVRM: Xid (PCI:redacted): 79, pid=1"),
]


@pytest.mark.parametrize("line", [pytest.param(text, id=name) for name, text in NOT_XID])
def test_not_an_xid(line: str) -> None:
    assert parse_line(line) is None


def test_kmsg_record_with_continuation_lines() -> None:
    record = (
        b"4,1834,94571234,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, "
        b"GPU has fallen off the bus.\n"
        b" SUBSYSTEM=pci\n"
        b" DEVICE=+pci:0000:3b:00.0\n"
        b"6,1835,94571300,-;NVRM: GPU 0000:5e:00.0: GPU has fallen off the bus.\n"
    )
    events = list(scan(record.splitlines()))
    assert [(e.seq, e.xid, e.pci, e.kind) for e in events] == [
        (1834, 79, "0000:3b:00", KIND_XID),
        (1835, 79, "0000:5e:00", KIND_FALLEN_OFF_BUS),
    ]


def test_fallen_off_bus_after_its_xid79_is_not_reported_twice() -> None:
    lines = [
        "NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.",
        "NVRM: GPU 0000:01:00.0: GPU has fallen off the bus.",
        "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (OS Reboot)",
        "NVRM: GPU 0000:02:00.0: GPU has fallen off the bus.",
    ]
    assert [(e.xid, e.pci, e.kind) for e in scan(lines)] == [
        (79, "0000:01:00", KIND_XID),
        (154, "0000:01:00", KIND_XID),
        (79, "0000:02:00", KIND_FALLEN_OFF_BUS),
    ]
    assert parse_line(lines[1]) is not None, "a single line has no context: it is still reported"


def test_three_line_fallen_off_bus_is_attributed_to_its_gpu() -> None:
    lines = [
        "[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0",
        "               NVRM: (PCI ID: 10de:26b5) installed in this system has",
        "               NVRM: fallen off the bus and is not responding to commands.",
    ]
    events = list(scan(lines))
    assert [(e.xid, e.pci, e.kind) for e in events] == [(79, "0000:b3:00", KIND_FALLEN_OFF_BUS)]


def test_fallen_off_bus_without_gpu_far_from_its_first_line_has_no_pci() -> None:
    lines = [
        "NVRM: The NVIDIA GPU 0000:b3:00.0",
        "a",
        "b",
        "c",
        "d",
        "NVRM: fallen off the bus and is not responding to commands.",
    ]
    assert [(e.xid, e.pci) for e in scan(lines)] == [(79, None)]


def test_mixed_formats_in_one_stream() -> None:
    filler = ["[    1.000000] usb 1-1: new high-speed USB device number 2 using xhci_hcd"] * 10
    # Filler keeps each hand-made line out of its neighbours' context (see the XID 79 test).
    lines: list[Any] = [text for case in HAND_MADE for text in [case[1], *filler]]
    lines += [text for _, text in NOT_XID]
    lines += [line.encode() for line in lines]
    stats = ScanStats()
    events = list(scan(lines, stats))
    assert len(events) == 2 * len(HAND_MADE)
    assert stats.lines == len(lines)
    assert stats.events == len(events)


def test_bad_input_is_skipped_and_counted() -> None:
    good = b"NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=x, DBE"
    lines: list[Any] = [
        b"\xff\xfe NVRM: Xid (PCI:0000:3b:00): 79, \xc3\x28",  # invalid UTF-8
        b"\x00\x01\x02NVRM: Xid (PCI:0000:3b:00): 79,\x00",  # binary junk
        b"NVRM: Xid (PCI:0000:3b:00): 79, " + b"A" * (5 * 1024 * 1024),  # megabytes
        "NVRM: Xid (PCI:0000:3b:00): 79, " + "B" * (MAX_LINE_BYTES + 1),
        12345,  # not a line at all
        good,
        "NVRM: Xid (PCI:0000:3b:00): 79, caf\u00e9 \u2603",  # valid non-ASCII text still parses
        "NVRM: Xid (PCI:0000:3b:00): 79, caf\u00e9".encode(),
    ]
    stats = ScanStats()
    events = list(scan(lines, stats))
    assert [e.xid for e in events] == [48, 79, 79]
    assert stats.too_long == 2
    assert stats.invalid == 3
    assert stats.skipped == 5
    assert stats.lines == len(lines)


def test_parse_line_ignores_over_long_lines() -> None:
    assert parse_line("NVRM: Xid (PCI:0000:3b:00): 79, " + "x" * MAX_LINE_BYTES) is None


def test_stats_are_counted_when_the_consumer_stops_early() -> None:
    stats = ScanStats()
    events = cast("Generator[XidEvent, None, None]", scan(["NVRM: Xid (PCI:0000:3b:00): 79, a"] * 5, stats))
    next(events)
    events.close()
    assert stats.events == 1
    assert stats.lines == 1


@pytest.mark.parametrize(
    ("chunks", "expected"),
    [
        pytest.param([b"a\nb", b"c\nd\n"], [b"a", b"bc", b"d"], id="line-split-across-chunks"),
        pytest.param([b"", b"a", b"", b"b"], [b"ab"], id="empty-chunks-no-final-newline"),
        pytest.param([b"xxxxx", b"yyyyy\nok\n"], [b"xxxxxy", b"ok"], id="over-long-line-truncated"),
        pytest.param([b"abcdefgh\nok"], [b"abcdef", b"ok"], id="over-long-in-one-chunk"),
        pytest.param([b"ok\n" + b"z" * 20, b"zz", b"z\nend"], [b"ok", b"z" * 6, b"end"], id="over-long-tail"),
    ],
)
def test_split_lines(chunks: list[bytes], expected: list[bytes]) -> None:
    assert list(split_lines(chunks, max_line_bytes=5)) == expected


def test_split_lines_feeds_scan_the_too_long_count() -> None:
    stats = ScanStats()
    chunks = [b"NVRM: Xid (PCI:0000:3b:00): 79, ", b"x" * (MAX_LINE_BYTES * 3), b"\nNVRM: Xid (PCI:0000:3b:00): 48\n"]
    assert [e.xid for e in scan(split_lines(chunks), stats)] == [48]
    assert stats.too_long == 1


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_fuzz_parse_line_text(text: str) -> None:
    event = parse_line(text)
    assert event is None or isinstance(event.xid, int)


XID_ALPHABET = st.sampled_from(
    [
        "NVRM: ",
        "Xid ",
        "(",
        ")",
        "PCI:",
        "0000:3b:00",
        " GPU-I:05",
        ": ",
        "79",
        ", ",
        "pid=",
        "'<unknown>'",
        "name=",
        "x",
        "[",
        "]",
        "4,1,2,-;",
        " ",
        "fallen off the bus",
        "\n",
        "\x00",
        "\udcff",
        "\u2603",
        "0x2",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(XID_ALPHABET, max_size=30).map("".join))
def test_fuzz_parse_line_near_misses(text: str) -> None:
    event = parse_line(text)
    if event is not None:
        assert event.pci is None or event.pci == event.pci.lower()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.binary(max_size=200), st.text(max_size=200)), max_size=20))
def test_fuzz_scan_any_lines(lines: list[Any]) -> None:
    stats = ScanStats()
    events = list(scan(lines, stats))
    assert stats.lines == len(lines)
    assert stats.events == len(events)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=64), max_size=20), st.integers(min_value=1, max_value=16))
def test_fuzz_split_lines_never_exceeds_limit(chunks: list[bytes], limit: int) -> None:
    for line in split_lines(chunks, max_line_bytes=limit):
        assert b"\n" not in line
        assert len(line) <= limit + 1


def test_split_lines_caps_whole_lines_inside_one_chunk() -> None:
    """A line with its newline on both sides in one chunk is capped like one split across chunks."""
    assert list(split_lines([b"\n\x00\x00\x00\n"], max_line_bytes=1)) == [b"", b"\x00\x00"]
    assert list(split_lines([b"a\n" + b"x" * 100 + b"\nb"], max_line_bytes=8)) == [b"a", b"x" * 9, b"b"]
