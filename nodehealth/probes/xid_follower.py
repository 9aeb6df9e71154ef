"""The daemon's XID follower: ``XidStore.follow`` in a thread, restarted when it stops.

This boot's backlog first, then each new kernel-log line; every event is stored (so the
``gpu_xid`` check and the next prolog see it) and handed to ``on_event`` judged. It implements
the daemon's ``XidFollower`` protocol (``nodehealth.daemon.hooks``).
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Optional

from nodehealth.checks.gpu_xid import xid_settings
from nodehealth.platform.wake import WakeEvent

if TYPE_CHECKING:
    from nodehealth.config.schema import Config

Logger = Callable[..., None]  # log(message, priority, **fields), as the daemon's Log


class StoreXidFollower:
    """The XID event store's follower (``nodehealth.probes.xid_store.XidStore.follow``) in a
    thread: this boot's backlog first, then each new kernel-log line; every event is stored
    (so the ``gpu_xid`` check and the next prolog see it) and handed to ``on_event`` judged.
    A kernel log that cannot be read makes the follower ``dead``; it retries every ``retry_s``.
    What the store says about itself (parts of the file that were not valid, a position past
    the end of the log) is logged at warning level, once.
    """

    def __init__(self, cfg: Config, log: Logger, retry_s: float = 10.0) -> None:
        self.cfg = cfg
        xid_settings(cfg)  # a wrong [checks.gpu_xid] type fails here, not in the thread
        self.log, self.retry_s = log, retry_s
        self._stop = WakeEvent()  # polled beside /dev/kmsg: an idle follower sleeps (platform.wake)
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
        from nodehealth.probes.kernel_log import KernelLogUnavailable
        from nodehealth.probes.xid_store import StoreError, XidStore

        def handle(record: Any) -> None:
            try:
                on_event(record.event)
            except Exception as exc:  # noqa: BLE001 - one bad event must not stop the watch
                self.log(f"XID event handling failed: {type(exc).__name__}: {exc}", "err")

        while not self._stop.is_set():
            try:
                store = XidStore.configured(self.cfg)
                self._alive = True
                self.since = time.time()
                store.follow(self._stop, handle, on_note=lambda note: self.log(f"XID event store: {note}", "warning"))
            except (KernelLogUnavailable, StoreError, OSError, ValueError) as exc:
                self.log(f"XID follower stopped: {exc}; retrying in {self.retry_s:g} s", "err")
            self._alive = False
            self._stop.wait(self.retry_s)
