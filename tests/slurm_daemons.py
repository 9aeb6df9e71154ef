"""The daemons of the tests' private Slurm clusters: munged, slurmctld and the slurmds, started from Debian's
packages as children of the test process (in the foreground: the test reaps them itself and stops them by
PID), everything in one directory. ``PrivateSlurm`` is what every cluster of the harness shares: its
directories and munge key, the head of its slurm.conf, munged and slurmctld started and waited for, the stop.
``slurm_cluster.SlurmCluster`` (one node, nodehealth wired in) and ``multinode.MultiNode`` (several
slurmds, each with its own node name) are built on it; a fix to how a cluster is started is made here."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Callable, Sequence


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


free_port = _free_port  # the benches' name for it (bench/slurm_rpc.py)


class PrivateSlurm:
    """The daemons of one private cluster under ``root``, and what every cluster of the harness shares:
    its directories and munge key, the head of slurm.conf (``conf_head``), munged and slurmctld started
    and waited for, the slurmds and the rest stopped by PID. ``SlurmCluster`` (one node, nodehealth wired
    in) and ``multinode.MultiNode`` (several nodes, each its own slurmd) are built on it."""

    new_session = False  # each daemon in a session of its own (``spawn``'s ``new_session``)

    def __init__(self, root: Path) -> None:
        self.root = root
        self.conf = root / "etc" / "slurm.conf"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def _make_dirs(self, *more: str) -> None:
        """The cluster's directories, searchable (munged wants every directory above its socket so), and a
        munge key (kept if there is one)."""
        r = self.root
        for d in ("etc", "state", "spool", "log", "run", "munge", *more):
            (r / d).mkdir(parents=True, exist_ok=True)
        os.chmod(r, 0o755)
        os.chmod(r / "munge", 0o755)  # munged needs o+x on the socket dir
        key = r / "munge" / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
            os.chmod(key, 0o400)

    def conf_head(self, cluster: str, host: str, per_node: bool, debug: Sequence[str] = ()) -> list[str]:
        """slurm.conf up to the site's lines: controller on ``host`` (127.0.0.1), root, munge, the state,
        pid and log files under ``root``, no cgroups or accounting, no batch delay. ``per_node``: several
        slurmds, each with its own spool, pid file and log (``%n``) and its port on its NodeName line;
        else one slurmd on ``SlurmdPort``. ``debug``: lines after the log files (debug levels)."""
        r, n = self.root, "-%n" if per_node else ""
        return [
            f"ClusterName={cluster}",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={_free_port()}",
            *([] if per_node else [f"SlurmdPort={_free_port()}"]),
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            f"AuthInfo=socket={r}/munge/munge.socket",
            "CredType=cred/munge",
            f"StateSaveLocation={r}/state",
            f"SlurmdSpoolDir={r}/spool" + ("/%n" if per_node else ""),
            f"SlurmctldPidFile={r}/run/slurmctld.pid",
            f"SlurmdPidFile={r}/run/slurmd{n}.pid",
            f"SlurmctldLogFile={r}/log/slurmctld.log",
            f"SlurmdLogFile={r}/log/slurmd{n}.log",
            *debug,
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SchedulerType=sched/backfill",
            "SchedulerParameters=batch_sched_delay=0",
            "MpiDefault=none",
            "MailProg=/bin/true",
            "ReturnToService=2",
        ]

    def _spawn(self, name: str, argv: list[str]) -> None:
        self.procs[name] = spawn(self.root, name, argv, self.env, new_session=self.new_session)

    def _client(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=30)

    def start_controller(self) -> None:
        """munged, then slurmctld; returns once munged's socket is there and slurmctld answers a ping."""
        m = self.root / "munge"
        self._spawn(
            "munged",
            [
                "/usr/sbin/munged",
                "-F",
                f"--socket={m}/munge.socket",
                f"--key-file={m}/munge.key",
                f"--pid-file={m}/munged.pid",
                f"--log-file={m}/munged.log",
                f"--seed-file={m}/munged.seed",
            ],
        )
        wait_for(lambda: (m / "munge.socket").exists(), 10, "munged socket")
        self.start_slurmctld()

    def start_slurmctld(self) -> None:
        self._spawn("slurmctld", ["/usr/sbin/slurmctld", "-D"])
        wait_for(lambda: self._client("/usr/bin/scontrol", "ping").returncode == 0, 15, "slurmctld up")

    def cancel_jobs(self, wait_s: float = 0, every: float = 0.1) -> None:
        """scancel every job, then wait up to ``wait_s`` for an empty queue (a daemon stopped under a job
        leaves its slurmstepd and the job's processes orphaned)."""
        self._client("/usr/bin/scancel", "--user=root")
        end = time.monotonic() + wait_s
        while time.monotonic() < end and self._client("/usr/bin/squeue", "-h", "-o", "%i").stdout.strip():
            time.sleep(every)

    def stop_daemon(self, name: str) -> None:
        p = self.procs.pop(name, None)
        if p is not None:
            stop_process(p)

    def stop_daemons(self) -> None:
        """The slurmds, slurmctld, munged, in that order (the others in ``procs`` are the caller's)."""
        for name in [k for k in self.procs if k.startswith("slurmd")] + ["slurmctld", "munged"]:
            self.stop_daemon(name)


def spawn(
    root: Path, name: str, argv: list[str], env: dict[str, str], new_session: bool = False
) -> subprocess.Popen[bytes]:
    """A daemon of the private cluster, its output in ``<root>/log/<name>.stdio``."""
    with open(root / "log" / f"{name}.stdio", "ab") as log:
        return subprocess.Popen(
            argv,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=root,
            start_new_session=new_session,
        )


def stop_process(p: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 15 s; always reaped."""
    p.terminate()
    try:
        p.wait(timeout=15)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def wait_for(pred: Callable[[], bool], timeout: float, what: str, every: float = 0.1) -> None:
    end = time.monotonic() + timeout
    while True:
        if pred():
            return
        if time.monotonic() > end:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(every)
