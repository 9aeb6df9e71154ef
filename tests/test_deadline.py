"""The faces' deadline: counted from the process's start, so start-up and config load are in the budget."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from nodehealth.platform import deadline as dl


def test_process_age_is_measured_from_the_process_start() -> None:
    code = (
        "import time; time.sleep(0.3); from nodehealth.platform.deadline import process_age_s, Deadline; "
        "d = Deadline.from_process_start(10.0); print(process_age_s(), d.spent())"
    )
    age, spent = map(
        float, subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    )
    assert 0.3 <= age < 5.0 and 0.3 <= spent < 5.0


def test_a_long_lived_caller_counts_from_now(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(dl, "process_age_s", lambda procfs_root="/proc": dl.STARTUP_ALLOWANCE_S + 60)
    d = dl.Deadline.from_process_start(10.0)
    assert 9.5 < d.left() <= 10.0
    monkeypatch.setattr(dl, "process_age_s", lambda procfs_root="/proc": 2.0)
    assert 7.5 < dl.Deadline.from_process_start(10.0).left() <= 8.0


def test_unreadable_stat_is_age_zero(tmp_path: Path) -> None:
    assert dl.process_age_s(str(tmp_path)) == 0.0
    (tmp_path / "self").mkdir()
    (tmp_path / "self" / "stat").write_text("garbage")
    assert dl.process_age_s(str(tmp_path)) == 0.0


def test_no_call_starts_with_too_little_left() -> None:
    now = [100.0]
    d = dl.Deadline(1.0, clock=lambda: now[0])
    assert d.call_timeout(5.0) == 1.0
    now[0] += 0.9
    assert abs(d.call_timeout(5.0) - 0.1) < 1e-9  # never more than what is left
    now[0] += 0.06
    assert d.call_timeout(5.0) is None
