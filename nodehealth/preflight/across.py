"""``preflight --nccl --across``: one all-reduce over every node of the step, after the local checks passed.

nccl-tests' ``all_reduce_perf`` built with MPI=1 learns its place from MPI: ``MPI_Init``, then
``MPI_Comm_size``/``MPI_Comm_rank`` give the processes; each process drives ``-g`` GPUs and is NCCL
ranks ``proc*g .. proc*g+g-1`` (src/common.cu); process 0 makes the ``ncclUniqueId`` and
``MPI_Bcast``s it; only process 0 prints the table. Under ``srun --mpi=pmix`` the MPI library
finds the PMIx server of the step in the task's environment (``PMIX_*``), so each pre-flight rank
runs its part as its own child with that environment passed on: one process per node, one
communicator over the step. Under ``srun --mpi=pmi2`` the task holds an open socket to the PMI
server, ``PMI_FD=<n>`` beside ``PMI_RANK``/``PMI_SIZE``: that one descriptor is kept open in the
child (``launch_fds``; ``proc.run``'s ``pass_fds`` passes only an open socket above 2), nothing else
of this process; a ``PMI_FD`` that is not such a socket is not passed, nor the variable, and the
part's notes say why. Launched without an MPI plugin, every copy is a one-process world of
its own: the table then lists one node's devices, which ``judge`` names.

Each rank parses its own ``NCCL_DEBUG=INFO`` output (``nccl.transport``; the table with
``nccl.parse`` on rank 0) and publishes only the summary (``part``), bounded by ``schema``; rank 0
turns the parts into findings that name the node whose connections went over ``NET/Socket``, or
lost GPUDirect RDMA, beside the bandwidth of the whole ring.
"""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Any, Mapping, Optional, Sequence

from nodehealth.config.schema import Config
from nodehealth.nccl.transport import net_kind
from nodehealth.preflight.judge import Finding
from nodehealth.xid.text import printable

# What the MPI library of the child needs to find its place in the step (never LD_*, PYTHON*, PATH).
LAUNCH_PREFIXES = ("PMIX_", "PMI_", "OMPI_", "SLURM_")
MAX_PAIRS = 64
_FD_RE = re.compile(r"^[0-9]{1,9}$")
# "Channel 00/0 : 7[7] -> 8[0] [send] via NET/IB/0/GDRDMA" (2.12 on; "%d[%lx]" before 2.18, "%d(%d)" with PXN)
_NET_CHANNEL_RE = re.compile(
    r"Channel \d+(?:/\d+)? : (\d+)(?:\[[0-9a-fA-Fx]+\])?(?:\(\d+\))? -> (\d+)(?:\[[0-9a-fA-Fx]+\])?(?:\(\d+\))?"
    r" (?:\[(send|receive)\] )?via NET/([A-Za-z][\w .-]*?)/\d+((?:/GDRDMA)?)"
)


def launch_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables of this task that tell an MPI program its rank (PMIx, PMI, Open MPI, Slurm)."""
    return {k: v for k, v in environ.items() if k.startswith(LAUNCH_PREFIXES) and len(v) < 4096}


def launch_fds(env: Mapping[str, str]) -> tuple[tuple[int, ...], dict[str, str], list[str]]:
    """The PMI2 socket named by ``env``'s ``PMI_FD``, to keep open in the child: (the descriptors, ``env``
    without ``PMI_FD`` when it is not passed, the notes why not)."""
    from nodehealth.platform import proc

    value = env.get("PMI_FD")
    if value is None:
        return (), dict(env), []
    rest = {k: v for k, v in env.items() if k != "PMI_FD"}
    if not ("PMI_RANK" in env and "PMI_SIZE" in env):
        why = "no PMI_RANK and PMI_SIZE beside it (not a PMI2 launch)"
    elif not _FD_RE.match(value):
        why = "not a descriptor number"
    else:
        why = proc.fd_problem(int(value))
    if why:
        return (), rest, [f"PMI_FD={printable(value[:32], 32)} not passed to all_reduce_perf: {why}"]
    return (int(value),), dict(env), []


def net_pairs(text: str) -> dict[str, dict[str, Any]]:
    """``"src->dst"`` NCCL ranks -> ``{"net": name, "gdr": bool}`` from the NET channel lines (first seen)."""
    out: dict[str, dict[str, Any]] = {}
    for m in _NET_CHANNEL_RE.finditer(text):
        src, dst, _, net, gdr = m.groups()
        key = f"{src}->{dst}"
        if key not in out:
            if len(out) >= MAX_PAIRS:
                break
            out[key] = {"net": net.strip(), "gdr": bool(gdr)}
    return out


def summarize(text: str, leader: bool) -> dict[str, Any]:
    """What a rank publishes of its part's output (pure): transport, NET pairs, the table on rank 0."""
    from nodehealth.nccl import parse, transport
    from nodehealth.nccl.results import ParseError

    tr = transport.classify(text)
    out: dict[str, Any] = {
        "transport": tr.transport,
        "network": tr.network,
        "fatal": tr.fatal,
        "errors": list(tr.errors[:3]),
        "pairs": net_pairs(text),
    }
    if leader:
        try:
            perf = parse.parse_perf(text)
            out["perf"] = {"ranks": perf.ranks, "busbw_gbps": perf.avg_busbw_gbps, "wrong": perf.wrong}
        except (ParseError, ValueError) as exc:
            out["perf_error"] = str(exc)
    return out


def run_part(cfg: Config, environ: Mapping[str, str], timeout_s: float, leader: bool, gpus: int = 0) -> dict[str, Any]:
    """This rank's process of the all-reduce (``[checks.nccl_selftest]``'s nccl-tests binary, MPI build)."""
    from nodehealth.nccl import plan as nplan
    from nodehealth.platform import proc

    settings = cfg.checks["nccl_selftest"]
    p = dataclasses.replace(nplan.Plan.from_settings(settings), runner="nccl-tests")
    _, problem, _ = nplan.choose_runner(p)
    if problem:
        return {"setup_error": problem}
    gpus = int(getattr(settings, "gpus", 0) or 0) or gpus or 1  # else the node's count (NVML)
    fds, env, notes = launch_fds({**launch_env(environ), **nplan.child_env(nplan.mode_env("nvlink"), p.env)})
    argv = nplan.argv_for("nccl-tests", p, gpus, None)
    t0 = time.monotonic()
    try:
        res = proc.run(argv, timeout_s, env=env, max_output=1 << 20, allow=tuple(env), pass_fds=fds)
    except proc.CommandError as exc:
        return {"setup_error": str(exc), "notes": notes}
    text = res.stdout + ("\n" + res.stderr if res.stderr else "")
    out = summarize(text, leader)
    out.update(
        notes=notes + list(res.notes),
        gpus=gpus,
        returncode=res.returncode,
        timed_out=res.timed_out,
        truncated=res.truncated,
        elapsed_s=round(time.monotonic() - t0, 2),
        timeout_s=timeout_s,
    )
    return out


def _node_of(nccl_rank: int, gpus: int, nodes: Sequence[str]) -> str:
    i = nccl_rank // max(1, gpus)
    return nodes[i] if 0 <= i < len(nodes) else f"NCCL rank {nccl_rank}"


def judge(
    nodes: Sequence[str], parts: Mapping[int, Mapping[str, Any]], expect_ib: bool, min_busbw: float
) -> list[Finding]:
    """The parts of every rank become findings naming nodes (pure)."""
    out: list[Finding] = []
    gpus = int((parts.get(0) or {}).get("gpus") or 1)
    bad_links: dict[str, list[str]] = {}
    nogdr: dict[str, list[str]] = {}
    hung = [n for r, n in enumerate(nodes) if (parts.get(r) or {}).get("timed_out")]
    # Every rank waits for a hung one: when all timed out, the ones that never connected are named.
    silent = [n for r, n in enumerate(nodes) if n in hung and not (parts.get(r) or {}).get("pairs")]
    if hung and len(hung) == len(nodes):
        who = silent if 0 < len(silent) < len(nodes) else ["job"]
        for node in who:
            out.append(
                Finding(
                    "FAIL",
                    node,
                    "the all-reduce across the allocation did not finish by its deadline"
                    + (" and this node never connected to its peers" if node != "job" else ""),
                )
            )
    for r, node in enumerate(nodes):
        part = parts.get(r)
        if part is None:
            out.append(Finding("FAIL", node, "no all-reduce result (the rank stopped or could not write it)"))
            continue
        if part.get("setup_error"):
            out.append(Finding("FAIL", node, f"all-reduce across the allocation not run: {part['setup_error']}"))
            continue
        if part.get("timed_out"):
            if len(hung) == len(nodes):
                continue
            out.append(
                Finding(
                    "FAIL",
                    node,
                    f"its part of the all-reduce did not finish within {float(part.get('timeout_s') or 0):.1f} s "
                    "(hung, or waiting for a peer that never came)" + _noted(part),
                )
            )
        elif part.get("truncated"):
            out.append(Finding("FAIL", node, "its part of the all-reduce printed past the output cap and was ended"))
        elif part.get("returncode") not in (0, None) or part.get("fatal"):
            first = next(iter(part.get("errors") or ()), "")
            out.append(
                Finding(
                    "FAIL",
                    node,
                    f"its part of the all-reduce failed (exit {part.get('returncode')}) {first}".strip() + _noted(part),
                )
            )
        for key, link in sorted((part.get("pairs") or {}).items()):
            src, _, dst = key.partition("->")
            if not (src.isdigit() and dst.isdigit()):
                continue
            pair = f"{_node_of(int(src), gpus, nodes)}->{_node_of(int(dst), gpus, nodes)}"
            net = str(link.get("net") or "")
            if net_kind(net) == "socket":
                bad_links.setdefault(node, []).append(f"{pair} via NET/{net}")
            elif net_kind(net) == "ib" and not link.get("gdr"):
                nogdr.setdefault(node, []).append(pair)
    for node, pairs in bad_links.items():
        out.append(
            Finding(
                "FAIL" if expect_ib else "WARN",
                node,
                f"the all-reduce across the allocation went over TCP, not InfiniBand: {', '.join(sorted(set(pairs)))}",
            )
        )
    # GPUDirect RDMA lost on a minority of nodes: their NICs copy through host memory (a slower link).
    with_gdr = [n for r, n in enumerate(nodes) if (parts.get(r) or {}).get("pairs") and n not in nogdr]
    if nogdr and with_gdr:
        for node, pairs in nogdr.items():
            out.append(
                Finding(
                    "WARN",
                    node,
                    f"its InfiniBand connections have no GPUDirect RDMA ({', '.join(sorted(set(pairs)))}), "
                    f"the other nodes' have (nvidia-peermem not loaded?)",
                )
            )
    perf = (parts.get(0) or {}).get("perf") or {}
    want = gpus * len(nodes)
    if parts.get(0) and not parts[0].get("setup_error") and not parts[0].get("timed_out"):
        if not perf:
            why = (parts.get(0) or {}).get("perf_error") or "no table"
            out.append(Finding("FAIL", "job", f"all-reduce across the allocation gave no result table ({why})"))
        elif perf.get("ranks") is not None and perf["ranks"] != want and len(nodes) > 1:
            out.append(
                Finding(
                    "FAIL",
                    "job",
                    f"all_reduce_perf did not run as one communicator: {perf['ranks']} rank(s), not {want} "
                    "(an MPI build of nccl-tests, started by srun --mpi=pmix or --mpi=pmi2, is needed)"
                    + "".join(f"; {nodes[r]}{_noted(parts[r])}" for r in range(len(nodes)) if _noted(parts.get(r))),
                )
            )
        elif min_busbw > 0 and isinstance(perf.get("busbw_gbps"), (int, float)) and perf["busbw_gbps"] < min_busbw:
            named = sorted(set(bad_links) | set(nogdr))
            which = (
                f"; the slow link: {', '.join(named)}"
                if named
                else "; no node's log tells which link (run the pairs one by one)"
            )
            out.append(
                Finding(
                    "FAIL",
                    named[0] if len(named) == 1 else "job",
                    f"all-reduce across {len(nodes)} node(s): {perf['busbw_gbps']:g} GB/s bus bandwidth, "
                    f"below {min_busbw:g}{which}",
                )
            )
    return out


def _noted(part: Optional[Mapping[str, Any]]) -> str:
    """A part's notes (a launch descriptor not passed), as the end of its finding ("" when none)."""
    notes = [n for n in (part or {}).get("notes") or () if isinstance(n, str)][:2]
    return f": {'; '.join(notes)}" if notes else ""


def busbw(parts: Mapping[int, Mapping[str, Any]]) -> Optional[float]:
    perf = (parts.get(0) or {}).get("perf") or {}
    v = perf.get("busbw_gbps")
    return float(v) if isinstance(v, (int, float)) else None
