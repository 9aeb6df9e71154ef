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

One node is read with ``sinfo -h -N -n NODE -O ...`` (the ``sinfo`` beside ``scontrol``):
slurmctld packs that one node (``REQUEST_NODE_INFO_SINGLE``), where ``scontrol show node NODE``
has it pack every node of the cluster and filters on its own side (docs/operations.md, "How
often nodehealth talks to slurmctld"). Its records end with a fresh random token, so a reason
holding ``|`` or newlines cannot forge a record. A node sinfo does not list (in no partition),
or no ``sinfo`` beside ``scontrol``, is read with ``scontrol show node -o NODE`` as before.

A read of this node that failed (slurmctld down, overloaded, or no Slurm answering here) is not made
again every round: ``BACKOFF`` holds, for the process, when it failed and how many times in a row,
and the next read for the same node, scontrol and state dir waits ``RETRY_FIRST_S``, doubled after
each failure in a row up to ``RETRY_MAX_S`` (or ``[slurm] reconcile_s`` if shorter), shifted by the
node's own jitter. The ``slurm_node`` probe and the healthy node's reconciliation (``act.after_check``)
ask it; a fault's drain and a due resume never wait for it. At 10,000 nodes and 30 s rounds,
retrying every round is 333 calls a second at a slurmctld that already does not answer; backed
off, about 10 within half an hour. A one-shot health check starts with none.
"""

from __future__ import annotations

import os
import shlex
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Protocol, TypeVar, Union

from nodehealth.observations import ProbeError
from nodehealth.platform.deadline import Deadline
from nodehealth.platform.proc import CommandError, CommandResult, refuse, run
from nodehealth.slurm.nodes import NodeInfo, parse_nodes, parse_sinfo_node, reconcile_after_s, sinfo_format

# ``scontrol show node -o`` of a 10,000-node cluster is a few MiB; one node's is under 2 KiB.
MAX_ANSWER = 16 << 20
MAX_NODE_ANSWER = 256 << 10  # ``show node -o NODE``: one record, a hundred times its usual size
RETRY_FIRST_S = 60.0  # after a failed read of this node, the next one waits this long (doubled after each)
RETRY_MAX_S = 960.0  # ... up to this: once slurmctld answers again, a node reads itself within ~16 minutes


def retry_after_s(node: str, failures: int, reconcile_s: float) -> float:
    """How long after the ``failures``-th failed read in a row the next one may be made: doubled each
    time, at most RETRY_MAX_S (or reconcile_s), shifted by the node's jitter (``reconcile_after_s``), so
    that nodes whose reads failed together do not all ask again at the same moment."""
    base = min(reconcile_s, RETRY_MAX_S, RETRY_FIRST_S * 2.0 ** min(max(failures - 1, 0), 16))
    return reconcile_after_s(node, base)


T = TypeVar("T")


class Backoff:
    """Failed reads of a node, by (node, scontrol, state dir): see the module's docstring."""

    def __init__(self) -> None:
        self._failed: dict[tuple[str, str, str], tuple[float, int, ProbeError]] = {}
        self._lock = threading.Lock()

    @staticmethod
    def key(cfg: Any, node: str) -> tuple[str, str, str]:
        return (node, cfg.slurm.scontrol, str(cfg.paths.state_dir))

    def waiting(self, cfg: Any, node: str, now: float) -> Optional[ProbeError]:
        """The last failure, saying when the next read is due, while the back-off lasts; else None."""
        with self._lock:
            failed = self._failed.get(self.key(cfg, node))
        if failed is None:
            return None
        at, failures, error = failed
        wait = retry_after_s(node, failures, cfg.slurm.reconcile_s) - (now - at)
        if wait <= 0:
            return None
        return ProbeError(
            error.probe, error.kind, f"{error.message} ({failures} failed read(s) in a row; the next in {wait:.0f} s)"
        )

    def answered(self, cfg: Any, node: str, got: object, now: float) -> None:
        """Note a read's outcome: a failure starts or lengthens the back-off, an answer ends it."""
        key = self.key(cfg, node)
        with self._lock:
            if isinstance(got, ProbeError):
                last = self._failed.get(key)
                self._failed[key] = (now, (last[1] if last else 0) + 1, got)
            else:
                self._failed.pop(key, None)

    def read(
        self, cfg: Any, node: str, read: Callable[[], T], clock: Callable[[], float] = time.monotonic
    ) -> Union[T, ProbeError]:
        """``read()`` and its outcome noted; while the back-off lasts, no read: the last failure, saying
        when the next read is due (``waiting``)."""
        waiting = self.waiting(cfg, node, clock())
        if waiting is not None:
            return waiting
        got = read()
        self.answered(cfg, node, got, clock())
        return got

    def held(self, cfg: Any, node: str) -> bool:
        with self._lock:
            return self.key(cfg, node) in self._failed


BACKOFF = Backoff()


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

    def reboot(self, node: str, reason: str) -> UpdateOutcome:
        """Ask Slurm to reboot ``node`` once it is idle and resume it after (``slurm.reboot``)."""


def environment(slurm_conf: str = "", base: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    """What scontrol gets on top of ``proc.BASE_ENV``: ``SLURM_CONF`` (``base``'s, else ``slurm_conf``)."""
    given = (os.environ if base is None else base).get("SLURM_CONF") or slurm_conf
    return {"SLURM_CONF": given} if given else {}


class Scontrol:
    """``SlurmClient`` through the ``scontrol`` command, every call bounded by ``deadline``."""

    def __init__(
        self,
        scontrol: str,
        per_call_s: float,
        deadline: Deadline,
        slurm_conf: str = "",
        environ: Optional[Mapping[str, str]] = None,
        sinfo: Optional[str] = None,
    ) -> None:
        self.scontrol, self.per_call_s, self.deadline = scontrol, per_call_s, deadline
        self.env = environment(slurm_conf, environ)
        self.calls = 0
        # One node's read: sinfo (None: the one beside scontrol when there is one; "": never sinfo).
        self.sinfo = sinfo_beside(scontrol) if sinfo is None else sinfo

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
            return ProbeError(
                "slurmctl",
                "invalid",
                f"{shlex.join(res.argv[:3])} answered more than {max_answer} bytes: not read further",
            )
        return res

    def show(self, node: Optional[str]) -> Union[list[NodeInfo], ProbeError]:
        """``node``'s record (``sinfo -n NODE``), or ``scontrol show node -o`` of every node.

        One node's answer may be at most ``MAX_NODE_ANSWER`` bytes.
        """
        if node and self.sinfo:
            got = self._sinfo_node(node)
            if got is not None:
                return got
        res = self._call(
            [self.scontrol, "show", "node", "-o"] + ([node] if node else []), MAX_NODE_ANSWER if node else MAX_ANSWER
        )
        if isinstance(res, ProbeError):
            return res
        if res.returncode != 0:
            return ProbeError("slurmctl", "error", f"scontrol exit {res.returncode}: {_first_line(res)}")
        nodes = parse_nodes(res.stdout)
        if node is not None and not any(n.name == node for n in nodes):
            return ProbeError("slurmctl", "invalid", f"scontrol did not describe node {node}")
        return nodes

    def _sinfo_node(self, node: str) -> Union[list[NodeInfo], ProbeError, None]:
        """``sinfo -h -N -n NODE -O ...`` (slurmctld packs this node alone); None: sinfo has no record of it."""
        # os.urandom is what secrets.token_hex reads; the secrets module would bring hmac and OpenSSL's
        # libcrypto (3.4 MiB of the daemon's RSS) for this one token.
        end = f"@nh{os.urandom(8).hex()}@"
        res = self._call([self.sinfo, "-h", "-N", "-n", node, "-O", sinfo_format(end)], MAX_NODE_ANSWER)
        if isinstance(res, ProbeError):
            return res
        if res.returncode != 0:
            return ProbeError("slurmctl", "error", f"sinfo exit {res.returncode}: {_first_line(res)}")
        got = parse_sinfo_node(res.stdout, node, end)
        if isinstance(got, str):
            return ProbeError("slurmctl", "invalid", f"sinfo's answer for node {node} is not one: {got}")
        return None if got is None else [got]

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

    def reboot(self, node: str, reason: str) -> UpdateOutcome:
        """``scontrol reboot ASAP nextstate=RESUME reason=... NODE``: Slurm drains the node (ASAP), runs
        ``RebootProgram`` once it is idle, and resumes it when it registers after the boot, clearing
        the reason (22.05; meanwhile it appends " : reboot issued" to it)."""
        res = self._call([self.scontrol, "reboot", "ASAP", "nextstate=RESUME", f"reason={reason}", node])
        if isinstance(res, ProbeError):
            return UpdateOutcome(False, res.message, timed_out=res.kind == "timeout")
        if res.returncode != 0:
            return UpdateOutcome(False, f"scontrol exit {res.returncode}: {_first_line(res)}")
        return UpdateOutcome(True, "ok")


def sinfo_beside(scontrol: str) -> str:
    """The ``sinfo`` in ``scontrol``'s directory (Slurm installs its commands together), or "" if none.

    Only one the runner would start (root's, nobody else can write it or its directories: the
    rule ``[slurm] scontrol`` is held to); else nodes are read with ``scontrol`` as before.
    """
    path = os.path.join(os.path.dirname(scontrol), "sinfo")
    return path if os.path.isabs(path) and os.path.isfile(path) and not refuse([path]) else ""


def me(client: SlurmClient, node: str) -> Union[NodeInfo, ProbeError]:
    """This node's record through ``client``."""
    got = client.show(node)
    if isinstance(got, ProbeError):
        return got
    return next(n for n in got if n.name == node)


def _first_line(res: CommandResult) -> str:
    lines = (res.stderr or res.stdout).strip().splitlines()
    return lines[0] if lines else ""
