"""A private Slurm cluster for the integration tests: munged + slurmctld + slurmd from Debian's
packages, all in one temp dir, with nodehealth's installed entry points as Prolog, Epilog and
HealthCheckProgram and simulated GPUs behind them.

Follows the verified recipe (Debian 12, Slurm 22.05): daemons run in the foreground as
children of the test process and are stopped by PID (``tests/slurm_daemons.py``'s ``PrivateSlurm``,
which ``tests/multinode.py`` is built on too); fake GPUs are gres.conf ``File=``
entries that are symlinks to /dev/null; ``SLURM_CONF`` points at the temp dir. slurmd gives
the prolog/epilog a fixed environment and the health check an empty one, so each face is
started through a two-line wrapper that sets ``NODEHEALTH_CONFIG`` and execs the installed
entry point (what a site does when its config is not at /etc/nodehealth/nodehealth.toml).

The simulated node is switched between scenarios by rewriting ``<dir>/scenario.toml``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Optional

import pytest
from slurm_daemons import PrivateSlurm, _free_port, wait_for

DAEMONS = {"munged": "/usr/sbin/munged", "slurmctld": "/usr/sbin/slurmctld", "slurmd": "/usr/sbin/slurmd"}
CLIENTS = (
    "/usr/bin/scontrol",
    "/usr/bin/sbatch",
    "/usr/bin/squeue",
    "/usr/bin/sinfo",
    "/usr/bin/scancel",
    "/usr/bin/sdiag",
)
BIN = Path(sys.executable).parent  # the venv's bin: nodehealth-prolog & co. live next to python
SCENARIOS = Path(__file__).parent / "fixtures" / "slurm"


def slurm_missing() -> Optional[str]:
    """Why the real-Slurm tests cannot run here, or None."""
    for path in list(DAEMONS.values()) + list(CLIENTS):
        if not os.access(path, os.X_OK):
            return f"{path} not installed (apt-get install slurmctld slurmd slurm-client munge)"
    if os.geteuid() != 0:
        return "the private Slurm cluster runs its daemons as root"
    for face in ("nodehealth-prolog", "nodehealth-epilog", "nodehealth-healthcheck"):
        if not (BIN / face).exists():
            return f"{BIN / face} missing (pip install -e .)"
    return None


def requires_slurm() -> Any:
    why = slurm_missing()
    return pytest.mark.skipif(why is not None, reason=why or "")


class SlurmCluster(PrivateSlurm):
    """One node (this host's short name) with ``ngpus`` fake GPUs, plus optional ghost nodes
    that are declared but never register (for the breaker)."""

    def __init__(
        self,
        root: Path,
        scenario: str = "healthy.toml",
        ngpus: int = 8,
        hc_interval: int = 0,
        ghosts: int = 0,
        nodehealth: Optional[dict[str, Any]] = None,
    ) -> None:
        super().__init__(Path(root).resolve())
        self.host = socket.gethostname().split(".")[0]
        self.ngpus, self.hc_interval, self.ghosts = ngpus, hc_interval, ghosts
        self.env.pop("NODEHEALTH_CONFIG", None)
        self.state_dir = self.root / "nodehealth-state"
        # nodehealth={"persistent_dir": True}: the split layout of a default install (a run dir and a
        # persistent dir); otherwise one state dir, as every config that sets only state_dir has it.
        self.split = bool((nodehealth or {}).get("persistent_dir"))
        self.persistent_dir = self.root / "nodehealth-lib" if self.split else self.state_dir
        self.procfs = self.root / "proc"  # [paths] procfs_root: only this boot's id lives there
        self.boot_id = self.procfs / "sys" / "kernel" / "random" / "boot_id"
        self.nh_config = self.root / "nodehealth.toml"
        self.scenario_file = self.root / "scenario.toml"
        self.nodehealth = nodehealth or {}
        self.use_scenario(scenario)

    # -------------------------------------------------------------- setup

    def use_scenario(self, name: str) -> None:
        """Switch the simulated GPUs (atomically: a face reads either the old or the new file)."""
        tmp = self.root / ".scenario.tmp"
        self.root.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(SCENARIOS / name, tmp)
        os.replace(tmp, self.scenario_file)

    def set_boot_id(self, value: str) -> None:
        self.boot_id.parent.mkdir(parents=True, exist_ok=True)
        self.boot_id.write_text(value + "\n")

    def _write_nodehealth(self) -> None:
        prolog = self.nodehealth.get("prolog_budget", 10)
        timeout = self.nodehealth.get("slurm_timeout", 2.0)
        clean = self.nodehealth.get("clean_runs", 2)
        lines = [
            f'node_name = "{self.host}"',
            "[phases.prolog]",
            f"budget_s = {prolog}",
            "[phases.epilog]",
            "budget_s = 10",
            "[phases.healthcheck]",
            "budget_s = 10",
            "[nvml]",
            f'simulate = "{self.scenario_file}"',
            "[paths]",
            f'state_dir = "{self.state_dir}"',
            f'procfs_root = "{self.procfs}"',
            *([f'persistent_dir = "{self.persistent_dir}"'] if self.split else []),
            "[slurm]",
            'scontrol = "/usr/bin/scontrol"',
            f"timeout_s = {timeout}",
            f'conf = "{self.conf}"',
            "[resume]",
            f"clean_runs = {clean}",
            "[drain]",
            f"max_share = {self.nodehealth.get('max_share', 0.25)}",
            "breaker_min_drained = 3",
        ]
        # More [slurm] keys (mode, reboot, another scontrol...), each a TOML value already.
        slurm_keys = self.nodehealth.get("slurm", {})
        if slurm_keys:
            at = lines.index("[slurm]") + 1
            lines[at:at] = [f"{k} = {v}" for k, v in slurm_keys.items()]
            if "scontrol" in slurm_keys:
                lines.remove('scontrol = "/usr/bin/scontrol"')
        # More [resume] keys (flap_drains, flap_window_s...), each a TOML value already.
        resume_keys = self.nodehealth.get("resume", {})
        if resume_keys:
            at = lines.index("[resume]") + 1
            lines[at:at] = [f"{k} = {v}" for k, v in resume_keys.items()]
        # Host checks added by other work (mounts, shared dirs, IB) are not what these tests are about.
        for check in self.nodehealth.get("disable", ()):
            lines += [f"[checks.{check}]", "enabled = false"]
        if "check_timeout" in self.nodehealth:
            from nodehealth.registry import CHECKS

            for spec in CHECKS:
                lines += [f"[checks.{spec.name}]", f"timeout_s = {self.nodehealth['check_timeout']}"]
        self.nh_config.write_text("\n".join(lines) + "\n")

    def _wrapper(self, face: str) -> str:
        path = self.root / "bin" / face
        path.parent.mkdir(parents=True, exist_ok=True)
        # slurmd gives the face no environment of ours: the defaults of [paths] stay in the run's sandbox
        # (where the prolog's fast-path settings are kept), as conftest moves them for this process.
        root = os.environ.get("NODEHEALTH_DEFAULT_ROOT", "")
        sandbox = f"NODEHEALTH_DEFAULT_ROOT={root}\nexport NODEHEALTH_DEFAULT_ROOT\n" if root else ""
        path.write_text(
            f"#!/bin/sh\nNODEHEALTH_CONFIG={self.nh_config}\nexport NODEHEALTH_CONFIG\n{sandbox}exec {BIN / face}\n"
        )
        path.chmod(0o755)
        return str(path)

    def _write_config(self) -> None:
        r = self.root
        self._make_dirs("dev", "out")
        for i in range(self.ngpus):  # gres File= must be a char/block device
            link = r / "dev" / f"gpu{i}"
            if not link.is_symlink():
                link.symlink_to("/dev/null")
        if not self.boot_id.exists():
            self.set_boot_id("boot-1")
        self._write_nodehealth()
        lines = self.conf_head(
            "nhtest", self.host, per_node=False, debug=("SlurmctldDebug=debug", "SlurmdDebug=debug2")
        )
        lines += [
            "GresTypes=gpu",
            f"Prolog={self._wrapper('nodehealth-prolog')}",
            f"Epilog={self._wrapper('nodehealth-epilog')}",
            "PrologEpilogTimeout=60",
        ]
        if self.hc_interval:
            lines += [
                f"HealthCheckProgram={self._wrapper('nodehealth-healthcheck')}",
                f"HealthCheckInterval={self.hc_interval}",
                "HealthCheckNodeState=ANY",
            ]
        lines += list(self.nodehealth.get("slurm_conf", ()))  # more slurm.conf lines (RebootProgram=...)
        lines.append(
            f"NodeName={self.host} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} RealMemory=1000 "
            f"Gres=gpu:{self.ngpus} State=UNKNOWN"
        )
        if self.ghosts:
            lines.append(
                f"NodeName=ghost[1-{self.ghosts}] NodeAddr=127.0.0.1 Port={_free_port()} CPUs=1 "
                f"RealMemory=100 Gres=gpu:8 State=UNKNOWN"
            )
            lines.append(f"PartitionName=ghosts Nodes=ghost[1-{self.ghosts}] Default=NO State=UP")
        lines.append(f"PartitionName=debug Nodes={self.host} Default=YES MaxTime=INFINITE State=UP")
        self.conf.write_text("\n".join(lines) + "\n")
        gres = ["AutoDetect=off"]
        if self.ngpus:
            gres.append(f"NodeName={self.host} Name=gpu File={r}/dev/gpu[0-{self.ngpus - 1}]")
        (r / "etc" / "gres.conf").write_text("\n".join(gres) + "\n")

    def start(self) -> SlurmCluster:
        self._write_config()
        self.start_controller()
        self._spawn("slurmd", ["/usr/sbin/slurmd", "-D"])
        # Registered: idle, or drained already by a health check that ran before registration.
        wait_for(
            lambda: self.node()["state"] not in ("", "unknown", "down", "idle*", "unknown*", "down*"),
            30,
            "node registered",
        )
        return self

    def stop(self) -> None:
        if "slurmctld" in self.procs:
            self.cancel_jobs(15)
        self.stop_daemons()

    # -------------------------------------------------------------- helpers

    def run(self, *argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(argv), env=self.env, capture_output=True, text=True, check=check, timeout=timeout)

    def node(self, name: Optional[str] = None) -> dict[str, str]:
        """State (sinfo's long word), reason text and the raw scontrol line of one node.

        Two commands, read one after the other: a drain that lands between them shows in ``state``
        but not yet in ``scontrol_state``/``reason``; a caller waiting for a drain checks both."""
        res = self.run("/usr/bin/scontrol", "show", "node", "-o", name or self.host, check=False)
        line = res.stdout.strip()
        state = re.search(r"\bState=(\S+)", line)
        reason = re.search(r" Reason=(.*?)(?: \[[^\]]*\])?$", line)
        sinfo = self.run("/usr/bin/sinfo", "-h", "-N", "-n", name or self.host, "-o", "%T", check=False)
        return {
            "state": sinfo.stdout.strip().splitlines()[0] if sinfo.stdout.strip() else "",
            "scontrol_state": state.group(1) if state else "",
            "reason": reason.group(1) if reason else "",
            "line": line,
        }

    def sbatch(self, *args: str) -> str:
        out = self.run("/usr/bin/sbatch", "--parsable", "-o", f"{self.root}/out/slurm-%j.out", *args).stdout
        return out.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        res = self.run("/usr/bin/scontrol", "show", "job", "-o", job_id, check=False)
        fields = dict(t.partition("=")[::2] for t in res.stdout.split() if "=" in t)
        return fields

    def wait_job(self, job_id: str, states: tuple[str, ...], timeout: float = 30) -> dict[str, str]:
        got: dict[str, str] = {}

        def done() -> bool:
            nonlocal got
            got = self.job(job_id)
            return got.get("JobState") in states

        wait_for(done, timeout, f"job {job_id} in {states} (last: {got.get('JobState')} {got.get('Reason')})")
        return got

    def wait_node(self, pred: Callable[[dict[str, str]], bool], timeout: float = 30, what: str = "") -> dict[str, str]:
        last: dict[str, str] = {}

        def ok() -> bool:
            nonlocal last
            last = self.node()
            return pred(last)

        wait_for(ok, timeout, f"node {what} (last: {last.get('line', '')[-200:]})")
        return last

    def nh_state(self) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads((self.persistent_dir / "slurm-state.json").read_text())
            return data
        except (OSError, ValueError):
            return {}

    def drain_record(self, timeout: float = 60) -> dict[str, Any]:
        """Our drain record, once it is on disk. A face records its drain after scontrol has answered
        (it records only what happened), so Slurm can show the drain a moment before the record."""
        wait_for(lambda: bool(self.nh_state().get("drain")), timeout, "the drain recorded in slurm-state.json")
        record: dict[str, Any] = self.nh_state()["drain"]
        return record

    def drain_forgotten(self, timeout: float = 60) -> dict[str, Any]:
        """The state once its drain record is gone: a resume is recorded after Slurm shows the node
        back in service (the face reads the node back first), so the record can lag a moment."""
        wait_for(lambda: self.nh_state().get("drain", "no state yet") is None, timeout, "no drain record")
        return self.nh_state()

    def ledger(self) -> list[dict[str, Any]]:
        path = self.state_dir / "jobs.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def sdiag_counts(self) -> dict[str, int]:
        """RPC counts by message type from ``sdiag``."""
        out = self.run("/usr/bin/sdiag", check=False).stdout
        counts: dict[str, int] = {}
        for m in re.finditer(r"^\s*(REQUEST_\w+|MESSAGE_\w+)\s+\(\s*\d+\)\s+count:(\d+)", out, re.M):
            counts[m.group(1)] = int(m.group(2))
        return counts

    def log(self, name: str) -> str:
        try:
            return (self.root / "log" / name).read_text(errors="replace")
        except OSError:
            return ""

    def face_env(self, job_id: str = "99", gpus: str = "0,1") -> dict[str, str]:
        """The environment slurmd gives a prolog (shared/notes/slurm-sandbox.md 3d): no PATH."""
        return {
            "SLURM_CONF": str(self.conf),
            "SLURMD_NODENAME": self.host,
            "SLURM_JOB_ID": job_id,
            "SLURM_JOBID": job_id,
            "SLURM_JOB_USER": "root",
            "SLURM_JOB_UID": "0",
            "SLURM_JOB_GPUS": gpus,
            "CUDA_VISIBLE_DEVICES": gpus,
            "SLURM_SCRIPT_CONTEXT": "prolog_slurmd",
            "PWD": str(self.root / "log"),
        }

    def wrapper(self, face: str) -> str:
        return str(self.root / "bin" / face)


def logged_scontrol(d: Path) -> tuple[Path, Path]:
    """A root-owned scontrol wrapper in ``d`` that appends its argv to a log, then runs the real one:
    ``(wrapper, log)``. What a test counts nodehealth's scontrol calls with."""
    log, wrapper = d / "scontrol-calls.log", d / "scontrol"
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> {log}\nexec /usr/bin/scontrol "$@"\n')
    wrapper.chmod(0o755)
    return wrapper, log


@pytest.fixture
def slurm_cluster() -> Any:
    """A factory: ``slurm_cluster(scenario=..., hc_interval=..., ghosts=..., nodehealth={...})``
    starts a cluster; every cluster started is stopped (by PID) at teardown.

    The directory is made directly under /tmp: munged wants every directory above its socket
    searchable, and pytest's own temp root is mode 0700.
    """
    why = slurm_missing()
    if why:
        pytest.skip(why)
    started: list[SlurmCluster] = []

    def make(**kwargs: Any) -> SlurmCluster:
        root = Path(tempfile.mkdtemp(prefix="nh-slurm."))
        cluster = SlurmCluster(root, **kwargs)
        started.append(cluster)
        return cluster.start()

    yield make
    for cluster in started:
        cluster.stop()
        if not os.environ.get("NODEHEALTH_KEEP_SLURM"):
            shutil.rmtree(cluster.root, ignore_errors=True)


def drained(node: dict[str, str]) -> bool:
    """Drained (or draining) by both sinfo and scontrol: ``SlurmCluster.node`` reads them apart."""
    return node["state"] in ("drained", "draining") and "DRAIN" in node["scontrol_state"]
