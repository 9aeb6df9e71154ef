"""The kernel-log prefixes: where a line's sequence number and time are (``/dev/kmsg`` records,
dmesg, dmesg -T, syslog, journalctl), and where its message starts (``MESSAGE_START``). Entries of the
one table, ``nodehealth.xid.patterns.PATTERNS``; each with its real sample lines. Pure: ``re`` only,
nothing compiled at import.
"""

from __future__ import annotations

from nodehealth.xid.pattern_kit import (
    CTIME_CLOCK,
    DMESG_LEVEL,
    DRIVER_TAG,
    ELIDED_CLOCK,
    GPUD_KMSG_EXTENDED_TEST,
    GPUD_KMSG_TEST,
    GPUD_PSTORE,
    GPUD_SXID_README,
    GPUD_XID119_LOG,
    ISO_CLOCK,
    KERNEL_STAMP,
    KERNEL_TAG,
    KMSG_PREFIX,
    M4_CHRONICLES,
    M4_JEANZAY,
    MAYBE_HOST_KERNEL,
    MONO_CLOCK,
    NVIDIA_XID_DOC,
    OGKM_1150,
    PLAIN_WORDS,
    RECORD,
    RELTIME_CLOCK,
    SWITCH_TAG,
    SYSLOG_CLOCK,
    TESTS,
    UPTIME,
    WALL_CLOCK,
    Pattern,
    Regex,
    gives,
    no_match,
)

KMSG_RECORD = Pattern(
    name="kmsg_record",
    role=RECORD,
    about="a `/dev/kmsg` record `pri,seq,usec,flags;message` (priority = 8 * facility + level; sequence "
    "number; microseconds since boot); the one record regex, also used by the kmsg reader",
    regex=Regex(r"^(?P<pri>\d{1,4}),(?P<seq>\d{1,20}),(?P<usec>\d{1,20}),[^;]{0,16};"),
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
    regex=Regex(r"^ [A-Z0-9_]+="),
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
    regex=Regex(r"\[(?P<t>(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4})\]"),
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
    regex=Regex(r"(?P<t>\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?)"),
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
    regex=Regex(
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
    regex=Regex(r"\[\s*(?P<t>\d+\.\d+)\]"),
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


# --------------------------------------------------------------------------- where a message starts

MESSAGE_START = Pattern(
    name="message_start",
    role=RECORD,
    about="where a record's message starts: right after its log format's own prefix at the start of the "
    "line (a kmsg record; dmesg's clock, with `-r` priority, `-x` level, `-T`, `-e`, iso; syslog and "
    "`journalctl -k`: clock, host, `kernel:` and an optional `[ 94.57]`, also after plain words such as a "
    "monitoring alert's; `journalctl --no-hostname`: clock and `kernel:`; a shipper's `kernel:` tag alone; a "
    "document's elided clock `[…]` or `[...]`), or at the start of a bare message. Events are read only from a "
    "message that "
    "starts there with the driver's tag `NVRM:` (or the NVSwitch driver's `nvidia-nvswitch<N>:`): a driver line "
    "quoted inside another record (a file or "
    "process name in an exec warning, an audit or ext4 message) is no event, nor is a syslog line "
    "another program than the kernel logged",
    regex=Regex(
        r"^(?P<prefix>"
        + KMSG_PREFIX
        + r"|(?:"
        + DMESG_LEVEL
        + r")?(?:<\d{1,3}>)?(?:(?:"
        + MONO_CLOCK
        + r"|\["
        + CTIME_CLOCK
        + r"\]|"
        + RELTIME_CLOCK
        + "|"
        + ISO_CLOCK
        + "|"
        + ELIDED_CLOCK
        + r")(?:"
        + MAYBE_HOST_KERNEL
        + r")?"
        + KERNEL_STAMP
        + r")?"
        + r"|(?:<\d{1,3}>)?"
        + KERNEL_TAG
        + KERNEL_STAMP
        + r"|(?:<\d{1,3}>)?(?![ \t])"
        + PLAIN_WORDS
        + r"(?:"
        + SYSLOG_CLOCK
        + "|"
        + ISO_CLOCK
        + r")"
        + MAYBE_HOST_KERNEL
        + KERNEL_STAMP
        + r")(?="
        + DRIVER_TAG
        + "|"
        + SWITCH_TAG
        + r")"
    ),
    samples=(
        gives(
            "4,1834,94571234,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.",
            TESTS,
            prefix="4,1834,94571234,-;",
        ),
        gives(
            "[Sun Feb 23 16:24:18 2025] NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, name=nvidia-smi",
            GPUD_XID119_LOG + " (line 3)",
            prefix="[Sun Feb 23 16:24:18 2025] ",
        ),
        gives(
            "[171167.620236] NVRM: Xid (PCI:0009:01:00): 149, NETIR_LINK_EVT", GPUD_KMSG_TEST, prefix="[171167.620236] "
        ),
        gives(
            "<4>[ 1126.635824] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.144.03",
            GPUD_PSTORE + " (line 341)",
            prefix="<4>[ 1126.635824] ",
        ),
        gives(
            "NVRM: Xid (PCI:0018:01:00): 145, pid=876767, name=ray::WorkerDict, RLW_RXPIPE Nonfatal XC0 i0",
            GPUD_KMSG_EXTENDED_TEST,
            prefix="",
        ),
        gives(
            "Xid errors on instance: ip-26-0-146-100, Error: May 19 07:08:57 ip-26-0-146-100 kernel: "
            "[680111.646286] NVRM: Xid (PCI:0000:10:1c): 63, pid=1850",
            M4_CHRONICLES + " (line 80)",
            prefix="Xid errors on instance: ip-26-0-146-100, Error: May 19 07:08:57 ip-26-0-146-100 kernel: "
            "[680111.646286] ",
        ),
        gives(
            "Feb 23 16:24:18 gpu017 kernel: NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380",
            TESTS,
            prefix="Feb 23 16:24:18 gpu017 kernel: ",
        ),
        gives(
            "2025-02-23T16:24:18+0000 gpu017 kernel: NVRM: Xid (PCI:0000:9b:00): 120, pid=1",
            TESTS,
            prefix="2025-02-23T16:24:18+0000 gpu017 kernel: ",
        ),
        gives(
            "2025-02-23T16:24:18,123456+00:00 NVRM: Xid (PCI:0000:9b:00): 119, Timeout",
            TESTS,
            prefix="2025-02-23T16:24:18,123456+00:00 ",
        ),
        gives(
            "kern  :warn  : [   94.571234] NVRM: Xid (PCI:0000:3b:00): 79, pid=1",
            TESTS,
            prefix="kern  :warn  : [   94.571234] ",
        ),
        gives("[  +0.000123] NVRM: Xid (PCI:0000:3b:00): 79, pid=1", TESTS, prefix="[  +0.000123] "),
        gives(
            "[   94.571234] gpu017 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1",
            TESTS,
            prefix="[   94.571234] gpu017 kernel: ",
        ),
        gives(
            "kernel: NVRM: Xid (PCI:0000:ed:00): 45, pid=1818992, name=python3, Ch 0000000c caused by previous Xid 145",
            OGKM_1150,
            prefix="kernel: ",
        ),
        gives(
            "[\u2026] NVRM: GPU at 0000:03:00: GPU-b850f46d-d5ea-c752-ddf3-c4453e44d3f7",
            NVIDIA_XID_DOC,
            prefix="[\u2026] ",
        ),
        gives(
            "Feb 23 16:24:18 kernel: NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380",
            TESTS,
            prefix="Feb 23 16:24:18 kernel: ",
        ),
        gives(
            "kernel: [16450076.435595] NVRM: Xid (PCI:0000:17:00): 94, pid=789012",
            TESTS,
            prefix="kernel: [16450076.435595] ",
        ),
        gives("[...] NVRM: Xid (PCI:0000:3b:00): 79, pid=1", TESTS, prefix="[...] "),
        gives(
            "[6781753.400584] nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up",
            GPUD_SXID_README,
            prefix="[6781753.400584] ",
        ),
        no_match("[ 5.1] kernel: nvidia-nvswitch: SXid (PCI:0000:06:00.0): 20034, Fatal", TESTS),
        no_match("Feb 23 16:24:18 gpu017 logger: kernel: NVRM: Xid (PCI:0000:3b:00): 79, x", TESTS),
        no_match("   kernel: NVRM: Xid (PCI:0000:3b:00): 79, x", TESTS),
        no_match("[ 5.1] EXT4-fs: name '[...] NVRM: Xid (PCI:0000:3b:00): 79, x'", TESTS),
        no_match(
            "4,2211,5123456789,-;process 'python3' launched 'NVRM: Xid (PCI:0000:3b:00): 79, x' with NULL argv: "
            "empty string added",
            TESTS,
        ),
        no_match(
            "May 19 07:08:57 gpu017 kernel: [ 5123.456789] audit: type=1400 audit(1716102537.123:412): "
            'apparmor="DENIED" operation="open" name="/tmp/NVRM:Xid(PCI:0000:1a:00):48,DBE"',
            TESTS,
        ),
        no_match(
            "process 'python3' launched 'May 19 07:08:57 gpu017 kernel: NVRM: Xid (PCI:0000:3b:00): 79, x' "
            "with NULL argv: empty string added",
            TESTS,
        ),
        no_match("May 19 07:08:57 gpu017 root: NVRM: Xid (PCI:0000:3b:00): 79, x", TESTS),
        no_match("               NVRM: fallen off the bus and is not responding to commands.", TESTS),
        no_match(
            "               Xid errors on instance: gpu017, Error: May 19 07:08:57 gpu017 kernel: NVRM: Xid "
            "(PCI:0000:3b:00): 79, x",
            TESTS,
        ),
        no_match("The Xid 79 means the GPU has fallen off the bus; reboot the node.", TESTS),
    ),
)


# The prefixes in the table's order (``patterns.PATTERNS``: records, then ``message_start``, then the
# clocks): a new one is its entry above and its name in one of these.
RECORDS: tuple[Pattern, ...] = (KMSG_RECORD, KMSG_CONTINUATION)
CLOCKS: tuple[Pattern, ...] = (CTIME, ISO, SYSLOG, MONOTONIC)
