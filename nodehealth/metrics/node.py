"""``NodeMetrics``: the daemon's metrics, kept up to date by its threads, rendered for scrapes.

The daemon never renders on a scrape what it could render after a round: ``NodeMetrics``
keeps the last round's Report and observations, renders them once (``payload()`` re-renders
only after an update), and adds a small live tail (time in the current round, the config
file's validity, process figures), itself kept as bytes: re-rendered only while a round runs,
after the config's watch saw a change, and for the process figures at most every
``PROCESS_EVERY_S``. The gzip form of both parts is cached the same way. So a scrape never waits
on NVML or on a round, and between rounds it costs a ``stat`` and the write.
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Callable, Optional

from nodehealth import __version__
from nodehealth.metrics.exposition import Metric, Process, go_float, render
from nodehealth.metrics.families import new, one
from nodehealth.metrics.renderers import b, gpu_families, job_family, probe_timeouts, report_families
from nodehealth.model import Report
from nodehealth.observations import NvmlSnapshot, Observations

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PROCESS_EVERY_S = 5.0  # the process figures (CPU seconds, RSS, fds) are read at most this often


@dataclass(frozen=True)
class SlurmView:
    """What the daemon's Slurm hook last saw and did (None fields: not known)."""

    drained: Optional[bool] = None
    drained_by_nodehealth: Optional[bool] = None
    breaker_open: Optional[bool] = None
    reason: Optional[str] = None
    last_action: str = ""  # drained, resumed, held, ... (see nodehealth.daemon.hooks)
    flapping: Optional[bool] = None  # our drain is held for a person (flap damping)
    orphan_drain: Optional[bool] = None  # drained with a nodehealth reason and no record of ours
    observe_mode: Optional[bool] = None  # [slurm] mode = "observe"
    would: tuple[tuple[str, int], ...] = ()  # observe mode: (action, count) from slurm-observe.json
    reboots_requested: Optional[int] = None  # [slurm] reboot = "asap": reboots asked within the window
    reboot_escalated: Optional[bool] = None  # our drain is held for a person after reboot_max reboots


class NodeMetrics:
    """The daemon's metrics, updated from its threads, rendered for scrapes and the textfile.

    Thread-safe: the round thread calls ``update_round``, the XID follower ``count_xid``, the
    HTTP threads ``payload``; a lock guards the state and the cached rendering.
    """

    def __init__(
        self,
        node: str,
        process: bool = True,
        clock: Any = time.time,
        detail: bool = False,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """``detail``: publish every series of the table (``[daemon] metrics_detail``), not only
        the default page's (docs/metrics.md, the series budget)."""
        self.node, self.clock, self.detail, self.monotonic = node, clock, detail, monotonic
        self._lock = threading.Lock()
        self.report: Optional[Report] = None
        self.observations: Optional[Observations] = None
        self.rounds = 0
        self.round_errors = 0
        self.last_round_at: Optional[float] = None
        self.last_round_duration: Optional[float] = None
        self.round_started: Optional[float] = None  # set while a round runs
        self.timed_out: dict[str, bool] = {}
        self.timeouts: dict[str, int] = {}
        self.xids: dict[tuple[str, str, str], int] = {}
        self.xid_follower = "off"
        self.slurm: Optional[SlurmView] = None
        self.slurm_actions: dict[str, int] = {}
        self.jobs: dict[int, str] = {}
        self.reloads: dict[str, int] = {"ok": 0, "error": 0}
        self.last_reload_ok: Optional[bool] = None
        self.config: Optional[tuple[str, str, str]] = None  # file, error kind ("none": valid), what runs
        self.config_probe: Optional[Callable[[], None]] = None  # called before each rendering of it
        self.state_write_errors = 0
        self.state_written_at: Optional[float] = None
        self.started_at = clock()
        self.process = Process() if process else None
        self._payload: Optional[bytes] = None
        self._payload_gz: Optional[tuple[bytes, bytes]] = None
        self._config_text: Optional[bytes] = None  # the config families, rendered at a change
        self._process_text, self._process_at = b"", -PROCESS_EVERY_S * 2
        self._tail: tuple[Optional[float], bytes, bytes] = (None, b"", b"")  # round started, config, process
        self._tail_text: Optional[bytes] = None
        self._tail_gz: Optional[tuple[bytes, bytes]] = None
        self._join: dict[bool, Optional[tuple[bytes, bytes, bytes]]] = {False: None, True: None}
        self._running_head = render([one("nodehealth_round_running_seconds", 0.0)])

    # ------------------------------------------------------------------ updates

    def _changed(self) -> None:
        self._payload = None

    def round_started_now(self) -> None:
        with self._lock:
            self.round_started = self.clock()

    def update_round(self, report: Report, observations: Optional[Observations]) -> None:
        """A round ended: publish its Report and observations, count probe timeouts."""
        with self._lock:
            self.report, self.observations = report, observations
            self.rounds += 1
            self.last_round_at = report.started_at + report.duration_s
            self.last_round_duration = report.duration_s
            self.round_started = None
            self.timed_out = probe_timeouts(observations)
            for probe, timed in self.timed_out.items():
                self.timeouts.setdefault(probe, 0)
                if timed:
                    self.timeouts[probe] += 1
            self._changed()

    def update_report(self, report: Report) -> None:
        """A verdict changed between rounds (a drain-class XID): publish it, no round counted."""
        with self._lock:
            self.report = report
            self._changed()

    def round_failed(self) -> None:
        with self._lock:
            self.round_errors += 1
            self.round_started = None
            self._changed()

    def count_xid(self, gpu: str, xid: int, action: str) -> None:
        with self._lock:
            key = (gpu, str(xid), action)
            self.xids[key] = self.xids.get(key, 0) + 1
            self._changed()

    def set_xid_follower(self, state: str) -> None:
        with self._lock:
            if state != self.xid_follower:
                self.xid_follower = state
                self._changed()

    def set_slurm(self, view: Optional[SlurmView]) -> None:
        with self._lock:
            self.slurm = view
            if view is not None and view.last_action:
                self.slurm_actions[view.last_action] = self.slurm_actions.get(view.last_action, 0) + 1
            self._changed()

    def set_jobs(self, jobs: Mapping[int, str]) -> None:
        with self._lock:
            if dict(jobs) != self.jobs:
                self.jobs = dict(jobs)
                self._changed()

    def reloaded(self, ok: bool) -> None:
        with self._lock:
            self.reloads["ok" if ok else "error"] += 1
            self.last_reload_ok = ok
            self._changed()

    def set_config(self, file: str, error: str, using: str) -> None:
        """The config file's validity (``error``: "none" or ``ConfigError.kind``) and what the daemon runs."""
        with self._lock:
            if self.config != (file, error, using):
                self.config = (file, error, using)
                self._config_text = None

    def set_detail(self, detail: bool) -> None:
        """``[daemon] metrics_detail`` (changed by a reload)."""
        with self._lock:
            if detail != self.detail:
                self.detail = detail
                self._changed()

    def state_written(self, ok: bool) -> None:
        with self._lock:
            if ok:
                self.state_written_at = self.clock()
            else:
                self.state_write_errors += 1
            self._changed()

    # ------------------------------------------------------------------ rendering

    def payload(self) -> bytes:
        """The exposition text: the cached round part plus the live tail."""
        tail = self._live()
        with self._lock:
            return self._joined(self._round_part(), tail, False)

    def payload_gzip(self) -> bytes:
        """The same text gzip-encoded (what Prometheus asks for): each part is compressed once per
        change of it; two gzip members concatenated are one valid gzip stream (RFC 1952)."""
        tail = self._live()
        with self._lock:
            if self._tail_gz is None or self._tail_gz[0] is not tail:
                self._tail_gz = (tail, gzip.compress(tail, compresslevel=1, mtime=0))
            return self._joined(self._round_part_gz(), self._tail_gz[1], True)

    def render_ahead(self) -> None:
        """Render the round part and its gzip now: the daemon's round thread calls it after the
        round's updates, so the scrapes that follow write bytes (rendering and compressing the
        page, ~1.5 ms, was the first scrape's after each round: every other one of a Prometheus
        scraping every 15 s with 30 s rounds). An update between rounds (an XID) renders at the
        next scrape."""
        with self._lock:
            self._round_part_gz()

    def _round_part(self) -> bytes:
        """Called with the lock held."""
        if self._payload is None:
            self._payload = render(list(self.families()))
        return self._payload

    def _round_part_gz(self) -> bytes:
        """Called with the lock held."""
        body = self._round_part()
        if self._payload_gz is None or self._payload_gz[0] is not body:
            self._payload_gz = (body, gzip.compress(body, compresslevel=6, mtime=0))
        return self._payload_gz[1]

    def _joined(self, body: bytes, tail: bytes, zipped: bool) -> bytes:
        """``body + tail``, kept until either changes (a scrape between rounds copies nothing)."""
        last = self._join[zipped]
        if last is None or last[0] is not body or last[1] is not tail:
            last = self._join[zipped] = (body, tail, body + tail)
        return last[2]

    def _live(self) -> bytes:
        """The live tail as bytes, re-rendered only where a part of it changed."""
        probe = self.config_probe
        if probe is not None:
            probe()  # the config file may have changed since the last scrape (one stat when it did not)
        now = self.monotonic()
        process = None
        if self.process is not None and now - self._process_at >= PROCESS_EVERY_S:
            process = self.process.text()  # outside the lock: it reads /proc
        with self._lock:
            if process is not None:
                self._process_text, self._process_at = process, now
            if self._config_text is None:
                self._config_text = render(list(self._config_families()))
            started, last = self.round_started, self._tail
            same = last[1] is self._config_text and last[2] is self._process_text
            if self._tail_text is None or started is not None or last[0] is not None or not same:
                running = max(0.0, self.clock() - started) if started is not None else 0.0
                head = self._running_head
                text = head[: head.rindex(b" ") + 1] + go_float(running).encode() + b"\n"
                self._tail = (started, self._config_text, self._process_text)
                self._tail_text = text + self._config_text + self._process_text
            return self._tail_text

    def families(self) -> Iterator[Metric]:
        """Called with the lock held (from payload)."""
        build = new("nodehealth_build_info")
        build.add([__version__, self.node, "daemon"], 1)
        yield build
        yield one("nodehealth_rounds_total", self.rounds)
        yield one("nodehealth_round_errors_total", self.round_errors)
        if self.last_round_at is not None:
            yield one("nodehealth_round_last_timestamp_seconds", self.last_round_at)
            yield one("nodehealth_round_duration_seconds", self.last_round_duration or 0.0)
        timed, total = new("nodehealth_probe_timed_out"), new("nodehealth_probe_timeouts_total", self.detail)
        for probe in sorted(set(self.timed_out) | set(self.timeouts)):
            timed.add([probe], b(self.timed_out.get(probe)))
            total.add([probe], self.timeouts.get(probe, 0))
        yield from (timed, total)
        if self.report is not None:
            yield from report_families(self.report, self.detail)
        obs = self.observations
        snap = obs.nvml if obs is not None and isinstance(obs.nvml, NvmlSnapshot) else None
        if snap is not None:
            yield one("nodehealth_nvml_probe_duration_seconds", snap.elapsed_s)
            yield from gpu_families(snap, self.detail)
        yield job_family(self.jobs, snap)
        xid = new("nodehealth_xid_errors_total")
        for (gpu, num, action), n in sorted(self.xids.items()):
            xid.add([gpu, num, action], n)
        follower = new("nodehealth_xid_follower_up")
        follower.add([self.xid_follower], b(self.xid_follower == "alive"))
        yield from (xid, follower)
        s = self.slurm
        if s is not None:
            for name, value in (
                ("nodehealth_slurm_node_drained", s.drained),
                ("nodehealth_slurm_node_drained_by_nodehealth", s.drained_by_nodehealth),
                ("nodehealth_slurm_breaker_open", s.breaker_open),
                ("nodehealth_slurm_flapping", s.flapping),
                ("nodehealth_slurm_orphan_drain", s.orphan_drain),
                ("nodehealth_slurm_observe_mode", s.observe_mode),
                ("nodehealth_slurm_reboot_escalated", s.reboot_escalated),
            ):
                if value is not None:
                    yield one(name, b(value))
            if s.reboots_requested is not None:
                yield one("nodehealth_slurm_reboots_requested", s.reboots_requested)
            if s.observe_mode or s.would:
                would = new("nodehealth_slurm_would_total")
                for action, n in s.would:
                    would.add([action], n)
                yield would
        acts = new("nodehealth_slurm_actions_total")
        for action, n in sorted(self.slurm_actions.items()):
            acts.add([action], n)
        yield acts
        rel = new("nodehealth_config_reloads_total")
        for result, n in sorted(self.reloads.items()):
            rel.add([result], n)
        yield rel
        if self.last_reload_ok is not None:
            yield one("nodehealth_config_last_reload_success", b(self.last_reload_ok))
        yield one("nodehealth_state_write_errors_total", self.state_write_errors)
        if self.state_written_at is not None:
            yield one("nodehealth_state_last_write_timestamp_seconds", self.state_written_at)
        yield one("nodehealth_start_time_seconds", self.started_at)

    def _config_families(self) -> Iterator[Metric]:
        """Called with the lock held."""
        if self.config is not None:
            file, error, using = self.config
            valid = new("nodehealth_config_valid")
            valid.add([file, error], b(error == "none"))
            in_use = new("nodehealth_config_in_use_info")
            in_use.add([using], 1)
            yield from (valid, in_use)
