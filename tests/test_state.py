"""The prolog's fast-path reader of the daemon state: fresh, stale, corrupt, partial, other boot."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from nodehealth.model import Action, CheckResult, Report, Status
from nodehealth.statedir import verdict as state

BOOT = "0b1c2d3e-aaaa-bbbb-cccc-000000000001"


def _report(status: Status = Status.OK) -> Report:
    return Report(
        node="gpu001",
        phase="daemon",
        duration_s=0.02,
        version="0.1.0",
        started_at=1000.0,
        results=(
            CheckResult("nvml", Status.OK, "fine", duration_s=0.01),
            CheckResult(
                "gpu_remapped_rows",
                status,
                "GPU 3: remap pending",
                action=Action.RESET_GPU,
                gpu=3,
                details={"gpus": {"3": "pending"}},
            ),
        ),
    )


def _write(tmp_path, report=None, boot=BOOT, at=1000.0, xid="alive", text=None):
    path = tmp_path / state.FILE_NAME
    path.write_text(text if text is not None else state.encode((report or _report()).to_json(), boot, at, xid))
    return path


def test_fresh_state_round_trips_the_report(tmp_path):
    _write(tmp_path, _report(Status.FAIL))
    got, why = state.read(str(tmp_path), max_age_s=90, boot_id=BOOT, now=1030.0)
    assert why == "fresh" and got is not None
    assert got.status == "FAIL" and got.age_s == 30.0 and got.xid_follower == "alive"
    rep = Report.from_json(got.report)
    assert rep == _report(Status.FAIL)  # rebuilt, not the object written: every field survived the file
    assert [r.name for r in rep.failures] == ["gpu_remapped_rows"]
    assert rep.results[1].action == Action.RESET_GPU and rep.results[1].gpu == 3 and rep.status == Status.FAIL


def test_refusals_say_why(tmp_path):
    cases = [
        (dict(), dict(now=2000.0), "old"),
        (dict(boot="another-boot"), dict(now=1001.0), "another boot"),
        (dict(xid="dead"), dict(now=1001.0), "XID follower dead"),
        (dict(xid="absent"), dict(now=1001.0), "XID follower absent"),
        (dict(at=1100.0), dict(now=1000.0), "future"),
        (dict(text=""), dict(now=1001.0), "empty"),
        (dict(text='{"v": 1, "kind": "nodehealth-daemon-state", "boot_id": "'), dict(now=1001.0), "corrupt or partial"),
        (dict(text='{"v": 1, "kind": "something-else"}'), dict(now=1001.0), "not a nodehealth"),
        (dict(text=json.dumps({"v": 2, "kind": state.KIND})), dict(now=1001.0), "version"),
        (
            dict(text=json.dumps({"v": 1, "kind": state.KIND, "boot_id": BOOT, "written_at": 1000.0})),
            dict(now=1001.0),
            "incomplete",
        ),
        (dict(text="\xff\xfe garbage"), dict(now=1001.0), "corrupt"),
    ]
    for write_kw, read_kw, expect in cases:
        _write(tmp_path, **write_kw)
        got, why = state.read(str(tmp_path), max_age_s=90, boot_id=BOOT, **read_kw)
        assert got is None and expect in why, (write_kw, why)


def test_truncated_file_at_every_length_is_refused_never_raises(tmp_path):
    full = state.encode(_report().to_json(), BOOT, 1000.0, "alive")
    for cut in range(0, len(full) - 2, 7):
        _write(tmp_path, text=full[:cut])
        got, why = state.read(str(tmp_path), max_age_s=90, boot_id=BOOT, now=1001.0)
        assert got is None, cut


def test_missing_file_and_unknown_boot(tmp_path):
    got, why = state.read(str(tmp_path / "nowhere"), max_age_s=90, boot_id=BOOT)
    assert got is None and "missing" in why
    _write(tmp_path)
    got, why = state.read(str(tmp_path), max_age_s=90, now=1001.0, procfs_root=str(tmp_path / "no-proc"))
    assert got is None and "boot" in why


def test_absent_follower_accepted_when_not_required(tmp_path):
    _write(tmp_path, xid="absent")
    got, why = state.read(str(tmp_path), max_age_s=90, boot_id=BOOT, now=1001.0, require_xid=False)
    assert got is not None and why == "fresh"


def test_fast_path_imports_nothing_heavy(tmp_path):
    _write(tmp_path)
    # What the reader itself imports: modules the interpreter's start-up already loaded (a .pth
    # file imports typing on some Pythons) are not its cost.
    code = (
        f"import sys; before = set(sys.modules); from nodehealth.statedir import verdict as state; "
        f"r = state.read({str(tmp_path)!r}, 90, boot_id={BOOT!r}, "
        "now=1001.0); assert r[0] is not None, r; "
        "heavy = {'pynvml', 'psutil', 'prometheus_client', 'dataclasses', 'typing', 'nodehealth.model'}; "
        "print(sorted(heavy & (set(sys.modules) - before)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_a_dead_daemons_verdict_is_not_trusted(tmp_path):
    """The verdict names the process that wrote it (pid and start time): once it is gone, the
    verdict is not a live daemon's, however young."""
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        started = state.start_ticks(child.pid)
        assert started is not None
        _write(
            tmp_path, text=state.encode(_report().to_json(), BOOT, 1000.0, "alive", pid=child.pid, pid_start=started)
        )
        got, why = state.read(str(tmp_path), max_age_s=90, boot_id=BOOT, now=1001.0)
        assert got is not None and got.pid == child.pid, why
    finally:
        child.kill()
        child.wait()
    got, why = state.read(str(tmp_path), max_age_s=90, boot_id=BOOT, now=1001.0)
    assert got is None and f"pid {child.pid}" in why and "no longer running" in why
    # A pid reused by another process has another start time.
    _write(tmp_path, text=state.encode(_report().to_json(), BOOT, 1000.0, "alive", pid=os.getpid(), pid_start=1))
    got, why = state.read(str(tmp_path), max_age_s=90, boot_id=BOOT, now=1001.0)
    assert got is None and "no longer running" in why
    # A verdict that does not say who wrote it is refused.
    text = state.encode(_report().to_json(), BOOT, 1000.0, "alive").replace('"pid_start":', '"pid_start_":')
    _write(tmp_path, text=text)
    got, why = state.read(str(tmp_path), max_age_s=90, boot_id=BOOT, now=1001.0)
    assert got is None and "which daemon process" in why
