"""State-dir safety: ownership, modes, no symlink followed; poisoned state files; the ledger keeps every record."""

from __future__ import annotations

import json
import multiprocessing
import os
import stat
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodehealth.statedir import counters, files, layout, ledger, slurmstate
from nodehealth.statedir import verdict as daemon_state

BOOT = "0b1c2d3e-aaaa-bbbb-cccc-000000000001"
NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def umask(value: int):  # type: ignore[no-untyped-def]
    class _Umask:
        def __enter__(self) -> None:
            self.old = os.umask(value)

        def __exit__(self, *exc: object) -> None:
            os.umask(self.old)

    return _Umask()


def verdict_text(at: float = 1000.0) -> str:
    report = {
        "node": "n1",
        "phase": "daemon",
        "status": "OK",
        "duration_s": 0.1,
        "version": "0",
        "started_at": at,
        "checks": [{"name": "nvml", "status": "OK", "summary": "8 GPUs", "action": "none", "gpu": None, "details": {}}],
    }
    return daemon_state.encode(report, BOOT, at, "alive")


def start_record(job: str, at: float = 100.0) -> dict:
    return {
        "v": 1,
        "event": "start",
        "job_id": job,
        "user": "alice",
        "uid": 1000,
        "gpus": [0, 1],
        "node": "n1",
        "time": at,
        "boot_id": BOOT,
    }


def counters_file(**over: object) -> dict:
    rec = counters.counters_record(
        {
            "0": {
                "uuid": "GPU-0",
                "volatile_uncorrected": 0,
                "volatile_corrected": 3,
                "remapped_uncorrectable": 0,
                "remapped_correctable": None,
            }
        },
        1000.0,
        BOOT,
        "daemon",
    )
    rec.update(over)
    return rec


# --- item 3: the directory ---------------------------------------------------------------------


@pytest.mark.parametrize("mask", [0o022, 0o277])
def test_state_dir_is_created_0700_whatever_the_umask(tmp_path: Path, mask: int) -> None:
    sd = tmp_path / "a" / "state"
    with umask(mask):
        assert files.ensure_state_dir(str(sd)) is None
    assert mode(sd) == 0o700  # not 0755 (the old default), not 0500 (umask 0277 left alone)
    with umask(mask):
        ledger.append(str(tmp_path / "b"), start_record("1"), 1 << 20)
    assert mode(tmp_path / "b") == 0o700  # the writers create it the same way


def test_a_safe_existing_dir_is_accepted_as_it_is(tmp_path: Path) -> None:
    sd = tmp_path / "state"
    sd.mkdir(mode=0o755)
    os.chmod(sd, 0o755)
    assert files.check_dir(str(sd)) is None and files.ensure_state_dir(str(sd)) is None
    assert mode(sd) == 0o755  # a directory the administrator made is not changed


@as_root
def test_a_dir_owned_by_another_user_is_refused_everywhere(tmp_path: Path) -> None:
    sd = tmp_path / "state"
    sd.mkdir(mode=0o700)
    (sd / layout.DAEMON_STATE).write_text(verdict_text())
    (sd / layout.SLURM_STATE).write_text(json.dumps({"version": 1, "clean_runs": 3}))
    os.chown(sd, NOBODY, NOBODY)
    why = files.check_dir(str(sd))
    assert why and f"owned by uid {NOBODY}" in why
    assert files.ensure_state_dir(str(sd)) == why
    got, why = daemon_state.read(str(sd), 90, boot_id=BOOT, now=1001.0)
    assert got is None and "not trusted" in why and f"uid {NOBODY}" in why  # a planted fresh verdict is not used
    assert slurmstate.load(str(sd)) == slurmstate.State()
    logged: list[str] = []
    assert slurmstate.update(str(sd), lambda s: s, 0.1, lambda m, **kw: logged.append(m)) is None
    assert logged and f"uid {NOBODY}" in logged[0]
    with pytest.raises(files.UnsafeDir, match=f"uid {NOBODY}"):
        ledger.append(str(sd), start_record("1"), 1 << 20)
    with pytest.raises(files.UnsafeDir):
        counters.write_latest(str(sd), {}, BOOT, "daemon")
    with pytest.raises(files.UnsafeDir):
        counters.write_baseline(str(sd), "7", counters_file())
    assert not (sd / layout.LEDGER).exists() and not (sd / layout.COUNTERS).exists()


@as_root
def test_a_dir_above_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    top = tmp_path / "theirs"
    top.mkdir(mode=0o755)
    os.chown(top, NOBODY, NOBODY)  # they can rename our directory away and put theirs in its place
    why = files.ensure_state_dir(str(top / "state"))
    assert why and str(top) in why and f"uid {NOBODY}" in why


@pytest.mark.parametrize("bits", [0o777, 0o770, 0o702, 0o1777])
def test_a_group_or_world_writable_dir_is_refused(tmp_path: Path, bits: int) -> None:
    sd = tmp_path / "state"
    sd.mkdir()
    os.chmod(sd, bits)
    why = files.check_dir(str(sd))
    assert why and "writable by group or others" in why
    with pytest.raises(files.UnsafeDir):
        ledger.append(str(sd), start_record("1"), 1 << 20)


def test_a_world_writable_dir_above_is_refused_unless_sticky(tmp_path: Path) -> None:
    top = tmp_path / "shared"
    top.mkdir()
    os.chmod(top, 0o777)
    why = files.ensure_state_dir(str(top / "state"))
    assert why and str(top) in why and "writable by group or others" in why
    os.chmod(top, 0o1777)  # like /tmp: others cannot rename or remove what is ours
    assert files.check_dir(str(top / "state")) is None


def test_a_symlinked_state_dir_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (real / layout.DAEMON_STATE).write_text(verdict_text())
    link = tmp_path / "state"
    link.symlink_to(real)
    why = files.check_dir(str(link))
    assert why and "symbolic link" in why
    got, why = daemon_state.read(str(link), 90, boot_id=BOOT, now=1001.0)
    assert got is None and "symbolic link" in why
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    assert "symbolic link" in (files.ensure_state_dir(str(dangling)) or "")
    assert not (tmp_path / "nowhere").exists()  # not created through the link


def test_a_symlinked_jobs_dir_is_refused(tmp_path: Path) -> None:
    sd, elsewhere = tmp_path / "state", tmp_path / "elsewhere"
    sd.mkdir(mode=0o700)
    elsewhere.mkdir()
    (sd / layout.JOBS_DIR).symlink_to(elsewhere)
    with pytest.raises(files.UnsafeDir, match="not a directory"):
        counters.write_baseline(str(sd), "7", counters_file())
    assert os.listdir(elsewhere) == []


# --- item 3: no symlink in the state dir is followed ---------------------------------------------


@pytest.fixture
def state(tmp_path: Path) -> Path:
    sd = tmp_path / "state"
    sd.mkdir(mode=0o700)
    return sd


@pytest.fixture
def target(tmp_path: Path) -> Path:
    t = tmp_path / "precious"
    t.write_text("do not touch\n")
    return t


def test_ledger_symlink_is_never_appended_to_or_read(state: Path, target: Path, tmp_path: Path) -> None:
    (state / layout.LEDGER).symlink_to(target)
    with pytest.raises(OSError):
        ledger.append(str(state), start_record("1"), 1 << 20)
    assert target.read_text() == "do not touch\n"
    other = tmp_path / "other-ledger"
    other.write_text(json.dumps(start_record("9")) + "\n")
    (state / layout.LEDGER).unlink()
    (state / layout.LEDGER).symlink_to(other)
    assert ledger.read(str(state)) == []


def test_lock_symlinks_are_never_created_through(state: Path, tmp_path: Path) -> None:
    for name in (layout.LEDGER, layout.SLURM_STATE):
        (state / f"{name}.lock").symlink_to(tmp_path / f"made-{name}")
    ledger.append(str(state), start_record("1"), 1 << 20)  # appended without the lock (O_APPEND)
    assert slurmstate.update(str(state), lambda s: s, 0.05) is not None
    assert not list(tmp_path.glob("made-*"))
    assert [r.job_id for r in ledger.read(str(state))] == ["1"]


def test_state_file_symlinks_are_not_read_and_are_replaced_on_write(state: Path, target: Path, tmp_path: Path) -> None:
    planted = tmp_path / "planted"
    planted.write_text(json.dumps({"version": 1, "clean_runs": 9, "drain": {"reason": "x", "time": 1.0}}))
    (state / layout.SLURM_STATE).symlink_to(planted)
    assert slurmstate.load(str(state)) == slurmstate.State()
    raw, why = files.read_json_checked(str(state / layout.SLURM_STATE))
    assert raw is None and why and "symbolic link" in why
    assert slurmstate.update(str(state), lambda s: s, 0.1) is not None
    assert not (state / layout.SLURM_STATE).is_symlink() and 'clean_runs": 9' in planted.read_text()

    good = tmp_path / "counters"
    good.write_text(json.dumps(counters_file()))
    (state / layout.COUNTERS).symlink_to(good)
    assert counters.read_latest(str(state)) is None
    (state / layout.DAEMON_STATE).symlink_to(tmp_path / "verdict")
    (tmp_path / "verdict").write_text(verdict_text())
    got, why = daemon_state.read(str(state), 90, boot_id=BOOT, now=1001.0)
    assert got is None and "symbolic link" in why

    jobs = state / layout.JOBS_DIR
    jobs.mkdir(mode=0o700)
    (jobs / "7.json").symlink_to(good)
    assert counters.read_baseline(str(state), "7")[0] is None
    assert counters.take_baseline(str(state), "7") is None
    assert good.exists() and not os.path.lexists(jobs / "7.json")  # the link is gone, not its target
    (jobs / "8.json").symlink_to(target)
    counters.write_baseline(str(state), "8", counters_file())
    assert target.read_text() == "do not touch\n" and not (jobs / "8.json").is_symlink()


def test_a_fifo_in_the_state_dir_is_refused_not_waited_on(state: Path) -> None:
    fifo = state / layout.SLURM_STATE
    os.mkfifo(fifo)
    out: list[object] = []
    t = threading.Thread(target=lambda: out.append(files.read_json_checked(str(fifo))), daemon=True)
    t.start()
    t.join(2.0)
    if t.is_alive():  # release the reader blocked in open(2), then fail
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        raise AssertionError("reading a FIFO in the state dir blocked")
    assert out == [(None, f"{fifo} is not a regular file")]


def test_temp_files_have_unique_names_and_never_write_through(state: Path, target: Path, monkeypatch) -> None:
    path = state / layout.COUNTERS
    names = iter([b"\x00" * 6, b"\x11" * 6])
    monkeypatch.setattr(os, "urandom", lambda n: next(names))
    planted = state / f".{layout.COUNTERS}.{os.getpid()}.{'00' * 6}"
    os.link(target, planted)  # a hard link to another file, waiting under the first name tried
    files.write_json(str(path), {"a": 1}, mode=files.STATE_FILE_MODE)
    assert target.read_text() == "do not touch\n"
    assert json.loads(path.read_text()) == {"a": 1}
    assert sorted(p.name for p in state.iterdir()) == sorted([planted.name, layout.COUNTERS])


# --- item 3: modes ------------------------------------------------------------------------------------


@pytest.mark.parametrize("mask", [0o000, 0o277])
def test_state_files_are_0600_whatever_the_umask(tmp_path: Path, mask: int) -> None:
    sd = tmp_path / "state"
    with umask(mask):
        ledger.append(str(sd), start_record("1"), 1 << 20)
        slurmstate.update(str(sd), lambda s: s, 0.1)
        counters.write_latest(str(sd), {"0": {"volatile_uncorrected": 0}}, BOOT, "daemon")
        counters.write_baseline(str(sd), "7", counters_file())
        ledger.append(str(sd), start_record("2"), 600)  # compaction rewrites the ledger
    got = {str(p.relative_to(sd)): mode(p) for p in sd.rglob("*")}
    assert got == {
        layout.LEDGER: 0o600,
        f"{layout.LEDGER}.lock": 0o600,
        layout.SLURM_STATE: 0o600,
        f"{layout.SLURM_STATE}.lock": 0o600,
        layout.COUNTERS: 0o600,
        layout.COUNTERS_MARSHAL: 0o600,
        layout.JOBS_DIR: 0o700,
        f"{layout.JOBS_DIR}/7.json": 0o600,
    }


def test_files_for_other_readers_are_0644_whatever_the_umask(tmp_path: Path) -> None:
    from nodehealth.metrics.textfile import write_textfile

    with umask(0o077):
        path = write_textfile(str(tmp_path), "daemon", b"x 1\n")
    assert mode(Path(path)) == 0o644  # node_exporter reads it as its own user


@pytest.mark.parametrize("mask", [0o000, 0o022])
def test_an_atomic_write_is_0600_unless_asked_and_its_new_directory_0700(tmp_path: Path, mask: int) -> None:
    """A writer that forgets the mode gets root's alone, and a directory made on the way is never wider."""
    with umask(mask):
        files.write_atomic(str(tmp_path / "new" / "x.json"), "{}\n")
    assert (mode(tmp_path / "new"), mode(tmp_path / "new" / "x.json")) == (0o700, 0o600)


# --- item 4: poisoned state files ---------------------------------------------------------------------

POISONS = {
    "nan": "NaN",
    "infinity": "Infinity",
    "minus-infinity": "-Infinity",
    "overflowing-float": "1e400",
    "huge-int": "1" + "0" * 30,
    "deep": "[" * 100_000 + "]" * 100_000,
    "nested-past-the-limit": "[" * 80 + "]" * 80,
}


@pytest.mark.parametrize("poison", sorted(POISONS))
def test_parse_json_refuses_what_json_loads_accepts(poison: str) -> None:
    with pytest.raises(ValueError):
        files.parse_json('{"x": @}'.replace("@", POISONS[poison]))
    assert files.parse_json('{"x": [1.5, -2, 1e300, 12345678901234567890]}') == {
        "x": [1.5, -2, 1e300, 12345678901234567890]
    }


def _depth(value: object) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


_TEXT = st.text(alphabet='[]{}"\\/ax\n\u00e9', max_size=8)
_VALUES = st.recursive(
    st.none() | st.integers(-5, 5) | _TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None)
@given(_VALUES, st.integers(0, 12), st.booleans())
def test_the_depth_bound_is_exact_whatever_the_strings_hold(value: object, limit: int, ascii_only: bool) -> None:
    """Brackets, quotes and backslashes inside strings neither hide nor add a level."""
    data = json.dumps(value, ensure_ascii=ascii_only).encode("utf-8")
    assert files.too_deep(data, limit) == (_depth(value) > limit)


@pytest.mark.parametrize("poison", sorted(POISONS))
def test_poisoned_slurm_state_is_absent_logged_and_rewritten(state: Path, poison: str) -> None:
    p = state / layout.SLURM_STATE
    p.write_text(
        '{"version": 1, "clean_runs": @, "drain": {"reason": "nodehealth: x", "time": 1}}'.replace("@", POISONS[poison])
    )
    assert slurmstate.load(str(state)) == slurmstate.State()
    logged: list[str] = []
    new = slurmstate.update(str(state), lambda s: s, 0.1, lambda m, **kw: logged.append(m))
    assert new == slurmstate.State()
    assert logged and "unusable" in logged[0] and str(p) in logged[0]
    assert files.parse_json(p.read_text())["clean_runs"] == 0  # rewritten, strict JSON again
    logged.clear()
    slurmstate.update(str(state), lambda s: s, 0.1, lambda m, **kw: logged.append(m))
    assert logged == []


@pytest.mark.parametrize("value", ["1e300", "1.5", '"7"', "true", "-5", "1000000000000", "null"])
def test_a_clean_run_count_of_the_wrong_kind_reads_as_zero(value: str) -> None:
    st = slurmstate.State.from_json(files.parse_json('{"version": 1, "clean_runs": @}'.replace("@", value)))
    assert st.clean_runs == 0
    assert slurmstate.State.from_json({"version": 1, "clean_runs": 4}).clean_runs == 4


@pytest.mark.parametrize("value", ['"nan"', '"inf"', '"7"', "true", "[1]", "1e301", "-1e301"])
def test_times_of_the_wrong_kind_read_as_zero_never_nan(value: str) -> None:
    raw = files.parse_json(
        '{"version": 1, "last_run": @, "drain": {"reason": "nodehealth: x", "time": @}}'.replace("@", value)
    )
    st = slurmstate.State.from_json(raw)
    assert st.last_run == 0.0 and st.drain is not None and st.drain.time == 0.0
    st = slurmstate.State.from_json({"version": 1, "last_run": 5, "drain": {"reason": "r", "time": 1e9}})
    assert st.last_run == 5.0 and st.drain is not None and st.drain.time == 1e9


@pytest.mark.parametrize(
    "body",
    [
        '{"time": NaN, "gpus": {}}',
        '{"time": 1, "gpus": 5}',
        '{"time": 1, "gpus": {"0": {"volatile_corrected": "x"}}}',
        '{"time": 1, "gpus": {"0": {"volatile_corrected": 1e400}}}',
        '{"time": "1", "gpus": {}}',
        '{"time": 1, "gpus": {"0": {"volatile_corrected": 100000000000000000000}}}',
        "[1]",
        '{"time": 1, "gpus": {"zero": {}}}',
        '{"time": 1, "gpus": {"0": [' + "[" * 5000 + "]" * 5000 + "]}}",
    ],
)
def test_poisoned_counters_are_absent_with_a_reason_and_rewritten(state: Path, body: str) -> None:
    (state / layout.COUNTERS).write_text(body)
    latest, why = counters.read_latest_checked(str(state))
    assert latest is None and why and str(state / layout.COUNTERS) in why
    missing = counters.baseline_from_latest(str(state), "7", None, BOOT)
    assert missing and "unusable" in missing
    jobs = state / layout.JOBS_DIR
    jobs.mkdir()
    (jobs / "8.json").write_text(body)
    assert counters.read_baseline(str(state), "8")[0] is None and counters.take_baseline(str(state), "8") is None
    counters.write_latest(str(state), {"0": {"volatile_corrected": 1}}, BOOT, "daemon")
    assert counters.read_latest_checked(str(state))[1] is None
    assert counters.baseline_from_latest(str(state), "7", None, BOOT) is None


@pytest.mark.parametrize("written", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_a_non_finite_verdict_time_is_never_fresh(state: Path, written: str) -> None:
    text = verdict_text().replace('"written_at":1000.0', f'"written_at":{written}')
    assert written in text
    (state / layout.DAEMON_STATE).write_text(text)
    got, why = daemon_state.read(str(state), 90, boot_id=BOOT, now=1001.0)
    assert got is None and "corrupt" in why


def test_a_nan_age_limit_trusts_no_verdict(state: Path) -> None:
    (state / layout.DAEMON_STATE).write_text(verdict_text())
    assert daemon_state.read(str(state), 90, boot_id=BOOT, now=1001.0)[0] is not None
    got, why = daemon_state.read(str(state), float("nan"), boot_id=BOOT, now=1001.0)
    assert got is None and "old" in why


def test_a_deep_verdict_is_corrupt_not_a_crash(state: Path) -> None:
    for depth in (80, 200_000):
        deep = verdict_text().replace('"details":{}', '"details":' + "[" * depth + "]" * depth)
        (state / layout.DAEMON_STATE).write_text(deep)
        got, why = daemon_state.read(str(state), 90, boot_id=BOOT, now=1001.0)
        assert got is None and "nested" in why


def test_non_finite_numbers_are_never_written(state: Path) -> None:
    text = daemon_state.encode(
        {"checks": [], "status": "OK", "duration_s": float("nan")}, BOOT, 1000.0, "alive", interval_s=float("inf")
    )
    assert files.parse_json(text)["interval_s"] is None
    files.write_json(str(state / "x.json"), {"a": float("-inf"), "b": [1.0, float("nan")]})
    assert files.parse_json((state / "x.json").read_text()) == {"a": None, "b": [1.0, None]}


@pytest.mark.parametrize(
    "line",
    [
        '{"v":1,"event":"start","job_id":"5","time":NaN}',
        '{"v":1,"event":"start","job_id":"5","time":"nan"}',
        '{"v":1,"event":"start","job_id":"5","time":1,"gpus":[1e400]}',
        '{"v":1,"event":"start","job_id":"5","time":1,"gpus":[1000000000000000000000000000000]}',
        '{"v":1,"event":"start","job_id":"5","time":1,"gpus":[100000]}',
        '{"v":1,"event":"start","job_id":"5","time":1,"gpus":[true]}',
        '{"v":1,"event":"start","job_id":"5","time":1,"user":["x"]}',
        '{"v":1,"event":"start","job_id":["5"],"time":1}',
        '{"v":1,"event":"start","job_id":"5","time":1,"x":' + "[" * 100_000 + "]" * 100_000 + "}",
    ],
)
def test_poisoned_ledger_lines_are_skipped_and_counted(state: Path, line: str) -> None:
    good = json.dumps(start_record("6"), separators=(",", ":"))
    (state / layout.LEDGER).write_text(line + "\n" + good + "\n")
    records, skipped = ledger.read_checked(str(state))
    assert [r.job_id for r in records] == ["6"] and skipped == 1
    assert ledger.parse_line(line) is None


def test_a_huge_uid_is_dropped_not_kept() -> None:
    rec = ledger.parse_line('{"v":1,"event":"start","job_id":"5","time":1,"uid":1000000000000}')
    assert rec is not None and rec.uid is None


# --- item 6: the ledger keeps every record --------------------------------------------------------------


def test_an_append_after_a_torn_record_starts_on_a_new_line(state: Path) -> None:
    torn = json.dumps(start_record("5"), separators=(",", ":"))[:40]
    (state / layout.LEDGER).write_text(json.dumps(start_record("4"), separators=(",", ":")) + "\n" + torn)
    ledger.append(str(state), start_record("6"), 1 << 20)
    records, skipped = ledger.read_checked(str(state))
    assert [r.job_id for r in records] == ["4", "6"] and skipped == 1


def test_a_short_write_raises_and_the_next_record_is_whole(state: Path, monkeypatch) -> None:
    real = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real(fd, bytes(data)[: len(data) // 2]))
    with pytest.raises(files.ShortWrite, match="appended"):
        ledger.append(str(state), start_record("5"), 1 << 20)
    monkeypatch.setattr(os, "write", real)
    ledger.append(str(state), start_record("6"), 1 << 20)
    records, skipped = ledger.read_checked(str(state))
    assert [r.job_id for r in records] == ["6"] and skipped == 1
    ledger.append(str(state), start_record("7"), 300)  # compaction keeps whole records only
    assert ledger.read_checked(str(state)) == ([ledger.parse_line(json.dumps(start_record("7")))], 0)


def test_compaction_drops_lines_that_are_not_whole_records() -> None:
    whole = [json.dumps(start_record(j), separators=(",", ":")) + "\n" for j in ("1", "2")]
    torn = whole[0][:30]
    assert ledger.compact([whole[0], torn + "\n", "junk\n", whole[1], torn], 1 << 20) == whole


def _prolog(state_dir: str, job: str, go: str) -> None:
    while not os.path.exists(go):
        time.sleep(0.0005)
    ledger.append(state_dir, start_record(job, time.time()), 1 << 20)


def test_forty_concurrent_prologs_across_compaction_lose_nothing(state: Path) -> None:
    """Each round: a ledger just under 1 MiB, then 40 processes append at once (the first crosses it)."""
    sd = str(state)
    ctx = multiprocessing.get_context("fork")
    filler = json.dumps(start_record("1", 1.0), separators=(",", ":")) + "\n"
    for rnd in range(3):
        path = state / layout.LEDGER
        path.write_text(filler * ((1 << 20) // len(filler) - 2))
        go = str(state / f"go-{rnd}")
        jobs = [f"{rnd + 1}{i:04d}" for i in range(40)]  # job ids: no leading zero
        procs = [ctx.Process(target=_prolog, args=(sd, job, go)) for job in jobs]
        for p in procs:
            p.start()
        Path(go).touch()
        for p in procs:
            p.join(60)
            assert p.exitcode == 0
        lines = path.read_text().splitlines()
        assert all(isinstance(json.loads(line), dict) for line in lines)  # no torn or glued line
        found = {r.job_id for r in ledger.parse("\n".join(lines))}
        assert set(jobs) <= found, f"round {rnd}: lost {sorted(set(jobs) - found)}"
        assert os.path.getsize(path) < 1 << 20  # and it was compacted


def test_a_record_appended_without_the_lock_during_a_compaction_is_kept(state: Path, monkeypatch) -> None:
    """A writer that found the lock busy appends to the old ledger after the compaction read it and
    before its rename: the compaction copies it into the new ledger (on a loaded machine 37 of 40
    prologs were lost this way)."""
    sd = str(state)
    path = state / layout.LEDGER
    filler = json.dumps(start_record("1", 1.0), separators=(",", ":")) + "\n"
    path.write_text(filler * 50)
    real = files.write_atomic

    def write_then_rename(target: str, text: str, mode: int) -> None:  # the late writer runs first
        files.append_line(str(path), json.dumps(start_record("77", 2.0), separators=(",", ":")) + "\n")
        real(target, text, mode)

    monkeypatch.setattr(files, "write_atomic", write_then_rename)
    ledger.append(sd, start_record("5", 3.0), len(filler) * 20)
    monkeypatch.setattr(files, "write_atomic", real)
    ids = [r.job_id for r in ledger.read(sd)]
    assert "77" in ids and "5" in ids, ids
    assert os.path.getsize(path) < len(filler) * 20  # it was compacted


def test_an_append_without_the_lock_follows_a_rename_over_the_ledger(state: Path, monkeypatch) -> None:
    """The compaction renames a new ledger in between this writer's write and its end: the record is
    written again into the new one."""
    sd = str(state)
    path = state / layout.LEDGER
    ledger.append(sd, start_record("1"), 1 << 20)
    real = os.write
    done = []

    def write_then_replaced(fd: int, data: bytes) -> int:
        n = real(fd, data)
        if not done:
            done.append(1)
            files.write_atomic(str(path), json.dumps(start_record("1"), separators=(",", ":")) + "\n")
        return n

    with files.locked(str(path)) as got:
        assert got
        monkeypatch.setattr(os, "write", write_then_replaced)
        note = ledger.append(sd, start_record("2"), 1 << 20, lock_timeout_s=0.05)
        monkeypatch.setattr(os, "write", real)
    assert note and "appended without it" in note
    assert [r.job_id for r in ledger.read(sd)] == ["1", "2"]


def test_a_busy_lock_still_appends_but_never_compacts(state: Path) -> None:
    path = state / layout.LEDGER
    ledger.append(str(state), start_record("1"), 1 << 20)
    with files.locked(str(path)) as got:
        assert got
        note = ledger.append(str(state), start_record("2"), 10, lock_timeout_s=0.05)
    assert note and "appended without it" in note
    assert [r.job_id for r in ledger.read(str(state))] == ["1", "2"]  # over max_bytes, not compacted
    assert ledger.append(str(state), start_record("3"), 10) is None
