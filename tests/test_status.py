"""``nodehealth status`` tells the truth after a drain, a resume and a breaker hold (a fake scontrol)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_slurm_faces import Fake

from nodehealth.cli import main as cli_main
from nodehealth.faces import healthcheck, prolog


def _status(capsys: pytest.CaptureFixture[str]) -> tuple[int, dict]:
    code = cli_main(["status", "--format", "json"])
    return code, json.loads(capsys.readouterr().out)


def test_status_after_a_drain_then_clean_runs_then_the_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    f = Fake(tmp_path, monkeypatch, scenario="remap-pending.toml", clean_runs=2)
    for var in ("SLURM_JOB_ID", "SLURM_JOB_GPUS"):
        monkeypatch.delenv(var)
    code, doc = _status(capsys)
    assert doc["drain"] is None and doc["daemon"]["alive"] is False and code == 4  # no daemon here
    calls = len(f.calls())
    assert healthcheck.main() == 1
    code, doc = _status(capsys)
    assert code == 1
    assert doc["drain"]["check"] == "gpu_remapped_rows" and doc["drain"]["reason"].startswith("nh:rowremap ")
    assert doc["drain"]["reboot_needed"] is False and doc["resume"] == {"clean_runs": 0, "needed": 2, "enabled": True}
    assert doc["slurm_view"]["gres_gpus"] == 8 and doc["last_run"]["status"] == "FAIL"
    f.use("healthy.toml")
    assert healthcheck.main() == 0
    code, doc = _status(capsys)
    assert code == 1 and doc["resume"]["clean_runs"] == 1  # still drained, one clean run of two
    assert healthcheck.main() == 0
    code, doc = _status(capsys)
    assert doc["drain"] is None and code == 4  # resumed; "cannot tell" only because no daemon runs here
    assert len(f.calls()) > calls  # the faces talked to Slurm ...
    before = len(f.calls())
    cli_main(["status"])
    assert len(f.calls()) == before  # ... status never does
    text = capsys.readouterr().out
    assert "drain: none of ours" in text and "config: " in text


def test_status_shows_a_breaker_hold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes = {f"g{i}": ["IDLE+DRAIN", "nodehealth: gpu_count: 7 of 8"] for i in range(5)}
    nodes["n1"] = ["IDLE", None]
    Fake(tmp_path, monkeypatch, scenario="remap-pending.toml", nodes=nodes)
    assert prolog.main() == 0  # held: the job runs
    code, doc = _status(capsys)
    assert doc["breaker_held"]["ours"] == 5 and doc["drain"] is None
    cli_main(["status"])
    assert "breaker: holding a drain back" in capsys.readouterr().out


def test_status_with_a_config_that_does_not_validate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    Fake(tmp_path, monkeypatch)
    cfg = tmp_path / "bad.toml"
    cfg.write_text(f'[paths]\nstate_dir = "{tmp_path}/state"\n[gpu]\nexpected_count = "eight"\n')
    code = cli_main(["status", "--config", str(cfg), "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 4 and doc["config"]["validated"] is False and "expected_count" in doc["config"]["error"]


def test_status_in_observe_mode_shows_the_would_be_drain_never_a_drain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """In observe mode the act sequence records its drain as if made; Slurm has the node in service,
    so status must not say "drained by nodehealth": it says what would have been done."""
    from test_slurm_observe import configure, no_job

    f = Fake(tmp_path, monkeypatch, scenario="remap-pending.toml", clean_runs=2)
    configure(f, mode='"observe"')
    no_job(monkeypatch)
    assert healthcheck.main() == 0
    assert f.state()["drain"] is not None  # the sequence's record, as if it had drained
    code, doc = _status(capsys)
    assert doc["drain"] is None and doc["would_drain"]["reason"].startswith("nh:rowremap GPU1")
    assert doc["slurm_mode"] == {"mode": "observe", "would": {"drain": 1}}
    assert code == 1  # the node is failing, whatever observe mode does about it
    cli_main(["status"])
    text = capsys.readouterr().out
    assert "drain: none of ours" in text and "would drain (observe mode" in text and "drain 1" in text


def test_status_counts_the_reboots_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from test_slurm_observe import configure, no_job

    f = Fake(tmp_path, monkeypatch, scenario="gpu-missing.toml", clean_runs=1)
    configure(f, reboot='"asap"', reboot_max=1)
    no_job(monkeypatch)
    _, doc = _status(capsys)
    assert doc["reboots"]["asked_in_window"] == 0 and doc["reboots"]["held_for_a_person"] is False
    assert healthcheck.main() == 1  # drained, reboot asked
    _, doc = _status(capsys)
    assert doc["reboots"]["asked_in_window"] == 1 and doc["slurm_mode"]["mode"] == "enforce"
    f.set_nodes({"n1": ["IDLE", None]})  # Slurm rebooted and resumed it; the fault is still there
    f.boot.write_text("boot-2\n")
    assert healthcheck.main() == 1  # held for a person
    _, doc = _status(capsys)
    assert doc["reboots"]["held_for_a_person"] is True
    cli_main(["status"])
    assert "reboots: 1 asked within 24 h (at most 1); held for a person after them" in capsys.readouterr().out


def test_status_words_for_a_drained_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every field in plain words: the headline names the drain, ages read as ages, no raw values."""
    import re

    Fake(tmp_path, monkeypatch, scenario="remap-pending.toml", clean_runs=2)
    for var in ("SLURM_JOB_ID", "SLURM_JOB_GPUS"):
        monkeypatch.delenv(var)
    assert healthcheck.main() == 1
    assert cli_main(["status"]) == 1
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert lines[0] == "node n1: drained by nodehealth (gpu_remapped_rows)", lines[0]
    assert re.search(r"^drain: ours, drained (just now|\d+ s ago): 'nh:rowremap GPU1 ", text, re.M), text
    assert re.search(r"^last face run: FAIL (just now|\d+ s ago)$", text, re.M), text
    assert re.search(r"^slurm \(cached view(, read (just now|\d+ s ago))?\): state IDLE, Gres gpu:8$", text, re.M), text
    assert not any(w in text for w in ("never", "-0 s", "or failing", "{'", "since just now")), text


def test_status_without_a_daemon_says_how_to_start_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A fresh install (the unit is installed, not enabled): "cannot tell", and the command that fixes it."""
    Fake(tmp_path, monkeypatch, scenario="healthy.toml")
    assert cli_main(["status"]) == 4
    lines = capsys.readouterr().out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("daemon: no usable verdict: no daemon state ("))
    assert lines[at + 1].strip() == "-> " + (
        "systemctl enable --now nodehealth.service starts it; journalctl -u nodehealth.service says why it stopped"
    ), lines
    code, doc = _status(capsys)
    assert code == 4 and doc["daemon"]["alive"] is False and "systemctl enable --now" in doc["daemon"]["fix"]
