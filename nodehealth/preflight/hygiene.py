"""Rank 0's job hygiene: a time limit, drained nodes, output files on node-local storage.

Two Slurm calls at most, both by rank 0 only, each bounded: ``scontrol show job -o <id>`` (the
time limit and the output files; the environment's ``SLURM_JOB_END_TIME`` answers the time limit
without a call when it is there) and ``scontrol show node -o <the job's nodes>`` (drained or
draining). A call that fails or times out is said, never a failure of the allocation.
"""

from __future__ import annotations

import os
import re
import time
from typing import Callable, Mapping, Optional, Sequence

from nodehealth.platform.proc import CommandError, CommandResult, run
from nodehealth.preflight import local
from nodehealth.preflight.judge import Finding
from nodehealth.slurm.nodes import parse_nodes

Execute = Callable[..., CommandResult]
CALL_S = 2.0
UNLIMITED = re.compile(r"^(UNLIMITED|INFINITE|NONE)$", re.I)


def _call(argv: list[str], env: Mapping[str, str], execute: Execute, timeout_s: float) -> tuple[Optional[str], str]:
    try:
        res = execute(argv, timeout_s, env=dict(env))
    except CommandError as exc:
        return None, str(exc)
    if res.timed_out:
        return None, f"{' '.join(argv[:3])} did not answer within {timeout_s:g} s"
    if res.returncode != 0:
        first = (res.stderr or res.stdout).strip().splitlines()
        return None, f"{' '.join(argv[:3])}: exit {res.returncode}: {first[0] if first else ''}"
    return res.stdout, ""


def job_fields(text: str) -> dict[str, str]:
    """``scontrol show job -o`` as fields (values may hold spaces only in the last ones; good enough here)."""
    out: dict[str, str] = {}
    for m in re.finditer(r"(?:^|\s)([A-Za-z][A-Za-z0-9:/_]*)=(\S*)", text):
        out.setdefault(m.group(1), m.group(2))
    return out


def time_limit(environ: Mapping[str, str], fields: Optional[Mapping[str, str]], now: float) -> list[Finding]:
    end = environ.get("SLURM_JOB_END_TIME", "").strip()
    if end.isdigit() and int(end) > 0:
        # Slurm writes a far-future end (year 2100+) for an unlimited job.
        return [] if int(end) - now < 50 * 365 * 86400 else [_no_limit("SLURM_JOB_END_TIME")]
    if fields is None:
        return [Finding("WARN", "job", "time limit not known (no SLURM_JOB_END_TIME, and scontrol did not answer)")]
    limit = fields.get("TimeLimit", "")
    if UNLIMITED.match(limit):
        return [_no_limit(f"TimeLimit={limit}")]
    return []


def _no_limit(source: str) -> Finding:
    return Finding(
        "WARN",
        "job",
        f"the job has no time limit ({source}): set --time so a hung run ends and the scheduler can backfill",
    )


def output_files(fields: Mapping[str, str], procfs_root: str = "/proc") -> tuple[list[Finding], list[str]]:
    out, notes = [], []
    entries = local.mountinfo(procfs_root)
    for key in ("StdOut", "StdErr"):
        path = fields.get(key, "")
        if not path or path == "(null)" or not path.startswith("/"):
            continue
        parent = os.path.dirname(path) or "/"
        why = local.locality(parent, local.containing_mount(entries, parent))
        if why:
            out.append(Finding("WARN", "job", f"the job's {key} {path} is on node-local storage ({why})"))
    if not any(fields.get(k, "(null)") not in ("", "(null)") for k in ("StdOut", "StdErr")):
        notes.append("note: the job's output files are not known to Slurm (an srun-only job): not checked")
    return out, notes


def drained(text: str, nodes: Sequence[str]) -> list[Finding]:
    out = []
    mine = set(nodes)
    for n in parse_nodes(text):
        if n.name in mine and n.drained:
            reason = f" ({n.reason.text})" if n.reason is not None and n.reason.text else ""
            word = "draining" if n.state.base in ("ALLOCATED", "MIXED", "COMPLETING") else "drained"
            out.append(
                Finding("WARN", n.name, f"is {word} in Slurm{reason}: the job will not get it back if it is requeued")
            )
    return out


def check(
    environ: Mapping[str, str],
    scontrol: str,
    slurm_conf: str,
    job_id: str,
    nodelist: str,
    nodes: Sequence[str],
    budget_s: float = 2 * CALL_S,
    execute: Execute = run,
    procfs_root: str = "/proc",
) -> tuple[list[Finding], list[str]]:
    """The hygiene findings and notes (what was not checked, and why)."""
    env = dict(environ)
    if slurm_conf and not env.get("SLURM_CONF"):
        env["SLURM_CONF"] = slurm_conf
    findings: list[Finding] = []
    notes: list[str] = []
    start = time.monotonic()
    fields: Optional[dict[str, str]] = None
    if job_id and job_id != "nojob":
        text, why = _call([scontrol, "show", "job", "-o", job_id], env, execute, min(CALL_S, budget_s))
        if text is not None:
            fields = job_fields(text)
            more, extra = output_files(fields, procfs_root)
            findings += more
            notes += extra
        else:
            notes.append(f"note: job record not read ({why}): output files not checked")
    findings += time_limit(environ, fields, time.time())
    left = budget_s - (time.monotonic() - start)
    if nodelist and left > 0.05:
        text, why = _call([scontrol, "show", "node", "-o", nodelist], env, execute, min(CALL_S, left))
        if text is not None:
            findings += drained(text, nodes)
        else:
            notes.append(f"note: node states not read ({why})")
    elif nodelist:
        notes.append("note: node states not read (no time left)")
    return findings, notes
