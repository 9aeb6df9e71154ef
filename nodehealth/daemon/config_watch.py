"""The daemon's configuration while it runs: SIGHUP's reload and the watch before a scrape.

A reload (``reload``) re-reads and validates the file and applies it, or rejects it and keeps
the running configuration (``[daemon] listen`` waits for a restart). The watch
(``watch_config``) judges the file again when it changed (one ``stat`` while it has not), for
``nodehealth_config_valid``, without applying it. ``ConfigWatch`` is a part of ``Daemon``
(``daemon/core.py``): it uses the daemon's config, log, metrics and wake-up event.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from typing import Any, Optional

from nodehealth.config import lean
from nodehealth.config.loader import ConfigError, load_valid
from nodehealth.config.schema import Config
from nodehealth.config.use import probe_setup, simulated
from nodehealth.daemon.logs import Log
from nodehealth.metrics import NodeMetrics


def file_identity(path: str) -> Any:
    """``lean.identity`` of what ``path`` names now; None when it is absent, the error text when it cannot tell."""
    try:
        return lean.identity(os.stat(path))
    except FileNotFoundError:
        return None
    except OSError as exc:
        return str(exc)


class ConfigWatch:
    """The reload and the watch of ``Daemon``; the attributes are the daemon's (set in its ``__init__``)."""

    cfg: Config
    config_path: Optional[str]
    config_file: str  # the absolute path of the file watched
    config_lock: threading.Lock  # one watch at a time (scrapes come in parallel)
    config_using: str  # "file", or "last_validated" after a rejected file
    config_seen: Any  # ``file_identity`` of the file when it was last judged
    simulate: Optional[str]  # the daemon's --simulate: a reload and the watch apply it as the start did
    log: Log
    metrics: NodeMetrics
    wake: threading.Event

    def load(self) -> tuple[Config, str]:
        """The config file validated as the start's ``config.use`` did: with the daemon's ``--simulate``
        applied before the probes' setup is checked (a SIGHUP must not drop the scenario)."""
        if not self.simulate:
            return load_valid(self.config_path, check=probe_setup)
        cfg, note = load_valid(self.config_path)
        cfg = simulated(cfg, self.simulate)
        probe_setup(cfg)
        return cfg, note

    def reload(self) -> bool:
        """Re-read the config file; a bad one is rejected and the running config kept."""
        seen = file_identity(self.config_file)
        try:
            new, note = self.load()
            if new.daemon.textfile_dir and not os.path.isdir(new.daemon.textfile_dir):
                raise ConfigError(f"{new.source}: daemon.textfile_dir: {new.daemon.textfile_dir} does not exist")
        except ConfigError as exc:
            self.log(f"config reload rejected, keeping the running configuration: {exc}", "err")
            self.metrics.reloaded(False)
            self.config_using = "last_validated"
            self._config_judged(seen, exc.kind)
            return False
        if note:
            self.log(note, "warning")
        if new.daemon.listen != self.cfg.daemon.listen:
            self.log(f"[daemon] listen changed to {new.daemon.listen!r}: takes effect at the next restart", "warning")
            new = dataclasses.replace(new, daemon=dataclasses.replace(new.daemon, listen=self.cfg.daemon.listen))
        self.cfg = new
        self.metrics.set_detail(new.daemon.metrics_detail)
        self.metrics.reloaded(True)
        self.config_using = "file"
        self._config_judged(seen, "none")
        self.log(f"configuration reloaded from {new.source}", "notice")
        self.wake.set()
        return True

    def _config_judged(self, seen: Any, error: str) -> None:
        self.config_seen = seen
        if self.metrics.config_probe is not None:
            self.metrics.set_config(self.config_file, error, self.config_using)

    def watch_config(self) -> None:
        """Before a scrape: when the config file changed, judge it again (not applied: SIGHUP does that).

        One ``stat`` while it has not changed. The file that changed and does not validate is
        logged once and shows as ``nodehealth_config_valid 0``; the running config stays.
        """
        if not self.config_lock.acquire(blocking=False):
            return
        try:
            seen = file_identity(self.config_file)
            if seen == self.config_seen:
                return
            try:
                self.load()
            except ConfigError as exc:
                self.log(
                    f"the config file changed and does not validate (the running configuration stays): {exc}", "err"
                )
                self._config_judged(seen, exc.kind)
            else:
                self._config_judged(seen, "none")
        finally:
            self.config_lock.release()
