"""The pollable stop event (platform.wake) and the idle XID follower that sleeps on it.

An idle follower on /dev/kmsg used to wake 4 times a second to look at its stop event; with a
``WakeEvent`` it waits in one ``poll()`` on the log and the event's pipe. The log here is a
pseudo-terminal: a character device, read without blocking and polled like /dev/kmsg.
"""

from __future__ import annotations

import fcntl
import os
import select
import threading
import time
import tty
from typing import Any

import pytest

from nodehealth.platform.wake import WakeEvent
from nodehealth.probes import kernel_log
from nodehealth.probes.kernel_log import WAKE_IDLE_S, KmsgReader

RECORD = b"3,1,100,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n"


def _readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


def test_readable_from_set_until_clear_and_private_to_the_process() -> None:
    ev = WakeEvent()
    assert not _readable(ev.fileno()) and not ev.is_set()
    ev.set()
    ev.set()  # twice: still one readable end, never blocks
    assert ev.is_set() and _readable(ev.fileno())
    ev.clear()
    assert not ev.is_set() and not _readable(ev.fileno())  # drained: a cleared event never spins a poll
    for fd in (ev._r, ev._w):
        assert fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC  # a program we start does not inherit it
    for _ in range(70000):  # more than a pipe holds: set() never blocks (a signal handler may call it)
        ev.set()
    ev.close()
    ev.set()  # after close: the event still works, the pipe is gone
    assert ev.is_set()


@pytest.fixture
def pty_log() -> Any:
    master, slave = os.openpty()
    tty.setraw(slave)
    yield master, os.ttyname(slave)
    os.close(master)
    os.close(slave)


def test_an_idle_follower_sleeps_until_a_record_or_the_stop(pty_log: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    master, path = pty_log
    waits: list[int] = []
    real_poll = select.poll

    class Recording:
        def __init__(self) -> None:
            self.p = real_poll()

        def register(self, fd: int, mask: int) -> None:
            self.p.register(fd, mask)

        def poll(self, timeout: int) -> Any:
            waits.append(timeout)
            return self.p.poll(timeout)

    monkeypatch.setattr(kernel_log.select, "poll", Recording)
    stop, got = WakeEvent(), []
    reader = KmsgReader(path)
    thread = threading.Thread(target=lambda: got.extend(reader.lines(follow=True, stop=stop)), daemon=True)
    thread.start()
    os.write(master, RECORD)
    end = time.monotonic() + 30
    while not got and time.monotonic() < end:
        time.sleep(0.01)
    assert got and b"Xid (PCI:0000:3b:00): 79" in got[0]
    stop.set()
    thread.join(timeout=30)  # ends at once: the stop's pipe is in the poll (else it would sleep 60 s)
    assert not thread.is_alive()
    # Every idle wait was the long one: no wake-up each poll interval to look at the stop.
    assert waits and set(waits) == {int(WAKE_IDLE_S * 1000)}, waits


def test_a_plain_event_still_bounds_each_wait_by_the_poll_interval(pty_log: Any) -> None:
    """Callers with a threading.Event (tests, older code) keep their prompt stop: each wait is poll_s."""
    _, path = pty_log
    stop = threading.Event()
    reader = KmsgReader(path, poll_s=0.05)
    thread = threading.Thread(target=lambda: list(reader.lines(follow=True, stop=stop)), daemon=True)
    thread.start()
    time.sleep(0.2)
    stop.set()
    thread.join(timeout=30)
    assert not thread.is_alive()
