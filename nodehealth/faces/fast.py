"""The prolog's fast path: decide from the daemon's fresh verdict, without NVML.

``prolog(environ)`` returns an exit code when the daemon's verdict (its marshal form,
``<state_dir>/daemon-state.marshal``, read by ``nodehealth.statedir.verdict.read``) is fresh and
healthy, a ``Fault`` when that verdict holds a node fault for this job (the caller drains through
the cold path's machinery, ``nodehealth.faces.common.fast_fault``), or the reason it cannot decide
(a string): the caller then runs the cold path and logs that reason.

What this path imports is paid for before every job, so it stays at the interpreter's floor: no
TOML, ``json``, ``re``, ``typing``, ``enum``, ``datetime`` or ``dataclasses`` (a test holds it to a
list of modules). It reads no config text: the settings it needs are the snapshot kept when the
config file last validated on this node (``nodehealth.config.snapshot``, ``marshal``), found by the
file's path, and used only while the file is that same file (its identity, from a ``stat`` now,
against the snapshot's: an edited or replaced file has not been seen by the full loader, and only
the cold path reports a file that does not validate). Running as root, the config file must be
root's own and not writable by others (``lean.untrusted``), as the loader requires. Then
``nodehealth.statedir`` (layout, verdict, files, counters, ledger: standard library only) and
``nodehealth.slurm.jobenv``. Never imported here: the config loader (``hostlist`` and the whole
check registry), pynvml, psutil, prometheus_client, the runner, the probes, the model. Any doubt
(no snapshot, a corrupt, foreign or stale one, a corrupt, stale or foreign verdict) sends the
prolog to the cold path with the reason.

On the way, as the cold path does: the job's ``start`` record in the ledger, and the job's ECC
baseline copied from the latest counter reading (``gpu-counters.marshal``, the marshal form of
``gpu-counters.json``; so the baseline is as old as that reading, which the baseline records).
"""

from __future__ import annotations

import os
import time

from nodehealth.config import lean, snapshot
from nodehealth.config.lean import Settings, node_name
from nodehealth.faces.log import Log
from nodehealth.slurm import jobenv
from nodehealth.statedir import counters, layout, ledger
from nodehealth.statedir import verdict as daemon_state

TYPE_CHECKING = False
if TYPE_CHECKING:  # no typing import at run time
    from typing import Any, Mapping, Optional, Union


class Fault:
    """The daemon's fresh verdict holds a fault for this job: ``report`` (scoped), ``verdict``."""

    __slots__ = ("report", "verdict")

    def __init__(self, report: Any, verdict: daemon_state.DaemonState) -> None:
        self.report, self.verdict = report, verdict


def append_ledger(s: Settings, environ: Mapping[str, str], node: str, boot_id: Optional[str], log: Log) -> None:
    """The job's ``start`` record (``statedir.ledger.append``, as the cold path writes it)."""
    if not s.ledger_enabled:
        return
    rec = jobenv.record("start", environ, time.time(), node=node, boot_id=boot_id)
    if rec is None:
        return
    try:
        ledger.append(s.state_dir, rec, s.ledger_max_bytes)
    except OSError as exc:
        log(f"cannot append to the job ledger: {exc}")


def _busy(checks: list[Any]) -> set[int]:
    """GPUs on which the daemon saw compute processes (``gpu_processes`` outside its idle phases)."""
    out: set[int] = set()
    for c in checks:
        if isinstance(c, dict) and c.get("name") == "gpu_processes":
            procs = (c.get("details") or {}).get("processes")
            if isinstance(procs, dict):
                out.update(int(k) for k, v in procs.items() if str(k).isdigit() and v)
    return out


def prolog(environ: Mapping[str, str], act: bool = True) -> Union[int, str, Fault, Any]:
    """The exit code or the ``Fault`` when the daemon's verdict decides, else why it cannot (never raises).

    ``act=False`` (``--dry-run``, ``check --as prolog``): the same decision, nothing written, and
    the daemon's verdict itself instead of 0 when it says healthy.
    """
    try:
        return _prolog(environ, act)
    except Exception as exc:  # noqa: BLE001 - the cold path is always there
        return f"fast path failed ({type(exc).__name__}: {exc})"


def settings(environ: Mapping[str, str]) -> tuple[Optional[Settings], str]:
    """The settings of the config file the cold path would read, from its snapshot, or why not."""
    path, required = lean.config_path(None, environ)
    path = os.path.abspath(path)
    try:
        st = os.stat(path)  # the loader reads a regular file only, following a link as this does
    except FileNotFoundError:
        if required:
            return None, f"config {path}: no such file"
        return snapshot.read(path, None, environ)
    except OSError as exc:
        return None, f"config {path}: cannot read: {exc.strerror or exc}"
    if st.st_mode & 0o170000 != 0o100000:
        return None, f"config {path}: not a regular file"
    distrust = lean.untrusted(st)
    if distrust:
        return None, f"config {path}: not trusted: {distrust}"
    return snapshot.read(path, lean.identity(st), environ)


def _prolog(environ: Mapping[str, str], act: bool = True) -> Union[int, str, Fault, Any]:
    s, why = settings(environ)
    if s is None:  # a new or edited file: the cold path validates it (and reports it when it does not validate)
        return why
    boot = layout.read_boot_id(s.procfs_root)
    if boot is None:
        return f"this boot's id is unknown ({layout.boot_id_path(s.procfs_root)}); daemon state not trusted"
    st, why = daemon_state.read(s.state_dir, s.max_age_s, boot_id=boot, require_xid=s.xid_follow, form="marshal")
    if st is None:
        return why
    checks = st.report.get("checks", [])
    gpus = jobenv.job_gpus(environ)
    busy = _busy(checks)
    if busy and (gpus is None or busy & set(gpus)):
        mine = sorted(busy if gpus is None else busy & set(gpus))
        return (
            f"the daemon saw compute processes on GPU(s) {','.join(map(str, mine))} of this job "
            f"{st.age_s:.0f} s ago; checking them now"
        )
    bad = [
        c
        for c in checks
        if isinstance(c, dict) and (c.get("status") == "FAIL" or (s.unknown == "fail" and c.get("status") == "UNKNOWN"))
    ]
    if bad:
        from nodehealth.model import Report
        from nodehealth.slurm.policy import scope_processes, worst_failure

        report = scope_processes(Report.from_json(st.report), gpus)
        if worst_failure(report, s.unknown) is not None:
            return Fault(report, st)
    if not act:
        return st
    job = jobenv.job_id(environ)
    log = Log("prolog", job)
    append_ledger(s, environ, node_name(s.node_name, environ), boot, log)
    if job:
        try:
            missing = counters.baseline_from_latest(s.state_dir, job, gpus, boot)
        except OSError as exc:
            missing = f"cannot write the job baseline: {exc}"
        if missing:
            log(f"no ECC baseline for the epilog: {missing}")
    log(f"{st.status} from the daemon's verdict (fast path; {st.age_s:.1f} s old, round {st.round})")
    return 0
