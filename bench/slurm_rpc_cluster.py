"""The private multi-node Slurm of ``bench/slurm_rpc.py``: the tests' harness with nodehealth on every node.

``Cluster`` is ``tests/multinode.py``'s ``MultiNode`` (munged, slurmctld, one slurmd per node in its
own UTS namespace, on ``tests/slurm_daemons.py``'s ``PrivateSlurm``) plus what the bench measures with: 8
fake GPUs per node (gres), nodehealth's faces as ``Prolog``, ``Epilog`` and
``HealthCheckProgram`` through wrappers that name the node, per-node ``scontrol``/``sinfo``
wrappers that log every call with the node and the caller, one ``nodehealth daemon`` per node in
daemon mode, declared nodes that never register (the scale run), and slurmctld logging every RPC
(``DebugFlags=Protocol``) with readers for that log, ``sdiag`` and the call log.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import signal
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the one Slurm harness: the tests' private cluster

from multinode import MultiNode  # noqa: E402
from slurm_cluster import BIN, SCENARIOS, slurm_missing  # noqa: E402
from slurm_daemons import free_port, spawn, stop_process, wait_for  # noqa: E402

__all__ = ["FIXTURES", "SCONTROL", "SINFO", "Cluster", "missing", "wait_for"]  # what bench/slurm_rpc.py uses

FIXTURES = SCENARIOS
SCONTROL = "/usr/bin/scontrol"
SINFO = "/usr/bin/sinfo"
FACES = ("nodehealth-prolog", "nodehealth-epilog", "nodehealth-healthcheck")
RPC_LINE = re.compile(r"^\[(\S+?)\] \S*: received opcode (\w+) from", re.M)
SDIAG_LINE = re.compile(
    r"^\s*(REQUEST_\w+|MESSAGE_\w+|RESPONSE_\w+)\s+\(\s*\d+\)\s+count:(\d+)"
    r"(?:\s+ave_time:\d+\s+total_time:(\d+))?",
    re.M,
)


def missing() -> Optional[str]:
    """Why the bench cannot run here (the harness's reasons, unshare, the nodehealth command), or None."""
    why = slurm_missing()
    if why:
        return why
    if not os.access("/usr/bin/unshare", os.X_OK):
        return "/usr/bin/unshare not installed (util-linux)"
    if not (BIN / "nodehealth").exists():
        return f"{BIN / 'nodehealth'} missing (pip install -e .)"
    return None


class Cluster(MultiNode):
    """The harness's multi-node cluster with nodehealth on every node: 8 fake GPUs each, the faces as
    Prolog, Epilog and HealthCheckProgram, per-node scontrol/sinfo wrappers that log every call, a
    ``nodehealth daemon`` per node in daemon mode, slurmctld logging every RPC."""

    def __init__(
        self,
        root: Path,
        nodes: int,
        hc_interval: int,
        daemon_interval: float,
        reconcile_s: float,
        clean_runs: int,
        daemons: bool,
        ghosts: int = 0,
    ) -> None:
        names = [f"n{i}" for i in range(1, nodes + 1)]
        # Declared nodes that never register (g1..gN): a cluster of that size to slurmctld.
        more = (
            [
                f"NodeName=g[1-{ghosts}] NodeAddr=127.0.0.1 Port={free_port()} CPUs=2 "
                "RealMemory=1000 Gres=gpu:8 State=UNKNOWN"
            ]
            if ghosts
            else []
        )
        super().__init__(
            names, root=root, node_opts=f"CPUs={os.cpu_count()} RealMemory=1000 Gres=gpu:8", more_nodes=more
        )
        self.names = names
        self.hc_interval, self.daemon_interval, self.reconcile_s = hc_interval, daemon_interval, reconcile_s
        self.clean_runs, self.with_daemons = clean_runs, daemons
        self.env.pop("NODEHEALTH_CONFIG", None)
        self.calls_log = root / "scontrol-calls.log"
        self.scenario_seq = 0
        self.sched_params = "batch_sched_delay=0"  # the harness's SchedulerParameters (slurm_facts.py edits it)

    def node_dir(self, name: str) -> Path:
        return self.root / "nodes" / name

    def state_dir(self, name: str) -> Path:
        return self.node_dir(name) / "state"

    # ---------------------------------------------------------------- files

    def use_scenario(self, name: str, scenario: Path) -> None:
        """Switch one node's simulated GPUs.

        The scenario goes to a new file and the node's config is pointed at it (both written
        atomically), then its daemon is sent SIGHUP: a running daemon parses a scenario path
        once (``nodehealth.probes._scenario`` is cached by path), so rewriting the same file
        would change what the faces see but not what the daemon sees.
        """
        nd = self.node_dir(name)
        self.scenario_seq += 1
        target = nd / f"scenario-{self.scenario_seq}.toml"
        shutil.copyfile(scenario, target)
        self._write_node_config(name, target)
        daemon = self.procs.get(f"daemon-{name}")
        if daemon is not None and daemon.poll() is None:
            daemon.send_signal(signal.SIGHUP)

    def _write_node_config(self, name: str, scenario: Path) -> None:
        nd = self.node_dir(name)
        tmp = nd / ".nodehealth.toml.tmp"
        tmp.write_text(
            "\n".join(
                [
                    f'node_name = "{name}"',
                    "[phases.prolog]",
                    "budget_s = 10",
                    "[phases.epilog]",
                    "budget_s = 10",
                    "[phases.healthcheck]",
                    "budget_s = 20",
                    "[nvml]",
                    f'simulate = "{scenario}"',
                    "[paths]",
                    f'state_dir = "{nd / "state"}"',
                    "[slurm]",
                    f'scontrol = "{nd / "bin" / "scontrol"}"',
                    "timeout_s = 3",
                    f'conf = "{self.conf}"',
                    f"reconcile_s = {self.reconcile_s:g}",
                    "[resume]",
                    f"clean_runs = {self.clean_runs}",
                    "[daemon]",
                    f"interval_s = {self.daemon_interval:g}",
                    'listen = ""',
                    "xid_follow = true",
                    "[checks.gpu_xid]",
                    f'kmsg_path = "{nd / "kmsg"}"',
                ]
            )
            + "\n"
        )
        os.replace(tmp, nd / "nodehealth.toml")

    def _script(self, path: Path, text: str) -> str:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o755)
        return str(path)

    def _write(self) -> None:
        """What the harness does not write: the call log and its wrappers, the faces' wrappers, each
        node's devices, config and scenario, gres.conf, and the slurm.conf lines of nodehealth."""
        r = self.root
        for d in ("etc", "out", "bin"):
            (r / d).mkdir(parents=True, exist_ok=True)
        self.calls_log.write_text("")
        # One line per call, written with one write(2): time, node, caller, pid, argv (tab-separated). The
        # runner gives scontrol and sinfo no variable of the face's, so each node has its own wrappers and the
        # caller is read from the parent's command line (the face or the daemon that ran the command).
        for name in self.names:
            for prog, real, tag in (("scontrol", SCONTROL, ""), ("sinfo", SINFO, "\tsinfo")):
                self._script(
                    self.node_dir(name) / "bin" / prog,
                    (
                        "#!/bin/sh\n"
                        "case \"$(tr '\\0' ' ' < /proc/$PPID/cmdline)\" in\n"
                        "  *prolog*) face=prolog;; *epilog*) face=epilog;; *healthcheck*) face=healthcheck;;\n"
                        "  *daemon*) face=daemon;; *) face=?;;\n"
                        "esac\n"
                        f'line="$(/bin/date +%s.%N)\t{name}\t$face\t$${tag}"\n'
                        'for a in "$@"; do line="$line\t$a"; done\n'
                        f"printf '%s\\n' \"$line\" >> {self.calls_log}\n"
                        f'exec {real} "$@"\n'
                    ),
                )
        faces = {}
        for face in FACES:
            short = face.split("-", 1)[1]
            faces[short] = self._script(
                r / "bin" / face,
                (
                    "#!/bin/sh\n"
                    f"NODEHEALTH_CONFIG={r}/nodes/$SLURMD_NODENAME/nodehealth.toml\n"
                    f"NH_NODE=$SLURMD_NODENAME NH_FACE={short}\n"
                    "export NODEHEALTH_CONFIG NH_NODE NH_FACE\n"
                    f"exec {BIN / face}\n"
                ),
            )
        gres = ["AutoDetect=off"]
        for name in self.names:
            nd = self.node_dir(name)
            for sub in ("dev", "state"):
                (nd / sub).mkdir(parents=True, exist_ok=True)
            for i in range(8):  # gres File= must be a character device
                (nd / "dev" / f"gpu{i}").symlink_to("/dev/null")
            (nd / "kmsg").write_text("")
            self.use_scenario(name, FIXTURES / "healthy.toml")
            gres.append(f"NodeName={name} Name=gpu File={nd}/dev/gpu[0-7]")
        (r / "etc" / "gres.conf").write_text("\n".join(gres) + "\n")
        self.extra = [
            # DebugFlags=Protocol: slurmctld logs every RPC it receives, with its time (ms) and type.
            "SlurmctldDebug=info",
            "DebugFlags=Protocol",
            "LogTimeFormat=iso8601_ms",
            "SlurmdDebug=info",
            "GresTypes=gpu",
            f"Prolog={faces['prolog']}",
            f"Epilog={faces['epilog']}",
            "PrologFlags=Alloc",
            "PrologEpilogTimeout=60",
            f"HealthCheckProgram={faces['healthcheck']}",
            f"HealthCheckInterval={self.hc_interval}",
            "HealthCheckNodeState=ANY",
        ]

    # ---------------------------------------------------------------- processes

    def start(self, timeout: float = 60) -> Cluster:
        self._write()
        super().start(timeout)  # munged, slurmctld, the slurmds; every node idle
        if self.with_daemons:
            for name in self.names:
                env = dict(self.env, NH_NODE=name, NH_FACE="daemon")
                self.procs[f"daemon-{name}"] = spawn(
                    self.root,
                    f"daemon-{name}",
                    [str(BIN / "nodehealth"), "daemon", "--config", str(self.node_dir(name) / "nodehealth.toml")],
                    env,
                )
        return self

    def stop(self) -> None:
        for name in [n for n in self.procs if n.startswith("daemon-")]:
            stop_process(self.procs.pop(name))
        if "slurmctld" in self.procs:
            self.cancel_jobs(20, every=0.2)
        super().stop()

    # ---------------------------------------------------------------- Slurm (outside the windows)

    def states(self) -> dict[str, str]:
        out = self.run(SCONTROL, "show", "node", "-o").stdout
        return {m.group(1): m.group(2) for m in re.finditer(r"NodeName=(\S+) .*?\bState=(\S+)", out)}

    def show(self, name: str) -> str:
        return self.run(SCONTROL, "show", "node", "-o", name).stdout.strip()

    # ---------------------------------------------------------------- inside the windows (no node query)

    def sdiag(self, field: int = 2) -> dict[str, int]:
        """sdiag's per-type RPC counts (``field=3``: total time, microseconds)."""
        out = self.run("/usr/bin/sdiag").stdout
        return {m.group(1): int(m.group(field) or 0) for m in SDIAG_LINE.finditer(out)}

    def sdiag_time_us(self) -> int:
        """slurmctld's total time in every RPC type but sdiag's own (microseconds), from one sdiag."""
        out = self.run("/usr/bin/sdiag").stdout
        return sum(int(m.group(3) or 0) for m in SDIAG_LINE.finditer(out) if m.group(1) != "REQUEST_STATS_INFO")

    def sbatch(self, node: str) -> str:
        res = self.run(
            "/usr/bin/sbatch",
            "--parsable",
            "-N1",
            "-w",
            node,
            "-o",
            f"{self.root}/out/slurm-%j.out",
            "--wrap",
            "hostname",
        )
        return res.stdout.strip().split(";")[0]

    def ended_jobs(self) -> set[str]:
        """Jobs whose epilog has run, from the nodes' job ledgers (no Slurm call)."""
        out = set()
        for name in self.names:
            try:
                text = (self.state_dir(name) / "jobs.jsonl").read_text()
            except OSError:
                continue
            for line in text.splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if rec.get("event") == "end":
                    out.add(str(rec.get("job_id")))
        return out

    def nh_state(self, name: str) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads((self.state_dir(name) / "slurm-state.json").read_text())
            return data
        except (OSError, ValueError):
            return {}

    def logged_rpcs(self, t0: float, t1: float) -> dict[str, int]:
        """RPCs slurmctld received between t0 and t1 by its own log (DebugFlags=Protocol), by type."""
        out: Counter[str] = Counter()
        text = (self.root / "log" / "slurmctld.log").read_text(errors="replace")
        for m in RPC_LINE.finditer(text):
            when = datetime.datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S.%f").timestamp()
            if t0 <= when < t1:
                out[m.group(2)] += 1
        return dict(sorted(out.items()))

    def calls(self) -> list[dict[str, Any]]:
        out = []
        for line in self.calls_log.read_text(errors="replace").splitlines():
            parts = line.split("\t")
            if len(parts) < 4:
                continue
            out.append(
                {
                    "time": float(parts[0]),
                    "node": parts[1],
                    "face": parts[2],
                    "pid": parts[3],
                    "argv": parts[4:],
                    "line": line,
                }
            )
        return out
