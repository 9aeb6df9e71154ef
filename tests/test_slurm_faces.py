"""The Slurm faces against a fake ``scontrol`` (no Slurm needed): calls made, exit codes, state."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import Timing
from helpers_scontrol import FAKE_SCONTROL, write_fake_scontrol

from nodehealth.faces import epilog, healthcheck, prolog
from nodehealth.probes import source
from nodehealth.registry import CHECKS

SCEN = Path(__file__).parent / "fixtures" / "slurm"

FAKE = FAKE_SCONTROL  # the name other tests import it by


class Fake:
    def __init__(
        self,
        tmp: Path,
        monkeypatch: pytest.MonkeyPatch,
        scenario: str = "healthy.toml",
        nodes: dict[str, Any] | None = None,
        clean_runs: int = 2,
    ) -> None:
        self.d = tmp
        self.scontrol = write_fake_scontrol(tmp)
        self.set_nodes(nodes or {"n1": ["IDLE", None]})
        self.boot = tmp / "proc" / "sys" / "kernel" / "random" / "boot_id"  # under [paths] procfs_root
        self.boot.parent.mkdir(parents=True)
        self.boot.write_text("boot-1\n")
        self.scenario = tmp / "scenario.toml"
        self.use(scenario)
        cfg = tmp / "nh.toml"
        cfg.write_text(
            f'node_name = "n1"\n[nvml]\nsimulate = "{self.scenario}"\n[paths]\nstate_dir = "{tmp}/state"\n'
            f'procfs_root = "{tmp}/proc"\n[slurm]\nscontrol = "{self.scontrol}"\ntimeout_s = 5\n'
            f"[resume]\nclean_runs = {clean_runs}\n"
        )
        for var in ("SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES", "SLURM_CONF"):
            monkeypatch.delenv(var, raising=False)
        monkeypatch.setenv("NODEHEALTH_CONFIG", str(cfg))
        monkeypatch.setenv("SLURMD_NODENAME", "n1")
        monkeypatch.setenv("SLURM_JOB_ID", "7")
        monkeypatch.setenv("SLURM_JOB_GPUS", "0,1")

    def use(self, scenario: str) -> None:
        """Switch the simulated node (each real face is a new process; here the parse cache must go)."""
        self.scenario.write_text((SCEN / scenario).read_text())
        source.forget()

    def set_nodes(self, nodes: dict[str, Any]) -> None:
        (self.d / "nodes.json").write_text(json.dumps(nodes))

    def nodes(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.d / "nodes.json").read_text())
        return data

    def calls(self) -> list[list[str]]:
        p = self.d / "calls.jsonl"
        return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []

    def updates(self) -> list[list[str]]:
        return [c for c in self.calls() if c[0] == "update"]

    def state(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.d / "state" / "slurm-state.json").read_text())
        return data


def job_fake(tmp: Path, monkeypatch: pytest.MonkeyPatch, scenario: str = "healthy.toml") -> Fake:
    """A ``Fake`` node running job 42 on GPUs 0 and 1 (the job's environment as Slurm sets it)."""
    f = Fake(tmp, monkeypatch, scenario)
    monkeypatch.setenv("SLURM_JOB_GPUS", "0,1")
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    return f


def test_healthy_prolog_makes_no_slurm_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = Fake(tmp_path, monkeypatch)
    assert prolog.main() == 0
    assert epilog.main() == 0
    assert f.calls() == []
    ledger = [json.loads(x) for x in (tmp_path / "state" / "jobs.jsonl").read_text().splitlines()]
    assert [r["event"] for r in ledger] == ["start", "end"] and ledger[0]["gpus"] == [0, 1]


def test_faulty_prolog_drains_with_one_reason_argument(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = Fake(tmp_path, monkeypatch, scenario="remap-pending.toml")
    assert prolog.main() == 1
    (upd,) = f.updates()
    assert upd[:3] == ["update", "nodename=n1", "state=drain"]
    assert upd[3].startswith("reason=nh:rowremap GPU1 gpu_remapped_rows: GPU 1: row remap pending")
    assert f.nodes()["n1"][0] == "IDLE+DRAIN"
    st = f.state()
    assert st["drain"]["check"] == "gpu_remapped_rows" and st["drain"]["job_id"] == "7"
    assert st["drain"]["boot_id"] == "boot-1"
    # The epilog of the same job sees the same fault: no second update, first record kept.
    assert epilog.main() == 1
    assert len(f.updates()) == 1 and f.state()["drain"]["phase"] == "prolog"


def test_admin_drain_is_left_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = Fake(tmp_path, monkeypatch, scenario="remap-pending.toml", nodes={"n1": ["MIXED+DRAIN", "admin: PSU"]})
    assert prolog.main() == 1
    assert f.updates() == []
    f.use("healthy.toml")
    for _ in range(4):
        assert healthcheck.main() == 0
    assert f.updates() == [] and f.nodes()["n1"] == ["MIXED+DRAIN", "admin: PSU"]


def test_breaker_holds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nodes = {f"g{i}": ["IDLE+DRAIN", "nodehealth: gpu_count: 7 of 8"] for i in range(5)}
    nodes["n1"] = ["IDLE", None]
    f = Fake(tmp_path, monkeypatch, scenario="remap-pending.toml", nodes=nodes)
    assert prolog.main() == 0  # held: the job runs
    assert f.updates() == []
    held = f.state()["breaker_held"]
    assert held["ours"] == 5 and held["total"] == 6


def test_healthcheck_drains_then_resumes_after_clean_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = Fake(tmp_path, monkeypatch, scenario="remap-pending.toml", clean_runs=2)
    for var in ("SLURM_JOB_ID", "SLURM_JOB_GPUS"):
        monkeypatch.delenv(var)
    assert healthcheck.main() == 1
    assert f.nodes()["n1"][0] == "IDLE+DRAIN"
    assert f.state()["slurm_node"]["gres_gpus"] == 8  # cached for the prolog
    f.use("healthy.toml")
    assert healthcheck.main() == 0
    assert f.nodes()["n1"][0] == "IDLE+DRAIN"  # one clean run is not enough
    assert healthcheck.main() == 0
    assert f.nodes()["n1"] == ["IDLE", None]
    assert f.state()["drain"] is None
    shows = [c for c in f.calls() if c[0] == "show"]
    one, everyone = ["show", "node", "-o", "n1"], ["show", "node", "-o"]
    # One node per run, all nodes only before a drain; the resume is made on a read just before it
    # (the third run), never on the view the second run cached, and read back after it.
    assert shows == [one, everyone, one, one, one]


def test_reboot_class_fault_needs_new_boot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = Fake(tmp_path, monkeypatch, scenario="gpu-missing.toml", clean_runs=1)
    monkeypatch.delenv("SLURM_JOB_ID")
    assert healthcheck.main() == 1
    assert f.state()["drain"]["action"] == "reboot"
    f.use("healthy.toml")
    assert healthcheck.main() == 0 and healthcheck.main() == 0
    assert f.nodes()["n1"][0] == "IDLE+DRAIN"
    f.boot.write_text("boot-2\n")
    assert healthcheck.main() == 0
    assert f.nodes()["n1"] == ["IDLE", None]


def test_config_error_never_drains(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(f'[paths]\nstate_dir = "{tmp_path / "state"}"\n[drain]\nmax_share = 7\n')
    monkeypatch.setenv("NODEHEALTH_CONFIG", str(bad))
    assert prolog.main() == 0
    err = capsys.readouterr().err
    assert "configuration error" in err and "checking with the built-in defaults" in err, err
    # Every record file looked for is named in one clause, not the same words once for each.
    assert err.count("no configuration has validated on this node") == 1 and "(neither " in err, err


def test_unreachable_slurmctld_still_exits_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = Fake(tmp_path, monkeypatch, scenario="remap-pending.toml")
    f.scontrol.write_text("#!/bin/sh\nexit 1\n")
    assert prolog.main() == 1
    assert f.state()["drain"] is None and f.state()["clean_runs"] == 0


HUNG_SCONTROL = "#!/bin/sh\nexec sleep 600\n"  # slurmctld down: scontrol waits for its MessageTimeout and more
FACE_RUN = """
import json, sys, time
from nodehealth.platform.deadline import process_age_s
from nodehealth.faces import {face}
rc = {face}.main()
print(json.dumps({{"rc": rc, "age_s": process_age_s()}}))
"""


HUNG_NVML = Path(__file__).parent.parent / "examples" / "scenarios" / "hung-nvml-init.toml"


@pytest.mark.timing
@pytest.mark.parametrize(
    "face,budget,scenario",
    [
        ("prolog", 2.0, "remap-pending.toml"),
        ("healthcheck", 2.0, "remap-pending.toml"),
        # NVML hangs until its deadline: the checks take nearly all of the budget, and the drain call
        # that follows may have only what is left (no minimum call time that outlives the budget).
        ("prolog", 1.5, HUNG_NVML),
    ],
    ids=["prolog", "healthcheck", "prolog-nvml-hung"],
)
def test_face_with_slurmctld_hung_returns_within_its_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, face: str, budget: float, scenario: Any, timing: Timing
) -> None:
    """The deadline starts at process start and covers config load, the checks and every Slurm call."""
    f = Fake(tmp_path, monkeypatch, scenario="remap-pending.toml")
    if isinstance(scenario, Path):
        f.scenario.write_text(scenario.read_text())
    else:
        f.use(scenario)
    f.scontrol.write_text(HUNG_SCONTROL)
    cfg = Path(os.environ["NODEHEALTH_CONFIG"])
    # A hung nvmlInit inside a 1.5 s budget cannot be told from a slow one (docs/nvml.md): it is
    # UNKNOWN, which this site counts as a fault, so the face tries to drain against a hung scontrol.
    policy = '[policy]\nunknown = "fail"\n' if scenario is HUNG_NVML else ""
    cfg.write_text(
        cfg.read_text()
        + policy
        + f"[phases.{face}]\nbudget_s = {budget}\n"
        + "".join(f"[checks.{c.name}]\ntimeout_s = {budget}\n" for c in CHECKS)
    )
    out = subprocess.run(
        [sys.executable, "-c", FACE_RUN.format(face=face)],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ),
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["rc"] == 1, out.stderr  # a fault: exit 1 even though the drain reason could not be set
    # Measured by the face process's own clock (its age when it was done), so a loaded machine's
    # slow interpreter start counts against the budget as slurmd would count it, not against the test.
    # The margin is the face's own way out after its deadline (ending scontrol's group, the exit).
    assert got["age_s"] <= budget + timing.slack(0.1), (got, out.stderr)
    assert "did not answer" in out.stderr or "no time left" in out.stderr, out.stderr


@pytest.mark.parametrize("scenario,unreachable_counted", [("healthy.toml", False), ("remap-pending.toml", True)])
def test_daemon_and_health_check_share_one_flow_with_slurmctld_down(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scenario: str, unreachable_counted: bool
) -> None:
    """With slurmctld down, a healthy round is no Slurm action (it was counted as "unreachable" every
    round); a fault that cannot be drained is."""
    from nodehealth import runner
    from nodehealth.config.loader import load
    from nodehealth.daemon.hooks import ActSlurm
    from nodehealth.slurm.act import ActOutcome

    f = Fake(tmp_path, monkeypatch, scenario=scenario)
    f.scontrol.write_text("#!/bin/sh\necho 'slurm_load_node: Unable to contact slurm controller' >&2\nexit 1\n")
    cfg = load()
    report = runner.execute(cfg, phase="daemon", node="n1").report
    lines: list[str] = []
    view = ActSlurm(lambda msg, *a, **k: lines.append(msg)).after_round(cfg, report, "n1", "boot-1")
    assert view is not None
    assert (view.last_action == ActOutcome.UNREACHABLE.value) is unreachable_counted, (view, lines)
    assert f.state()["clean_runs"] == (1 if not unreachable_counted else 0)
    # The health check takes the same path and says the same.
    rc = healthcheck.main()
    assert rc == (1 if unreachable_counted else 0)
    assert f.state()["clean_runs"] == (2 if not unreachable_counted else 0)


def test_a_prolog_does_not_trust_a_drain_record_older_than_its_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A person resumed the node while its fault persists: the next prolog's job could only start
    because the drain was lifted, so the prolog drains again (with our reason, not Slurm's "Prolog
    error", which nodehealth would never resume) instead of trusting its old record."""
    f = Fake(tmp_path, monkeypatch, scenario="remap-pending.toml")
    monkeypatch.delenv("SLURM_JOB_ID")
    assert healthcheck.main() == 1
    ours = f.nodes()["n1"][1]
    assert ours.startswith("nh:rowremap GPU1 gpu_remapped_rows")
    f.set_nodes({"n1": ["IDLE", None]})  # scontrol update state=resume, by hand
    state = f.state()
    state["drain"]["time"] -= 3600  # drained an hour ago
    (f.d / "state" / "slurm-state.json").write_text(json.dumps(state))
    monkeypatch.setenv("SLURM_JOB_ID", "8")
    assert prolog.main() == 1
    assert f.nodes()["n1"] == ["IDLE+DRAIN", ours]
    # A record the daemon wrote a moment ago (the node drained while this job was being allocated)
    # is trusted: no call.
    calls = len(f.calls())
    monkeypatch.setenv("SLURM_JOB_ID", "9")
    assert prolog.main() == 1
    assert len(f.calls()) == calls
