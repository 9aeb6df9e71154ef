"""Epilog job forensics: XIDs and ECC increments during the job (pure table tests, then the faces)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import pytest

from nodehealth.checks.job_forensics import ecc_increments, job_forensics
from nodehealth.model import Action, Status
from nodehealth.observations import (
    EccCounts,
    GpuObservation,
    NvmlSnapshot,
    ProbeError,
    RemappedRows,
    XidObservation,
    XidRecord,
    gpu_counters,
)
from nodehealth.statedir.counters import counters_record
from nodehealth.statedir.ledger import JobEntry as JobLedgerEntry  # the ledger's records
from nodehealth.xid.events import Severity, XidEvent

PCI = ["0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0"]
T0 = 1_800_000_000.0  # job start
NOW = T0 + 600


def gpu(i: int, vu: int = 0, vc: int = 0, ru: int = 0, rc: int = 0, uuid: Optional[str] = None) -> GpuObservation:
    return GpuObservation(
        index=i,
        uuid=uuid or f"GPU-{i}",
        pci_bus_id=PCI[i],
        ecc=EccCounts(volatile_corrected=vc, volatile_uncorrected=vu),
        remapped_rows=RemappedRows(correctable=rc, uncorrectable=ru, pending=False, failure=False),
    )


def snap(*gpus: GpuObservation) -> NvmlSnapshot:
    return NvmlSnapshot(
        driver_version="550", cuda_driver_version=12040, device_count=len(gpus), gpus=gpus, elapsed_s=0.01
    )


def baseline(*gpus: GpuObservation, boot: str = "b1", job_gpus: Optional[list[int]] = None) -> dict[str, Any]:
    return counters_record(gpu_counters(gpus), T0 - 1, boot, "prolog", job_gpus, "42")


def xev(
    xid: int, gpu_i: Optional[int], sev: Severity, job: Optional[str] = None, action: Optional[Action] = None
) -> XidEvent:
    return XidEvent(
        xid=xid,
        pci=PCI[gpu_i][:12] if gpu_i is not None else None,
        job_id=job,
        severity=sev,
        action=action or (Action.REBOOT if sev == Severity.DRAIN else Action.NONE),
    )


def xobs(
    *recs: tuple[XidEvent, Optional[float]], ledger: tuple[JobLedgerEntry, ...] = (), current: bool = True
) -> XidObservation:
    return XidObservation(
        boot_id="b1",
        records=tuple(XidRecord(e, "b1", at, current) for e, at in recs),
        gathered_at=NOW,
        source="file",
        ledger=ledger,
    )


QUIET = xobs()
FOUR = [gpu(i) for i in range(4)]


def judge(
    before: Any,
    after: Any,
    xid: Any = QUIET,
    gpus: Optional[tuple[int, ...]] = (0, 1),
    boot: str = "b1",
    start: Optional[float] = T0,
) -> Any:
    return job_forensics("42", gpus, before, after, xid, start, NOW, boot)


@pytest.mark.parametrize(
    "after, status, words",
    [
        (snap(*FOUR), Status.OK, "job 42: no XID or ECC increment"),
        (snap(gpu(0, vc=3), *FOUR[1:]), Status.WARN, "job 42: GPU 0: +3 corrected ECC error(s) during the job"),
        (snap(gpu(0, rc=1), *FOUR[1:]), Status.WARN, "job 42: GPU 0: +1 row(s) remapped for correctable errors"),
        (
            snap(gpu(0), gpu(1, vu=2, vc=9), *FOUR[2:]),
            Status.FAIL,
            "job 42: GPU 1: +2 uncorrectable ECC error(s) during the job",
        ),
        (snap(gpu(0, ru=1), *FOUR[1:]), Status.FAIL, "job 42: GPU 0: +1 row(s) remapped for uncorrectable errors"),
        # Increments on GPUs of other jobs are not this job's.
        (snap(gpu(0), gpu(1), gpu(2, vu=5), gpu(3, vc=1)), Status.OK, "no XID or ECC increment"),
    ],
)
def test_ecc_increments_table(after: NvmlSnapshot, status: Status, words: str) -> None:
    res = judge(baseline(*FOUR), after)
    assert res.name == "job_forensics"
    assert res.status == status, res
    assert words in res.summary, res.summary
    if status == Status.FAIL:
        assert res.action == Action.RESET_GPU and res.gpu is not None


def test_uncorrectable_wins_over_corrected_and_both_gpus_named() -> None:
    res = judge(baseline(*FOUR), snap(gpu(0, vc=4), gpu(1, vu=1), *FOUR[2:]))
    assert res.status == Status.FAIL and res.gpu == 1
    assert res.summary.startswith("job 42: GPU 1: +1 uncorrectable") and "GPU 0: +4 corrected" in res.summary
    incs = res.details["ecc_increments"]
    assert {"gpu": 1, "counter": "volatile_uncorrected", "before": 0, "after": 1} in incs


def test_counters_matched_by_uuid_when_indexes_move() -> None:
    before = baseline(gpu(0, uuid="U-a"), gpu(1, uuid="U-b"))
    after = snap(gpu(0, uuid="U-b"), gpu(1, uuid="U-a", vu=1))  # renumbered; U-a got an error
    res = judge(before, after, gpus=(0,))
    assert res.status == Status.FAIL and "GPU 1: +1 uncorrectable" in res.summary


@pytest.mark.parametrize(
    "before, after, boot, note",
    [
        (None, snap(*FOUR), "b1", "no ECC baseline"),
        ("base", ProbeError("nvml", "timeout", "NVML did not answer"), "b1", "no NVML reading at job end"),
        ("base", snap(*FOUR), "b2", "rebooted during the job"),
    ],
)
def test_nothing_to_compare_is_not_a_fault(before: Any, after: Any, boot: str, note: str) -> None:
    b = baseline(*FOUR) if before == "base" else before
    res = judge(b, after, xid=ProbeError("xid", "unavailable", "simulated"), boot=boot)
    assert res.status == Status.SKIPPED, res
    assert note in res.summary and res.summary.startswith("job 42:")


def test_counter_reset_during_the_job_is_noted_not_judged() -> None:
    res = judge(baseline(gpu(0, vc=10, vu=1), *FOUR[1:]), snap(*FOUR))
    assert res.status == Status.OK
    assert any("went from 10 to 0" in n for n in res.details["notes"])


def test_ecc_increments_helper_with_unknown_job_gpus() -> None:
    before = gpu_counters(FOUR)
    after = gpu_counters([gpu(0), gpu(1), gpu(2, vc=1), gpu(3)])
    incs, notes = ecc_increments(before, after, None)
    assert incs == [(2, "volatile_corrected", 0, 1)] and notes == []


@pytest.mark.parametrize(
    "xid, status, words",
    [
        # Drain-class XID on a job GPU inside the job's window.
        (xobs((xev(79, 0, Severity.DRAIN), T0 + 100)), Status.FAIL, "job 42: GPU 0: XID 79 during the job"),
        # Attributed to the job by the event store (process alive when read): counts wherever it was.
        (xobs((xev(48, 3, Severity.DRAIN, job="42", action=Action.RESET_GPU), T0 + 5)), Status.FAIL, "GPU 3: XID 48"),
        # Attributed to another job: not ours, even on our GPU in our window.
        (xobs((xev(79, 0, Severity.DRAIN, job="41"), T0 + 100)), Status.OK, "no XID"),
        # Before the job started, or on another job's GPU: not ours.
        (xobs((xev(79, 0, Severity.DRAIN), T0 - 100)), Status.OK, "no XID"),
        (xobs((xev(79, 2, Severity.DRAIN), T0 + 100)), Status.OK, "no XID"),
        # Earlier boot's event: not this job's.
        (xobs((xev(79, 0, Severity.DRAIN), T0 + 100), current=False), Status.OK, "no XID"),
        # Warning-class: WARN; application-class: the job's own fault, not the node's.
        (xobs((xev(63, 1, Severity.WARNING), T0 + 100)), Status.WARN, "job 42: GPU 1: XID 63 during the job"),
        (xobs((xev(13, 1, Severity.APPLICATION), T0 + 100)), Status.OK, "no XID"),
    ],
)
def test_xid_table(xid: XidObservation, status: Status, words: str) -> None:
    res = judge(baseline(*FOUR), snap(*FOUR), xid=xid)
    assert res.status == status, res
    assert words in res.summary, res.summary
    if status == Status.FAIL:
        assert res.action in (Action.REBOOT, Action.RESET_GPU)


def test_xid_attributed_through_the_ledger() -> None:
    ledger = (JobLedgerEntry("42", T0, None, "alice", (0, 1)),)
    res = judge(
        baseline(*FOUR), snap(*FOUR), xid=xobs((xev(79, 1, Severity.DRAIN), T0 + 50), ledger=ledger), start=None
    )  # no start known: the ledger attribution alone decides
    assert res.status == Status.FAIL and res.gpu == 1
    assert res.details["xids"][0]["job_id"] == "42"


def test_xid_and_ecc_together_drain_class_first() -> None:
    res = judge(baseline(*FOUR), snap(gpu(0, vc=2), *FOUR[1:]), xid=xobs((xev(79, 1, Severity.DRAIN), T0 + 1)))
    assert res.status == Status.FAIL and res.action == Action.REBOOT
    assert res.summary.startswith("job 42: GPU 1: XID 79") and "GPU 0: +2 corrected" in res.summary


@pytest.mark.parametrize(
    "after, xid, head",
    [
        (snap(*FOUR), xobs((xev(79, 0, Severity.DRAIN), T0 + 100)), "nh:xid79 GPU0 job_forensics: job 42: "),
        (snap(gpu(0, vc=2), *FOUR[1:]), xobs((xev(79, 1, Severity.DRAIN), T0 + 1)), "nh:xid79 GPU1 "),
        # An uncorrectable ECC increment first (FAIL, as the XID): the ECC finding names the reason.
        (
            snap(gpu(0, vu=1), *FOUR[1:]),
            xobs((xev(48, 1, Severity.DRAIN, action=Action.RESET_GPU), T0 + 1)),
            "nh:jobecc GPU0 ",
        ),
        (snap(gpu(0, vu=1), *FOUR[1:]), QUIET, "nh:jobecc GPU0 "),
    ],
    ids=["xid", "xid-beats-corrected-ecc", "ecc-first", "ecc"],
)
def test_the_drain_reason_names_what_the_job_met(after: NvmlSnapshot, xid: XidObservation, head: str) -> None:
    from nodehealth.slurm.policy import format_reason

    res = judge(baseline(*FOUR), after, xid=xid)
    assert res.status == Status.FAIL
    assert format_reason(res).startswith(head), format_reason(res)


# ----------------------------------------------------------------------------- the faces (fake scontrol)

SCEN = Path(__file__).parent / "fixtures" / "slurm"


def with_gpu0(extra: str) -> str:
    text = (SCEN / "healthy.toml").read_text()
    return text.replace(
        '[[gpu]]  # GPU 0\npci_bus_id = "0000:18:00.0"\n', f'[[gpu]]  # GPU 0\npci_bus_id = "0000:18:00.0"\n{extra}\n'
    )


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    from test_slurm_faces import job_fake

    return job_fake(tmp_path, monkeypatch)


def rewrite(f: Any, text: str) -> None:
    from nodehealth.probes import source

    f.scenario.write_text(text)
    source.forget()


def test_prolog_records_the_baseline_epilog_consumes_it(fake: Any) -> None:
    from nodehealth.faces import epilog, prolog

    assert prolog.main() == 0
    base = json.loads((fake.d / "state" / "jobs" / "42.json").read_text())
    assert base["job_id"] == "42" and set(base["gpus"]) == {"0", "1"} and base["boot_id"] == "boot-1"
    latest = json.loads((fake.d / "state" / "gpu-counters.json").read_text())
    assert len(latest["gpus"]) == 8 and latest["source"] == "prolog"
    assert epilog.main() == 0
    assert not (fake.d / "state" / "jobs" / "42.json").exists()
    assert fake.calls() == []  # a clean epilog makes no Slurm call


def test_corrected_ecc_during_the_job_warns_only(fake: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from nodehealth.faces import epilog, prolog

    assert prolog.main() == 0
    rewrite(fake, with_gpu0("ecc = { volatile_corrected = 7 }"))
    assert epilog.main() == 0
    err = capsys.readouterr().err
    assert "WARN job_forensics: job 42: GPU 0: +7 corrected ECC error(s) during the job" in err
    assert fake.calls() == []


def test_uncorrectable_ecc_during_the_job_drains_naming_the_job(fake: Any) -> None:
    from nodehealth.faces import epilog, prolog

    assert prolog.main() == 0
    rewrite(fake, with_gpu0("ecc = { volatile_uncorrected = 1 }"))
    assert epilog.main() == 1
    state, reason = fake.nodes()["n1"]
    assert "DRAIN" in state
    assert reason.startswith("nh:jobecc GPU0 job_forensics: job 42: GPU 0: +1 uncorrectable ECC error"), reason


def test_ecc_on_another_jobs_gpu_is_not_this_jobs(
    fake: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from nodehealth.faces import epilog, prolog

    monkeypatch.setenv("SLURM_JOB_GPUS", "2,3")
    assert prolog.main() == 0
    rewrite(fake, with_gpu0("ecc = { volatile_corrected = 7 }"))
    assert epilog.main() == 0
    assert "job_forensics" not in capsys.readouterr().err
