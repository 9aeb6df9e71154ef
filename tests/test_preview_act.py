"""``--dry-run`` and ``check --as`` run the real ``slurm.act`` sequence against a client that records instead of
acting (``observe.RecordingClient``) and a memory that changes nothing on disk (``act.MemoryStore``).

The guards: the Fake's logging ``scontrol`` (every call is a line in calls.jsonl), a ``Scontrol`` whose every
call raises, and the state dir's bytes before and after. The by-hand runs of the faces
(tests/test_faces_by_hand.py) check the same from the command line.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from helpers_act import healthcheck_actor
from test_slurm_faces import Fake

from nodehealth.config.loader import load
from nodehealth.faces import healthcheck
from nodehealth.faces.preview import preview
from nodehealth.model import Action, CheckResult, Report, Status
from nodehealth.slurm import act, observe
from nodehealth.slurm.client import Scontrol
from nodehealth.slurm.nodes import NodeInfo, parse_reason, parse_state
from nodehealth.statedir import slurmstate


def _files(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()} if d.exists() else {}


def refuse_scontrol(monkeypatch: pytest.MonkeyPatch) -> None:
    """From now on any Slurm call fails the test, not just counted."""

    def refuse(self: Scontrol, *args: object, **kwargs: object) -> None:
        raise AssertionError(f"a preview called scontrol: {args}")

    monkeypatch.setattr(Scontrol, "_call", refuse)


@pytest.fixture
def no_scontrol(monkeypatch: pytest.MonkeyPatch) -> None:
    refuse_scontrol(monkeypatch)


@pytest.mark.parametrize("face", ["prolog", "epilog", "healthcheck"])
def test_a_preview_of_a_fault_names_the_sequences_drain_and_acts_on_nothing(
    face: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_scontrol: None
) -> None:
    f = Fake(tmp_path, monkeypatch, scenario="remap-pending.toml")
    before = _files(tmp_path / "state")
    got = preview(face, dict(os.environ))
    assert f.calls() == [], "a preview made a Slurm call"
    assert _files(tmp_path / "state") == before, "a preview wrote state"
    assert got.exit_code == 1
    assert got.decision[0].startswith("drain the node with reason 'nh:rowremap GPU1 gpu_remapped_rows: ")
    assert any(line.startswith("would log: drained n1: nh:rowremap GPU1") for line in got.decision), got.decision


def test_a_preview_of_a_due_resume_says_resume_where_prose_could_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The health check drained for a fault (really: the Fake's scontrol); the fault is gone and one clean
    run is all [resume] asks: the preview's sequence resumes the node (recorded), the disk stays as it was."""
    f = Fake(tmp_path, monkeypatch, scenario="remap-pending.toml", clean_runs=1)
    for var in ("SLURM_JOB_ID", "SLURM_JOB_GPUS"):
        monkeypatch.delenv(var)
    assert healthcheck.main() == 1 and f.nodes()["n1"][0] == "IDLE+DRAIN"
    f.use("healthy.toml")
    calls, before = len(f.calls()), _files(tmp_path / "state")
    refuse_scontrol(monkeypatch)
    got = preview("healthcheck", dict(os.environ))
    assert len(f.calls()) == calls and _files(tmp_path / "state") == before
    assert got.decision[0] == "resume the node (scontrol update state=resume)", got.decision
    assert got.exit_code == 0
    assert any(line.startswith("drain record of ours: 'nh:rowremap GPU1") for line in got.inputs), got.inputs


def test_a_preview_with_drain_disabled_says_the_sequences_words(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_scontrol: None
) -> None:
    f = Fake(tmp_path, monkeypatch, scenario="remap-pending.toml")
    cfg = tmp_path / "nh.toml"
    cfg.write_text(cfg.read_text() + "[drain]\nenabled = false\n")
    got = preview("epilog", dict(os.environ))
    assert f.calls() == []
    assert got.exit_code == 1 and got.decision[0] == "exit 1: no drain (the sequence's words below)"
    assert any("[drain] enabled = false: not draining" in line for line in got.decision), got.decision


# ----------------------------------------------------------------------------- the client and the memory


def _fault() -> Report:
    r = CheckResult("gpu_ecc", Status.FAIL, "GPU 6: 2 uncorrectable ECC errors", action=Action.RESET_GPU, gpu=6)
    return Report(node="n1", phase="healthcheck", results=(r,), duration_s=0.1, version="t", started_at=time.time())


def test_the_recording_client_reads_the_cached_view_and_records_changes() -> None:
    cached = NodeInfo(name="n1", state=parse_state("MIXED"), seen_at=1.0)
    c = observe.RecordingClient("n1", cached)
    assert not c.assumed and c.show(None) == [cached] and c.show("n1") == [cached] and c.show("n2") == []
    assert c.update("n1", "drain", "nh:ecc GPU6 x").ok
    (node,) = c.show("n1")  # type: ignore[misc]
    assert node.state.text == "MIXED+DRAIN" and node.reason == parse_reason("nh:ecc GPU6 x")
    assert c.update("n1", "resume").ok and c.reboot("n1", "why").ok
    (node,) = c.show("n1")  # type: ignore[misc]
    assert not node.drained and node.reason is None
    assert [r.action for r in c.recorded] == ["drain", "resume", "reboot"] and c.calls == 0
    blank = observe.RecordingClient("n1", None)
    assert blank.assumed and blank.view.state.text == "IDLE"


def test_the_sequence_on_memory_drains_in_memory_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    Fake(tmp_path, monkeypatch)
    cfg = load()
    before = _files(tmp_path / "state")
    client, store, said = observe.RecordingClient("n1"), act.MemoryStore(cfg.paths), []
    actor = healthcheck_actor(cfg, client, lambda m, **k: said.append(m), store=store)
    assert act.after_check(actor, _fault()).outcome == act.ActOutcome.DRAINED
    assert [(r.action, r.node) for r in client.recorded] == [("drain", "n1")]
    assert store.state.drain is not None and store.state.drain.check == "gpu_ecc"
    assert slurmstate.load(cfg.paths).drain is None and _files(tmp_path / "state") == before
    # The memory holds: the next run of the same sequence finds its own drain and calls nothing more.
    assert act.on_fault(actor, _fault()).outcome == act.ActOutcome.ALREADY
    assert len(client.recorded) == 1
    assert json.dumps(said)  # what it said is plain text for the preview's lines


def test_check_as_json_carries_what_the_sequence_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], no_scontrol: None
) -> None:
    from nodehealth.cli import main as cli_main

    f = Fake(tmp_path, monkeypatch, scenario="remap-pending.toml")
    assert cli_main(["check", "--as", "epilog", "--format", "json"]) == 1
    (rec,) = json.loads(capsys.readouterr().out)["as"]["recorded"]
    assert rec["action"] == "drain" and rec["node"] == "n1" and rec["reason"].startswith("nh:rowremap GPU1 ")
    assert f.calls() == []
