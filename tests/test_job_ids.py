"""Job ids are Slurm's 32-bit numbers, checked by one rule (``statedir.layout.valid_job_id``) before they
reach the ledger, a file name, a drain record, a reason or a metric label; names echoed from the
command line are shown ``printable`` (docs/security.md, "Inputs a user can influence").

The attacks: a job environment (``SLURM_JOB_ID`` is the job's, and a user's ``srun --export`` or a
forged ledger line can carry anything) with a path, a sign, hex, an exponent, 300 digits, Unicode
digits; ``check --only`` with a terminal escape.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_slurm_faces import Fake

from nodehealth.commands.check import check_names
from nodehealth.commands.common import UsageError
from nodehealth.faces import epilog, prolog
from nodehealth.probes.process_job import job_from_cgroup, job_from_environ
from nodehealth.slurm import jobenv
from nodehealth.statedir import counters, layout, ledger

BIN = Path(sys.executable).parent
ATTACKS = {
    "dotdot": "../../../tmp/evil",
    "slash": "7/../../x",
    "hex": "0x10",
    "negative": "-1",
    "plus": "+7",
    "exponent": "1e3",
    "300-digits": "9" * 300,
    "zero": "0",
    "leading-zero": "007",
    "space": " 7",
    "newline": "7\n",
    "arabic-indic": "\u0663",
    "superscript": "\u00b2",
    "fullwidth": "\uff17",
    "no-val": "4294967294",
    "infinite": "4294967295",
    "past-32-bits": "99999999999",
    "array-form": "7_1",
    "het-form": "7+0",
    "empty": "",
    "nul": "7\x00",
    "float": "7.0",
}
GOOD = ["1", "7", "81234", "4294967293"]


@pytest.mark.parametrize("job", list(ATTACKS.values()), ids=list(ATTACKS))
def test_a_job_id_that_is_not_one_is_refused_by_the_one_rule(job: str) -> None:
    assert layout.valid_job_id(job) is None
    assert jobenv.job_id({"SLURM_JOB_ID": job}) is None
    assert jobenv.record("start", {"SLURM_JOB_ID": job, "SLURM_JOB_USER": "eve"}, 100.0) is None
    assert layout.job_file("/run/nodehealth", job) is None
    line = json.dumps({"v": 1, "event": "start", "job_id": job, "time": 100.0, "gpus": [0]})
    assert ledger.parse_line(line) is None  # a forged ledger line is no record: no label, no holder
    # From /proc: whatever is found is a job id by the same rule, or nothing.
    for got in (
        job_from_cgroup(f"0::/system.slice/slurmstepd.scope/job_{job}/step_0\n"),
        job_from_environ(b"SLURM_JOB_ID=" + job.encode("utf-8") + b"\0"),
    ):
        assert got is None or layout.valid_job_id(got) == got


@pytest.mark.parametrize("job", GOOD)
def test_a_real_job_id_is_taken_as_it_is(job: str) -> None:
    assert layout.valid_job_id(job) == job and layout.valid_job_id(int(job)) == job
    assert jobenv.job_id({"SLURM_JOB_ID": job}) == job
    rec = jobenv.record("start", {"SLURM_JOB_ID": job}, 100.0)
    assert rec is not None and rec["job_id"] == job
    assert layout.job_file("/s", job) == f"/s/jobs/{job}.json"
    assert ledger.parse_line(json.dumps({"v": 1, "event": "start", "job_id": job, "time": 1.0})) is not None


def test_booleans_and_other_types_are_not_job_ids() -> None:
    assert [layout.valid_job_id(v) for v in (True, False, 7.0, None, [7], 0, -1, 1 << 32)] == [None] * 8


def test_the_ledger_appender_refuses_a_record_whose_job_id_is_not_one(tmp_path: Path) -> None:
    sd = tmp_path / "state"
    note = ledger.append(str(sd), {"v": 1, "event": "start", "job_id": "../../../tmp/evil", "time": 1.0}, 1 << 20)
    assert note is not None and "not appended" in note
    assert not (sd / layout.LEDGER).exists()


def test_a_baseline_is_never_written_under_a_path_job_id(tmp_path: Path) -> None:
    sd = tmp_path / "state"
    counters.write_baseline(str(sd), "../../evil", {"v": 1})
    counters.write_baseline(str(sd), "7/../../x", {"v": 1})
    assert not (tmp_path / "evil.json").exists() and not list(tmp_path.rglob("*.json"))


@pytest.mark.parametrize(
    "job",
    ["../../../tmp/evil", "7/../../x", "0x10", "-1", "1e3", "9" * 300],
    ids=["dotdot", "slash", "hex", "negative", "exponent", "300-digits"],
)
def test_a_prolog_and_epilog_with_a_forged_job_id_store_nothing_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, job: str
) -> None:
    """The faces still check the node (and drain a faulty one) but record no job: nothing to blame."""
    f = Fake(tmp_path, monkeypatch, scenario="remap-pending.toml")
    monkeypatch.setenv("SLURM_JOB_ID", job)
    assert prolog.main() == 1 and epilog.main() == 1
    sd = tmp_path / "state"
    stored = "\n".join(p.read_text(errors="replace") for p in sd.rglob("*") if p.is_file())
    assert json.dumps(job) not in stored  # as a JSON string: "-1", "0x10"
    assert not (sd / layout.LEDGER).exists() or ledger.read(str(sd)) == []
    assert not (sd / layout.JOBS_DIR).exists() or list((sd / layout.JOBS_DIR).iterdir()) == []
    assert not list(Path(tmp_path).rglob("evil*")) and not list(Path("/tmp").glob("evil*.json"))
    assert f.state()["drain"]["job_id"] is None
    assert f.updates() and job not in " ".join(f.updates()[0])


ESC = "gpu_ecc\x1b[2J"


def test_only_echoes_a_name_printable() -> None:
    with pytest.raises(UsageError) as exc:
        check_names([[ESC, "gpu_temp\u202eerature"]])
    text = str(exc.value)
    assert "\x1b" not in text and "\u202e" not in text
    assert "gpu_ecc\\x1b[2J" in text and "gpu_temp\\u202eerature" in text


@pytest.mark.parametrize(
    "argv",
    [
        ["check", "--only", ESC],
        ["check", "-i", "0\x1b]0;pwned\x07"],
        ["check", "--as", "prolog", "--job", "7\x1b[2J"],
        ["check", "--config", "/nonexistent/\x1b[2J.toml"],
    ],
    ids=["only", "gpu", "job", "config"],
)
def test_the_cli_never_echoes_a_terminal_escape(argv: list[str], tmp_path: Path) -> None:
    exe = BIN / "nodehealth"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "nodehealth"]
    cfg = tmp_path / "nh.toml"
    cfg.write_text(f'[paths]\nstate_dir = "{tmp_path}/state"\n')
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "NODEHEALTH"))},
        "NODEHEALTH_CONFIG": str(cfg),
    }
    res = subprocess.run([*cmd, *argv], capture_output=True, text=True, env=env, cwd="/", timeout=300)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "\x1b" not in res.stdout + res.stderr and "\x07" not in res.stdout + res.stderr
    assert "\\x1b" in res.stderr


@pytest.mark.parametrize("face", ["nodehealth-prolog", "nodehealth-epilog", "nodehealth-healthcheck"])
def test_a_face_never_echoes_a_terminal_escape(face: str) -> None:
    res = subprocess.run([str(BIN / face), "--dry-run", ESC], capture_output=True, text=True, cwd="/", timeout=300)
    assert res.returncode == 2 and "\x1b" not in res.stderr and "gpu_ecc\\x1b[2J" in res.stderr
