"""Observe mode and the reboot loop against a fake ``scontrol`` (no Slurm needed): every call it gets is
logged, so "no update" is what scontrol saw, not what nodehealth says it did.

The real-Slurm versions of both are in tests/test_slurm_reboot_observe.py.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from test_slurm_faces import Fake

from nodehealth.config import loader as C
from nodehealth.faces import epilog, healthcheck, prolog
from nodehealth.slurm import observe, reboot
from nodehealth.slurm.nodes import NodeInfo, parse_reason, parse_state
from nodehealth.statedir import slurmstate

NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="ownership is checked only when running as root")


def configure(f: Fake, **slurm: Any) -> Path:
    """Add ``[slurm]`` keys (TOML values) to the fake's config file."""
    cfg = f.d / "nh.toml"
    text = cfg.read_text()
    keys = "".join(f"{k} = {v}\n" for k, v in slurm.items())
    cfg.write_text(text.replace("[slurm]\n", "[slurm]\n" + keys, 1))
    return cfg


def observed(f: Fake) -> dict[str, Any]:
    p = f.d / "state" / "slurm-observe.json"
    data: dict[str, Any] = json.loads(p.read_text()) if p.exists() else {}
    return data


def no_job(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("SLURM_JOB_ID", "SLURM_JOB_GPUS"):
        monkeypatch.delenv(var, raising=False)


# ----------------------------------------------------------------------------- observe mode


def test_observe_mode_makes_no_update_and_says_what_it_would_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    f = Fake(tmp_path, monkeypatch, scenario="remap-pending.toml", clean_runs=2)
    configure(f, mode='"observe"')
    assert prolog.main() == 0  # a fault: would exit 1, exits 0
    assert epilog.main() == 0
    no_job(monkeypatch)
    for _ in range(3):
        assert healthcheck.main() == 0
    err = capsys.readouterr().err
    assert f.updates() == [] and f.nodes()["n1"] == ["IDLE", None]
    assert err.count("would drain n1: nh:rowremap GPU1") == 1, err  # once: the next runs see it drained
    assert "would exit 1" in err
    doc = observed(f)
    assert doc["would"] == {"drain": 1} and doc["drain"]["reason"].startswith("nh:rowremap GPU1")
    assert f.state()["drain"]["check"] == "gpu_remapped_rows"  # the act sequence recorded its drain as usual
    # The fault clears: after [resume] clean_runs clean runs it would resume, and says so.
    f.use("healthy.toml")
    for _ in range(3):
        assert healthcheck.main() == 0
    err = capsys.readouterr().err
    assert err.count("would resume n1") == 1, err
    assert f.updates() == [] and observed(f)["would"] == {"drain": 1, "resume": 1}
    assert observed(f)["drain"] is None and f.state()["drain"] is None
    # Nothing but reads reached scontrol.
    assert {c[0] for c in f.calls()} == {"show"}


def test_a_reason_slurm_shows_wins_over_the_would_be_drain(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = Fake(tmp_path, monkeypatch, scenario="remap-pending.toml", clean_runs=1)
    configure(f, mode='"observe"')
    no_job(monkeypatch)
    assert healthcheck.main() == 0
    assert observed(f)["drain"] is not None
    f.set_nodes({"n1": ["IDLE+DRAIN", "admin: PSU"]})  # a person drains it for real
    f.use("healthy.toml")
    for _ in range(3):
        assert healthcheck.main() == 0
    assert observed(f)["drain"] is None and f.state()["drain"] is None
    assert "resume" not in observed(f)["would"]  # never a would-be resume of an admin's drain
    assert f.updates() == [] and f.nodes()["n1"] == ["IDLE+DRAIN", "admin: PSU"]


def test_enforce_after_observe_drains_for_real(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The would-be drain of observe mode is recorded as our drain; back in enforce mode it must not
    pass for a real one (the fault would be "already drained" and the node would take jobs)."""
    f = Fake(tmp_path, monkeypatch, scenario="remap-pending.toml")
    cfg = configure(f, mode='"observe"')
    no_job(monkeypatch)
    assert healthcheck.main() == 0 and f.updates() == []
    cfg.write_text(cfg.read_text().replace('mode = "observe"', 'mode = "enforce"'))
    assert healthcheck.main() == 1
    (upd,) = f.updates()
    assert upd[2] == "state=drain" and f.nodes()["n1"][0] == "IDLE+DRAIN"
    assert observed(f)["drain"] is None


def test_a_leftover_would_be_drain_is_never_overlaid_in_enforce_mode(tmp_path: Path) -> None:
    """Only [slurm] mode turns observe mode on: a would-be drain in the file does not."""
    from nodehealth.config.schema import Config, Paths, SlurmSettings

    cfg = Config(
        paths=Paths(state_dir=str(tmp_path), persistent_dir=str(tmp_path)), slurm=SlurmSettings(mode="enforce")
    )
    observe.update_doc(cfg.paths, observe.FILE_NAME, lambda d: {"drain": {"node": "n1", "reason": "nh:x"}})
    rec = slurmstate.DrainRecord(reason="nh:x", check="gpu_count", action="reboot", boot_id="b", time=1.0, phase="x")
    slurmstate.update(cfg.paths, lambda s: replace(s, drain=rec), 1.0)
    node = NodeInfo(name="n1", state=parse_state("IDLE"))
    assert observe.view(cfg, node) is node
    on = Config(paths=cfg.paths, slurm=SlurmSettings(mode="observe"))
    assert observe.view(on, node).drained and observe.view(on, node).reason == parse_reason("nh:x")


@pytest.mark.parametrize("value", ['"Observe"', '"observe "', '"dry-run"', '"off"', "true", "1", '""'])
def test_an_invalid_mode_is_never_observe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    """A value of [slurm] mode that is not one is a config error: the run keeps the last configuration
    that validated (enforce here), and the faulty node is drained."""
    f = Fake(tmp_path, monkeypatch, scenario="healthy.toml")
    assert prolog.main() == 0  # validates the enforce configuration and remembers it
    cfg = configure(f, mode=value)
    with pytest.raises(C.ConfigError, match="mode"):
        C.load(str(cfg))
    f.use("remap-pending.toml")
    assert prolog.main() == 1
    assert len(f.updates()) == 1 and f.nodes()["n1"][0] == "IDLE+DRAIN"


def test_an_invalid_mode_with_nothing_validated_runs_enforce(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = Fake(tmp_path, monkeypatch, scenario="healthy.toml")
    cfg = configure(f, mode='"obsrve"')
    loaded = C.load_safe(str(cfg), remember=False)
    assert loaded.error is not None and loaded.using == "defaults" and loaded.cfg.slurm.mode == "enforce"


@as_root
@pytest.mark.parametrize("how", ["file-owner", "file-mode"])
def test_observe_mode_from_a_config_others_can_change_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    f = Fake(tmp_path, monkeypatch, scenario="remap-pending.toml")
    assert prolog.main() == 1  # enforce, validated and remembered
    cfg = configure(f, mode='"observe"')
    if how == "file-owner":
        os.chown(cfg, NOBODY, 0)
    else:
        os.chmod(cfg, 0o666)
    with pytest.raises(C.ConfigError) as info:
        C.load(str(cfg))
    assert info.value.kind == "untrusted"
    # What a face would run with: the last configuration that validated, enforce (a face is not run
    # here: the refused file's fallback is the built-in defaults' paths, the host's).
    loaded = C.load_safe(str(cfg), remember=False)
    assert loaded.error is not None and loaded.cfg.slurm.mode == "enforce"


# ----------------------------------------------------------------------------- the reboot loop


@pytest.mark.parametrize(
    "times,expect",
    [
        ([], "reboot"),
        ([100.0], "reboot"),
        ([100.0, 200.0], "escalate"),
        ([-90000.0 + 1000, 200.0], "reboot"),  # the first is out of the window
    ],
)
def test_decide_counts_reboots_within_the_window(times: list[float], expect: str) -> None:
    d = reboot.decide("asap", "reboot", ("reboot",), times, 1000.0, 2, 86400.0)
    assert d.action == expect


def test_decide_is_off_by_default_and_only_for_reboot_class_faults() -> None:
    assert reboot.decide("off", "reboot", ("reboot",), [], 1.0, 2, 60.0).action == "none"
    assert reboot.decide("asap", "inspect", ("reboot",), [], 1.0, 2, 60.0).action == "none"


def test_the_inspect_reason_says_it_in_twenty_characters() -> None:
    text = reboot.inspect_reason("nh:gpucount gpu_count: 7 of 8 GPUs", "gpu_count", 2, 86400.0, 200)
    assert text[:20] == "nh:inspect gpu_count" and text.endswith("7 of 8 GPUs") and "2 reboots in 24 h" in text
    assert len(reboot.inspect_reason("x" * 500, "gpu_count", 2, 86400.0, 200)) == 200


def test_reboot_loop_asks_for_reboots_then_escalates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = Fake(tmp_path, monkeypatch, scenario="gpu-missing.toml", clean_runs=1)
    configure(f, reboot='"asap"', reboot_max=2)
    no_job(monkeypatch)
    reboots = []
    for boot in (1, 2, 3):
        f.boot.write_text(f"boot-{boot}\n")
        assert healthcheck.main() == 1
        reboots = [c for c in f.calls() if c[0] == "reboot"]
        # Slurm rebooted the node and resumed it (nextstate=RESUME): the fault is still there.
        f.set_nodes({"n1": ["IDLE", None]})
    assert len(reboots) == 2
    assert reboots[0][:3] == ["reboot", "ASAP", "nextstate=RESUME"] and reboots[0][-1] == "n1"
    assert reboots[0][3].startswith("reason=nh:") and "gpu_count" in reboots[0][3]
    # The third drain: no reboot, a reason for a person, held.
    upd = f.updates()
    assert upd[-1][3].startswith("reason=nh:inspect gpu_count: 2 reboots in 24 h"), upd
    st = f.state()
    assert st["drain"]["flapping"] is True and st["drain"]["reason"].startswith("nh:inspect")
    doc = json.loads((tmp_path / "state" / "reboots.json").read_text())
    assert len(doc["checks"]["gpu_count"]) == 2 and "gpu_count" in doc["escalated"]


def test_while_slurm_reboots_the_node_it_is_read_every_run_so_its_return_is_seen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """During the reboot we asked for, Slurm shows our reason with its own " : reboot issued": still
    ours (no disowning, no orphan). Slurm then returns the node to service by itself (nextstate=RESUME,
    ReturnToService after a timed-out boot): the run after that must see it, not trust the record
    for an hour, and drain again."""
    f = Fake(tmp_path, monkeypatch, scenario="gpu-missing.toml", clean_runs=1)
    configure(f, reboot='"asap"', reboot_max=2)
    no_job(monkeypatch)
    assert healthcheck.main() == 1  # drained, reboot 1 asked
    ours = f.state()["drain"]["reason"]
    f.set_nodes({"n1": ["DOWN+DRAIN+REBOOT_ISSUED", ours + " : reboot issued"]})
    f.boot.write_text("boot-2\n")
    capsys.readouterr()
    for _ in range(3):
        healthcheck.main()
    err = capsys.readouterr().err
    assert f.state()["drain"] is not None and f.state().get("orphan") is None, err
    assert "belongs to whoever changed it" not in err and "no record of ours" not in err, err
    assert len([c for c in f.calls() if c[0] == "reboot"]) == 1
    f.set_nodes({"n1": ["IDLE", None]})  # the boot timed out; ReturnToService=2 took it back
    healthcheck.main()
    assert len([c for c in f.calls() if c[0] == "reboot"]) == 2  # seen at once, drained, reboot 2
    assert f.nodes()["n1"][0].endswith("DRAIN")


def test_an_escalated_drain_is_not_resumed_after_a_boot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = Fake(tmp_path, monkeypatch, scenario="gpu-missing.toml", clean_runs=1)
    configure(f, reboot='"asap"', reboot_max=1)
    no_job(monkeypatch)
    assert healthcheck.main() == 1  # reboot 1
    f.set_nodes({"n1": ["IDLE", None]})
    f.boot.write_text("boot-2\n")
    assert healthcheck.main() == 1  # escalated
    node = f.nodes()["n1"]
    assert node[0] == "IDLE+DRAIN" and node[1].startswith("nh:inspect")
    f.use("healthy.toml")
    f.boot.write_text("boot-3\n")  # a person rebooted it; the GPU is back
    for _ in range(3):
        healthcheck.main()
    assert f.nodes()["n1"][1].startswith("nh:inspect")  # still drained: a person resumes it
    assert len([c for c in f.calls() if c[0] == "reboot"]) == 1


def test_reboot_off_asks_for_no_reboot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = Fake(tmp_path, monkeypatch, scenario="gpu-missing.toml")
    no_job(monkeypatch)
    assert healthcheck.main() == 1
    assert [c for c in f.calls() if c[0] == "reboot"] == [] and len(f.updates()) == 1


def test_observe_mode_would_reboot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = Fake(tmp_path, monkeypatch, scenario="gpu-missing.toml")
    configure(f, mode='"observe"', reboot='"asap"')
    no_job(monkeypatch)
    assert healthcheck.main() == 0
    assert {c[0] for c in f.calls()} == {"show"}
    assert observed(f)["would"] == {"drain": 1, "reboot": 1}


# ----------------------------------------------------------------------------- what the daemon exports


def test_the_daemon_exports_the_faces_would_be_actions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from nodehealth.daemon.hooks import with_loop
    from nodehealth.metrics import SlurmView

    f = Fake(tmp_path, monkeypatch, scenario="remap-pending.toml")
    cfg = configure(f, mode='"observe"')
    no_job(monkeypatch)
    assert healthcheck.main() == 0
    view = with_loop(SlurmView(drained=True, drained_by_nodehealth=True), C.load(str(cfg)), "n1")
    assert view.observe_mode is True and view.would == (("drain", 1),)
    assert (view.drained, view.drained_by_nodehealth) == (False, False)  # Slurm's node is in service
    assert (view.reboots_requested, view.reboot_escalated) == (None, None)  # reboot = off, nothing asked


def test_the_daemon_exports_the_reboot_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from nodehealth.daemon.hooks import with_loop
    from nodehealth.metrics import SlurmView

    f = Fake(tmp_path, monkeypatch, scenario="gpu-missing.toml", clean_runs=1)
    cfg = configure(f, reboot='"asap"', reboot_max=1)
    no_job(monkeypatch)
    assert healthcheck.main() == 1
    loaded = C.load(str(cfg))
    view = with_loop(SlurmView(), loaded, "n1")
    assert view.observe_mode is False and (view.reboots_requested, view.reboot_escalated) == (1, False)
    f.set_nodes({"n1": ["IDLE", None]})
    f.boot.write_text("boot-2\n")
    assert healthcheck.main() == 1
    assert with_loop(SlurmView(), loaded, "n1").reboot_escalated is True


def test_after_the_reboot_the_cached_view_is_not_taken_for_our_drain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slurm resumes the node itself after the boot (nextstate=RESUME). A view cached while it waited for
    the boot shows our drain; trusted for [slurm] reconcile_s, the node would take jobs with the fault."""
    f = Fake(tmp_path, monkeypatch, scenario="gpu-missing.toml", clean_runs=1)
    configure(f, reboot='"asap"', reboot_max=2)
    no_job(monkeypatch)
    assert healthcheck.main() == 1  # drained, reboot asked
    for _ in range(2):  # runs while the reboot is pending: the view (drained, ours) is cached
        assert healthcheck.main() in (0, 1)
    assert len(f.updates()) == 1
    f.set_nodes({"n1": ["IDLE", None]})  # booted; slurmd registered; Slurm resumed the node
    f.boot.write_text("boot-2\n")
    for _ in range(2):
        healthcheck.main()
    assert len(f.updates()) == 2 and f.nodes()["n1"][0] == "IDLE+DRAIN"
    assert len([c for c in f.calls() if c[0] == "reboot"]) == 2
