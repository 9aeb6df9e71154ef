"""``nodehealth xid`` through argparse, as the main CLI will call it."""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path

import pytest

from nodehealth.commands import xid

FIXTURES = Path(__file__).parent / "fixtures" / "real-world"
XID119_LOG = FIXTURES / "xid_logs" / "gpud_dmesg_T_xid119_gsp_timeouts.log"


def run(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="nodehealth")
    sub = parser.add_subparsers(dest="command")
    xid.register(sub)
    args = parser.parse_args(list(argv))
    return int(args.func(args))


def test_scan_file_text(capsys: pytest.CaptureFixture[str]) -> None:
    assert run("xid", "scan", "--from", str(XID119_LOG)) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 5
    assert lines[0].startswith("Sun Feb 23 16:24:18 2025 XID 119 GSP_RPC_TIMEOUT pci=0000:9b:00 severity=drain")
    assert "process=nvidia-smi" in lines[0]


def test_scan_file_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert run("xid", "scan", "--from", str(XID119_LOG), "--format", "json") == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["xid"], r["pci"]) for r in rows] == [(119, "0000:9b:00")] * 5
    required = {"xid", "pci", "gpu", "pid", "process", "job_id", "kind", "severity", "action", "message", "time"}
    assert required <= set(rows[0])
    assert rows[-1]["process"] == "gpud"
    assert rows[-1]["pid"] == 1240590
    assert rows[0]["action"] == "reset_gpu"


def test_scan_no_xid_log_says_so_on_stderr_and_prints_no_event(capsys: pytest.CaptureFixture[str]) -> None:
    log = FIXTURES / "xid_logs" / "hf_m4logs_jeanzay_dmesg_T_no_xid.log"
    assert run("xid", "scan", "--from", str(log)) == 0
    captured = capsys.readouterr()
    assert captured.out == ""  # stdout stays the events only (a pipe sees nothing)
    lines = len(log.read_bytes().splitlines())
    assert captured.err == f"nodehealth xid scan: read {lines} line(s) from {log}: no XID event\n"


def test_kmsg_records_get_a_wall_clock_time() -> None:
    from nodehealth.commands.xid import format_event
    from nodehealth.xid.events import XidEvent

    event = XidEvent(
        xid=79,
        pci="0000:3b:00",
        kind="xid",
        pid=None,
        process=None,
        message="x",
        time=None,
        uptime_s=100.0,
        seq=1,
        raw="",
    )
    assert format_event(event, booted=1796000000.0).startswith("2026-11-30T")  # 1796000100 UTC
    assert format_event(event).startswith("- ")


def test_scan_stdin_mixed_formats(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    data = (
        b"4,1834,94571234,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.\n"
        b" SUBSYSTEM=pci\n"
        b"May 19 07:08:57 gpu01 kernel: [680111.646286] NVRM: Xid (PCI:0000:10:1c): 63, pid=1850, Row Remapper\n"
        b"\xff\xfe junk NVRM \x00\n"
        b"NVRM: GPU 0000:01:00.0: GPU has fallen off the bus.\n"
    )
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    assert run("xid", "scan", "--from", "-", "--format", "json") == 0
    captured = capsys.readouterr()
    rows = [json.loads(line) for line in captured.out.splitlines()]
    assert [(r["xid"], r["pci"], r["kind"], r["seq"]) for r in rows] == [
        (79, "0000:3b:00", "xid", 1834),
        (63, "0000:10:1c", "xid", None),
        (79, "0000:01:00", "fallen_off_bus", None),
    ]
    assert rows[1]["time"] == "May 19 07:08:57"
    assert "skipped 1 of 5 lines" in captured.err


def test_scan_kmsg_backlog(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.write_bytes(
        b"6,1,0,-;Linux version 6.1\n3,9,5000000,-;NVRM: Xid (PCI:0000:3b:00): 48, pid=7, name=a.out, DBE\n"
    )
    assert run("xid", "scan", "--kmsg", str(kmsg), "--format", "json") == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["xid"], r["seq"], r["time"]) for r in rows] == [(48, 9, "5.000000")]


def test_scan_unreadable_kmsg_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run("xid", "scan", "--kmsg", str(tmp_path / "missing")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "cannot read" in err and "missing" in err and "No such file" in err


def test_scan_missing_file_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run("xid", "scan", "--from", str(tmp_path / "nope.log")) == 2
    assert "nope.log" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("number", "expected"),
    [
        pytest.param(
            "79",
            [
                "XID 79  GPU_HAS_FALLEN_OFF_THE_BUS",
                "severity:       drain",
                "action:         reboot",
                "NVIDIA action:  restart the bare-metal node (RESTART_BM)",
            ],
            id="xid79",
        ),
        pytest.param("13", ["severity:       application", "application-XID rate rule"], id="xid13"),
        pytest.param(
            "154",
            ["GPU_RECOVERY_ACTION_CHANGED", "0x2 Node Reboot Required: severity drain, action reboot"],
            id="xid154",
        ),
        pytest.param("149", ["when Fatal:     severity drain, action reset_gpu"], id="xid149"),
    ],
)
def test_explain_text(number: str, expected: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert run("xid", "explain", number) == 0
    out = capsys.readouterr().out
    for text in expected:
        assert text in out
    assert "source:" in out


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_explain_of_an_xid_the_catalog_does_not_know_says_so_and_exits_2(
    fmt: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Most often a typo: the stand-in entry (what gpu_xid does with it) is shown, and the exit is not 0."""
    assert run("xid", "explain", "9999", "--format", fmt) == 2
    captured = capsys.readouterr()
    if fmt == "json":
        assert json.loads(captured.out)["known"] is False
    else:
        assert all(t in captured.out for t in ("XID 9999  UNKNOWN", "severity:       warning", "action:  "))
    assert "XID 9999 is not in the catalog" in captured.err


def test_explain_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert run("xid", "explain", "63", "--format", "json") == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["xid"], data["severity"], data["action"], data["nvidia_action"]) == (
        63,
        "warning",
        "reset_gpu",
        "IGNORE",
    )
    assert "nvidia.com" in data["source"]


@pytest.mark.parametrize(
    "argv", [["xid"], ["xid", "explain", "abc"], ["xid", "explain", "-5"], ["xid", "scan", "--format", "xml"]]
)
def test_usage_errors_exit_2(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        run(*argv)
    assert exc.value.code == 2
