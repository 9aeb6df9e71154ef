"""The kernel-log prefixes: where a line's sequence number and time are (``/dev/kmsg`` records,
dmesg, dmesg -T, syslog, journalctl; where its message starts is ``patterns.MESSAGE_START``). Entries of the one table,
``nodehealth.xid.patterns.PATTERNS``; each with its real sample lines. Pure: ``re`` only.
"""

from __future__ import annotations

import re

from nodehealth.xid.pattern_kit import (
    GPUD_KMSG_TEST,
    GPUD_PSTORE,
    GPUD_XID119_LOG,
    M4_CHRONICLES,
    M4_JEANZAY,
    RECORD,
    TESTS,
    UPTIME,
    WALL_CLOCK,
    Pattern,
    gives,
    no_match,
)

KMSG_RECORD = Pattern(
    name="kmsg_record",
    role=RECORD,
    about="a `/dev/kmsg` record `pri,seq,usec,flags;message` (priority = 8 * facility + level; sequence "
    "number; microseconds since boot); the one record regex, also used by the kmsg reader",
    regex=re.compile(r"^(?P<pri>\d{1,4}),(?P<seq>\d{1,20}),(?P<usec>\d{1,20}),[^;]{0,16};"),
    samples=(
        gives(
            "4,1834,94571234,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.",
            TESTS,
            pri="4",
            seq="1834",
            usec="94571234",
        ),
        gives(
            "3,77,5000000,c;NVRM: Xid (PCI:0000:3b:00): 48, pid=9, name=a.out, An uncorrectable double bit error",
            TESTS,
            pri="3",
            seq="77",
        ),
        gives("12,9,120000000,-;NVRM: Xid (PCI:0018:01:00): 145, pid=876767", TESTS, pri="12"),
        no_match(
            "<4>[ 1126.635824] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.144.03  Mon Dec 30 17:44:08 "
            "UTC 2024",
            GPUD_PSTORE + " (line 341)",
        ),
        no_match(" SUBSYSTEM=pci", TESTS),
    ),
)

KMSG_CONTINUATION = Pattern(
    name="kmsg_continuation",
    role=RECORD,
    about="a continuation (dictionary) line ` KEY=value` of a `/dev/kmsg` record: never an event, and "
    "skipped with its record by the reader",
    regex=re.compile(r"^ [A-Z0-9_]+="),
    samples=(
        gives(" SUBSYSTEM=pci", TESTS),
        gives(" DEVICE=+pci:0000:3b:00.0", TESTS),
        no_match("               NVRM: (PCI ID: 10de:26b5) installed in this system has", TESTS),
    ),
)

CTIME = Pattern(
    name="ctime",
    role=WALL_CLOCK,
    about="`dmesg -T` (day space-padded)",
    regex=re.compile(r"\[(?P<t>(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4})\]"),
    samples=(
        gives(
            "[Sun Feb 23 16:24:18 2025] NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, name=nvidia-smi",
            GPUD_XID119_LOG + " (line 3)",
            t="Sun Feb 23 16:24:18 2025",
        ),
        gives(
            "[Wed Mar  1 17:44:24 2023] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  525.60.13  Wed Nov 30 "
            "06:39:21 UTC 2022",
            M4_JEANZAY + " (line 5936)",
            t="Wed Mar  1 17:44:24 2023",
        ),
        no_match("[171167.620236] NVRM: Xid (PCI:0009:01:00): 149, NETIR_LINK_EVT", GPUD_KMSG_TEST),
    ),
)

ISO = Pattern(
    name="iso",
    role=WALL_CLOCK,
    about="ISO 8601: `dmesg --time-format=iso`, rsyslog RFC 3339, `journalctl -o short-iso`",
    regex=re.compile(r"(?P<t>\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?)"),
    samples=(
        gives(
            "2025-02-23T16:24:18,123456+00:00 NVRM: Xid (PCI:0000:9b:00): 119, Timeout",
            TESTS,
            t="2025-02-23T16:24:18,123456+00:00",
        ),
        gives(
            "2025-02-23T16:24:18+0000 gpu017 kernel: NVRM: Xid (PCI:0000:9b:00): 120, pid=1",
            TESTS,
            t="2025-02-23T16:24:18+0000",
        ),
        no_match("May 19 07:08:57 ip-26-0-146-100 kernel: [680111.646286] NVRM:", M4_CHRONICLES + " (line 80)"),
    ),
)

SYSLOG = Pattern(
    name="syslog",
    role=WALL_CLOCK,
    about="syslog files and `journalctl -k` (`Mon dd hh:mm:ss host kernel:`, `--no-hostname` without the host; "
    "the year is not given and is not guessed)",
    regex=re.compile(
        r"(?P<t>(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) [ \d]\d \d\d:\d\d:\d\d(?:\.\d+)?)"
        r"(?: \S+)? kernel:"
    ),
    samples=(
        gives(
            "Xid errors on instance: ip-26-0-146-100, Error: May 19 07:08:57 ip-26-0-146-100 kernel: "
            "[680111.646286] NVRM: Xid (PCI:0000:10:1c): 63, pid=1850",
            M4_CHRONICLES + " (line 80)",
            t="May 19 07:08:57",
        ),
        gives(
            "Feb 23 16:24:18 gpu017 kernel: NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380", TESTS, t="Feb 23 16:24:18"
        ),
        gives("Feb 23 16:24:18 kernel: NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380", TESTS, t="Feb 23 16:24:18"),
        no_match("[Sun Feb 23 16:24:18 2025] NVRM: Xid (PCI:0000:9b:00): 119", GPUD_XID119_LOG + " (line 3)"),
    ),
)

MONOTONIC = Pattern(
    name="monotonic",
    role=UPTIME,
    about="`dmesg` seconds since boot (`[ 94.571234]`, also after a `<4>` priority or a syslog prefix)",
    regex=re.compile(r"\[\s*(?P<t>\d+\.\d+)\]"),
    samples=(
        gives("[171167.620236] NVRM: Xid (PCI:0009:01:00): 149, NETIR_LINK_EVT", GPUD_KMSG_TEST, t="171167.620236"),
        gives(
            "<4>[ 1126.635824] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.144.03",
            GPUD_PSTORE + " (line 341)",
            t="1126.635824",
        ),
        no_match("[Sun Feb 23 16:24:18 2025] NVRM: Xid (PCI:0000:9b:00): 119", GPUD_XID119_LOG + " (line 3)"),
    ),
)


# The prefixes in the table's order (``patterns.PATTERNS``: records, then ``message_start``, then the
# clocks): a new one is its entry above and its name in one of these.
RECORDS: tuple[Pattern, ...] = (KMSG_RECORD, KMSG_CONTINUATION)
CLOCKS: tuple[Pattern, ...] = (CTIME, ISO, SYSLOG, MONOTONIC)
