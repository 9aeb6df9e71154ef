"""Run an XID store's follower in a thread, as the daemon does, until it has handed on a record."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from nodehealth.observations import XidRecord
from nodehealth.probes.xid_store import XidStore


def until_seen(seen: list[Any], stop: Callable[[], None]) -> None:
    """Wait until ``seen`` holds something (5 s at most), then ``stop()`` (also when the wait fails)."""
    try:
        deadline = time.monotonic() + 5
        while not seen and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        stop()


def follow_until_seen(store: XidStore, **kwargs: Any) -> list[XidRecord]:
    """The records ``store.follow`` hands on from its start until the first one (5 s at most), the follower
    then stopped and joined. ``kwargs``: more of follow's arguments (``on_note``...)."""
    seen: list[XidRecord] = []
    stop = threading.Event()
    t = threading.Thread(target=store.follow, args=(stop,), kwargs={"on_event": seen.append, "poll_s": 0.02, **kwargs})
    t.start()

    def stop_and_join() -> None:
        stop.set()
        t.join(5)

    until_seen(seen, stop_and_join)
    return seen
