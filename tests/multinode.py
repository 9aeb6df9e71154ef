"""A private multi-node Slurm on one machine: one munged, one slurmctld, one slurmd per node, each
slurmd in its own UTS namespace (hostname = node name), optionally in its own mount namespace
with an empty tmpfs over a directory ("shared storage missing on that node").

Follows shared/notes/slurm-multinode.md; reuses ``tests/slurm_cluster.py``'s helpers. The one
multi-node harness of the tests and the benches (``bench/slurm_rpc.py`` builds its cluster on it:
its own directory, node lines with GPUs, declared nodes that never register, more slurm.conf lines).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Optional, Sequence, Union

from slurm_cluster import _free_port, spawn, stop_process, wait_for


class MultiNode:
    def __init__(
        self,
        nodes: Sequence[str],
        private: Sequence[str] = (),
        extra: Sequence[str] = (),
        root: Union[str, Path, None] = None,
        node_opts: str = "CPUs=2 RealMemory=1000",
        more_nodes: Sequence[str] = (),
    ) -> None:
        """``root``: the cluster's directory (a new one under /tmp by default; munged wants every
        directory above its socket searchable); ``node_opts``: the NodeName lines' resources
        (``Gres=gpu:8``...); ``more_nodes``: NodeName lines of nodes that never register (a
        cluster of that size to slurmctld; in the partition, not waited for)."""
        self.root = Path(root) if root is not None else Path(tempfile.mkdtemp(prefix="nh-multi."))
        self.node_opts, self.more_nodes = node_opts, list(more_nodes)
        self.nodes, self.private = list(nodes), set(private)
        self.extra = list(extra)  # more slurm.conf lines (HealthCheckProgram=...), before the nodes
        self.conf = self.root / "etc" / "slurm.conf"
        self.shared = self.root / "shared"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def _spawn(self, name: str, argv: list[str]) -> None:
        self.procs[name] = spawn(self.root, name, argv, self.env, new_session=True)

    def start(self, timeout: float = 30) -> MultiNode:
        """munged, slurmctld, every node's slurmd; returns once every node of ``nodes`` is idle
        (within ``timeout`` s)."""
        r = self.root
        for d in ("etc", "state", "spool", "log", "run", "munge", "shared"):
            (r / d).mkdir(parents=True, exist_ok=True)
        os.chmod(r, 0o755)
        os.chmod(r / "munge", 0o755)
        key = r / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        lines = [
            "ClusterName=nhmulti",
            "SlurmctldHost=vm(127.0.0.1)",
            f"SlurmctldPort={_free_port()}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            f"AuthInfo=socket={r}/munge/munge.socket",
            "CredType=cred/munge",
            f"StateSaveLocation={r}/state",
            f"SlurmdSpoolDir={r}/spool/%n",
            f"SlurmctldPidFile={r}/run/slurmctld.pid",
            f"SlurmdPidFile={r}/run/slurmd-%n.pid",
            f"SlurmctldLogFile={r}/log/slurmctld.log",
            f"SlurmdLogFile={r}/log/slurmd-%n.log",
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
        lines += self.extra
        for n in self.nodes:
            lines.append(f"NodeName={n} NodeAddr=127.0.0.1 Port={_free_port()} {self.node_opts} State=UNKNOWN")
        lines += self.more_nodes
        lines.append("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        lines[1] = f"SlurmctldHost={os.uname().nodename.split('.')[0]}(127.0.0.1)"
        self.conf.write_text("\n".join(lines) + "\n")
        self._spawn(
            "munged",
            [
                "/usr/sbin/munged",
                "-F",
                f"--socket={r}/munge/munge.socket",
                f"--key-file={key}",
                f"--pid-file={r}/munge/munged.pid",
                f"--log-file={r}/munge/munged.log",
                f"--seed-file={r}/munge/munged.seed",
            ],
        )
        wait_for(lambda: (r / "munge" / "munge.socket").exists(), 10, "munged socket")
        self._spawn("slurmctld", ["/usr/sbin/slurmctld", "-D"])
        wait_for(lambda: self.run("/usr/bin/scontrol", "ping").returncode == 0, 15, "slurmctld up")
        for n in self.nodes:
            if n in self.private:
                argv = [
                    "/usr/bin/unshare",
                    "--uts",
                    "--mount",
                    "--propagation",
                    "private",
                    "sh",
                    "-c",
                    f"mount -t tmpfs -o size=1m nh-empty {self.shared} && hostname {n} && "
                    f"exec /usr/sbin/slurmd -D -N {n}",
                ]
            else:
                argv = ["/usr/bin/unshare", "--uts", "sh", "-c", f"hostname {n} && exec /usr/sbin/slurmd -D -N {n}"]
            self._spawn(f"slurmd-{n}", argv)
        idle = ["idle", str(len(self.nodes))]
        wait_for(
            lambda: self.run("/usr/bin/sinfo", "-h", "-n", ",".join(self.nodes), "-o", "%T %D").stdout.split() == idle,
            timeout,
            "all nodes idle",
        )
        return self

    def run(self, *argv: str, timeout: float = 60, cwd: Optional[str] = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=timeout, cwd=cwd)

    def stop(self) -> None:
        self.run("/usr/bin/scancel", "--user=root")
        for name in [k for k in self.procs if k.startswith("slurmd")] + ["slurmctld", "munged"]:
            p = self.procs.pop(name, None)
            if p is not None:
                stop_process(p)
        if not os.environ.get("NODEHEALTH_KEEP_SLURM"):
            shutil.rmtree(self.root, ignore_errors=True)
