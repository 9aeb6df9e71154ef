"""One rank of ``nodehealth preflight``: local facts, the exchange, and (rank 0) the allocation's report.

Time: every deadline counts from the process's start (``platform.deadline``), as srun starts
all tasks together. The local checks get half the timeout; the ring peers are awaited until
``timeout - margin``; rank 0 collects until ``timeout`` and everyone else awaits the verdict
until ``timeout + VERDICT_GRACE_S``. A shared directory that hangs (a stuck NFS mount) cannot
hold a rank past ``timeout + WATCHDOG_S``: a watchdog prints why and ends the process.

``--across`` (``preflight.across``): when rank 0's verdict passes every node, it says so in the
verdict (``across``); every rank then runs its part of one all-reduce over the step (at most
``nccl_timeout``, ending by ``across_until``), writes ``a<rank>.json``, and waits for rank 0's
``final.json``; the watchdog moves by ``nccl_timeout + 2 * VERDICT_GRACE_S``. A failed verdict
runs no all-reduce (a missing rank would only make the others wait for it).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import IO, Any, Callable, Iterator, Mapping, Optional

from nodehealth.config.schema import Config
from nodehealth.platform.deadline import process_age_s
from nodehealth.preflight import across, exchange, hygiene, judge, local, schema
from nodehealth.preflight.ranks import Rank

VERDICT_GRACE_S = 3.0
CLOSE_GRACE_S = 2.0
WATCHDOG_S = 10.0
JOIN_S = 2.0  # rank 0 collects for at least this long (or the timeout) after its pointer appeared
EXIT_OK, EXIT_FAIL, EXIT_CANNOT = 0, 1, 2
# srun's address for this step's tasks: the same for every rank of a step, another for the next step.
STEP_KEY_VARS = ("SLURM_SRUN_COMM_HOST", "SLURM_SRUN_COMM_PORT", "SLURM_STEP_LAUNCHER_PORT")


@dataclass
class Options:
    shared_dir: str
    paths: tuple[str, ...] = ()
    checkpoints: tuple[str, ...] = ()
    nccl: bool = False
    expect_ib: bool = False
    across: bool = False  # with nccl: one all-reduce over every node once all passed (preflight.across)
    min_busbw_gbps: float = 0.0  # with across: the ring's bus bandwidth must reach this (0: not judged)
    nccl_timeout_s: float = 60.0
    drain: bool = False
    timeout_s: float = 10.0
    fmt: str = "text"
    local_checks: bool = True  # False: the coordination only (the scale bench)
    ops_file: str = ""  # where to write this rank's shared-FS operation counts (the scale bench)
    extra: dict[str, Any] = field(default_factory=dict)


def _watchdog(until: float, node: str, where: str, out: IO[str]) -> None:
    def body() -> None:
        left = until - time.monotonic()
        if left > 0:
            time.sleep(left)
        out.write(f"FAIL {node}: preflight did not finish by its deadline: {where} did not answer (a hung mount?)\n")
        out.flush()
        os._exit(EXIT_FAIL)

    threading.Thread(target=body, name="preflight-watchdog", daemon=True).start()


def local_report(
    cfg: Optional[Config], rank: Rank, opts: Options, environ: Mapping[str, str], started: float
) -> dict[str, Any]:
    rep: dict[str, Any] = {"rank": rank.rank, "node": rank.node, "pid": os.getpid(), "expect_ib": opts.expect_ib}
    if not opts.local_checks or cfg is None:
        return rep
    from nodehealth import runner

    pending = local.start_paths(opts.paths, opts.checkpoints, max(0.5, opts.timeout_s * 0.4))
    budget = max(2.0, opts.timeout_s * 0.6 - (time.monotonic() - started))
    outcome = runner.execute(cfg, phase="prolog", node=rank.node, environ=environ, budget_s=budget, look_only=True)
    rep["health"] = local.health(outcome.report, cfg.policy.unknown)
    try:
        rep["daemon_fault"] = local.daemon_fault(environ)
    except Exception as exc:  # noqa: BLE001 - the daemon's verdict is extra evidence, never required
        rep["daemon_fault"] = None
        rep["daemon_note"] = f"{type(exc).__name__}: {exc}"
    rep["paths"] = pending.collect(cfg.paths.procfs_root)
    rep["facts"] = local.facts(outcome.observations)
    if opts.nccl:
        rep["nccl"] = local.nccl(cfg, opts.expect_ib, opts.nccl_timeout_s, rank.node)
    if opts.drain and rep["health"]["hardware"]:
        rep["drain"] = drain(cfg, rank, outcome.report, environ)
    return rep


def drain(cfg: Config, rank: Rank, report: Any, environ: Mapping[str, str]) -> dict[str, Any]:
    """This node's hardware fault through the one drain sequence (``slurm.act.on_fault``: ownership, breaker)."""
    from nodehealth.platform.deadline import Deadline
    from nodehealth.slurm import act, observe
    from nodehealth.slurm.client import Scontrol
    from nodehealth.statedir import layout

    said: list[str] = []
    deadline = Deadline(max(1.0, 2 * cfg.slurm.timeout_s))
    real = Scontrol(cfg.slurm.scontrol, cfg.slurm.timeout_s, deadline, cfg.slurm.conf, environ)
    client = observe.client(cfg, rank.node, real, lambda message, notable=False: said.append(message))
    actor = act.Actor(
        cfg=cfg,
        node=rank.node,
        phase="manual",
        client=client,
        deadline=deadline,
        log=lambda message, notable=False: said.append(message),
        boot_id=layout.read_boot_id(cfg.paths.procfs_root),
        job_id=rank.job_id,
    )
    got = act.on_fault(actor, report)
    if got.outcome.drained_by_us:
        return {"ok": True, "outcome": got.outcome.value, "text": f"drained ({said[-1] if said else 'ours'})"}
    text = said[-1] if said else got.outcome.value
    if got.outcome == act.ActOutcome.UNREACHABLE and "denied" in text.lower():
        text += " (draining needs Slurm operator rights: ask an administrator, or run without --drain)"
    ok = got.outcome in (act.ActOutcome.OTHER, act.ActOutcome.HELD, act.ActOutcome.DISABLED)
    return {"ok": ok, "outcome": got.outcome.value, "text": f"not drained: {text}"}


@contextmanager
def _exchange(
    rank: Rank, opts: Options, environ: Mapping[str, str], clock: Callable[[], float]
) -> Iterator[exchange.Exchange]:
    """This step's exchange, released however the rank ends (and, for the scale bench, its counts written)."""
    key = ":".join(environ.get(k, "") for k in STEP_KEY_VARS) if any(k in environ for k in STEP_KEY_VARS) else ""
    ex = exchange.Exchange(opts.shared_dir, rank, clock=clock, step_key=key)
    try:
        yield ex
    finally:
        ex.release()
        if opts.ops_file:  # a fresh name (the scale bench's own directory): never written through a link
            fd = os.open(opts.ops_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump({"rank": rank.rank, **ex.ops.to_json()}, fh)


def preflight(
    cfg: Optional[Config],
    rank: Rank,
    opts: Options,
    environ: Mapping[str, str],
    out: IO[str] = sys.stdout,
    scontrol: str = "/usr/bin/scontrol",
    slurm_conf: str = "",
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """This rank's part; the exit code (every rank: 0 the allocation passed, 1 it failed)."""
    with _exchange(rank, opts, environ, clock) as ex:
        started = clock() - process_age_s()
        total = opts.timeout_s + (opts.nccl_timeout_s if opts.nccl else 0.0)
        # --across: after the verdict, every rank's part of the all-reduce ends by across_until.
        across_until = started + total + VERDICT_GRACE_S + opts.nccl_timeout_s
        extra_s = opts.nccl_timeout_s + 2 * VERDICT_GRACE_S if opts.across else 0.0
        _watchdog(started + total + VERDICT_GRACE_S + extra_s + WATCHDOG_S, rank.node, opts.shared_dir, out)
        hyg: dict[str, Any] = {}
        collect_until = started + total  # rank 0: the others join only once its pointer is there
        if rank.leader and opts.local_checks:
            nodelist = environ.get("SLURM_JOB_NODELIST", "")

            def hygiene_body() -> None:
                hyg["result"] = hygiene.check(
                    environ, scontrol, slurm_conf, rank.job_id, nodelist, rank.nodelist, execute=_execute
                )

            t = threading.Thread(target=hygiene_body, name="preflight-hygiene", daemon=True)
            t.start()
        try:
            ex.open_shared()
            if rank.leader:
                collect_until = max(collect_until, clock() + min(total, JOIN_S))
                ex.create(until_wall=time.time() + (collect_until - clock()))
        except exchange.Taken as exc:
            return _cannot(out, rank, exc)
        except OSError as exc:
            out.write(f"FAIL {rank.node}: cannot use the shared directory {opts.shared_dir}: {exc}\n")
            return EXIT_FAIL
        try:
            rep = local_report(cfg, rank, opts, environ, started)
        except Exception as exc:  # noqa: BLE001 - a node we cannot check is named, the exchange still runs
            rep = {"rank": rank.rank, "node": rank.node, "error": f"{type(exc).__name__}: {exc}"}
        rep["shared"] = shared_mount(opts.shared_dir, cfg)
        margin = min(1.0, opts.timeout_s * 0.25)
        sh = rep["shared"]
        if not rank.leader:
            try:
                joined = ex.join(started + total + VERDICT_GRACE_S)  # as long as it would wait for the verdict
            except exchange.Taken as exc:
                return _cannot(out, rank, exc)
            if not joined:
                out.write(
                    f"FAIL {rank.node}: no verdict from the first node in {opts.shared_dir} within "
                    f"{total + VERDICT_GRACE_S:g} s: the directory is not shared with {rank.node} "
                    f"(no {ex.pointer} appeared there; here it is {sh.get('fstype')} at {sh.get('mount')})\n"
                )
                return EXIT_FAIL
        ex.publish(rep)
        ring_until = collect_until - margin
        if not rank.leader and ex.leader_until_wall:  # as long as rank 0 collects (ranks start at different times)
            ring_until = max(
                ring_until,
                min(clock() + ex.leader_until_wall - time.time() - margin, started + total + VERDICT_GRACE_S - margin),
            )
        view = ex.ring(ring_until)
        if not rank.leader:
            v = ex.await_verdict(started + total + VERDICT_GRACE_S)
            if v is None:
                ex.leave_unshared()
                blind = ", ".join(f"{rank.node_of(int(p))} {got}" for p, got in view["peers"].items())
                out.write(
                    f"FAIL {rank.node}: no verdict from the first node in {ex.dir} within "
                    f"{total + VERDICT_GRACE_S:g} s: the directory is not shared with {rank.node} "
                    f"(peers: {blind}; here it is {sh.get('fstype')} at {sh.get('mount')})\n"
                )
                return EXIT_FAIL
            if v.get("across"):
                ex.write(f"a{rank.rank}.json", _part(cfg, rank, opts, environ, rep, across_until, clock))
                v = ex.await_verdict(across_until + 2 * VERDICT_GRACE_S, exchange.FINAL) or {"ok": False}
                if not v.get("ok") and not ex.exists(exchange.FINAL):
                    out.write(f"FAIL {rank.node}: no verdict after the all-reduce across the allocation\n")
                ex.remove(f"a{rank.rank}.json")
            ex.leave()
            return EXIT_OK if v.get("ok") else EXIT_FAIL
        g = ex.gather(collect_until)
        nodes = list(rank.nodelist) or [str(g.reports.get(r, {}).get("node") or f"rank{r}") for r in range(rank.size)]
        for r, doc in g.reports.items():  # a rank's own name wins over the list's order, never outside the list
            if doc.get("node") and (not rank.nodelist or doc["node"] in rank.nodelist):
                nodes[r] = str(doc["node"])
        findings = judge.visibility(nodes, g.reports, g.peer_views, opts.shared_dir, total)
        for r, doc in sorted(g.reports.items()):
            findings += judge.local(nodes[r], doc)
        findings += judge.consistency(g.reports, nodes)
        for r, why in sorted(g.unreadable.items()):
            findings.append(judge.Finding("FAIL", nodes[r], f"its file in the exchange was refused: {why}"))
        notes: list[str] = []
        if rank.leader and opts.local_checks:
            t.join(max(0.0, hygiene.CALL_S * 2 - (clock() - started)))
            more, notes = hyg.get("result", ([], ["note: job hygiene not checked (scontrol did not finish)"]))
            findings += more
        v = judge.verdict(findings)
        parts: dict[int, dict[str, Any]] = {}
        if opts.across and v["ok"] and rank.size > 1:
            ex.announce({**v, "across": True})
            own = _part(cfg, rank, opts, environ, g.reports.get(0, {}), across_until, clock)
            parts = {0: schema.across_part(own, 0)}  # rank 0's own output is bounded and printable too
            parts.update(_gather_parts(ex, rank.size, across_until + VERDICT_GRACE_S, clock))
            findings += across.judge(nodes, parts, opts.expect_ib, opts.min_busbw_gbps)
            bw = across.busbw(parts)
            notes.append(
                f"all-reduce across {len(nodes)} node(s): " + (f"{bw:g} GB/s bus bandwidth" if bw else "no table")
            )
            v = judge.verdict(findings)
            ex.write(exchange.FINAL, v)
        else:
            ex.announce(v)
        leftovers = ex.close(clock() + CLOSE_GRACE_S)
        if leftovers:
            notes.append(f"note: removed what stopped ranks left: {', '.join(leftovers)}")
        notes.extend(ex.notes)
        head = {"job": rank.job_id, "step": rank.step_id, "shared_dir": opts.shared_dir, "elapsed_s": clock() - started}
        if opts.fmt == "json":
            doc = {
                **head,
                "nodes": nodes,
                "verdict": v,
                "findings": [f.to_json() for f in findings],
                "notes": notes,
                "ops_rank0": ex.ops.to_json(),
                "reports": {nodes[r]: d for r, d in sorted(g.reports.items())},
                "across": {nodes[r]: d for r, d in sorted(parts.items()) if r < len(nodes)},
            }
            out.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")
        else:
            out.write(judge.render_text(nodes, findings, head, notes))
        out.flush()
        return EXIT_OK if v["ok"] else EXIT_FAIL


def _part(
    cfg: Optional[Config],
    rank: Rank,
    opts: Options,
    environ: Mapping[str, str],
    rep: Mapping[str, Any],
    until: float,
    clock: Callable[[], float],
) -> dict[str, Any]:
    """This rank's part of the all-reduce, ended by ``until``, as ``a<rank>.json`` holds it."""
    left = min(opts.nccl_timeout_s, until - clock())
    if cfg is None or left < 1.0:
        return {"rank": rank.rank, "node": rank.node, "setup_error": "no time left before the deadline"}
    gpus = (rep.get("facts") or {}).get("gpu_count")
    try:
        part = across.run_part(cfg, environ, left, rank.leader, gpus if isinstance(gpus, int) else 0)
    except Exception as exc:  # noqa: BLE001 - a part that cannot run is this node's finding
        part = {"setup_error": f"{type(exc).__name__}: {exc}"}
    return {**part, "rank": rank.rank, "node": rank.node}


def _gather_parts(
    ex: exchange.Exchange, size: int, until: float, clock: Callable[[], float]
) -> dict[int, dict[str, Any]]:
    """Rank 0: the other ranks' ``a<r>.json`` (until ``until``); a refused one is that node's setup error."""
    wanted = {f"a{r}.json" for r in range(1, size)}
    while clock() < until and not wanted <= ex.listing():
        ex.sleep(0.05)
    parts: dict[int, dict[str, Any]] = {}
    for r in range(1, size):
        try:
            if ex.exists(f"a{r}.json"):
                parts[r] = schema.across_part(ex.read(f"a{r}.json"), r)
        except (OSError, ValueError) as exc:
            parts[r] = {"setup_error": f"its all-reduce result was refused: {schema.printable(str(exc), 300)}"}
    return parts


def _cannot(out: IO[str], rank: Rank, exc: Exception) -> int:
    """The exchange cannot be set up: said, and no node judged (never a verdict, never a drain)."""
    out.write(f"nodehealth preflight: cannot run on {rank.node}: {exc}\n")
    out.flush()
    return EXIT_CANNOT


def _execute(argv: Any, timeout_s: float, env: Optional[Mapping[str, str]] = None) -> Any:
    from nodehealth.platform.proc import run

    return run(argv, timeout_s, env=env)


def shared_mount(path: str, cfg: Optional[Config]) -> dict[str, Any]:
    entries = local.mountinfo(cfg.paths.procfs_root if cfg is not None else "/proc")
    e = local.containing_mount(entries, os.path.realpath(path))
    return {
        "dir": path,
        "fstype": e.fstype if e else None,
        "mount": e.mount_point if e else None,
        "source": e.source if e else None,
    }
