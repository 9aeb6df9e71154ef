"""Talking to slurmctld: read node states, drain and resume a node, each under a short deadline.

Every call is ``scontrol`` by absolute path with an argv list (no shell): the reason text is
one argument, never interpolated into a command line. ``SLURM_CONF`` is passed when the
configuration names one and the environment has none (HealthCheckProgram runs with an
empty environment).
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from typing import Mapping, Optional, Union

from nodehealth.observations import ProbeError
from nodehealth.platform.proc import CommandError, CommandResult, run
from nodehealth.slurm.policy import NodeInfo, parse_nodes


@dataclass(frozen=True)
class UpdateOutcome:
    ok: bool
    message: str
    timed_out: bool = False
    elapsed_s: float = 0.0


def environment(slurm_conf: str = "", base: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    if slurm_conf and not env.get("SLURM_CONF"):
        env["SLURM_CONF"] = slurm_conf
    return env


def _call(argv: list[str], timeout_s: float, env: Mapping[str, str]) -> Union[CommandResult, ProbeError]:
    try:
        res = run(argv, max(0.05, timeout_s), env=env)
    except CommandError as exc:
        return ProbeError("slurmctl", "unavailable", str(exc))
    if res.timed_out:
        return ProbeError("slurmctl", "timeout", f"{shlex.join(res.argv)} did not answer within {timeout_s:.1f} s")
    return res


def _first_line(res: CommandResult) -> str:
    lines = (res.stderr or res.stdout).strip().splitlines()
    return lines[0] if lines else ""


def show_nodes(scontrol: str, node: Optional[str], timeout_s: float,
               env: Mapping[str, str]) -> Union[list[NodeInfo], ProbeError]:
    """``scontrol show node -o [NODE]``: one node, or every node of the cluster when None."""
    argv = [scontrol, "show", "node", "-o"] + ([node] if node else [])
    res = _call(argv, timeout_s, env)
    if isinstance(res, ProbeError):
        return res
    if res.returncode != 0:
        return ProbeError("slurmctl", "error", f"scontrol exit {res.returncode}: {_first_line(res)}")
    nodes = parse_nodes(res.stdout)
    if node is not None and not any(n.name == node for n in nodes):
        return ProbeError("slurmctl", "invalid", f"scontrol did not describe node {node}")
    return nodes


def update_node(scontrol: str, node: str, state: str, reason: Optional[str], timeout_s: float,
                env: Mapping[str, str]) -> UpdateOutcome:
    """``scontrol update nodename=N state=drain|resume [reason=...]``."""
    argv = [scontrol, "update", f"nodename={node}", f"state={state}"]
    if reason is not None:
        argv.append(f"reason={reason}")
    res = _call(argv, timeout_s, env)
    if isinstance(res, ProbeError):
        return UpdateOutcome(False, res.message, timed_out=res.kind == "timeout")
    if res.returncode != 0:
        return UpdateOutcome(False, f"scontrol exit {res.returncode}: {_first_line(res)}")
    return UpdateOutcome(True, "ok")


def drain(scontrol: str, node: str, reason: str, timeout_s: float, env: Mapping[str, str]) -> UpdateOutcome:
    return update_node(scontrol, node, "drain", reason, timeout_s, env)


def resume(scontrol: str, node: str, timeout_s: float, env: Mapping[str, str]) -> UpdateOutcome:
    return update_node(scontrol, node, "resume", None, timeout_s, env)
