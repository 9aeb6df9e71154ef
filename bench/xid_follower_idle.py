"""What an idle XID follower costs: its thread's CPU on a quiet kernel-log device, per 30 s, by stop event.

    .venv/bin/python bench/xid_follower_idle.py [--seconds 10] [--rounds 5] [--out report.md]

The daemon's follower waits on /dev/kmsg for the next record. With a plain ``threading.Event`` as
its stop it wakes every ``poll_s`` (0.25 s) to look at the event; with ``platform.wake.WakeEvent``
the event's pipe is in the same ``poll()`` and it sleeps until a record or the stop. Each round
runs the reader in a thread for --seconds with one stop kind, then the other (interleaved, so a
busy machine weighs on both), and takes the thread's own CPU time (``time.thread_time``). The log
is a pseudo-terminal: a character device read without blocking and polled as /dev/kmsg is (the
same code path: EAGAIN, then ``poll()``), with no backlog to read first, so all the time measured
is idle time, and no root needed. Quoted: the medians per 30 s of idle, their ratio, and the
wake-ups (poll calls).
"""

from __future__ import annotations

import argparse
import os
import select
import statistics
import sys
import threading
import time
import tty
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from nodehealth.platform.wake import WakeEvent  # noqa: E402
from nodehealth.probes import kernel_log  # noqa: E402


def _log_path() -> str:
    master, slave = os.openpty()
    tty.setraw(slave)
    _KEEP.extend((master, slave))
    return os.ttyname(slave)


_KEEP: list[int] = []


def one(path: str, stop: threading.Event, seconds: float) -> tuple[float, int]:
    """(thread CPU seconds, poll calls) of a follower left idle for ``seconds`` after its backlog."""
    polls = [0]
    real = select.poll

    class Counting:
        def __init__(self) -> None:
            self.p = real()

        def register(self, fd: int, mask: int) -> None:
            self.p.register(fd, mask)

        def poll(self, timeout: int) -> Any:
            polls[0] += 1
            return self.p.poll(timeout)

    kernel_log.select.poll = Counting  # type: ignore[misc]
    cpu: list[float] = []

    def body() -> None:
        t0 = time.thread_time()
        for _ in kernel_log.KmsgReader(path).lines(follow=True, stop=stop):
            pass
        cpu.append(time.thread_time() - t0)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    time.sleep(seconds)
    stop.set()
    thread.join(30)
    kernel_log.select.poll = real  # type: ignore[misc]
    return cpu[0], polls[0]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    path, what = _log_path(), "a pseudo-terminal standing in for /dev/kmsg"
    rows: dict[str, list[tuple[float, int]]] = {"threading.Event": [], "WakeEvent": []}
    for _ in range(args.rounds):
        rows["threading.Event"].append(one(path, threading.Event(), args.seconds))
        rows["WakeEvent"].append(one(path, WakeEvent(), args.seconds))
    scale = 30.0 / args.seconds
    med = {k: statistics.median(c for c, _ in v) * scale * 1000 for k, v in rows.items()}
    wakes = {k: statistics.median(p for _, p in v) * scale for k, v in rows.items()}
    lines = [
        f"# Idle XID follower on {what}: {args.rounds} interleaved rounds of {args.seconds:g} s each",
        "",
        "| stop event | thread CPU per 30 s idle (median) | poll calls per 30 s (median) |",
        "|---|---|---|",
        *(f"| {k} | {med[k]:.2f} ms | {wakes[k]:.0f} |" for k in rows),
        "",
        f"ratio WakeEvent / threading.Event: {med['WakeEvent'] / med['threading.Event']:.3f}"
        if med["threading.Event"]
        else "ratio: n/a",
        f"load average at the end: {os.getloadavg()[0]:.2f}",
    ]
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
