"""What the daemon plugs in around its rounds, each replaceable (tests pass their own).

* ``SlurmHook``: act on a round's Report: drain on a fault, resume when clean, through the
  health-check face's functions (``nodehealth.faces.common``: ownership, breaker, hysteresis,
  reboot-class faults) so the daemon and the Slurm faces can never disagree on policy.
* ``XidFollower``: follow the kernel log and call back for every XID event, judged with the
  XID catalog. A drain-class event makes the daemon act at once, not at its next round.
* ``ledger_jobs``: which Slurm job holds each GPU, from the job ledger the prolog/epilog keep.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import replace
from typing import Any, Callable, Optional, Protocol

from nodehealth.config.loader import Config
from nodehealth.metrics import SlurmView
from nodehealth.model import Report

Logger = Callable[..., None]


class SlurmHook(Protocol):
    def after_round(self, cfg: Config, report: Report, node: str, boot_id: Optional[str]) -> Optional[SlurmView]:
        """Drain or resume as the policy says; what Slurm shows now (None: not known)."""

    def on_fault(self, cfg: Config, report: Report, node: str, boot_id: Optional[str]) -> Optional[SlurmView]:
        """A fault that cannot wait for the next round (a drain-class XID): drain now."""


class XidFollower(Protocol):
    def start(self, on_event: Callable[[Any], None]) -> None: ...

    def state(self) -> str:
        """``alive`` or ``dead``."""

    def stop(self) -> None: ...


class FacesSlurm:
    """The health-check face's Slurm policy, run by the daemon (``nodehealth.faces.common``)."""

    def __init__(self, log: Logger) -> None:
        self.log = log
        self.lock = threading.Lock()

    def _run(self, cfg: Config, node: str, boot_id: Optional[str]) -> tuple[Any, Any, Any]:
        from nodehealth.faces import common

        flog = common.Log("daemon")
        deadline = common.Deadline(max(1.0, 3 * cfg.slurm.timeout_s))
        path = common.state_path(cfg)
        run = common.Run(face="daemon", phase="daemon", cfg=cfg, node=node, log=flog, deadline=deadline,
                         environ=os.environ, state_path=path, boot_id=boot_id, state=common.load_state(path))
        return common, run, common.Slurm(cfg, node, deadline, flog, os.environ)

    def on_fault(self, cfg: Config, report: Report, node: str, boot_id: Optional[str]) -> Optional[SlurmView]:
        from nodehealth.slurm.policy import worst_failure

        if worst_failure(report, cfg.policy.unknown) is None:
            return None
        with self.lock:
            common, run, slurm = self._run(cfg, node, boot_id)
            outcome = common.act_on_fault(run, report, slurm)
            return SlurmView(drained=True if outcome in ("drained", "already") else None,
                             drained_by_nodehealth=True if outcome in ("drained", "already") else None,
                             breaker_open=outcome == "held", last_action=outcome)

    def after_round(self, cfg: Config, report: Report, node: str, boot_id: Optional[str]) -> Optional[SlurmView]:
        from nodehealth.observations import ProbeError
        from nodehealth.slurm.policy import after_run, decide_resume, worst_failure

        with self.lock:
            common, run, slurm = self._run(cfg, node, boot_id)
            me = slurm.me()
            now = time.time()

            def advance(s: Any) -> Any:
                s = after_run(s, report, cfg.policy.unknown, now, boot_id)
                if not isinstance(me, ProbeError):
                    s = replace(s, slurm_node={"name": me.name, "gres_gpus": me.gres_gpus, "state": me.state.text,
                                               "reason": me.reason.full if me.reason else None, "time": now})
                return s

            state = common.save_state(run, advance)
            if isinstance(me, ProbeError):
                if worst_failure(report, cfg.policy.unknown) is not None:
                    self.log(f"fault, but slurmctld did not answer: {me.message}", "warning")
                return SlurmView(last_action="unreachable")
            if worst_failure(report, cfg.policy.unknown) is not None:
                outcome = common.act_on_fault(run, report, slurm, me=me)
                ours = me.drained_by_us or outcome == "drained"
                return SlurmView(drained=me.drained or outcome == "drained", drained_by_nodehealth=ours,
                                 breaker_open=outcome == "held", reason=me.reason.full if me.reason else None,
                                 last_action=outcome if outcome != "already" else "")
            if state.drain is not None and not me.drained_by_us:
                state = common.save_state(run, lambda s: replace(s, drain=None))
            view = SlurmView(drained=me.drained, drained_by_nodehealth=me.drained_by_us, breaker_open=False,
                             reason=me.reason.full if me.reason else None)
            if not cfg.resume.enabled:
                return view
            decision = decide_resume(me, state, cfg.resume.clean_runs, boot_id, cfg.resume.reboot_actions)
            if decision.action != "resume":
                return view
            out = slurm.resume()
            if not out.ok:
                self.log(f"resume failed: {out.message}", "warning")
                return replace(view, last_action="resume_failed")
            self.log(f"resumed {node}: {decision.why}", "notice")
            common.save_state(run, lambda s: replace(s, drain=None, breaker_held=None))
            return SlurmView(drained=False, drained_by_nodehealth=False, breaker_open=False, last_action="resumed")


def default_slurm_hook(log: Logger) -> Optional[SlurmHook]:
    """The faces' policy when that module is installed, else None (the daemon only publishes)."""
    try:
        import nodehealth.faces.common  # noqa: F401
    except ImportError as exc:
        log(f"Slurm actions unavailable ({exc}); publishing only", "warning")
        return None
    return FacesSlurm(log)


class StoreXidFollower:
    """The XID event store's follower (``nodehealth.xid.store.XidStore.follow``) in a
    thread: this boot's backlog first, then each new kernel-log line; every event is stored
    (so the ``gpu_xid`` check and the next prolog see it) and handed to ``on_event`` judged.
    A kernel log that cannot be read makes the follower ``dead``; it retries every ``retry_s``.
    """

    def __init__(self, cfg: Config, log: Logger, retry_s: float = 10.0) -> None:
        settings = cfg.checks.get("gpu_xid")
        self.state_dir, self.procfs_root = cfg.paths.state_dir, cfg.paths.procfs_root
        self.kmsg_path = str(getattr(settings, "kmsg_path", "/dev/kmsg"))
        self.overrides = tuple(getattr(settings, "severity_overrides", ()))
        self.max_events = getattr(settings, "store_max_events", None)
        self.kernel_only = bool(getattr(settings, "kernel_facility_only", False))
        self.log, self.retry_s = log, retry_s
        self._stop = threading.Event()
        self._alive = False
        self._thread: Optional[threading.Thread] = None
        self.since: Optional[float] = None

    def start(self, on_event: Callable[[Any], None]) -> None:
        self._thread = threading.Thread(target=self._body, args=(on_event,), name="xid-follower", daemon=True)
        self._thread.start()

    def state(self) -> str:
        return "alive" if self._alive and self._thread is not None and self._thread.is_alive() else "dead"

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)

    def _body(self, on_event: Callable[[Any], None]) -> None:
        from nodehealth.xid import store as xid_store
        from nodehealth.xid.parse import KernelLogUnavailable

        def handle(record: Any) -> None:
            try:
                on_event(record.event)
            except Exception as exc:  # noqa: BLE001 - one bad event must not stop the watch
                self.log(f"XID event handling failed: {type(exc).__name__}: {exc}", "err")

        while not self._stop.is_set():
            try:
                kwargs = {} if self.max_events is None else {"max_events": self.max_events}
                store = xid_store.XidStore(self.state_dir, self.procfs_root, self.kmsg_path, self.overrides,
                                           kernel_only=self.kernel_only, **kwargs)
                self._alive = True
                self.since = time.time()
                store.follow(self._stop, handle)
            except (KernelLogUnavailable, xid_store.StoreError, OSError, ValueError) as exc:
                self.log(f"XID follower stopped: {exc}; retrying in {self.retry_s:g} s", "err")
            self._alive = False
            self._stop.wait(self.retry_s)


def ledger_jobs(state_dir: str, gpus: list[int], now: float) -> dict[int, str]:
    """GPU index -> the job id holding it now, from ``<state_dir>/jobs.jsonl``."""
    from nodehealth.statedir import files as statefile
    from nodehealth.statedir import ledger

    records = ledger.parse(statefile.read_text(os.path.join(state_dir, ledger.FILE_NAME), limit=4 << 20))
    out: dict[int, str] = {}
    for gpu in gpus:
        jobs = ledger.jobs_on_gpu(records, gpu, now)
        if jobs:
            out[gpu] = jobs[0]
    return out
