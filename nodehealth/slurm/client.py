"""Talking to slurmctld: read node states, drain and resume a node, each under a deadline.

``SlurmClient`` is the interface the act sequence (``nodehealth.slurm.act``) needs; ``Scontrol``
is the real one: ``scontrol`` by absolute path with an argv list (no shell), so the reason
text is one argument, never interpolated into a command line, through ``platform.proc.run``
(trusted path, ``cwd="/"``, group killed on every way out, output capped while reading). Its
environment is ``proc.BASE_ENV`` and ``SLURM_CONF`` alone: the caller's when it has one, else
the configuration's (HealthCheckProgram runs with an empty environment); nothing else of a
job's or a shell's environment (``LD_*``, ``PATH``, ``SLURM_TIME_FORMAT``...) reaches scontrol.
Every call takes its timeout from the caller's ``Deadline``: with too little left, no call is
started (an "unreachable" answer, not an overrun). An answer over ``MAX_ANSWER`` is cut while
reading (scontrol killed) and is an error, never parsed nor cached.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from typing import Mapping, Optional, Protocol, Union

from nodehealth.observations import ProbeError
from nodehealth.platform.deadline import Deadline
from nodehealth.platform.proc import CommandError, CommandResult, run
from nodehealth.slurm.nodes import NodeInfo, parse_nodes

# ``scontrol show node -o`` of a 10,000-node cluster is a few MiB; one node's is under 2 KiB.
MAX_ANSWER = 16 << 20
MAX_NODE_ANSWER = 256 << 10  # ``show node -o NODE``: one record, a hundred times its usual size


@dataclass(frozen=True)
class UpdateOutcome:
    ok: bool
    message: str
    timed_out: bool = False


class SlurmClient(Protocol):
    """What nodehealth asks of slurmctld. ``calls`` counts the requests made (each costs slurmctld)."""

    calls: int

    def show(self, node: Optional[str]) -> Union[list[NodeInfo], ProbeError]:
        """``node``'s record, or every node of the cluster when None."""

    def update(self, node: str, state: str, reason: Optional[str] = None) -> UpdateOutcome:
        """Set ``state`` (drain, resume) with ``reason`` on ``node``."""


def environment(slurm_conf: str = "", base: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    """What scontrol gets on top of ``proc.BASE_ENV``: ``SLURM_CONF`` (``base``'s, else ``slurm_conf``)."""
    given = (os.environ if base is None else base).get("SLURM_CONF") or slurm_conf
    return {"SLURM_CONF": given} if given else {}


class Scontrol:
    """``SlurmClient`` through the ``scontrol`` command, every call bounded by ``deadline``."""

    def __init__(self, scontrol: str, per_call_s: float, deadline: Deadline, slurm_conf: str = "",
                 environ: Optional[Mapping[str, str]] = None) -> None:
        self.scontrol, self.per_call_s, self.deadline = scontrol, per_call_s, deadline
        self.env = environment(slurm_conf, environ)
        self.calls = 0

    def _call(self, argv: list[str], max_answer: int = MAX_ANSWER) -> Union[CommandResult, ProbeError]:
        timeout = self.deadline.call_timeout(self.per_call_s)
        if timeout is None:
            return ProbeError("slurmctl", "timeout", f"no time left in the budget for {shlex.join(argv[:3])}")
        self.calls += 1
        try:
            res = run(argv, timeout, env=self.env, max_output=max_answer, allow=("SLURM_CONF",))
        except CommandError as exc:
            return ProbeError("slurmctl", "unavailable", str(exc))
        if res.timed_out:
            return ProbeError("slurmctl", "timeout", f"{shlex.join(res.argv)} did not answer within {timeout:.1f} s")
        if res.truncated:  # cut while reading and killed: a partial answer is no answer
            return ProbeError("slurmctl", "invalid", f"{shlex.join(res.argv[:3])} answered more than "
                              f"{max_answer} bytes: not read further")
        return res

    def show(self, node: Optional[str]) -> Union[list[NodeInfo], ProbeError]:
        """``scontrol show node -o [NODE]``; one node's answer may be at most ``MAX_NODE_ANSWER`` bytes."""
        res = self._call([self.scontrol, "show", "node", "-o"] + ([node] if node else []),
                         MAX_NODE_ANSWER if node else MAX_ANSWER)
        if isinstance(res, ProbeError):
            return res
        if res.returncode != 0:
            return ProbeError("slurmctl", "error", f"scontrol exit {res.returncode}: {_first_line(res)}")
        nodes = parse_nodes(res.stdout)
        if node is not None and not any(n.name == node for n in nodes):
            return ProbeError("slurmctl", "invalid", f"scontrol did not describe node {node}")
        return nodes

    def update(self, node: str, state: str, reason: Optional[str] = None) -> UpdateOutcome:
        """``scontrol update nodename=N state=drain|resume [reason=...]``."""
        argv = [self.scontrol, "update", f"nodename={node}", f"state={state}"]
        if reason is not None:
            argv.append(f"reason={reason}")
        res = self._call(argv)
        if isinstance(res, ProbeError):
            return UpdateOutcome(False, res.message, timed_out=res.kind == "timeout")
        if res.returncode != 0:
            return UpdateOutcome(False, f"scontrol exit {res.returncode}: {_first_line(res)}")
        return UpdateOutcome(True, "ok")


def me(client: SlurmClient, node: str) -> Union[NodeInfo, ProbeError]:
    """This node's record through ``client``."""
    got = client.show(node)
    if isinstance(got, ProbeError):
        return got
    return next(n for n in got if n.name == node)


def _first_line(res: CommandResult) -> str:
    lines = (res.stderr or res.stdout).strip().splitlines()
    return lines[0] if lines else ""
