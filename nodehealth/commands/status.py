"""``nodehealth status``: the agent's own state, read from the state dir; changes nothing.

The daemon's last verdict and its age, whether the daemon that wrote it still runs, our drain
record (reason, check, job, since), clean runs toward a resume, whether a reboot is awaited, the
drain-storm breaker, the cached Slurm view of this node, the config in use and whether it
validated, the XID store. Exit codes of its own (``EXIT_CODES``, in ``--help`` and docs/operations.md):
0 healthy, 1 drained by nodehealth or failing (our drain, an orphan drain, a would-be drain in observe
mode, or the daemon's last verdict FAIL), 4 cannot tell (no daemon verdict yet, the daemon not running,
an UNKNOWN verdict, a config that does not validate), 2 usage error, 3 internal error (a bug).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Any, Optional

from nodehealth import SCHEMA_VERSION
from nodehealth.commands.common import UsageError, fail_usage
from nodehealth.commands.options import ExitCode, add_config, add_format

EXIT_HEALTHY, EXIT_DRAINED, EXIT_OTHER = ExitCode.OK, ExitCode.FAULT, ExitCode.NO_VERDICT
EXIT_CODES = (
    (EXIT_HEALTHY, "healthy"),
    (EXIT_DRAINED, "drained by nodehealth or failing"),
    (ExitCode.USAGE, "usage error"),
    (ExitCode.INTERNAL, "internal error (a bug in nodehealth)"),
    (EXIT_OTHER, "cannot tell: no daemon verdict yet, the daemon not running, an UNKNOWN verdict or a bad config"),
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "status",
        help="what nodehealth knows about this node now (its own state; acts on nothing)",
        description="The daemon's last verdict, our drain record, clean runs toward a resume, "
        "the breaker, the config in use. Exit " + ", ".join(f"{int(code)} {words}" for code, words in EXIT_CODES) + ".",
    )
    add_config(p)
    add_format(p)
    p.set_defaults(func=run)


def gather(config: Optional[str] = None, now: Optional[float] = None) -> dict[str, Any]:
    """The status document (what ``--format json`` prints)."""
    import os

    from nodehealth.config.lean import config_path, node_name
    from nodehealth.config.use import ConfigError, use
    from nodehealth.slurm import policy
    from nodehealth.statedir import layout, slurmstate
    from nodehealth.statedir import verdict as daemon_state

    t = time.time() if now is None else now
    env = dict(os.environ)
    if config:
        env["NODEHEALTH_CONFIG"] = config
    path, _ = config_path(None, env)
    doc: dict[str, Any] = {"time": round(t, 3)}
    try:
        loaded = use(environ=env, remember=False, setup=False)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    cfg = loaded.cfg
    doc["node"] = node_name(cfg.node_name, env)
    doc["config"] = {
        "file": path,
        "validated": loaded.error is None,
        "using": loaded.using,
        "error": str(loaded.error) if loaded.error else None,
        "note": loaded.note or None,
    }
    state_dir = cfg.paths.state_dir
    boot = layout.read_boot_id(cfg.paths.procfs_root)
    doc["boot_id"] = boot
    st, why = daemon_state.read(
        state_dir, math.inf, boot_id=boot, now=t, require_xid=False, procfs_root=cfg.paths.procfs_root
    )
    if st is None:
        # What an admin does next: the unit is installed but not enabled by the packages (docs/daemon.md).
        doc["daemon"] = {"verdict": None, "alive": False, "why": why, "fix": _DAEMON_FIX}
    else:
        doc["daemon"] = {
            "verdict": st.status,
            "age_s": round(st.age_s, 1),
            "round": st.round,
            "pid": st.pid,
            "alive": True,
            "xid_follower": st.xid_follower,
            "fresh_for_prolog": st.age_s <= cfg.daemon.state_max_age_s,
            "not_ok": [
                {"name": c.get("name"), "status": c.get("status"), "summary": c.get("summary")}
                for c in st.report.get("checks", [])
                if isinstance(c, dict) and c.get("status") in ("WARN", "UNKNOWN", "FAIL")
            ],
        }
    s = slurmstate.load(cfg.paths)
    drain = s.drain
    doc["drain"] = (
        None
        if drain is None
        else {
            "reason": drain.reason,
            "check": drain.check,
            "action": drain.action,
            "job_id": drain.job_id,
            "phase": drain.phase,
            "since": round(drain.time, 3),
            "age_s": round(max(0.0, t - drain.time), 1),
            "reboot_needed": drain.action in cfg.resume.reboot_actions and drain.boot_id == boot,
            "flapping": drain.flapping,
            "drains_in_window": drain.drains,
        }
    )
    needed = (
        cfg.resume.clean_runs
        if drain is None
        else policy.clean_runs_needed_for(drain, cfg.resume.clean_runs, cfg.resume.clean_runs_max)
    )
    doc["resume"] = {"clean_runs": s.clean_runs, "needed": needed, "enabled": cfg.resume.enabled}
    doc["slurm_mode"], doc["would_drain"] = _observe(cfg, doc)
    doc["reboots"] = _reboots(cfg, doc["node"])
    doc["orphan"] = _orphan(s, doc["node"])
    doc["breaker_held"] = s.breaker_held
    doc["last_run"] = {"status": s.last_status, "age_s": round(t - s.last_run, 1) if s.last_run else None}
    node = s.slurm_node or None
    doc["slurm_view"] = (
        None
        if not node
        else {
            "state": node.get("state"),
            "reason": node.get("reason"),
            "gres_gpus": node.get("gres_gpus"),
            "age_s": round(t - node["time"], 1) if isinstance(node.get("time"), (int, float)) else None,
        }
    )
    doc["xid"] = _xid(state_dir, boot)
    doc["exit_code"] = _exit(doc)
    return doc


def _orphan(s: Any, node: str) -> Optional[dict[str, Any]]:
    """A nodehealth reason on this node with no record of ours (what the health check or the daemon
    found, else what the cached Slurm view shows), with the command that resumes it by hand."""
    from nodehealth.slurm.nodes import NodeInfo

    if s.drain is not None:
        return None
    reason = s.orphan
    if reason is None:
        view = NodeInfo.from_json(s.slurm_node)
        if view is None or not view.drained_by_us or view.reason is None:
            return None
        reason = view.reason.full
    return {"reason": reason, "resume": f"scontrol update nodename={node} state=resume"}


def _observe(cfg: Any, doc: dict[str, Any]) -> tuple[dict[str, Any], Optional[dict[str, Any]]]:
    """``[slurm] mode`` and the would-be actions counted; in observe mode the act sequence keeps its
    drain record as if it had drained, but Slurm has the node in service: that record is the
    *would-be* drain (moved out of ``drain``, so nothing reads it as a drain of the node)."""
    from nodehealth.slurm import observe
    from nodehealth.statedir.records import read_doc

    mode = {"mode": cfg.slurm.mode, "would": observe.would_counts(read_doc(cfg.paths, observe.FILE_NAME))}
    would = None
    if (
        observe.observing(cfg)
        and doc["drain"] is not None
        and observe.effective(cfg.paths, doc["node"]) == doc["drain"]["reason"]
    ):
        would, doc["drain"] = doc["drain"], None
    return mode, would


def _reboots(cfg: Any, node: str) -> Optional[dict[str, Any]]:
    """Reboots asked within ``[slurm] reboot_window_s`` and whether our drain is held after them."""
    from nodehealth.slurm import reboot

    asked, held = reboot.status(cfg, node)
    if asked is None:
        return None
    return {
        "asked_in_window": asked,
        "max": cfg.slurm.reboot_max,
        "window_s": cfg.slurm.reboot_window_s,
        "held_for_a_person": bool(held),
    }


def _xid(state_dir: str, boot: Optional[str]) -> dict[str, Any]:
    from nodehealth.probes.xid_store import StoreError, load_state

    try:
        store, notes = load_state(state_dir)
    except StoreError as exc:
        return {"error": str(exc)}
    events = [e for e in store.events if e.get("boot_id") == boot] if boot else list(store.events)
    by: dict[str, int] = {}
    for e in events:
        key = f"{e.get('xid')}:{e.get('severity') or '?'}"
        by[key] = by.get(key, 0) + 1
    return {"events_this_boot": len(events), "by_xid": by, "last_clear": store.last_clear, "notes": list(notes)}


def _exit(doc: dict[str, Any]) -> int:
    if (
        doc["drain"] is not None
        or doc.get("orphan")
        or doc.get("would_drain")
        or doc["daemon"].get("verdict") == "FAIL"
    ):
        return EXIT_DRAINED
    if not doc["config"]["validated"] or not doc["daemon"].get("alive") or doc["daemon"].get("verdict") == "UNKNOWN":
        return EXIT_OTHER
    return EXIT_HEALTHY


def _age(seconds: Optional[float]) -> str:
    """How long ago, in words; a clock a little behind the writer's reads as "just now", never "-0 s"."""
    if seconds is None:
        return "never"
    if seconds < 1:
        return "just now"
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"


def headline(doc: dict[str, Any]) -> str:
    """What the exit code means for this node, in the words of what made it so."""
    code, d = doc["exit_code"], doc["daemon"]
    if code == EXIT_HEALTHY:
        return "healthy"
    why = []
    if code == EXIT_DRAINED:
        if doc["drain"] is not None:
            why.append(f"drained by nodehealth ({doc['drain']['check']})")
        if doc.get("orphan"):
            why.append("drained with a nodehealth reason and no record of ours (an orphan)")
        if doc.get("would_drain"):
            why.append("would be drained (observe mode: Slurm has it in service)")
        if d.get("verdict") == "FAIL":
            why.append("failing (the daemon's last verdict is FAIL)")
        return "; ".join(why)
    if not doc["config"]["validated"]:
        why.append("the config does not validate")
    if d.get("verdict") is None:
        why.append("no daemon verdict to go by (see the daemon line)")
    elif d.get("verdict") == "UNKNOWN":
        why.append("the daemon's last verdict is UNKNOWN")
    return "cannot tell: " + "; ".join(why)


_DAEMON_FIX = (
    "systemctl enable --now nodehealth.service starts it; journalctl -u nodehealth.service says why it stopped"
)


def _breaker(held: dict[str, Any]) -> str:
    """The drain-storm breaker's hold in words (``slurm.act``'s record of it)."""
    share, limit = held.get("share"), held.get("limit")
    counted = f"{held.get('ours')} of {held.get('total')} nodes drained by nodehealth" + (
        f" ({share:.0%}, the limit is {limit:.0%})" if isinstance(share, float) and isinstance(limit, float) else ""
    )
    when = _age(time.time() - held["time"]) if isinstance(held.get("time"), (int, float)) else "at an unknown time"
    return f"breaker: holding a drain back (held {when}, in the {held.get('phase')}; {counted}): {held.get('reason')}"


def text(doc: dict[str, Any]) -> str:
    c, d = doc["config"], doc["daemon"]
    lines = [f"node {doc['node']}: {headline(doc)}"]
    lines.append(
        f"config: {c['file']}"
        + ("" if c["validated"] else f" (does NOT validate: {c['error']}; running with {c['using']})")
    )
    if d.get("verdict") is None:
        lines.append(f"daemon: no usable verdict: {d.get('why') or 'none written yet'}")
        lines.append(f"        -> {d['fix']}")
    else:
        lines.append(
            f"daemon: pid {d['pid']} running; last verdict {d['verdict']} {_age(d['age_s'])} (round "
            f"{d['round']}; XID follower {d['xid_follower']}; "
            f"{'fresh for' if d['fresh_for_prolog'] else 'too old for'} the prolog's fast path)"
        )
        for check in d["not_ok"]:
            lines.append(f"  {check['status']} {check['name']}: {check['summary']}")
    dr = doc["drain"]
    orphan = doc.get("orphan")
    if orphan:
        lines.append(
            f"drain: ORPHAN: drained with a nodehealth reason and no record of ours ({orphan['reason']!r}): "
            f"never resumed by nodehealth; once fixed, resume it by hand: {orphan['resume']}"
        )
    elif dr is None:
        lines.append("drain: none of ours")
    else:
        lines.append(
            f"drain: ours, drained {_age(dr['age_s'])}: {dr['reason']!r} (check {dr['check']}, action "
            f"{dr['action']}, {dr['phase']}" + (f", job {dr['job_id']}" if dr["job_id"] else "") + ")"
        )
        r = doc["resume"]
        if dr.get("flapping"):
            lines.append(
                f"resume: held for a person (flapping: {dr['drains_in_window']} drains of {dr['check']}); "
                f"nodehealth never resumes it: scontrol update nodename={doc['node']} state=resume"
            )
        elif dr["reboot_needed"]:
            lines.append("resume: after a reboot (a reboot-class fault), then clean health checks")
        elif r["enabled"]:
            lines.append(f"resume: {r['clean_runs']} of {r['needed']} clean health checks so far")
        else:
            lines.append("resume: off ([resume] enabled = false): resume by hand")
    mode, would = doc["slurm_mode"], doc.get("would_drain")
    if mode["mode"] != "enforce":
        counts = ", ".join(f"{a} {n}" for a, n in sorted(mode["would"].items())) or "none yet"
        lines.append(f"slurm mode: {mode['mode']}: no scontrol update is sent; would-be actions so far: {counts}")
    if would is not None:
        lines.append(
            f"would drain (observe mode; Slurm has the node in service), decided {_age(would['age_s'])}: "
            f"{would['reason']!r}"
        )
    rb = doc.get("reboots")
    if rb is not None:
        lines.append(
            f"reboots: {rb['asked_in_window']} asked within {rb['window_s'] / 3600:g} h (at most "
            f"{rb['max']})" + ("; held for a person after them" if rb["held_for_a_person"] else "")
        )
    if doc["breaker_held"]:
        lines.append(_breaker(doc["breaker_held"]))
    lr = doc["last_run"]
    lines.append(
        f"last face run: {lr['status']} {_age(lr['age_s'])}"
        if lr["status"] and lr["age_s"] is not None
        else "last face run: none yet"
    )
    sv = doc["slurm_view"]
    if sv:
        lines.append(
            f"slurm (cached view{', read ' + _age(sv['age_s']) if sv['age_s'] is not None else ''}): "
            f"state {sv['state']}, Gres gpu:{sv['gres_gpus']}" + (f", reason {sv['reason']!r}" if sv["reason"] else "")
        )
    x = doc["xid"]
    if "error" in x:
        lines.append(f"xid: {x['error']}")
    else:
        kinds = ", ".join(f"XID {k.split(':')[0]} ({k.split(':')[1]}) x{n}" for k, n in sorted(x["by_xid"].items()))
        lines.append(f"xid: {x['events_this_boot']} event(s) this boot" + (f": {kinds}" if kinds else ""))
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    try:
        doc = gather(args.config)
    except UsageError as exc:
        return fail_usage(exc)
    sys.stdout.write(
        json.dumps({"schema_version": SCHEMA_VERSION, **doc}, indent=2) + "\n" if args.format == "json" else text(doc)
    )
    return int(doc["exit_code"])
