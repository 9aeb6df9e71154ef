"""NVSwitch SXids: the catalog, the gpu_sxid check's verdicts (a table of observations), gpu_xid leaving
them alone, and the whole way from a kernel-log file through the event store (the ``xid`` probe)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from nodehealth.checks import gpu_sxid, gpu_xid
from nodehealth.checks.base import Context
from nodehealth.model import Action, Status
from nodehealth.observations import Observations, ProbeError, XidObservation, XidRecord
from nodehealth.probes.xid_store import gather
from nodehealth.slurm import reasons
from nodehealth.xid.catalog import SXID_CATALOG_PATH, catalog_for, enrich, sxid_catalog_for
from nodehealth.xid.events import Severity
from nodehealth.xid.parse import MAX_LINE_BYTES, parse_line, scan
from nodehealth.xid.sxid import (
    ALWAYS_FATAL,
    CLASSES,
    FATAL,
    KIND_SXID,
    NON_FATAL,
    judge_sxid,
    link_of,
    parse_sxid_overrides,
    sxid_catalog_from_mapping,
)

FIXTURES = Path(__file__).parent / "fixtures" / "real-world" / "xid_logs"
BOOT, OLD_BOOT = "11111111-1111-4111-8111-111111111111", "boot-before"
NOW = 1_800_000_000.0
CTX = Context(name="gpu_sxid", phase="prolog", node="gpu017", expected_gpus="auto")
XCTX = replace(CTX, name="gpu_xid")

# Published lines (gpud's README and kmsg_test.go, tests/fixtures/real-world/xid_logs/gpud_sxid_*.log).
FATAL_20034 = "[6781753.400584] nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up"
NONFATAL_12028 = (
    "[111111111.111] nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted "
    "PRIV error (First)"
)
# An always-fatal SXid (the guide's table) whose line would say Non-fatal: written by hand.
ALWAYS_23001 = "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 23001, Non-fatal, Link 4 ingress SRC-VC buffer overflow"
XID_79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus."


def rec(line: str, at: float = NOW - 60.0, boot: str = BOOT) -> XidRecord:
    event = parse_line(line)
    assert event is not None
    return XidRecord(enrich(event, catalog_for()), boot, at, boot == BOOT)


def obs(*records: XidRecord, complete: bool = True) -> Observations:
    return Observations(xid=XidObservation(BOOT, records, NOW, "/dev/kmsg", complete=complete))


# --------------------------------------------------------------------------- the catalog


def test_the_catalog_file_loads_with_its_source_and_the_guides_classes() -> None:
    cat = sxid_catalog_for()
    assert "Fabric Manager" in cat.source
    assert {e.klass for e in cat.entries.values()} == set(CLASSES)
    assert cat.entries[20034].klass == FATAL and cat.name(20034) == "LTSSM Fault Up"
    assert cat.entries[12028].klass == NON_FATAL
    assert cat.entries[23001].klass == ALWAYS_FATAL
    assert cat.name(11111) == "UNKNOWN"
    assert SXID_CATALOG_PATH.name == "sxid_catalog.toml"


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ({}, "source"),
        ({"meta": {"source": ""}}, "source"),
        ({"meta": {"source": "x"}, "sxid": {"abc": {"name": "n", "class": "fatal"}}}, "SXid number"),
        ({"meta": {"source": "x"}, "sxid": {"1": {"class": "fatal"}}}, "name"),
        ({"meta": {"source": "x"}, "sxid": {"1": {"name": "n", "class": "deadly"}}}, "class"),
        ({"meta": {"source": "x"}, "sxid": [1]}, "table"),
    ],
    ids=["no-meta", "empty-source", "key", "no-name", "class", "not-a-table"],
)
def test_a_bad_catalog_is_refused_naming_what(data: Any, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        sxid_catalog_from_mapping(data)


@pytest.mark.parametrize("item", ["20034", "x=drain", "20034=application", "20034=fatal", "1234567=drain"])
def test_a_bad_override_is_refused(item: str) -> None:
    with pytest.raises(ValueError, match="SXid override"):
        parse_sxid_overrides([item])
    with pytest.raises(ValueError):
        gpu_sxid.Settings(severity_overrides=(item,)).validate()


@pytest.mark.parametrize(
    ("line", "overrides", "want"),
    [
        (FATAL_20034, (), (Severity.DRAIN, Action.REBOOT)),
        (NONFATAL_12028, (), (Severity.WARNING, Action.NONE)),
        (ALWAYS_23001, (), (Severity.DRAIN, Action.REBOOT)),
        (FATAL_20034, ("20034=warning",), (Severity.WARNING, Action.NONE)),
        (NONFATAL_12028, ("12028=drain",), (Severity.DRAIN, Action.REBOOT)),
        (
            "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 11111, Fatal, Link 2 unlisted",
            (),
            (Severity.DRAIN, Action.REBOOT),
        ),
        ("nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 11111, Non-fatal, Link 2", (), (Severity.WARNING, Action.NONE)),
    ],
    ids=[
        "fatal-line",
        "nonfatal-line",
        "always-fatal",
        "override-warning",
        "override-drain",
        "unlisted-fatal",
        "unlisted",
    ],
)
def test_the_verdict_on_one_sxid(line: str, overrides: tuple[str, ...], want: Any) -> None:
    event = parse_line(line)
    assert event is not None and event.kind == KIND_SXID
    assert judge_sxid(event, sxid_catalog_for(overrides)) == want


def test_enrichment_names_the_sxid_and_no_gpu() -> None:
    ev = rec(FATAL_20034).event
    assert (ev.severity, ev.action, ev.mnemonic, ev.gpu) == (Severity.DRAIN, Action.REBOOT, "LTSSM Fault Up", None)
    assert link_of(ev) == 48


# --------------------------------------------------------------------------- the check


def _judge(*records: XidRecord, **settings: Any) -> Any:
    return gpu_sxid.evaluate(obs(*records), gpu_sxid.Settings(**settings), CTX)


def test_no_sxid_is_ok() -> None:
    res = _judge(rec(XID_79))
    assert res.status == Status.OK and res.summary == "no NVSwitch SXid since boot"


def test_a_fatal_sxid_fails_naming_the_nvswitch_the_sxid_and_its_links() -> None:
    res = _judge(rec(FATAL_20034), rec(FATAL_20034.replace("Link 48", "Link 50")), rec(NONFATAL_12028))
    assert res.status == Status.FAIL and res.action == Action.REBOOT
    assert "NVSwitch 0000:06:00: fatal SXid 20034 LTSSM Fault Up (link 48, 50) x2" in res.summary
    assert res.gpu is None
    assert reasons.reason_head(res) == "nh:sxid"
    assert res.details["fatal_events"] == 2 and res.details["sxid_events_this_boot"] == 3
    assert res.details["events"][0]["sxid"] == 20034 and res.details["events"][0]["link"] == 48


def test_an_always_fatal_sxid_fails_whatever_its_line_says() -> None:
    assert _judge(rec(ALWAYS_23001)).status == Status.FAIL


def test_a_fatal_sxid_of_an_earlier_boot_is_not_judged() -> None:
    assert _judge(rec(FATAL_20034, boot=OLD_BOOT)).status == Status.OK


def test_overrides_change_the_verdict() -> None:
    assert _judge(rec(FATAL_20034), severity_overrides=("20034=warning",)).status == Status.OK
    assert _judge(rec(NONFATAL_12028), severity_overrides=("12028=drain",)).status == Status.FAIL


def test_non_fatal_sxids_warn_only_past_their_rate_per_nvswitch() -> None:
    burst = [rec(NONFATAL_12028, at=NOW - 100 + i) for i in range(4)]
    assert _judge(*burst, nonfatal_max_events=4).status == Status.OK
    res = _judge(*burst, nonfatal_max_events=3)
    assert res.status == Status.WARN and res.action == Action.INSPECT
    assert "NVSwitch 0000:05:00: 4 non-fatal SXids within 3600 s (more than 3)" in res.summary
    spread = [rec(NONFATAL_12028, at=NOW - 10_000 * i) for i in range(4)]
    assert _judge(*spread, nonfatal_max_events=1).status == Status.OK
    other = [rec(NONFATAL_12028.replace("0000:05:00.0", f"0000:0{i}:00.0")) for i in range(4)]
    assert _judge(*other, nonfatal_max_events=1).status == Status.OK  # one each: per NVSwitch


def test_the_kernel_log_not_read_is_never_ok() -> None:
    assert gpu_sxid.evaluate(Observations(), gpu_sxid.Settings(), CTX).status == Status.UNKNOWN
    broken = Observations(xid=ProbeError("xid", "permission", "permission denied"))
    assert gpu_sxid.evaluate(broken, gpu_sxid.Settings(), CTX).status == Status.UNKNOWN
    absent = Observations(xid=ProbeError("xid", "unavailable", "no kernel log"))
    assert gpu_sxid.evaluate(absent, gpu_sxid.Settings(), CTX).status == Status.SKIPPED
    cut = gpu_sxid.evaluate(obs(complete=False), gpu_sxid.Settings(), CTX)
    assert cut.status == Status.UNKNOWN


def test_gpu_xid_leaves_sxids_to_gpu_sxid() -> None:
    res = gpu_xid.evaluate(obs(rec(FATAL_20034), rec(NONFATAL_12028)), gpu_xid.Settings(), XCTX)
    assert res.status == Status.OK and res.details["events"] == []
    both = gpu_xid.evaluate(obs(rec(FATAL_20034), rec(XID_79)), gpu_xid.Settings(), XCTX)
    assert both.status == Status.FAIL and "20034" not in both.summary and both.details["xid"] == 79


# --------------------------------------------------------------------------- hostile text


def test_an_sxid_line_past_the_line_limit_is_skipped_and_counted() -> None:
    line = (FATAL_20034 + " " + "x" * MAX_LINE_BYTES).encode()
    events = list(scan([line]))
    assert events == []


def test_an_sxid_quoted_by_a_user_or_a_program_is_no_event() -> None:
    quoted = [
        "6,9,1,-;process 'x' launched 'nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 1' with NULL argv",
        "May 19 07:08:57 gpu017 logger: nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 1",
        "   nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 1",  # a continuation line
    ]
    assert list(scan(quoted)) == []


# --------------------------------------------------------------------------- through the store


class Node:
    def __init__(self, root: Path) -> None:
        self.proc = root / "proc"
        (self.proc / "sys" / "kernel" / "random").mkdir(parents=True)
        (self.proc / "sys" / "kernel" / "random" / "boot_id").write_text(BOOT + "\n")
        (self.proc / "stat").write_text("btime 1700000000\n")
        self.kmsg = root / "kmsg"
        self.state = root / "state"
        self.state.mkdir()

    def log(self, *records: tuple[int, str]) -> None:
        """``(priority, message)`` records in /dev/kmsg's format (priority 4: the kernel's, 14: a user's)."""
        self.kmsg.write_text("".join(f"{p},{i},{i * 1_000_000},-;{m}\n" for i, (p, m) in enumerate(records, 1)))

    def judge(self, kernel_only: bool = True) -> tuple[Any, Any]:
        x = gather(str(self.state), str(self.proc), str(self.kmsg), (), 1000, kernel_only, 10.0)
        o = Observations(xid=x)
        return gpu_sxid.evaluate(o, gpu_sxid.Settings(), CTX), gpu_xid.evaluate(o, gpu_xid.Settings(), XCTX)


def _message(line: str) -> str:
    return line.split("] ", 1)[1] if line.startswith("[") else line


def test_the_published_sxid_log_through_the_store(tmp_path: Path) -> None:
    node = Node(tmp_path)
    lines = (FIXTURES / "gpud_sxid_readme_dmesg.log").read_text().splitlines()
    node.log(*((4, _message(line)) for line in lines))
    sx, xid = node.judge()
    assert sx.status == Status.FAIL
    assert sx.details["switches"] == ["NVSwitch 0000:05:00", "NVSwitch 0000:06:00", "NVSwitch 0000:07:00"]
    assert sx.details["fatal_events"] == 4
    assert xid.status == Status.FAIL and xid.details["xid"] == 79  # the XID 79 stays gpu_xid's
    again, _ = node.judge()  # read back from the store's file: still SXids, still fatal
    assert again.status == Status.FAIL and again.details["fatal_events"] == 4


def test_an_sxid_written_from_user_space_is_not_the_kernels(tmp_path: Path) -> None:
    for kernel_only, want in ((True, Status.OK), (False, Status.FAIL)):
        node = Node(tmp_path / str(kernel_only))
        node.log((14, _message(FATAL_20034)))
        assert node.judge(kernel_only)[0].status == want


# --------------------------------------------------------------------------- the metric


def test_the_metric_counts_this_boots_sxids_per_nvswitch_and_class() -> None:
    from nodehealth.metrics.exposition import render
    from nodehealth.metrics.renderers import report_families
    from nodehealth.model import Report

    res = _judge(rec(FATAL_20034), rec(FATAL_20034), rec(NONFATAL_12028), rec(FATAL_20034, boot=OLD_BOOT))
    page = render(report_families(Report("gpu017", "daemon", (res,), 0.0, "X", NOW))).decode()
    assert 'nodehealth_nvswitch_sxid_errors_total{class="fatal",switch="0000:06:00"} 2.0' in page
    assert 'nodehealth_nvswitch_sxid_errors_total{class="non_fatal",switch="0000:05:00"} 1.0' in page
    quiet = render(report_families(Report("gpu017", "daemon", (_judge(),), 0.0, "X", NOW))).decode()
    assert "nvswitch_sxid" not in quiet  # no SXid, no series


def test_xid_scan_names_an_sxid_as_one() -> None:
    from nodehealth.commands.xid import format_event

    assert " SXid 20034 LTSSM Fault Up pci=0000:06:00 severity=drain action=reboot: Fatal, Link 48" in format_event(
        rec(FATAL_20034).event
    )
    assert " XID 79 " in format_event(rec(XID_79).event)


def test_hostile_payload_text_stays_out_of_the_summary_and_bounded_in_the_details() -> None:
    line = "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 7 \x1b[31mred\x07 " + "y" * 20_000
    res = _judge(rec(line))
    assert res.status == Status.FAIL
    assert res.summary.startswith("NVSwitch 0000:05:00: fatal SXid 20034 LTSSM Fault Up (link 7)")
    assert "\x1b" not in res.summary and "y" * 10 not in res.summary
    message = res.details["events"][0]["message"]
    assert "\x1b" not in message and "\x07" not in message and len(message) < 5000


# --------------------------------------------------------------------------- through the runner


def test_the_runner_reads_the_kernel_log_once_for_both_checks(tmp_path: Path) -> None:
    from nodehealth import runner
    from nodehealth.config import loader as config

    node = Node(tmp_path)
    node.log((4, _message(FATAL_20034)), (4, _message(NONFATAL_12028)), (6, "eth0: link up"))
    cfg = config.resolve(
        {
            "paths": {"procfs_root": str(node.proc), "state_dir": str(node.state), "sysfs_root": str(tmp_path)},
            "checks": {"gpu_xid": {"kmsg_path": str(node.kmsg)}},
        },
        "<test>",
    )
    out = runner.execute(cfg, phase="daemon", only=("gpu_xid", "gpu_sxid"), node="gpu001")
    by = {r.name: r for r in out.report.results}
    assert by["gpu_sxid"].status is Status.FAIL and by["gpu_sxid"].details["sxid_events_this_boot"] == 2
    assert by["gpu_xid"].status is Status.OK  # no XID: the SXids are not its
    assert reasons.reason_head(by["gpu_sxid"]) == "nh:sxid"
