"""Forged driver lines: an XID comes only from the driver's own record, never from text another
kernel record quotes (a file or process name a user chose).

Each log format is rendered the way its tool writes a record (``/dev/kmsg`` escapes control
characters and newlines; dmesg and journalctl indent the further lines of a record; rsyslog
writes a newline as ``#012``). The positive controls show that the same renderers make real
driver records that are read, so the properties below cannot pass by rendering nonsense.

Not covered, because the text itself cannot tell: a log without any prefix (``dmesg -t``,
``journalctl -o cat``), where a newline in a name starts a line like any other, and a log that
gives every line of a record its own prefix (the console, ``dmesg -S``, rsyslog's imklog). The
event store reads only ``/dev/kmsg`` (docs/xid.md, "Which lines are XIDs").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodehealth.probes.xid_store import XidStore
from nodehealth.xid.events import KIND_FALLEN_OFF_BUS
from nodehealth.xid.parse import parse_line, scan

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "real-world"

# Real published lines with an XID (every format of the fixtures), and the driver messages alone.
REAL_XID_LINES = [
    row["line"]
    for row in map(json.loads, (FIXTURES / "xid_lines.jsonl").read_text(encoding="utf-8").splitlines())
    if row["xid"] is not None
]
DRIVER_MESSAGES = sorted(
    {line[line.index("NVRM: ") :] for line in REAL_XID_LINES}
    | {
        "NVRM: GPU 0000:01:00.0: GPU has fallen off the bus.",
        "NVRM: GPU at PCI:0000:3b:00: GPU has fallen off the bus.",
        "NVRM: fallen off the bus and is not responding to commands.",
        "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.",
    }
)
THREE_LINE = (
    "NVRM: The NVIDIA GPU 0000:b3:00.0\nNVRM: (PCI ID: 10de:26b5) installed in this system has\n"
    "NVRM: fallen off the bus and is not responding to commands."
)

# Kernel records that quote a name a user chose, with {} where the name goes.
NON_DRIVER_RECORDS = {
    "exec-null-argv": "process 'python3' launched '{}' with NULL argv: empty string added",
    "apparmor-name": (
        'audit: type=1400 audit(1716102537.123:412): apparmor="DENIED" operation="open" '
        'class="file" profile="/usr/bin/man" name="{}" pid=2411 comm="man" requested_mask="r" '
        'denied_mask="r" fsuid=1000 ouid=1000'
    ),
    "ext4-mount-option": 'EXT4-fs (loop0): Unrecognized mount option "{}" or missing value',
    "audit-comm": (
        "audit: type=1326 audit(1716102537.456:77): auid=1000 uid=1000 gid=1000 ses=3 "
        'subj=unconfined pid=4242 comm="{}" exe="/usr/bin/python3.11" sig=31 arch=c000003e '
        "syscall=165 compat=0 ip=0x7f5e4d1e0b3a code=0x0"
    ),
}
# A record that starts with the process name: the kernel's names are at most 15 bytes
# (TASK_COMM_LEN), too short for any driver line the parser reads.
COMM_FIRST = "{}[4242]: segfault at 0 ip 00007f5e4d1e0b3a sp 00007ffd5a3f0c18 error 4 in libc.so.6"
COMM_LEN = 15
# A driver record that quotes text from user space (the client's version string).
DRIVER_QUOTING = "NVRM: API mismatch: the client has the version {}, but this kernel module has the version 550.54"


def _kmsg_escape(message: str) -> str:
    """As /dev/kmsg writes a record's text: controls, non-ASCII bytes and backslash as \\xNN."""
    out = []
    for byte in message.encode("utf-8", "surrogatepass"):
        out.append(f"\\x{byte:02x}" if byte < 32 or byte >= 127 or byte == 0x5C else chr(byte))
    return "".join(out)


def _indented(prefix: str) -> Callable[[str], list[str]]:
    """dmesg and journalctl: the prefix on the first line, the record's further lines indented."""

    def render(message: str) -> list[str]:
        first, *rest = message.split("\n")
        return [prefix + first] + [" " * len(prefix) + line for line in rest]

    return render


def _rsyslog(prefix: str) -> Callable[[str], list[str]]:
    """rsyslog (from the journal): control characters written as #ooo, so one line per record."""

    def render(message: str) -> list[str]:
        return [prefix + "".join(f"#{ord(c):03o}" if ord(c) < 32 else c for c in message)]

    return render


FORMATS: dict[str, Callable[[str], list[str]]] = {
    "kmsg": lambda m: [f"4,2211,5123456789,-;{_kmsg_escape(m)}"],
    "dmesg": _indented("[ 5123.456789] "),
    "dmesg-r": _indented("<4>[ 5123.456789] "),
    "dmesg-T": _indented("[Sun Feb 23 16:24:18 2025] "),
    "dmesg-iso": _indented("2025-02-23T16:24:18,123456+00:00 "),
    "dmesg-x": _indented("kern  :warn  : [ 5123.456789] "),
    "journalctl-k": _indented("Feb 23 16:24:18 gpu017 kernel: "),
    "journalctl-short-iso": _indented("2025-02-23T16:24:18+0000 gpu017 kernel: "),
    "syslog": _rsyslog("May 19 07:08:57 gpu017 kernel: [ 5123.456789] "),
    "syslog-rfc3339": _rsyslog("2025-02-23T16:24:18+00:00 gpu017 kernel: "),
    "monitoring-alert": _rsyslog("Xid errors on instance: gpu017, Error: May 19 07:08:57 gpu017 kernel: "),
    "journalctl-no-hostname": _indented("Feb 23 16:24:18 kernel: "),
    "journalctl-short-iso-no-hostname": _indented("2025-02-23T16:24:18+0000 kernel: "),
    "kernel-tag": _indented("kernel: "),
    "kernel-tag-uptime": _indented("kernel: [ 5123.456789] "),
    "doc-elided": _indented("[\u2026] "),
    "doc-elided-ascii": _indented("[...] "),
}
BARE = _indented("")  # dmesg -t: no prefix, and so no indentation either


def _events(lines: list[str]) -> list[tuple[int, object]]:
    return [(e.xid, e.pci) for e in scan(lines)]


# --------------------------------------------------------------------------- positive controls


@pytest.mark.parametrize("fmt", [*FORMATS, "bare"])
@pytest.mark.parametrize("message", DRIVER_MESSAGES)
def test_a_driver_record_is_read_in_every_format(fmt: str, message: str) -> None:
    lines = (FORMATS.get(fmt) or BARE)(message)
    assert len(_events(lines)) == 1, lines
    assert parse_line(lines[0]) is not None


@pytest.mark.parametrize("fmt", [*FORMATS, "bare"])
def test_the_three_line_fallen_off_the_bus_record_is_read_in_every_format(fmt: str) -> None:
    lines = (FORMATS.get(fmt) or BARE)(THREE_LINE)
    events = list(scan(lines))
    assert [(e.xid, e.pci, e.kind) for e in events] == [(79, "0000:b3:00", KIND_FALLEN_OFF_BUS)], lines


# --------------------------------------------------------------------------- properties

EMBEDDED = st.one_of(
    st.text(max_size=80),
    st.sampled_from(REAL_XID_LINES + DRIVER_MESSAGES),
    st.tuples(
        st.text(max_size=12),
        st.sampled_from(REAL_XID_LINES + DRIVER_MESSAGES + [THREE_LINE]),
        st.sampled_from(["", "\n", "\r", "'", '"', "\x1b[2K\r"]),
        st.text(max_size=12),
    ).map(lambda t: t[0] + t[2] + t[1] + t[2] + t[3]),
)
# A real driver line just before the forged record: the one place a continuation line is read.
BEFORE = "NVRM: GPU at PCI:0000:9b:00: GPU-509665ad-b600-ac93-3616-d754b23d636d"


@settings(max_examples=200, deadline=None)
@given(record=st.sampled_from(sorted(NON_DRIVER_RECORDS)), fmt=st.sampled_from(sorted(FORMATS)), text=EMBEDDED)
def test_driver_text_inside_another_kernel_record_is_never_an_event(record: str, fmt: str, text: str) -> None:
    render = FORMATS[fmt]
    lines = render(NON_DRIVER_RECORDS[record].format(text))
    assert [line for line in lines if parse_line(line) is not None] == []
    assert _events(render(BEFORE) + lines) == []
    assert _events(render(THREE_LINE.split("\n")[0]) + lines) == []


@settings(max_examples=100, deadline=None)
@given(record=st.sampled_from(sorted(NON_DRIVER_RECORDS)), text=EMBEDDED.map(lambda t: t.replace("\n", " ")))
def test_driver_text_inside_another_record_without_a_prefix_is_never_an_event(record: str, text: str) -> None:
    lines = BARE(NON_DRIVER_RECORDS[record].format(text))
    assert _events(lines) == []


@settings(max_examples=100, deadline=None)
@given(fmt=st.sampled_from([*FORMATS, "bare"]), text=EMBEDDED.map(lambda t: t[:COMM_LEN]))
def test_a_record_that_starts_with_a_process_name_is_never_an_event(fmt: str, text: str) -> None:
    render = FORMATS.get(fmt) or BARE
    if fmt == "bare":
        text = text.replace("\n", " ")
    assert _events(render(COMM_FIRST.format(text))) == []


@settings(max_examples=150, deadline=None)
@given(fmt=st.sampled_from(sorted(FORMATS)), text=EMBEDDED)
def test_driver_text_quoted_by_another_driver_record_is_never_an_event(fmt: str, text: str) -> None:
    """The driver's own message prints a client's version string: what it quotes is no event."""
    render = FORMATS[fmt]
    assert _events(render(DRIVER_QUOTING.format(text))) == []
    assert _events(render(THREE_LINE.split("\n")[0]) + render(DRIVER_QUOTING.format(text))) == []


def test_a_continuation_line_is_read_only_inside_the_three_line_form() -> None:
    """dmesg prints a newline in a name as an indented line: only the driver's three-line
    "fallen off the bus" message continues on such lines."""
    dmesg = FORMATS["dmesg"]
    quoted = "x\nNVRM: Xid (PCI:0000:3b:00): 79, x\nNVRM: fallen off the bus and is not responding"
    assert _events(dmesg(BEFORE) + dmesg(NON_DRIVER_RECORDS["exec-null-argv"].format(quoted))) == []
    assert _events(dmesg(DRIVER_QUOTING.format(quoted))) == []
    assert _events(dmesg(THREE_LINE)) == [(79, "0000:b3:00")]
    assert _events(dmesg(THREE_LINE)[1:]) == [], "its first line is what makes the others count"


# --------------------------------------------------------------------------- through the event store

FORGED = [
    (
        "exec-null-argv",
        NON_DRIVER_RECORDS["exec-null-argv"].format(
            "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus."
        ),
    ),
    ("apparmor-name", NON_DRIVER_RECORDS["apparmor-name"].format("/tmp/NVRM:Xid(PCI:0000:1a:00):48,DBE")),
    ("ext4", NON_DRIVER_RECORDS["ext4-mount-option"].format("NVRM: Xid (PCI:0000:1a:00): 48, DBE")),
    (
        "newline-in-name",
        NON_DRIVER_RECORDS["exec-null-argv"].format(
            "x\nNVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus."
        ),
    ),
]


@pytest.mark.parametrize(("name", "message"), FORGED, ids=[f[0] for f in FORGED])
def test_a_forged_kmsg_record_records_no_event_and_drains_nothing(tmp_path: Path, name: str, message: str) -> None:
    proc = tmp_path / "proc"
    (proc / "sys" / "kernel" / "random").mkdir(parents=True)
    (proc / "sys" / "kernel" / "random" / "boot_id").write_text("11111111-1111-4111-8111-111111111111\n")
    (proc / "stat").write_text("btime 1700000000\n")
    kmsg = tmp_path / "kmsg"
    real = "NVRM: Xid (PCI:0000:3b:00): 13, pid=4242, name=train.py, Graphics Exception: ESR 0x50"
    kmsg.write_text("\n".join(FORMATS["kmsg"](message)) + "\n" + f"4,2212,5123456790,-;{real}\n")
    store = XidStore(str(tmp_path / "state"), str(proc), str(kmsg))
    result = store.sync()
    assert [e["xid"] for e in result.state.events] == [13], "only the driver's own record is an event"
    assert result.state.kmsg_seq == 2212
