"""Job ledger: records from a job's environment, reading back, GPU attribution, bounded size."""

from __future__ import annotations

import json
import os
from pathlib import Path

from nodehealth.slurm import jobenv
from nodehealth.statedir import files as statefile
from nodehealth.statedir import layout, ledger

ENV = {
    "SLURM_JOB_ID": "12",
    "SLURM_JOB_USER": "alice",
    "SLURM_JOB_UID": "1000",
    "SLURM_JOB_GPUS": "0,1",
    "SLURMD_NODENAME": "gpu017",
}


def line(rec: dict) -> str:
    return json.dumps(rec, separators=(",", ":")) + "\n"


def test_record_from_environment() -> None:
    rec = jobenv.record("start", ENV, 100.0, boot_id="b1")
    assert rec == {
        "v": 1,
        "event": "start",
        "job_id": "12",
        "user": "alice",
        "uid": 1000,
        "gpus": [0, 1],
        "node": "gpu017",
        "time": 100.0,
        "boot_id": "b1",
    }
    parsed = ledger.parse_line(line(rec))
    assert parsed == ledger.JobRecord("start", "12", 100.0, "alice", 1000, (0, 1), "gpu017", "b1")
    assert parsed.line() == line(rec)  # what readers write back is what the writer wrote


def test_no_job_no_record() -> None:
    assert jobenv.record("start", {}, 1.0) is None


def test_environment_is_data() -> None:
    env = {
        "SLURM_JOB_ID": "12",
        "SLURM_JOB_USER": 'ev"il\n{"v":1,"event":"end"}',
        "SLURM_JOB_UID": "x",
        "CUDA_VISIBLE_DEVICES": "0;reboot",
    }
    rec = jobenv.record("start", env, 1.0)
    assert rec is not None
    text = line(rec)
    assert text.count("\n") == 1
    obj = json.loads(text)
    assert obj["uid"] is None and obj["gpus"] is None
    assert '"' not in obj["user"] and "\n" not in obj["user"]


def test_holder_is_the_one_rule() -> None:
    jobs = ledger.entries(
        [
            ledger.JobRecord("start", "1", 10.0, gpus=(0, 1)),
            ledger.JobRecord("end", "1", 20.0),
            ledger.JobRecord("start", "2", 15.0, gpus=(2,)),
            ledger.JobRecord("start", "3", 25.0, gpus=(0,)),
        ]
    )
    assert ledger.holder(jobs, 0, 12.0) == "1"
    assert ledger.holder(jobs, 0, 21.0) == "1"  # just after its end: teardown is still the job's
    assert ledger.holder(jobs, 0, 21.0, slack_s=0.0) is None
    assert ledger.holder(jobs, 0, 60.0, slack_s=0.0) == "3"
    assert ledger.holder(jobs, 2, 30.0) == "2"
    assert ledger.holder(jobs, None, 16.0) is None  # two jobs on the node: the GPU decides, else no one
    assert ledger.holder(jobs, None, 12.0) == "1"
    overlapping = ledger.entries(
        [
            *map(
                lambda r: ledger.JobRecord(*r),
                [("start", "5", 40.0, None, None, (3,)), ("start", "6", 41.0, None, None, None)],
            )
        ]
    )
    assert ledger.holder(overlapping, 3, 50.0) is None  # two candidates name no one


def test_parse_skips_junk() -> None:
    text = (
        'not json\n{"event":"start"}\n[1]\n{"v":1,"event":"end","job_id":"7","time":"x"}\n'
        '{"v":1,"event":"start","job_id":"8","time":5,"gpus":[1]}\n\x00\xff\n'
    )
    recs = ledger.parse(text)
    assert [r.job_id for r in recs] == ["8"]


def test_append_is_bounded_and_atomic(tmp_path: Path) -> None:
    path = str(tmp_path / "state" / ledger.FILE_NAME)
    max_bytes = 4096
    for i in range(1, 500):  # job ids start at 1 (0 is none)
        rec = jobenv.record("start" if i % 2 == 0 else "end", dict(ENV, SLURM_JOB_ID=str(i)), float(i))
        assert rec is not None
        ledger.append(str(tmp_path / "state"), rec, max_bytes)
        assert os.path.getsize(path) <= max_bytes + len(line(rec))
    recs = ledger.parse(Path(path).read_text())
    assert recs and recs[-1].job_id == "499"
    ids = [int(r.job_id) for r in recs]
    assert ids == sorted(ids) and ids == list(range(ids[0], 500))
    assert not [p for p in os.listdir(tmp_path / "state") if p.startswith(".")]  # no temp files left


def test_state_file_atomic_and_locked(tmp_path: Path) -> None:
    path = str(tmp_path / "s" / "slurm-state.json")
    assert statefile.read_json(path) is None
    assert statefile.ensure_state_dir(str(tmp_path / "s")) is None
    with statefile.locked(path) as got:
        assert got
        with statefile.locked(path, timeout_s=0.05) as again:
            assert not again  # flock is per open file description: a second holder waits
        statefile.write_json(path, {"a": 1})
    assert statefile.read_json(path) == {"a": 1}
    Path(path).write_text("{broken")
    assert statefile.read_json(path) is None


def test_boot_id(tmp_path: Path) -> None:
    p = tmp_path / "sys" / "kernel" / "random" / "boot_id"
    p.parent.mkdir(parents=True)
    p.write_text("6f1c2a1e-aaaa-bbbb-cccc-0123456789ab\n")
    assert layout.read_boot_id(str(tmp_path)) == "6f1c2a1e-aaaa-bbbb-cccc-0123456789ab"
    assert layout.read_boot_id(str(tmp_path / "missing")) is None


def test_short_append_is_an_error(tmp_path: Path, monkeypatch) -> None:
    real = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real(fd, bytes(data)[: len(data) // 2]))
    try:
        statefile.append_line(str(tmp_path / "l"), "0123456789\n")
    except statefile.ShortWrite:
        pass
    else:
        raise AssertionError("a short append must raise")
