"""A private multi-node Slurm on one machine: one munged, one slurmctld, one slurmd per node, each
slurmd in its own UTS namespace (hostname = node name), optionally in its own mount namespace
with an empty tmpfs over a directory ("shared storage missing on that node").

Follows shared/notes/slurm-multinode.md; built on ``tests/slurm_daemons.py``'s ``PrivateSlurm`` (the
directories, the head of slurm.conf, munged and slurmctld, the stop), as ``SlurmCluster`` is. The one
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

from slurm_daemons import PrivateSlurm, _free_port, wait_for


class MultiNode(PrivateSlurm):
    new_session = True

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
        super().__init__(Path(root) if root is not None else Path(tempfile.mkdtemp(prefix="nh-multi.")))
        self.node_opts, self.more_nodes = node_opts, list(more_nodes)
        self.nodes, self.private = list(nodes), set(private)
        self.extra = list(extra)  # more slurm.conf lines (HealthCheckProgram=...), before the nodes
        self.shared = self.root / "shared"

    def start(self, timeout: float = 30) -> MultiNode:
        """munged, slurmctld, every node's slurmd; returns once every node of ``nodes`` is idle
        (within ``timeout`` s)."""
        self._make_dirs("shared")
        lines = self.conf_head("nhmulti", os.uname().nodename.split(".")[0], per_node=True) + self.extra
        for n in self.nodes:
            lines.append(f"NodeName={n} NodeAddr=127.0.0.1 Port={_free_port()} {self.node_opts} State=UNKNOWN")
        lines += self.more_nodes
        lines.append("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        self.conf.write_text("\n".join(lines) + "\n")
        self.start_controller()
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
        self.cancel_jobs()
        self.stop_daemons()
        if not os.environ.get("NODEHEALTH_KEEP_SLURM"):
            shutil.rmtree(self.root, ignore_errors=True)
