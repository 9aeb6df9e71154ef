"""The daemon: periodic rounds, the state hand-off, metrics, Slurm actions, signals, systemd.

Threads: the main thread waits for signals, deadlines and the watchdog; each round runs in
a ``round`` thread (``runner.execute`` bounds it by the daemon phase's budget, the NVML
probe is a killable child); the HTTP server has its own threads and only reads the
rendered metrics; the XID follower reads the kernel log in its own thread and acts on a
drain-class XID at once (state file, metrics, drain) instead of at the next round.

The configuration's reload (SIGHUP) and its watch before a scrape are ``daemon/config_watch.py``'s
(``ConfigWatch``, a part of ``Daemon``); the NCCL self-test's schedule is ``daemon/selftest.py``'s.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
from typing import Any, Callable, Optional

from nodehealth import runner
from nodehealth.checks.gpu_xid import CHECK as XID_CHECK
from nodehealth.config import lean
from nodehealth.config.lean import node_name
from nodehealth.config.loader import Loaded
from nodehealth.config.schema import Config
from nodehealth.daemon import selftest
from nodehealth.daemon.config_watch import ConfigWatch, file_identity
from nodehealth.daemon.hooks import SlurmHook, StoreXidFollower, XidFollower, default_slurm_hook, ledger_jobs
from nodehealth.daemon.http import ListenError, MetricsServer
from nodehealth.daemon.logs import Log
from nodehealth.daemon.start import StartError, validate_start
from nodehealth.metrics import NodeMetrics, write_textfile
from nodehealth.model import Report, Status
from nodehealth.observations import NvmlSnapshot, Observations, gpu_counters
from nodehealth.registry import BY_NAME
from nodehealth.statedir import counters
from nodehealth.statedir import verdict as state_file


class Daemon(ConfigWatch):
    def __init__(
        self,
        cfg: Config,
        config_path: Optional[str] = None,
        log: Optional[Log] = None,
        slurm: Optional[SlurmHook] = None,
        xid: Optional[XidFollower] = None,
        notify: Optional[Callable[[str], bool]] = None,
        use_default_hooks: bool = True,
        loaded: Optional[Loaded] = None,
        simulate: Optional[str] = None,
    ) -> None:
        """``loaded``: how ``cfg`` was loaded (``loader.load_safe``); with it, the config file is
        watched for ``nodehealth_config_valid``."""
        self.cfg = cfg
        self.config_path = config_path
        self.simulate = simulate  # --simulate: kept across reloads (daemon/config_watch.py)
        self.log = log or Log.default()
        self.node = node_name(cfg.node_name)
        self.metrics = NodeMetrics(self.node, detail=cfg.daemon.metrics_detail)
        self.config_file = os.path.abspath(lean.config_path(config_path)[0])
        self.config_lock = threading.Lock()
        self.config_using = "file"
        self.config_seen: Any = file_identity(self.config_file)
        if loaded is not None:
            if loaded.error is not None:
                self.config_using = "last_validated"
            self.metrics.set_config(
                self.config_file, "none" if loaded.error is None else loaded.error.kind, self.config_using
            )
            self.metrics.config_probe = self.watch_config
        if notify is None:
            from nodehealth.platform.sdnotify import notify as sd_notify

            notify = sd_notify
        self.notify = notify
        if slurm is None and use_default_hooks and cfg.daemon.slurm_actions:
            slurm = default_slurm_hook(self.log)
        self.slurm = slurm
        if xid is None and use_default_hooks and cfg.daemon.xid_follow:
            xid = StoreXidFollower(cfg, self.log)
        self.xid = xid
        self.server: Optional[MetricsServer] = None
        self.stop_event = threading.Event()
        self.wake = threading.Event()
        self.reload_requested = False
        self.round_thread: Optional[threading.Thread] = None
        self.round_started_mono: Optional[float] = None
        self.rounds = 0
        self.report: Optional[Report] = None
        self.observations: Optional[Observations] = None
        self.xid_events = 0
        self.said: dict[str, str] = {}  # check -> the finding line last logged (quiet rounds)
        self.lock = threading.Lock()
        from nodehealth.daemon.selftest import Schedule

        nccl = cfg.checks.get("nccl_selftest")
        self.selftest = Schedule(getattr(nccl, "interval_s", 0.0), getattr(nccl, "jitter_s", 0.0))
        self.selftest_result: Optional[Any] = None  # the NCCL self-test's latest CheckResult
        self.selftest_running = False
        from nodehealth.statedir import layout

        self.boot_id = layout.read_boot_id(cfg.paths.procfs_root)

    # ------------------------------------------------------------------ life cycle

    def start(self) -> None:
        """Check the state and textfile dirs, bind the endpoint, start the follower. Raises StartError."""
        validate_start(self.cfg)
        if self.cfg.daemon.listen:
            try:
                self.server = MetricsServer(
                    self.cfg.daemon.listen, self.metrics.payload, self.health, self.metrics.payload_gzip
                )
            except ListenError as exc:
                raise StartError(str(exc)) from None
            self.server.start()
        if self.xid is not None:
            self.xid.start(self.on_xid)
        self.metrics.set_xid_follower(self.xid_state())
        where = f"http://{self.server.address[0]}:{self.server.address[1]}/metrics" if self.server else "no endpoint"
        self.log(
            f"started: node {self.node}, every {self.cfg.daemon.interval_s:g} s, {where}, state in "
            f"{self.cfg.paths.state_dir}",
            "notice",
            config=self.cfg.source,
        )

    def run(self) -> int:
        """Until SIGTERM/SIGINT: rounds every interval, SIGHUP reloads. Returns the exit code."""
        self._install_signals()
        self.notify("READY=1")
        self.notify(f"STATUS=started, first round running; {len(BY_NAME)} checks known")
        from nodehealth.platform.sdnotify import watchdog_interval_s

        ping = watchdog_interval_s()
        next_due = time.monotonic()
        while not self.stop_event.is_set():
            if self.reload_requested:
                self.reload_requested = False
                self.reload()
            now = time.monotonic()
            if now >= next_due and not self.round_running():
                self.start_round()
                next_due = now + self.cfg.daemon.interval_s
            if ping is not None and self.healthy_loop():
                self.notify("WATCHDOG=1")
            wait = max(0.0, next_due - time.monotonic())
            if ping is not None:
                wait = min(wait, ping)
            self.wake.wait(min(wait, 5.0) if wait > 0 else 0.05)
            self.wake.clear()
        self.shutdown()
        return 0

    def shutdown(self) -> None:
        self.notify("STOPPING=1")
        self.log("stopping", "notice")
        if self.xid is not None:
            self.xid.stop()
        if self.server is not None:
            self.server.stop()
        t = self.round_thread
        if t is not None:
            t.join(timeout=1.0)
            if t.is_alive():  # a probe is still inside its deadline (a hung GPU): end its child now
                from nodehealth.platform.reap import kill_children

                kill_children()

    def request_stop(self) -> None:
        self.stop_event.set()
        self.wake.set()

    def _install_signals(self) -> None:
        def on_term(signum: int, frame: Any) -> None:
            self.request_stop()

        def on_hup(signum: int, frame: Any) -> None:
            self.reload_requested = True
            self.wake.set()

        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGINT, on_term)
        signal.signal(signal.SIGHUP, on_hup)

    def healthy_loop(self) -> bool:
        """False when a round has run far past its budget: then no watchdog ping, systemd restarts us."""
        started = self.round_started_mono
        if started is None:
            return True
        extra = self.cfg.checks["nccl_selftest"].timeout_s + 5 if self.selftest_running else 0.0
        return time.monotonic() - started < 2 * self.cfg.phases.daemon.budget_s + 10 + extra

    def health(self) -> tuple[int, str]:
        if not self.healthy_loop():
            return 503, "round stuck"
        return 200, f"ok: {self.rounds} rounds, last {self.report.status.name if self.report else 'none yet'}"

    # ------------------------------------------------------------------ rounds

    def round_running(self) -> bool:
        return self.round_thread is not None and self.round_thread.is_alive()

    def start_round(self) -> None:
        self.round_started_mono = time.monotonic()
        thread = threading.Thread(target=self.round, name="round", daemon=True)
        try:
            thread.start()
        except RuntimeError as exc:  # out of tasks (TasksMax): skip this round, keep watching
            self.round_started_mono = None
            self.metrics.round_failed()
            self.log(f"round not started: {exc}", "err")
            return
        self.round_thread = thread

    def round(self) -> Optional[Report]:
        """One round: run the checks, publish, hand off, act. Never raises."""
        cfg = self.cfg
        self.metrics.round_started_now()
        try:
            outcome = runner.execute(cfg, phase="daemon", node=self.node)
            report = selftest.merge(outcome.report, self.selftest_result)
            with self.lock:
                self.report, self.observations = report, outcome.observations
                self.rounds += 1
            self.metrics.set_xid_follower(self.xid_state())
            self.metrics.update_round(report, outcome.observations)
            self.publish_jobs(cfg, outcome.observations)
            self.write_state(cfg, report)
            self.write_counters(cfg, outcome.observations)
            self.write_textfile(cfg)
            self.act(cfg, report)
            self.notify(
                f"STATUS=round {self.rounds}: {report.status.name}, {len(report.results)} checks in "
                f"{report.duration_s:.2f} s"
            )
            report = self.run_selftest(cfg, report, outcome.observations)
            # A finding is said when it appears, changes or clears, not every round (a drained
            # faulty node logged the same FAIL line 2,880 times a day at 30 s rounds).
            from nodehealth.slurm.policy import changed_lines, result_lines

            lines = result_lines(report)
            by_name = {r.name: r for r in report.results}
            for line in changed_lines(self.said, lines):
                r = by_name.get(line.split(" ", 2)[1].rstrip(":"))
                if r is not None and r.status >= Status.WARN:
                    self.log(
                        line,
                        "warning" if r.status < Status.FAIL else "err",
                        check=r.name,
                        status=r.status.name,
                        gpu=r.gpu,
                    )
                else:
                    self.log(line, "notice")
            self.said = lines
            try:  # the page of this round, rendered here and not by the next scrape
                self.metrics.render_ahead()
            except Exception:  # noqa: BLE001 - a rendering bug is the scrape's 500, not a failed round
                pass
            return report
        except Exception as exc:  # noqa: BLE001 - a bug in one round must not end the watch
            self.metrics.round_failed()
            self.log(f"round failed: {type(exc).__name__}: {exc}", "err")
            return None
        finally:
            self.round_started_mono = None

    def run_selftest(self, cfg: Config, report: Report, obs: Observations) -> Report:
        """The NCCL self-test when it is due and the node idle (ledger, GPU processes): its result
        joins this report (published now) and the next rounds' (judged by the Slurm policy then)."""

        def jobs() -> Any:
            return selftest.holding_jobs(cfg.paths.state_dir, self.boot_id)

        def run() -> Any:
            timeout = cfg.checks["nccl_selftest"].timeout_s
            self.selftest_running = True
            try:
                out = runner.execute(
                    cfg, phase="daemon", only=(selftest.CHECK,), node=self.node, own_budget_s=timeout + 1.0
                )
            finally:
                self.selftest_running = False
            return out.report.results[0]

        self.selftest.interval_s = getattr(cfg.checks["nccl_selftest"], "interval_s", 0.0)
        decision = selftest.maybe_run(self.selftest, obs, jobs, run)
        if not decision.ran:
            return report
        if decision.result is None:
            self.log(f"NCCL self-test: {decision.why}", "notice")
            return report
        self.selftest_result = decision.result
        r = decision.result
        self.log(
            f"NCCL self-test {r.status.name}: {r.summary}",
            "err" if r.status == Status.FAIL else ("warning" if r.status >= Status.WARN else "info"),
            check=r.name,
            status=r.status.name,
        )
        report = selftest.merge(report, r)
        with self.lock:
            self.report = report
        self.metrics.update_report(report)
        self.write_state(cfg, report)
        self.write_textfile(cfg)
        return report

    def write_state(self, cfg: Config, report: Report) -> None:
        path = state_file.path_in(cfg.paths.state_dir)
        since = getattr(self.xid, "since", None) if self.xid is not None else None
        text = state_file.encode(
            report.to_json(),
            self.boot_id or "unknown",
            time.time(),
            self.xid_state(),
            since,
            cfg.daemon.interval_s,
            self.rounds,
        )
        try:
            state_file.write(cfg.paths.state_dir, text)  # the JSON, then its marshal form for the fast path
            self.metrics.state_written(True)
        except OSError as exc:
            self.metrics.state_written(False)
            self.log(f"cannot write {path}: {exc}", "err")

    def write_counters(self, cfg: Config, obs: Observations) -> None:
        """The latest per-GPU ECC/remap reading, the baseline a fast-path prolog copies for its job."""
        try:
            if isinstance(obs.nvml, NvmlSnapshot):
                counters.write_latest(cfg.paths.state_dir, gpu_counters(obs.nvml.gpus), self.boot_id, "daemon")
        except OSError as exc:
            self.log(f"cannot write the GPU counter reading: {exc}", "err")

    def write_textfile(self, cfg: Config) -> None:
        if not cfg.daemon.textfile_dir:
            return
        try:
            write_textfile(cfg.daemon.textfile_dir, "daemon", self.metrics.payload())
        except OSError as exc:
            self.log(f"cannot write the metrics textfile: {exc}", "err")

    def publish_jobs(self, cfg: Config, obs: Observations) -> None:
        if not cfg.daemon.metrics_job_ids:  # who runs on which GPU stays off the endpoint
            self.metrics.set_jobs({})
            return
        if not isinstance(obs.nvml, NvmlSnapshot):
            return
        try:
            jobs = ledger_jobs(cfg.paths.state_dir, [g.index for g in obs.nvml.gpus], time.time())
        except Exception as exc:  # noqa: BLE001 - the ledger is a nice-to-have here
            self.log(f"job ledger unreadable: {exc}", "warning")
            return
        self.metrics.set_jobs(jobs)

    def act(self, cfg: Config, report: Report) -> None:
        if self.slurm is None or not cfg.daemon.slurm_actions:
            return
        try:
            view = self.slurm.after_round(cfg, report, self.node, self.boot_id)
        except Exception as exc:  # noqa: BLE001
            self.log(f"Slurm action failed: {type(exc).__name__}: {exc}", "err")
            return
        self.metrics.set_slurm(view)

    # ------------------------------------------------------------------ XID

    def xid_state(self) -> str:
        if self.xid is None:
            return "absent" if self.cfg.daemon.xid_follow else "off"
        return self.xid.state()

    def on_xid(self, event: Any) -> None:
        """From the follower thread: count it; a drain-class XID is judged and acted on now.

        The follower has already stored the event, so the ``gpu_xid`` check alone (no NVML)
        gives the new verdict: it replaces that check's result in the last Report, which is
        then published (state file, metrics) and handed to the Slurm policy, without waiting
        for the next round.
        """
        from nodehealth.xid.attribution import attribute, gpu_map
        from nodehealth.xid.events import Severity

        obs = self.observations
        gpus = gpu_map(obs.nvml.gpus) if obs is not None and isinstance(obs.nvml, NvmlSnapshot) else {}
        # An NVSwitch's SXid (xid/sxid.py) is not a GPU's XID: its own family comes with the round
        # (nodehealth_nvswitch_sxid_errors_total), its check is gpu_sxid.
        sxid = getattr(event, "kind", "") == "sxid"
        index = None if sxid else attribute(event, gpus).gpu
        action = event.action.value if event.action is not None else "unknown"
        gpu = str(index) if index is not None else (event.pci or "unknown")
        if not sxid:
            self.metrics.count_xid(gpu, event.xid, action)
        drain = event.severity == Severity.DRAIN
        with self.lock:
            self.xid_events += 1
        severity = event.severity.value if event.severity else "?"
        self.log(
            f"{'SXid' if sxid else 'XID'} {event.xid} on {'NVSwitch' if sxid else 'GPU'} {gpu}: {event.mnemonic or ''} "
            f"({severity}, action {action})",
            "err" if drain else "warning",
            xid=event.xid,
            gpu=gpu,
            action=action,
            job=event.job_id,
        )
        if not drain:
            return
        cfg = self.cfg
        with self.lock:
            base = self.report
        if base is None:
            base = Report(
                node=self.node, phase="daemon", results=(), duration_s=0.0, version="", started_at=time.time()
            )
        check = "gpu_sxid" if sxid else XID_CHECK
        fresh = runner.execute(cfg, phase="daemon", only=(check,), node=self.node).report.results
        by_name = {r.name: r for r in fresh}
        results = tuple(by_name.pop(r.name, r) for r in base.results) + tuple(by_name.values())
        report = dataclasses.replace(base, results=results)
        with self.lock:
            self.report = report
        self.metrics.update_report(report)
        self.write_state(cfg, report)
        if self.slurm is not None and cfg.daemon.slurm_actions:
            try:
                view = self.slurm.on_fault(cfg, report, self.node, self.boot_id)
            except Exception as exc:  # noqa: BLE001
                self.log(f"Slurm drain after XID failed: {type(exc).__name__}: {exc}", "err")
            else:
                self.metrics.set_slurm(view)
        self.wake.set()
