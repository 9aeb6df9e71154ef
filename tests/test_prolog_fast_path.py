"""The prolog's fast path: a fresh daemon verdict decides without NVML; anything else runs the cold path.

Each prolog runs as its own process (as slurmd starts it), so what it imported and how long
it took are the real ones. The simulated NVML behind these nodes hangs in ``nvmlInit``: a
prolog that touched NVML would sit out its check deadline and report a FAIL.
"""

from __future__ import annotations

import json
import marshal
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

import pytest

from nodehealth.config import lean
from nodehealth.faces import fast
from nodehealth.statedir import verdict as daemon_state

SCEN = Path(__file__).parent / "fixtures" / "slurm"
HUNG = Path(__file__).parent.parent / "examples" / "scenarios" / "hung-nvml-init.toml"
HEAVY = (
    "pynvml",
    "psutil",
    "prometheus_client",
    "nodehealth.runner",
    "nodehealth.probes",
    "nodehealth.config.loader",
    "nodehealth.config.schema",
    "nodehealth.registry",
    "dataclasses",
    "hostlist",
    "nodehealth.slurm.policy",
    "nodehealth.slurm.act",
    "nodehealth.faces.common",
    "nodehealth.model",
)

RUN = """
import json, sys, time
t0 = time.perf_counter()
from nodehealth.faces import prolog
rc = prolog.main()
print(json.dumps({"rc": rc, "s": time.perf_counter() - t0, "modules": sorted(sys.modules)}))
"""


class Node:
    def __init__(self, d: Path) -> None:
        from test_slurm_faces import FAKE

        self.d = d
        self.state = d / "state"
        self.scontrol = d / "scontrol"
        self.scontrol.write_text(FAKE.format(python=sys.executable, d=str(d)))
        self.scontrol.chmod(0o755)
        (d / "nodes.json").write_text(json.dumps({"n1": ["IDLE", None]}))
        self.boot = d / "proc" / "sys" / "kernel" / "random" / "boot_id"  # under [paths] procfs_root
        self.boot.parent.mkdir(parents=True)
        self.boot.write_text("boot-1\n")
        self.scenario = d / "scenario.toml"
        self.scenario.write_text((SCEN / "healthy.toml").read_text())
        self.config = d / "nh.toml"
        self.write_config()

    def write_config(self, extra: str = "", validated: bool = True) -> None:
        """The node's config; ``validated``: recorded as this node's last good one, as the daemon does at start."""
        self.config.write_text(
            f'node_name = "n1"\n[phases.prolog]\nbudget_s = 12\n[nvml]\nsimulate = "{self.scenario}"\n'
            f'[paths]\nstate_dir = "{self.state}"\nprocfs_root = "{self.d / "proc"}"\n'
            f'[slurm]\nscontrol = "{self.scontrol}"\ntimeout_s = 5\n[checks.nvml]\ntimeout_s = 3\n' + extra
        )
        if validated:
            from nodehealth.config.loader import load_valid

            load_valid(str(self.config))

    def hang(self) -> None:
        self.scenario.write_text(HUNG.read_text())

    def daemon_report(self) -> dict[str, Any]:
        """A real daemon-phase report of the healthy simulated node."""
        from nodehealth import runner
        from nodehealth.config.loader import load
        from nodehealth.probes import source

        source.forget()
        report: dict[str, Any] = runner.run(load(str(self.config)), phase="daemon", node="n1").to_json()
        return report

    def write_state(
        self, report: dict[str, Any], age: float = 1.0, boot: str = "boot-1", follower: str = "alive"
    ) -> None:
        daemon_state.write(  # as the daemon writes it: the JSON, then its marshal form (the fast path's)
            str(self.state), daemon_state.encode(report, boot, time.time() - age, follower, interval_s=30, round=3)
        )

    def prolog(self, job: str = "7", gpus: Optional[str] = "0,1") -> tuple[dict[str, Any], str]:
        env = {
            "NODEHEALTH_CONFIG": str(self.config),
            lean.DEFAULT_ROOT_ENV: os.environ[lean.DEFAULT_ROOT_ENV],  # the run's sandbox, where the snapshot is
            "SLURMD_NODENAME": "n1",
            "SLURM_JOB_ID": job,
            "SLURM_JOB_USER": "alice",
            "SLURM_JOB_UID": "1000",
        }
        if gpus is not None:
            env["SLURM_JOB_GPUS"] = gpus
        res = subprocess.run([sys.executable, "-c", RUN], env=env, capture_output=True, text=True, timeout=60)
        assert res.stdout.strip(), res.stderr
        return json.loads(res.stdout.strip().splitlines()[-1]), res.stderr

    def nodes(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.d / "nodes.json").read_text())
        return data

    def ledger(self) -> list[dict[str, Any]]:
        p = self.state / "jobs.jsonl"
        return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


@pytest.fixture(scope="module")
def healthy_report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return Node(tmp_path_factory.mktemp("report")).daemon_report()


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


def with_check(report: dict[str, Any], name: str, **change: Any) -> dict[str, Any]:
    out = json.loads(json.dumps(report))
    for c in out["checks"]:
        if c["name"] == name:
            c.update(change)
    if any(c["status"] == "FAIL" for c in out["checks"]):
        out["status"] = "FAIL"
    return out


def test_fresh_verdict_decides_without_nvml_and_lean_imports(node: Node, healthy_report: dict[str, Any]) -> None:
    node.write_state(healthy_report)
    node.hang()  # NVML would now hang in nvmlInit: only a prolog that never touches it answers fast
    out, err = node.prolog()
    assert out["rc"] == 0, err
    assert out["s"] < 1.0, out["s"]
    assert "fast path" in err and "not taken" not in err, err
    loaded = set(out["modules"])
    assert not [m for m in HEAVY if m in loaded], [m for m in HEAVY if m in loaded]
    # The job ledger still gets the job's start.
    recs = node.ledger()
    assert [(r["event"], r["job_id"], r["gpus"]) for r in recs] == [("start", "7", [0, 1])]


def test_cold_path_with_a_hung_nvml_takes_its_deadline(node: Node, healthy_report: dict[str, Any]) -> None:
    """The contrast: without a fresh verdict the same node costs the NVML deadline and drains.

    A hung nvmlInit is told from a slow one by its lack of progress over ``[nvml] init_timeout_s``
    (30 s by default, so a bring-up without persistence mode is never called hung, docs/nvml.md);
    a site whose GPUs run with persistence mode lowers it so the prolog itself can tell."""
    node.config.write_text(node.config.read_text().replace("[nvml]\n", "[nvml]\ninit_timeout_s = 2.5\n", 1))
    from nodehealth.config.loader import load_valid

    load_valid(str(node.config))
    node.hang()
    out, err = node.prolog()
    assert out["rc"] == 1 and out["s"] >= 2.5, (out["rc"], out["s"], err)
    assert "fast path not taken: no daemon state" in err
    assert "nodehealth.runner" in out["modules"]


@pytest.mark.parametrize(
    "how, words",
    [
        ("stale", "s old (limit 90 s)"),
        ("other-boot", "from another boot"),
        ("follower-dead", "XID follower dead"),
        ("truncated", "corrupt or partial"),
        ("empty", "is empty"),
        ("garbage", "corrupt or partial"),
        ("missing-fields", "incomplete"),
        ("not-json-types", "corrupt or partial"),
        ("nan", "corrupt or partial"),
        ("json-only", "no daemon state"),
    ],
)
def test_unusable_verdict_runs_the_cold_path(node: Node, healthy_report: dict[str, Any], how: str, words: str) -> None:
    """The fast path reads the verdict's marshal form; each way it cannot be believed sends the prolog cold."""
    path = Path(daemon_state.path_in(str(node.state), "marshal"))
    if how == "stale":
        node.write_state(healthy_report, age=1000)
    elif how == "other-boot":
        node.write_state(healthy_report, boot="boot-0")
    elif how == "follower-dead":
        node.write_state(healthy_report, follower="dead")
    elif how == "json-only":  # a daemon of an earlier release writes the JSON alone
        node.write_state(healthy_report)
        path.unlink()
    else:
        node.write_state(healthy_report)
        data = path.read_bytes()
        raw = marshal.loads(data)
        path.write_bytes(
            {
                "truncated": data[: len(data) // 2],
                "empty": b"",
                "garbage": b"\x00\xff not marshal",
                "missing-fields": marshal.dumps({"v": 1, "kind": daemon_state.KIND}),
                "not-json-types": marshal.dumps(dict(raw, report=tuple(raw["report"].items()))),
                "nan": marshal.dumps(dict(raw, written_at=float("nan"))),
            }[how]
        )
    out, err = node.prolog()
    assert out["rc"] == 0, err  # healthy node: the cold path passes it
    assert "fast path not taken" in err and words in err, err
    assert "nodehealth.runner" in out["modules"]
    assert [r["event"] for r in node.ledger()] == ["start"]


def test_fault_in_the_fresh_verdict_drains_through_the_same_policy(node: Node, healthy_report: dict[str, Any]) -> None:
    bad = with_check(
        healthy_report,
        "gpu_remapped_rows",
        status="FAIL",
        action="reset_gpu",
        gpu=1,
        summary="GPU 1: row remap pending (GPU reset needed)",
    )
    node.write_state(bad)
    node.hang()
    out, err = node.prolog()
    assert out["rc"] == 1, err
    assert out["s"] < 3.0, out["s"]
    state, reason = node.nodes()["n1"]
    assert "DRAIN" in state
    assert reason == "nh:rowremap GPU1 gpu_remapped_rows: GPU 1: row remap pending (GPU reset needed)"
    assert not [m for m in ("pynvml", "psutil", "prometheus_client", "nodehealth.runner") if m in out["modules"]]
    slurm_state = json.loads((node.state / "slurm-state.json").read_text())
    assert slurm_state["drain"]["phase"] == "prolog" and slurm_state["drain"]["job_id"] == "7"
    assert [r["event"] for r in node.ledger()] == ["start"]


def test_process_fault_on_another_jobs_gpu_is_scoped_away(node: Node, healthy_report: dict[str, Any]) -> None:
    bad = with_check(
        healthy_report,
        "gpu_processes",
        status="FAIL",
        action="restart_app",
        gpu=4,
        summary="GPU 4: 1 compute process(es)",
        details={"gpus": {"4": "GPU 4: 1 compute process(es)"}},
    )
    node.write_state(bad)
    node.hang()
    out, err = node.prolog(gpus="0,1")
    assert out["rc"] == 0, err
    assert node.nodes()["n1"] == ["IDLE", None]


def test_daemon_saw_processes_on_this_jobs_gpu_checks_now(node: Node, healthy_report: dict[str, Any]) -> None:
    busy = with_check(
        healthy_report, "gpu_processes", details={"gpus_judged": list(range(8)), "processes": {"1": [4242]}}
    )
    node.write_state(busy)
    out, err = node.prolog(gpus="0,1")
    assert out["rc"] == 0 and "compute processes on GPU(s) 1 of this job" in err, err
    assert "nodehealth.runner" in out["modules"]
    out, err = node.prolog(job="8", gpus="2,3")  # another job's GPUs: fast path
    assert out["rc"] == 0 and "not taken" not in err, err


def test_fast_path_copies_the_latest_counters_as_the_job_baseline(node: Node, healthy_report: dict[str, Any]) -> None:
    out, err = node.prolog(job="6")  # cold: reads NVML, leaves the latest counters behind
    assert out["rc"] == 0, err
    node.write_state(healthy_report)
    out, err = node.prolog(job="7", gpus="2,3")
    assert out["rc"] == 0 and "not taken" not in err, err
    base = json.loads((node.state / "jobs" / "7.json").read_text())
    assert set(base["gpus"]) == {"2", "3"} and base["boot_id"] == "boot-1" and "fast path" in base["source"]


def test_settings_reader_defaults_overrides_and_bad_values(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        '[daemon]\nstate_max_age_s = 30\n[[override]]\nhosts = "n[1-3]"\npaths.state_dir = "/x"\n'
        'phases.prolog.budget_s = 4\n[[override]]\nhosts = "m1"\npaths.state_dir = "/y"\n'
        '[[override]]\nhosts = "n1"\ngpu.expected_count = 4\n[[override]]\nhosts = "n2"\n'
        "[override.slurm]\ntimeout_s = 1\n"
    )
    s, why = lean.read_settings({"NODEHEALTH_CONFIG": str(cfg), "SLURMD_NODENAME": "n2"})
    assert s is not None and s.state_dir == "/x" and s.max_age_s == 30.0 and s.unknown == "pass", why
    assert (s.prolog_budget_s, s.slurm_timeout_s, s.procfs_root) == (4.0, 1.0, "/proc")
    s, _ = lean.read_settings({"NODEHEALTH_CONFIG": str(cfg), "SLURMD_NODENAME": "q9"})
    assert s is not None and s.state_dir == lean.default("paths.state_dir")  # /run/nodehealth outside the suite
    assert (s.prolog_budget_s, s.slurm_timeout_s) == (20.0, 3.0)
    cfg.write_text("[daemon]\nstate_max_age_s = true\n")
    s, why = lean.read_settings({"NODEHEALTH_CONFIG": str(cfg)})
    assert s is None and "daemon.state_max_age_s" in why
    cfg.write_text("[phases.prolog]\nbudget_s = 0.5\n")  # below the loader's minimum: the cold path says so
    s, why = lean.read_settings({"NODEHEALTH_CONFIG": str(cfg)})
    assert s is None and "phases.prolog.budget_s has an unexpected value" in why
    cfg.write_text('[[override]]\nhosts = "n1"\npolicy.unknown = "maybe"\n')
    s, why = lean.read_settings({"NODEHEALTH_CONFIG": str(cfg), "SLURMD_NODENAME": "n1"})
    assert s is None and "override policy.unknown has an unexpected value" in why
    cfg.write_text("[daemon\n")
    s, why = lean.read_settings({"NODEHEALTH_CONFIG": str(cfg)})
    assert s is None and "invalid TOML" in why
    s, why = lean.read_settings({"NODEHEALTH_CONFIG": str(tmp_path / "nope.toml")})
    assert s is None and "no such file" in why


def test_unreadable_boot_id_under_procfs_root_runs_the_cold_path(node: Node, healthy_report: dict[str, Any]) -> None:
    node.write_state(healthy_report)
    node.boot.unlink()
    out, err = node.prolog()
    assert out["rc"] == 0, err
    assert f"this boot's id is unknown ({node.boot})" in err, err
    assert "nodehealth.runner" in out["modules"]


def test_a_config_error_still_ends_in_the_cold_paths_verdict(node: Node, healthy_report: dict[str, Any]) -> None:
    node.write_state(healthy_report)
    node.write_config('[daemon]\nstate_max_age_s = "soon"\n', validated=False)
    out, err = node.prolog()
    assert out["rc"] == 0 and "configuration error" in err, err


def test_fast_ledger_record_is_the_ledgers_format(tmp_path: Path) -> None:
    from nodehealth.faces.log import Log
    from nodehealth.slurm import jobenv
    from nodehealth.statedir import ledger

    env = {
        "SLURM_JOB_ID": "12",
        "SLURM_JOB_USER": 'al\nice"',
        "SLURM_JOB_UID": "1000",
        "SLURM_JOB_GPUS": "3,1",
        "SLURMD_NODENAME": "gpu01",
    }
    s = lean.Settings()
    s.state_dir = str(tmp_path)
    fast.append_ledger(s, env, "gpu01", "b", Log("prolog"))
    (got,) = ledger.read(str(tmp_path))
    assert got.event == "start" and got.job_id == "12" and got.gpus == (1, 3) and got.uid == 1000
    assert got.user == "al ice" and got.node == "gpu01" and got.boot_id == "b"
    assert jobenv.record("start", {}, 1.0) is None
