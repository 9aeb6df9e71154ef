"""Text from the kernel log is safe to print: no control character or terminal escape reaches a
terminal or a summary (``xid scan`` text and JSON, ``xid watch``, the check, the store, the
daemon's follower), and process names and messages are bounded."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path
from typing import Any

import pytest
from helpers_xid import follow_until_seen
from hypothesis import given, settings
from hypothesis import strategies as st

from nodehealth.checks import gpu_xid
from nodehealth.checks.base import Context
from nodehealth.commands import xid as xid_cmd
from nodehealth.observations import Observations, XidObservation, XidRecord
from nodehealth.probes.xid_store import XidStore, load_state
from nodehealth.xid.catalog import enrich, load_catalog
from nodehealth.xid.events import XidEvent
from nodehealth.xid.parse import parse_line, scan
from nodehealth.xid.text import MAX_MESSAGE_CHARS, MAX_PROCESS_CHARS, printable

# What a terminal acts on: C0 controls (ESC, \r, backspace, BEL ...), DEL, C1 controls (CSI
# U+009B, OSC U+009D ...), and the bidirectional and zero-width format characters.
HOSTILE = [
    "\x1b[2J\x1b[H",
    "\x1b]0;owned\x07",
    "\r",
    "\x08\x08\x08",
    "\x9b31m",
    "\x9d0;x\x9c",
    "\x7f",
    "\x00",
    "\u202e",
    "\u200b",
    "\u2028",
    "\t",
    "\n",
    "\x0b",
    "\x85",
]
# In a line: all but NUL (a line with NUL is not text; the scanner skips it) and the newline.
ESCAPES = "".join(h for h in HOSTILE if h not in ("\x00", "\n"))
NAME = f"evil{ESCAPES}name"
LINE = f"[ 94.571234] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name={NAME}, GPU has fallen{ESCAPES} off the bus."


def terminal_safe(text: str) -> bool:
    """Every character printable (``\\n`` between lines aside)."""
    return all(line.isprintable() for line in text.split("\n"))


@pytest.mark.parametrize("bad", HOSTILE)
def test_printable_escapes_what_a_terminal_acts_on(bad: str) -> None:
    out = printable(f"a{bad}b")
    assert out.isprintable() and out.startswith("a") and out.endswith("b")
    assert bad not in out


def test_printable_keeps_printable_text_and_bounds_it() -> None:
    assert printable("café ☃ ray::WorkerDict") == "café ☃ ray::WorkerDict"
    assert printable("\x1b[31m") == "\\x1b[31m", "as /dev/kmsg writes it"
    assert printable("\u202e") == "\\u202e" and printable("\U000e0001") == "\\U000e0001"
    assert printable("x" * 200, 64) == "x" * 64
    assert printable("\x1b" * 10, 10) == "\\x1b\\x1b", "an escape is never cut in half"
    assert printable("x" * 200, None) == "x" * 200


@settings(max_examples=200, deadline=None)
@given(st.text(), st.integers(min_value=0, max_value=80))
def test_printable_output_is_always_printable_and_within_its_bound(text: str, limit: int) -> None:
    out = printable(text, limit)
    assert out.isprintable() and len(out) <= limit


def test_the_parser_makes_process_and_message_printable_and_bounded() -> None:
    event = parse_line(LINE)
    assert event is not None and event.xid == 79 and event.pid == 1234
    assert event.process is not None and event.process.isprintable() and event.process.startswith("evil\\x1b[2J")
    assert event.message.isprintable() and "fallen" in event.message
    long = parse_line("NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=" + "p" * 500 + ", " + "m" * 5000)
    assert long is not None
    assert long.process == "p" * MAX_PROCESS_CHARS and long.message == "m" * MAX_MESSAGE_CHARS


def run_scan(path: Path, fmt: str, capsys: pytest.CaptureFixture[str]) -> str:
    parser = argparse.ArgumentParser(prog="nodehealth")
    xid_cmd.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["xid", "scan", "--from", str(path), "--format", fmt, "--no-nvml"])
    assert args.func(args) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_xid_scan_prints_no_escape(tmp_path: Path, fmt: str, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "kern.log"
    log.write_bytes(LINE.encode() + b"\n")
    out = run_scan(log, fmt, capsys)
    assert "XID 79" in out or '"xid": 79' in out
    assert terminal_safe(out), repr(out)
    if fmt == "json":
        row = json.loads(out)
        # what `jq -r .process` would print
        assert terminal_safe(row["process"]) and terminal_safe(row["message"])


def _event(**kw: Any) -> XidEvent:
    base = parse_line("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.")
    assert base is not None
    from dataclasses import replace

    return replace(enrich(base, load_catalog()), **kw)


# What reaches the printing code from elsewhere than the parser: the job ledger, an older store.
RAW = {
    "process": NAME * 20,
    "message": f"m{ESCAPES}" * 300,
    "job_id": f"81234{ESCAPES}",
    "time": f"t{ESCAPES}",
    "mnemonic": f"GPU_HAS_FALLEN{ESCAPES}",
    "gpu_uuid": f"GPU-{ESCAPES}",
}


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_xid_watch_output_has_no_escape_whatever_the_event_holds(fmt: str) -> None:
    out = io.StringIO()
    xid_cmd._print_event(_event(**RAW), fmt, out)
    text = out.getvalue()
    assert text.endswith("\n") and text.count("\n") == 1
    assert terminal_safe(text), repr(text)
    if fmt == "json":
        row = json.loads(text)
        assert all(terminal_safe(v) for v in row.values() if isinstance(v, str))
        assert len(row["process"]) <= MAX_PROCESS_CHARS and len(row["message"]) <= MAX_MESSAGE_CHARS


def test_the_check_summary_and_details_have_no_escape() -> None:
    record = XidRecord(event=_event(**RAW), boot_id="b", at=1.0, current_boot=True)
    obs = XidObservation(boot_id="b", records=(record,), gathered_at=2.0, source="/dev/kmsg", complete=True, kmsg_seq=1)
    ctx = Context(name="gpu_xid", phase="prolog", node="n", expected_gpus="auto")
    res = gpu_xid.evaluate(Observations(xid=obs), gpu_xid.Settings(), ctx)
    assert "XID 79" in res.summary and "job 81234" in res.summary
    assert terminal_safe(res.summary), repr(res.summary)
    details = json.dumps(res.details, ensure_ascii=False)
    assert terminal_safe(json.loads(details)["events"][0]["message"])
    assert all(terminal_safe(v) for v in res.details["events"][0].values() if isinstance(v, str))


def _node(tmp_path: Path, records: bytes) -> XidStore:
    proc = tmp_path / "proc"
    (proc / "sys" / "kernel" / "random").mkdir(parents=True)
    (proc / "sys" / "kernel" / "random" / "boot_id").write_text("11111111-1111-4111-8111-111111111111\n")
    (proc / "stat").write_text("btime 1700000000\n")
    (tmp_path / "kmsg").write_bytes(records)
    return XidStore(str(tmp_path / "state"), str(proc), str(tmp_path / "kmsg"))


def test_the_store_holds_printable_bounded_text_and_the_follower_hands_it_on(tmp_path: Path) -> None:
    # A replayed file of records may hold raw bytes (the kernel would have escaped them).
    message = LINE.split("] ", 1)[1].replace(", pid=1234, name=", ", pid=1234, name=" + "x" * 300)
    store = _node(tmp_path, f"4,1,94571234,-;{message}\n".encode())
    (record,) = follow_until_seen(store)
    assert record.event.process is not None and terminal_safe(record.event.process)
    assert terminal_safe(record.event.message)
    (stored,) = load_state(store.state_dir)[0].events
    assert len(stored["process"]) == MAX_PROCESS_CHARS and stored["process"].isprintable()
    assert stored["message"].isprintable() and len(stored["message"]) <= MAX_MESSAGE_CHARS


def test_scan_of_raw_text_never_yields_unprintable_text() -> None:
    lines = [LINE, "NVRM: Xid (PCI:0000:3b:00): 13, pid=7, name=\x1b[8m, hidden\x1b[0m"]
    events = list(scan(lines))
    assert len(events) == 2
    for e in events:
        assert terminal_safe(e.message) and (e.process is None or terminal_safe(e.process))


def test_the_store_bounds_what_it_is_given_from_elsewhere_than_the_parser() -> None:
    from nodehealth.probes.xid_store import StoreState, add_events, catalog_for

    state = StoreState(boot_id="b")
    event = XidEvent(
        xid=13,
        pci="0000:3b:00",
        process=RAW["process"],
        message=RAW["message"],
        job_id=RAW["job_id"],
        time=RAW["time"],
        seq=5,
    )
    assert add_events(state, [(event, None, 0.0)], catalog_for(())) == 1
    (stored,) = state.events
    for key in ("process", "message", "job_id", "time"):
        assert stored[key].isprintable(), key
    assert len(stored["process"]) <= MAX_PROCESS_CHARS and len(stored["message"]) <= MAX_MESSAGE_CHARS
    assert stored["process"].startswith("evil\\x1b[2J") and len(stored["process"]) > MAX_PROCESS_CHARS - 8
