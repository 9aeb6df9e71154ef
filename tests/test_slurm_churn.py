"""Slurm under churn: flap damping, a fresh read before every resume, strays held while they live,
orphan drains said, quiet logs and the health check's exit code (a fake scontrol, real faces)."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Optional, Union

import pytest
from helpers_act import healthcheck_actor
from test_slurm_faces import Fake

from nodehealth.cli import main as cli_main
from nodehealth.config.loader import load
from nodehealth.faces import epilog, healthcheck, prolog
from nodehealth.model import Action, CheckResult, Report, Status
from nodehealth.observations import ProbeError
from nodehealth.slurm import act, policy
from nodehealth.slurm.client import UpdateOutcome
from nodehealth.slurm.nodes import NodeInfo, parse_reason, parse_state
from nodehealth.statedir import slurmstate


def flap_config(f: Fake, drains: int = 3, window_s: float = 3600) -> None:
    """The Fake's config ends in its [resume] section: add the damping keys there."""
    cfg = f.d / "nh.toml"
    cfg.write_text(cfg.read_text() + f"flap_drains = {drains}\nflap_window_s = {window_s}\n")


def no_job(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("SLURM_JOB_ID", "SLURM_JOB_GPUS"):
        monkeypatch.delenv(var)


def write_state(f: Fake, state: dict[str, Any]) -> None:
    path = Path(slurmstate.path(load().paths))
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.write_text(json.dumps(state))
    path.chmod(0o600)


# ----------------------------------------------------------------------------- 1. flap damping


def test_the_third_drain_in_the_window_is_held_for_a_person(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fault that comes and goes: drain 1 resumes after 1 clean run, drain 2 after 2 (backoff),
    drain 3 is held: reason nh:flap, never resumed however many clean runs follow."""
    f = Fake(tmp_path, monkeypatch, scenario="remap-pending.toml", clean_runs=1)
    flap_config(f)
    no_job(monkeypatch)

    def fault() -> None:
        f.use("remap-pending.toml")
        assert healthcheck.main() == 1
        assert f.nodes()["n1"][0] == "IDLE+DRAIN"

    fault()
    f.use("healthy.toml")
    assert healthcheck.main() == 0
    assert f.nodes()["n1"] == ["IDLE", None]  # drain 1: clean_runs x 1
    fault()
    assert f.state()["drain"]["drains"] == 2
    f.use("healthy.toml")
    assert healthcheck.main() == 0
    assert f.nodes()["n1"][0] == "IDLE+DRAIN"  # drain 2 needs 2 clean runs
    assert healthcheck.main() == 0
    assert f.nodes()["n1"] == ["IDLE", None]
    fault()
    reason = f.nodes()["n1"][1]
    assert reason.startswith("nh:flap GPU1 gpu_remapped_rows: flapping: 3 drains in 1 h, resume by hand"), reason
    assert f.state()["drain"]["flapping"] is True
    f.use("healthy.toml")
    for _ in range(6):
        assert healthcheck.main() == 0
    assert f.nodes()["n1"] == ["IDLE+DRAIN", reason]
    assert len(f.updates()) == 5  # 3 drains, 2 resumes: the held drain is never resumed


def test_a_person_resuming_a_held_drain_restarts_its_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = Fake(tmp_path, monkeypatch, scenario="remap-pending.toml", clean_runs=1)
    flap_config(f, drains=2)
    no_job(monkeypatch)
    assert healthcheck.main() == 1
    f.use("healthy.toml")
    assert healthcheck.main() == 0
    f.use("remap-pending.toml")
    assert healthcheck.main() == 1
    assert f.nodes()["n1"][1].startswith("nh:flap ")
    f.set_nodes({"n1": ["IDLE", None]})  # a person replaced the part and resumed the node
    state = f.state()
    state["slurm_node"]["time"] = 0  # the next health check reads the node again
    write_state(f, state)
    f.use("healthy.toml")
    assert healthcheck.main() == 0
    assert f.state()["drain"] is None and f.state()["history"] == []
    f.use("remap-pending.toml")
    assert healthcheck.main() == 1
    assert f.nodes()["n1"][1].startswith("nh:rowremap GPU1 ")  # drain 1 of a new count, not held


def test_drain_history_survives_a_new_process_and_stays_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The history is in the state file (faces and daemon share it); a file with garbage, NaN,
    future and too many entries is read back bounded, the rest of the state kept."""
    f = Fake(tmp_path, monkeypatch, scenario="remap-pending.toml", clean_runs=1)
    flap_config(f)
    no_job(monkeypatch)
    now = time.time()
    junk: list[Any] = [
        {"check": "gpu_remapped_rows", "time": now - 60},
        {"check": "gpu_remapped_rows", "time": now - 30},
        {"check": "x", "time": "soon"},
        {"check": 7, "time": now},
        "text",
        None,
        {"check": "y" * 500, "time": now},
        {"check": "gpu_ecc", "time": -1},
    ]
    write_state(f, {"version": 1, "history": [{"check": "old", "time": 1000.0 + i} for i in range(300)] + junk})
    st = slurmstate.load(load().paths)
    assert len(st.history) == slurmstate.MAX_HISTORY
    assert all(e.check in ("old", "gpu_remapped_rows") and math.isfinite(e.time) and e.time > 0 for e in st.history)
    assert healthcheck.main() == 1  # two drains of this check in the window already: this one is held
    assert f.nodes()["n1"][1].startswith("nh:flap GPU1 gpu_remapped_rows: flapping: 3 drains in 1 h")
    kept = f.state()["history"]
    assert [e["check"] for e in kept] == ["gpu_remapped_rows"] * 3  # old entries out of the window dropped
    nan = slurmstate.State.from_json(
        {
            "version": 1,
            "history": [
                {"check": "x", "time": math.nan},
                {"check": "x", "time": math.inf},
                {"check": "x", "time": 5.0},
            ],
        }
    )
    assert nan.history == (slurmstate.DrainEvent("x", 5.0),)
    bad = {"version": 1, "drain": {"reason": "r", "drains": 10**12, "flapping": "yes", "gpus": [1, -1, True, "2", 3]}}
    rec = slurmstate.State.from_json(bad).drain
    assert rec is not None and rec.drains == 1 and rec.flapping is False and rec.gpus == (1, 3)
    many = slurmstate.State.from_json({"version": 1, "drain": {"reason": "r", "drains": 40, "flapping": True}}).drain
    assert many is not None and many.drains == slurmstate.MAX_HISTORY and many.flapping is True


def test_backoff_is_capped() -> None:
    assert [policy.clean_runs_needed(3, n, 48) for n in (1, 2, 3, 4, 5, 6, 40)] == [3, 6, 12, 24, 48, 48, 48]
    assert policy.clean_runs_needed(5, 1, 2) == 5  # never fewer than clean_runs


# ----------------------------------------------------------------------------- 2. fresh read before resume


class Recording:
    """A ``SlurmClient`` over an in-memory cluster that records every call."""

    def __init__(self, nodes: dict[str, tuple[str, Optional[str]]]) -> None:
        self.nodes = dict(nodes)
        self.log: list[tuple[str, ...]] = []
        self.calls = 0

    def show(self, node: Optional[str]) -> Union[list[NodeInfo], ProbeError]:
        self.calls += 1
        self.log.append(("show", node or "*"))
        return [
            NodeInfo(
                name=n,
                state=parse_state(s),
                gres_gpus=8,
                reason=parse_reason(f"{r} [root@2026-12-01T10:00:00]" if r else None),
            )
            for n, (s, r) in self.nodes.items()
            if node in (None, n)
        ]

    def update(self, node: str, state: str, reason: Optional[str] = None) -> UpdateOutcome:
        self.calls += 1
        self.log.append(("update", node, state))
        base = self.nodes[node][0].split("+")[0]
        self.nodes[node] = (base + "+DRAIN", reason) if state == "drain" else (base, None)
        return UpdateOutcome(True, "ok")

    def reboot(self, node: str, reason: str) -> UpdateOutcome:
        self.calls += 1
        self.log.append(("reboot", node))
        return UpdateOutcome(True, "ok")


def _report(status: Status) -> Report:
    r = CheckResult(
        "gpu_ecc",
        status,
        "GPU 6: 2 uncorrectable ECC errors" if status == Status.FAIL else "ok",
        action=Action.RESET_GPU if status == Status.FAIL else Action.NONE,
        gpu=6,
    )
    return Report(node="n1", phase="healthcheck", results=(r,), duration_s=0.1, version="t", started_at=time.time())


def test_an_admin_edit_inside_the_cache_window_is_never_resumed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Drained by us; the cached view is seconds old when a person edits the reason; the resume
    falls due: the sequence reads the node first and leaves the edit alone."""
    Fake(tmp_path, monkeypatch, clean_runs=1)
    cfg = load()
    client = Recording({"n1": ("IDLE", None), "n2": ("IDLE", None)})
    actor = healthcheck_actor(cfg, client, lambda *a, **k: None)
    assert act.after_check(actor, _report(Status.FAIL)).outcome == act.ActOutcome.DRAINED
    ours = client.nodes["n1"][1]
    assert ours is not None
    act.read_me(actor)  # the view is cached now: fresh for a minute
    cached = NodeInfo.from_json(slurmstate.load(cfg.paths).slurm_node)
    assert cached is not None and cached.fresh(time.time(), 60.0)
    client.nodes["n1"] = ("IDLE+DRAIN", ours + " -- investigating DO NOT RESUME")
    got = act.after_check(actor, _report(Status.OK))
    assert got.outcome == act.ActOutcome.NONE
    assert client.nodes["n1"] == ("IDLE+DRAIN", ours + " -- investigating DO NOT RESUME")
    assert ("update", "n1", "resume") not in client.log
    assert client.log[-1] == ("show", "n1")  # the read made right before the resume would have been
    st = slurmstate.load(cfg.paths)
    assert st.drain is None and st.disowned is not None and "DO NOT RESUME" in st.disowned


def test_a_resume_is_made_on_a_read_just_before_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same with the real health check face and the fake scontrol."""
    f = Fake(tmp_path, monkeypatch, scenario="remap-pending.toml", clean_runs=2)
    no_job(monkeypatch)
    assert healthcheck.main() == 1
    f.use("healthy.toml")
    assert healthcheck.main() == 0  # clean run 1: reads the node (the drain made the cache stale)
    assert f.state()["slurm_node"]["time"] > time.time() - 60  # a fresh view is cached
    ours = f.nodes()["n1"][1]
    f.set_nodes({"n1": ["IDLE+DRAIN", ours + " -- investigating DO NOT RESUME"]})
    assert healthcheck.main() == 0
    assert f.nodes()["n1"] == ["IDLE+DRAIN", ours + " -- investigating DO NOT RESUME"]
    assert [c for c in f.updates() if "state=resume" in c] == []
    for _ in range(3):
        assert healthcheck.main() == 0
    assert f.nodes()["n1"][1].endswith("DO NOT RESUME") and f.state()["drain"] is None


# ----------------------------------------------------------------------------- 3. strays


def test_a_stray_drain_lasts_while_nvml_lists_the_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The job ended leaving pid 4242 on GPU 0, still in the job's cgroup: the epilog drains "left
    by job 7"; the health check must not resume while NVML lists the process, whatever the cgroup
    says, and resumes once it is gone."""
    f = Fake(tmp_path, monkeypatch, clean_runs=1)
    assert prolog.main() == 0
    f.use("stray-process.toml")
    assert epilog.main() == 1
    st = f.state()["drain"]
    assert st["check"] == "gpu_processes" and st["gpus"] == [0] and "left by job 7" in st["reason"]
    cgroup = f.d / "proc" / "4242" / "cgroup"  # under [paths] procfs_root: the node_jobs probe reads it
    cgroup.parent.mkdir(parents=True)
    cgroup.write_text("0::/system.slice/slurmstepd.scope/job_7/step_0/user/task_0\n")
    no_job(monkeypatch)
    for _ in range(4):
        assert healthcheck.main() == 0  # the process belongs to a job's cgroup: no fault of its own ...
        assert f.nodes()["n1"][0] == "IDLE+DRAIN"  # ... but it lives: the drain stays
    assert f.state()["clean_runs"] == 0
    f.use("healthy.toml")  # the process is gone
    assert healthcheck.main() == 0
    assert f.nodes()["n1"] == ["IDLE", None]


def test_processes_gone_needs_the_gpus_read() -> None:
    def res(**details: Any) -> Report:
        r = CheckResult("gpu_processes", Status.OK, "8 GPU(s) checked", details=details)
        return Report(node="n1", phase="healthcheck", results=(r,), duration_s=0, version="t", started_at=0)

    assert policy.processes_gone(res(gpus_judged=[0, 1], processes={"0": [42]}), (0,)) is False
    assert policy.processes_gone(res(gpus_judged=[0, 1], processes={"1": [42]}), (0,)) is True
    assert policy.processes_gone(res(gpus_judged=[1]), (0,)) is None  # GPU 0 not read: no evidence
    assert policy.processes_gone(res(gpus_judged=[0, 1], judged=False), (0,)) is True  # no ledger: NVML says
    assert policy.processes_gone(res(gpus_judged=[0], processes={"0": [1]}), ()) is False


# ----------------------------------------------------------------------------- 4. orphans


def test_a_wiped_state_dir_gives_one_orphan_line_and_status_says_how_to_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from nodehealth.daemon.hooks import slurm_view

    f = Fake(tmp_path, monkeypatch, scenario="remap-pending.toml", clean_runs=1)
    no_job(monkeypatch)
    assert healthcheck.main() == 1
    ours = f.nodes()["n1"][1]
    Path(slurmstate.path(load().paths)).unlink()  # the state dir lost (a tmpfs one after the reboot)
    f.use("healthy.toml")
    capsys.readouterr()
    assert healthcheck.main() == 0
    err = capsys.readouterr().err
    assert err.count("no record of ours") == 1 and "scontrol update nodename=n1 state=resume" in err, err
    for _ in range(3):
        assert healthcheck.main() == 0
    assert "no record of ours" not in capsys.readouterr().err  # said once
    assert f.nodes()["n1"] == ["IDLE+DRAIN", ours]  # never resumed
    code = cli_main(["status"])
    out = capsys.readouterr().out
    (line,) = [x for x in out.splitlines() if "ORPHAN" in x]
    assert "scontrol update nodename=n1 state=resume" in line and code == 1
    view = slurm_view(act.Acted(act.ActOutcome.NONE), load().paths)
    assert view.orphan_drain is True and view.flapping is False
    # A person resumes it: the next reconciliation forgets the orphan.
    f.set_nodes({"n1": ["IDLE", None]})
    state = f.state()
    state["slurm_node"]["time"] = 0
    write_state(f, state)
    assert healthcheck.main() == 0
    assert f.state()["orphan"] is None


def test_a_faulty_orphan_is_left_alone_and_said_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    orphan = "nh:ecc GPU3 gpu_ecc: x"
    f = Fake(tmp_path, monkeypatch, scenario="remap-pending.toml", nodes={"n1": ["IDLE+DRAIN", orphan]})
    no_job(monkeypatch)
    capsys.readouterr()
    for _ in range(3):
        assert healthcheck.main() == 1
    err = capsys.readouterr().err
    assert err.count("no record of ours") == 1, err
    assert f.updates() == [] and f.nodes()["n1"] == ["IDLE+DRAIN", orphan]
    shows = [c for c in f.calls() if c[0] == "show"]
    assert len(shows) == 1  # the probe's one read; the fresh view saves the cluster read after


# ----------------------------------------------------------------------------- 5. quiet


def test_a_drained_faulty_node_logs_one_line_per_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    f = Fake(tmp_path, monkeypatch, scenario="remap-pending.toml")
    no_job(monkeypatch)
    assert healthcheck.main() == 1  # the drain: said, exit 1
    capsys.readouterr()
    for _ in range(5):
        assert healthcheck.main() == 0  # already drained by us for this fault: Slurm ignores the status
    quiet = capsys.readouterr().err.splitlines()
    assert len([x for x in quiet if x.startswith("nodehealth-healthcheck: FAIL gpu_remapped_rows")]) == 0, quiet
    assert len(quiet) <= 1, quiet  # at most the sequence's one "already drained" line
    f.use("gpu-missing.toml")  # the finding changes: said again
    healthcheck.main()
    changed = capsys.readouterr().err
    assert "FAIL gpu_count" in changed and "OK gpu_remapped_rows: cleared" in changed
    assert len(f.updates()) == 2  # a more severe fault (reboot) replaces the reason


def test_changed_lines() -> None:
    before = {"gpu_ecc": "FAIL gpu_ecc: GPU 1: 2", "gpu_temperature": "WARN gpu_temperature: hot"}
    now = {"gpu_ecc": "FAIL gpu_ecc: GPU 1: 3", "gpu_nvlink": "FAIL gpu_nvlink: down"}
    assert policy.changed_lines(before, now) == [
        "FAIL gpu_ecc: GPU 1: 3",
        "FAIL gpu_nvlink: down",
        "OK gpu_temperature: cleared (was: WARN gpu_temperature: hot)",
    ]
    assert policy.changed_lines(now, now) == []
    long = {"c": "FAIL c: " + "x" * 2000}
    assert policy.changed_lines({"c": long["c"][: slurmstate.MAX_LOGGED_CHARS]}, long) == []


def test_state_logged_memory_is_bounded() -> None:
    raw = {
        "version": 1,
        "logged": {"healthcheck": {f"c{i}": "y" * 5000 for i in range(500)}, "": {}, "x": 5, "daemon": {"a": 3}},
    }
    logged = slurmstate.State.from_json(raw).logged
    assert logged is not None and set(logged) == {"healthcheck", "daemon"}
    assert len(logged["healthcheck"]) == slurmstate.MAX_LOGGED and logged["daemon"] == {}
    assert all(len(v) == slurmstate.MAX_LOGGED_CHARS for v in logged["healthcheck"].values())


def test_the_daemon_says_a_finding_once_per_change(tmp_path: Path) -> None:
    import io

    from test_daemon_util import SCENARIOS, free_port, write_config

    from nodehealth.daemon.core import Daemon
    from nodehealth.daemon.logs import Log
    from nodehealth.probes import source

    cfgp = write_config(tmp_path, "row-remap-pending", free_port())
    node = tmp_path / "node.toml"
    node.write_text((SCENARIOS / "row-remap-pending.toml").read_text())
    cfgp.write_text(cfgp.read_text().replace(str(SCENARIOS / "row-remap-pending.toml"), str(node)))
    source.forget()
    d = Daemon(load(str(cfgp)), None, log=Log(stream=io.StringIO()), notify=lambda s: True, use_default_hooks=False)
    for _ in range(3):
        d.round()
    text = d.log.stream.getvalue()
    assert text.count("FAIL gpu_remapped_rows:") == 1, text
    node.write_text((SCENARIOS / "healthy-8x-h100.toml").read_text())
    source.forget()
    d.round()
    d.round()
    text = d.log.stream.getvalue()
    assert text.count("OK gpu_remapped_rows: cleared") == 1 and text.count("err: FAIL gpu_remapped_rows:") == 1, text


# ----------------------------------------------------------------------------- 4. a resume by hand, then a new fault


@pytest.mark.parametrize("cached", [False, True], ids=["no-view", "view-cached-before-the-resume"])
def test_a_fault_after_clean_runs_reads_the_node_back_and_drains_a_node_resumed_by_hand(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cached: bool
) -> None:
    """Drained by us; the fault clears (a clean run) and a person resumes the node by hand while our
    record stays; the fault comes back: the record is read back, not trusted, and the node drained
    again (trusted, it said "already drained" and the node took jobs with the fault). A view of the
    node cached seconds before the resume is not this run's read either."""
    Fake(tmp_path, monkeypatch, clean_runs=3)
    cfg = load()
    client = Recording({"n1": ("IDLE", None), "n2": ("IDLE", None)})
    actor = healthcheck_actor(cfg, client, lambda *a, **k: None)
    assert act.after_check(actor, _report(Status.FAIL)).outcome == act.ActOutcome.DRAINED
    if cached:
        act.read_me(actor)  # fresh for a minute: shows our drain
    assert act.after_check(actor, _report(Status.OK)).outcome == act.ActOutcome.NONE  # clean run 1 of 3
    client.nodes["n1"] = ("IDLE", None)  # scontrol update nodename=n1 state=resume
    assert slurmstate.load(cfg.paths).drain is not None  # our record stays
    got = act.after_check(actor, _report(Status.FAIL))
    assert got.outcome == act.ActOutcome.DRAINED, client.log
    assert client.nodes["n1"][0] == "IDLE+DRAIN" and client.log[-1] == ("update", "n1", "drain")


def test_the_follower_reads_back_too_after_a_clean_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``on_fault`` called on its own (the XID follower, the prolog, the epilog) takes the count it loads."""
    Fake(tmp_path, monkeypatch, clean_runs=3)
    cfg = load()
    client = Recording({"n1": ("IDLE", None), "n2": ("IDLE", None)})
    actor = healthcheck_actor(cfg, client, lambda *a, **k: None)
    assert act.on_fault(actor, _report(Status.FAIL)).outcome == act.ActOutcome.DRAINED
    act.after_check(actor, _report(Status.OK))
    client.nodes["n1"] = ("IDLE", None)
    assert act.on_fault(actor, _report(Status.FAIL)).outcome == act.ActOutcome.DRAINED
    assert client.nodes["n1"][0] == "IDLE+DRAIN"


def test_a_fault_that_held_since_the_drain_costs_no_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The other side of the rule: a drained node whose fault never cleared makes no Slurm call per run,
    and one read after a clean run that finds our drain still there trusts the record again."""
    Fake(tmp_path, monkeypatch, clean_runs=3)
    cfg = load()
    client = Recording({"n1": ("IDLE", None), "n2": ("IDLE", None)})
    actor = healthcheck_actor(cfg, client, lambda *a, **k: None)
    assert act.after_check(actor, _report(Status.FAIL)).outcome == act.ActOutcome.DRAINED
    act.read_me(actor)
    monkeypatch.setattr(time, "time", lambda real=time.time: real() + 120)  # the cached view is stale
    calls = client.calls
    for _ in range(3):
        assert act.after_check(actor, _report(Status.FAIL)).outcome == act.ActOutcome.ALREADY
    assert client.calls == calls
    act.after_check(actor, _report(Status.OK))
    assert act.after_check(actor, _report(Status.FAIL)).outcome == act.ActOutcome.ALREADY  # read: still ours
    assert client.calls == calls + 1 and client.log[-1] == ("show", "*")
    assert act.after_check(actor, _report(Status.FAIL)).outcome == act.ActOutcome.ALREADY
    assert client.calls == calls + 1


class NotAnswering(Recording):
    """slurmctld does not answer reads (an overloaded or stopped controller); updates still go through."""

    def show(self, node: Optional[str]) -> Union[list[NodeInfo], ProbeError]:
        self.calls += 1
        self.log.append(("show", node or "*"))
        return ProbeError("slurmctl", "timeout", "scontrol: Socket timed out on send/recv operation")


def test_a_healthy_nodes_reconciliation_backs_off_while_slurmctld_does_not_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rounds of a healthy node with no fresh view: one read, not one a round; a fault still acts."""
    Fake(tmp_path, monkeypatch)
    cfg = load()
    client = NotAnswering({"n1": ("IDLE", None)})
    actor = healthcheck_actor(cfg, client, lambda *a, **k: None)
    for _ in range(4):
        assert act.after_check(actor, _report(Status.OK)).outcome == act.ActOutcome.NONE
    assert client.log == [("show", "n1")]
    calls = client.calls
    act.after_check(actor, _report(Status.FAIL))  # a fault is never held back by the back-off
    assert client.calls > calls
