"""The gpu_xid check: a table of XID observations and the verdicts they must give."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Union

import pytest

from nodehealth.checks import gpu_xid
from nodehealth.checks.base import Context
from nodehealth.model import Action, CheckResult, Status
from nodehealth.observations import (
    GpuObservation,
    NvmlSnapshot,
    Observations,
    ProbeError,
    XidObservation,
    XidRecord,
)
from nodehealth.statedir.ledger import JobEntry as JobLedgerEntry  # the ledger's records
from nodehealth.xid.catalog import enrich, load_catalog
from nodehealth.xid.parse import parse_line

CATALOG = load_catalog()
BOOT, OLD_BOOT = "boot-now", "boot-before"
NOW = 1_800_000_000.0
CTX = Context(name="gpu_xid", phase="prolog", node="gpu017", expected_gpus="auto")

LINES = {
    79: "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.",
    48: "NVRM: Xid (PCI:0000:1a:00): 48, pid=9, name=a.out, An uncorrectable double bit error",
    64: "NVRM: Xid (PCI:0000:1a:00): 64, pid=77, name=x, Row Remapper failure",
    63: "NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu to activate.",
    13: "NVRM: Xid (PCI:0000:3b:00): 13, pid=4242, name=train.py, Graphics Exception: ESR 0x50",
    154: "NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
}


def rec(xid: int, ago_s: float = 60.0, boot: str = BOOT, job: Optional[str] = None, uptime: float = 100.0) -> XidRecord:
    event = parse_line(LINES[xid])
    assert event is not None
    event = enrich(event, CATALOG, job_id=job)
    from dataclasses import replace

    event = replace(event, uptime_s=uptime)
    return XidRecord(event=event, boot_id=boot, at=NOW - ago_s, current_boot=boot == BOOT)


def obs(
    *records: XidRecord, complete: bool = True, notes: tuple[str, ...] = (), ledger: tuple[JobLedgerEntry, ...] = ()
) -> XidObservation:
    return XidObservation(
        boot_id=BOOT,
        records=records,
        gathered_at=NOW,
        source="/dev/kmsg",
        complete=complete,
        kmsg_seq=1234,
        notes=notes,
        ledger=ledger,
    )


SNAP = NvmlSnapshot(
    "550.54",
    12040,
    2,
    (
        GpuObservation(index=0, uuid="GPU-aaaa", pci_bus_id="00000000:1A:00.0"),
        GpuObservation(index=3, uuid="GPU-dddd", pci_bus_id="00000000:3B:00.0"),
    ),
    0.01,
)


@dataclass
class Case:
    id: str
    xid: Union[XidObservation, ProbeError, None]
    status: Status
    action: Action = Action.NONE
    gpu: Optional[int] = None
    says: tuple[str, ...] = ()
    settings: dict[str, Any] = field(default_factory=dict)
    nvml: Any = SNAP


CASES = [
    Case("nothing-since-boot", obs(), Status.OK, says=("no XID since boot",)),
    Case("fallen-off-bus-fails-reboot", obs(rec(79)), Status.FAIL, Action.REBOOT, 3, ("GPU 3 (0000:3b:00)", "XID 79")),
    Case("dbe-fails-reset", obs(rec(48)), Status.FAIL, Action.RESET_GPU, 0, ("GPU 0 (0000:1a:00)", "XID 48")),
    Case(
        "without-nvml-the-pci-address-names-the-gpu",
        obs(rec(48)),
        Status.FAIL,
        Action.RESET_GPU,
        None,
        ("GPU 0000:1a:00",),
        nvml=ProbeError("nvml", "unavailable", "no NVML"),
    ),
    Case("worst-action-per-gpu", obs(rec(48), rec(64)), Status.FAIL, Action.INSPECT, 0, ("XID 48", "XID 64")),
    Case("repeats-are-counted", obs(rec(79, 100), rec(79, 50)), Status.FAIL, Action.REBOOT, 3, ("XID 79", "x2")),
    Case("job-named", obs(rec(79, job="81234")), Status.FAIL, Action.REBOOT, 3, ("job 81234",)),
    Case("recovery-action-154-reboot", obs(rec(154)), Status.FAIL, Action.REBOOT, 3, ("XID 154",)),
    Case("drain-outside-window-ok", obs(rec(48, ago_s=7200)), Status.OK, settings={"window_s": 3600}),
    Case("drain-inside-window", obs(rec(48, ago_s=600)), Status.FAIL, Action.RESET_GPU, 0, settings={"window_s": 3600}),
    Case("drain-window-0-is-whole-boot", obs(rec(48, ago_s=30 * 86400)), Status.FAIL, Action.RESET_GPU, 0),
    Case(
        "earlier-boot-inspect-class",
        obs(rec(64, boot=OLD_BOOT)),
        Status.FAIL,
        Action.INSPECT,
        0,
        ("earlier boot", "nodehealth xid clear"),
    ),
    Case("warning-class-warns", obs(rec(63)), Status.WARN, Action.RESET_GPU, None, ("XID 63",)),
    Case("warning-class-expires", obs(rec(63, ago_s=2 * 86400)), Status.OK),
    Case("one-application-xid-ok", obs(rec(13)), Status.OK, says=("1 XID event(s) since boot",)),
    Case(
        "application-burst-warns",
        obs(*[rec(13, uptime=100.0 + i) for i in range(25)]),
        Status.WARN,
        Action.INSPECT,
        3,
        ("25 application XIDs", "more than 20"),
    ),
    Case(
        "application-rate-configurable",
        obs(*[rec(13, uptime=100.0 + i) for i in range(5)]),
        Status.WARN,
        Action.INSPECT,
        3,
        settings={"application_max_events": 4},
    ),
    Case("application-spread-out-ok", obs(*[rec(13, uptime=100.0 + i * 4000) for i in range(25)]), Status.OK),
    Case("fail-beats-warn", obs(rec(63), rec(79)), Status.FAIL, Action.REBOOT, 3, ("XID 79", "XID 63")),
    Case("incomplete-read-unknown", obs(complete=False), Status.UNKNOWN, says=("not fully read", "deadline")),
    Case(
        "unreadable-kmsg-unknown-names-reason",
        obs(
            complete=False,
            notes=("cannot read /dev/kmsg: Permission denied (reading the kernel log needs root or CAP_SYSLOG)",),
        ),
        Status.UNKNOWN,
        says=("Permission denied", "root"),
    ),
    Case(
        "unreadable-kmsg-but-stored-drain-fails",
        obs(rec(79), complete=False, notes=("cannot read /dev/kmsg",)),
        Status.FAIL,
        Action.REBOOT,
        3,
        ("XID 79", "cannot read /dev/kmsg"),
    ),
    Case(
        "probe-error-unknown",
        ProbeError("xid", "permission", "cannot read /dev/kmsg: Permission denied"),
        Status.UNKNOWN,
        says=("cannot watch XIDs", "Permission denied"),
    ),
    Case(
        "probe-timeout-unknown",
        ProbeError("xid", "timeout", "xid probe did not finish within 10.2 s"),
        Status.UNKNOWN,
        says=("did not finish",),
    ),
    Case("not-probed-unknown", None, Status.UNKNOWN, says=("not read",)),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_gpu_xid_verdicts(case: Case) -> None:
    settings = gpu_xid.Settings(**case.settings)
    res = gpu_xid.evaluate(Observations(xid=case.xid, nvml=case.nvml), settings, CTX)
    assert isinstance(res, CheckResult)
    assert res.status == case.status, res.summary
    assert res.action == case.action, res.summary
    if case.status in (Status.FAIL, Status.WARN) and case.gpu is not None:
        assert res.gpu == case.gpu
    for text in case.says:
        assert text in res.summary


def test_details_carry_attributed_events_and_counts() -> None:
    ledger = (JobLedgerEntry(job_id="555", start=NOW - 3600, end=None, user="alice", gpus=(3,)),)
    res = gpu_xid.evaluate(
        Observations(xid=obs(rec(13), rec(79), rec(64, boot=OLD_BOOT), ledger=ledger), nvml=SNAP),
        gpu_xid.Settings(),
        CTX,
    )
    d = res.details
    assert (d["events_this_boot"], d["events_earlier_boots"], d["drain_events"]) == (2, 1, 2)
    by_xid = {e["xid"]: e for e in d["events"]}
    assert by_xid[79]["gpu"] == 3 and by_xid[79]["gpu_uuid"] == "GPU-dddd" and by_xid[79]["job_id"] == "555"
    assert by_xid[64]["current_boot"] is False and by_xid[64]["job_id"] is None
    assert by_xid[79]["severity"] == "drain" and by_xid[79]["action"] == "reboot"


def test_settings_defaults_are_documented_and_sane() -> None:
    s = gpu_xid.Settings()
    assert s.window_s == 0 and s.kmsg_path == "/dev/kmsg" and s.kernel_facility_only is True
    assert s.application_max_events == 20 and s.application_window_s == 3600


@pytest.mark.parametrize(
    "records,nvml,head",
    [
        ((rec(79),), SNAP, "nh:xid79 GPU3 gpu_xid: "),
        ((rec(48), rec(64)), SNAP, "nh:xid64 GPU0 "),  # one GPU: the XID with the most invasive action names it
        ((rec(63), rec(79)), SNAP, "nh:xid79 GPU3 "),  # the FAIL's XID, not the warning's
        ((rec(79, 100), rec(79, 50)), SNAP, "nh:xid79 GPU3 "),
        ((rec(48),), ProbeError("nvml", "unavailable", "no NVML"), "nh:xid48 gpu_xid: GPU 0000:1a:00"),
    ],
    ids=["79", "48+64-same-gpu", "warn+fail", "repeats", "gpu-unknown"],
)
def test_the_drain_reason_names_the_xid_and_gpu_of_the_worst_finding(
    records: tuple[XidRecord, ...], nvml: Any, head: str
) -> None:
    from nodehealth.slurm.policy import format_reason

    res = gpu_xid.evaluate(Observations(xid=obs(*records), nvml=nvml), gpu_xid.Settings(), CTX)
    assert res.status == Status.FAIL
    assert format_reason(res).startswith(head), format_reason(res)


def test_no_xid_is_named_when_the_verdict_is_not_an_xids() -> None:
    res = gpu_xid.evaluate(Observations(xid=obs(complete=False), nvml=SNAP), gpu_xid.Settings(), CTX)
    assert res.status == Status.UNKNOWN and "xid" not in res.details
