"""Which of a daemon round's state files are fsynced: the verdict (both forms: the prolog lets a
job start on it) is; the latest GPU counter reading is not: only a reading of this boot is ever
used, and a crash that loses unsynced data is a reboot."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nodehealth.statedir import counters, files
from nodehealth.statedir import verdict as state_file

READING = {"0": {"uuid": "GPU-0", "volatile_uncorrected": 0, "volatile_corrected": 0}}


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    names: list[int] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        names.append(fd)
        real(fd)

    monkeypatch.setattr(files.os, "fsync", fsync)
    return names


def test_the_verdict_is_fsynced_in_both_forms(tmp_path: Path, synced: list[int]) -> None:
    state = str(tmp_path / "state")
    report = {"node": "n1", "phase": "daemon", "status": "OK", "results": []}
    state_file.write(state, state_file.encode(report, "boot-1", 1.0, "off", None, 30.0, 1))
    assert len(synced) == 2, synced


def test_the_counter_reading_is_not_fsynced(tmp_path: Path, synced: list[int]) -> None:
    state = str(tmp_path / "state")
    counters.write_latest(state, READING, "boot-1", "daemon")
    assert synced == []
    assert counters.read_latest(state) is not None  # written all the same


def test_a_reading_of_another_boot_is_never_a_baseline(tmp_path: Path) -> None:
    """Why it need not survive a crash: after the reboot such a crash is, it is refused."""
    state = str(tmp_path / "state")
    counters.write_latest(state, READING, "boot-1", "daemon")
    why = counters.baseline_from_latest(state, "42", None, "boot-2")
    assert why == "the latest GPU counter reading is from another boot"
