"""The daemon's self-test calls the node busy exactly when the job ledger's one rule says a job holds
it (``statedir.ledger.holding``/``holder`` with no teardown slack, as the daemon's job labels use):
never a rule of its own that drifts from the ledger's."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import pytest

from nodehealth.daemon import hooks, selftest
from nodehealth.statedir import ledger

BOOT = "0b1c2d3e-aaaa-bbbb-cccc-000000000001"
NOW = 1_800_000_000.0


def _start(job: str, at: float, gpus: Optional[list[int]] = None, boot: Optional[str] = BOOT) -> dict[str, object]:
    return {
        "v": 1,
        "event": "start",
        "job_id": job,
        "user": "alice",
        "gpus": gpus,
        "node": "n1",
        "time": at,
        "boot_id": boot,
    }


def _end(job: str, at: float, boot: Optional[str] = BOOT) -> dict[str, object]:
    return {"v": 1, "event": "end", "job_id": job, "time": at, "boot_id": boot}


# (records, whether a job holds the node at NOW): each a case the ledger's rule decides.
CASES = {
    "running": ([_start("1", NOW - 60, [0])], True),
    "running, GPUs unknown": ([_start("1", NOW - 60)], True),
    "ended before now": ([_start("1", NOW - 60, [0]), _end("1", NOW - 1)], False),
    # An end stamped after now (the clock stepped back after the epilog): the holder rule counts the
    # job as running at now; a rule of "a start and no end" did not.
    "end stamped after now": ([_start("1", NOW - 60, [0]), _end("1", NOW + 30)], True),
    "ended just now": ([_start("1", NOW - 60, [0]), _end("1", NOW)], True),
    "started after now": ([_start("1", NOW + 30, [0])], False),
    "two jobs on one GPU": ([_start("1", NOW - 60, [0]), _start("2", NOW - 30, [0])], True),
    "a job of another boot": ([_start("1", NOW - 60, [0], boot="another-boot")], False),
    "a record without a boot id": ([_start("1", NOW - 60, [0], boot=None)], True),
    "requeued: started again after its end": (
        [_start("1", NOW - 90, [0]), _end("1", NOW - 80), _start("1", NOW - 10, [1])],
        True,
    ),
}


def _ledger(tmp_path: Path, records: list[dict[str, object]]) -> str:
    sd = tmp_path / "state"
    sd.mkdir(mode=0o700)
    for rec in records:
        assert ledger.append(str(sd), rec, 1 << 20) is None
    return str(sd)


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_the_self_test_holds_off_exactly_when_the_ledger_rule_names_a_holder(tmp_path: Path, case: str) -> None:
    records, held = CASES[case]
    sd = _ledger(tmp_path, records)
    got = selftest.holding_jobs(sd, BOOT, at=NOW)
    assert bool(got) is held, (case, got)
    # The same answer as the ledger's own rule, job by job and GPU by GPU (no slack, as for labels).
    jobs = ledger.entries(ledger.of_boot(ledger.read(sd), BOOT))
    by_rule = {j.job_id for j in jobs if ledger.holder([j], None, NOW, slack_s=0.0) is not None}
    assert {j.job_id for j in got} == by_rule
    assert ("running (job ledger)" in selftest.busy_reason(None, got)) is held


def test_a_job_the_daemon_labels_on_a_gpu_keeps_the_self_test_off(tmp_path: Path) -> None:
    """Where the daemon's job labels (``hooks.ledger_jobs``) put a job on a GPU, the self-test sees it."""
    now = time.time()
    sd = _ledger(tmp_path, [_start("7", now - 5, [3]), _start("8", now - 50, [1]), _end("8", now - 40)])
    labels = hooks.ledger_jobs(sd, list(range(8)), now)
    assert labels == {3: "7"}
    assert [j.job_id for j in selftest.holding_jobs(sd, BOOT, at=now)] == ["7"]
