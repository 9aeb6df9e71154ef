"""Progress of a slow ``nodehealth check`` on a terminal: one updating line on stderr naming what the run
waits for and its budget ("waiting for nvml (4 s of its 10 s); budget 10 s"), so a hung NVML is never
minutes of silence. Nothing when stderr is not a terminal (a pipe, a file, cron, slurmd), and nothing for a
run done within ``AFTER_S``; the line is erased when the run ends, so the report reads as without it.

What it waits for comes from the probes themselves: ``watched`` wraps each probe of the table the runner is
given (``runner.execute(probes=...)``), marking when it started, its deadline and when it answered.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import IO, Any, Callable, Optional

from nodehealth.probes import PROBES, Probe

AFTER_S = 1.0  # a run done sooner shows nothing
EVERY_S = 0.5  # the line's refresh
WIDTH = 100  # at most this many characters: one terminal line
ERASE = "\r\x1b[K"


class Watch:
    """The probes of one run: name -> [started (monotonic), deadline_s, answered]."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.probes: dict[str, list[Any]] = {}
        self.lock = threading.Lock()

    def start(self, name: str, timeout_s: float) -> None:
        with self.lock:
            self.probes[name] = [self.clock(), timeout_s, False]

    def answered(self, name: str) -> None:
        with self.lock:
            if name in self.probes:
                self.probes[name][2] = True

    def waiting(self) -> list[tuple[str, float, float]]:
        """(probe, seconds it has run, its deadline) of each probe not answered yet, the longest first."""
        now = self.clock()
        with self.lock:
            out = [(n, now - t0, limit) for n, (t0, limit, done) in self.probes.items() if not done]
        return sorted(out, key=lambda w: -w[1])


def watched(watch: Watch, table: Optional[dict[str, Probe]] = None) -> dict[str, Probe]:
    """``table`` (default: the probes' own) with every probe reporting to ``watch``; same answers."""
    return {name: dataclasses.replace(p, gather=_gather(watch, p)) for name, p in (table or PROBES).items()}


def _gather(watch: Watch, probe: Probe) -> Callable[[Any, float], Any]:
    def gather(ctx: Any, timeout_s: float) -> Any:
        watch.start(probe.name, timeout_s)
        try:
            got = probe.gather(ctx, timeout_s)
        except BaseException:
            watch.answered(probe.name)
            raise
        if probe.forks and hasattr(got, "collect"):
            return _Pending(got, watch, probe.name)  # answered when its child's answer is collected
        watch.answered(probe.name)
        return got

    return gather


class _Pending:
    """A forking probe's pending read, marked answered once collected."""

    def __init__(self, pending: Any, watch: Watch, name: str) -> None:
        self.pending, self.watch, self.name = pending, watch, name

    def collect(self) -> Any:
        try:
            return self.pending.collect()
        finally:
            self.watch.answered(self.name)


def describe(watch: Watch, budget_s: Optional[float], elapsed_s: float) -> str:
    """The progress line: what the run waits for, and the budget (None: the face's own, which each probe's
    deadline is held within: ``check --as``)."""
    waiting = watch.waiting()
    budget = f"budget {_s(budget_s)} s" if budget_s is not None else "within the face's budget"
    if waiting:
        what = ", ".join(f"{n} ({_s(ran)} s of its {_s(limit)} s)" for n, ran, limit in waiting)
        line = f"nodehealth: waiting for {what}; {budget}"
    else:
        line = f"nodehealth: deciding, {_s(elapsed_s)} s so far; {budget}"
    return line if len(line) <= WIDTH else line[: WIDTH - 3] + "..."


def _s(seconds: float) -> str:
    """Seconds to a tenth, without a trailing ``.0``: 2.6, 10."""
    return f"{max(0.0, seconds):.1f}".removesuffix(".0")


class Line:
    """``with Line(stream, text):`` one line rewritten every ``every_s`` while the block runs, from ``after_s``
    on, on a terminal only; erased at the end. ``text(elapsed_s)`` gives the line."""

    def __init__(
        self,
        stream: IO[str],
        text: Callable[[float], str],
        after_s: float = AFTER_S,
        every_s: float = EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream, self.text, self.after_s, self.every_s, self.clock = stream, text, after_s, every_s, clock
        self.stop = threading.Event()
        self.thread: Optional[threading.Thread] = None
        self.shown = False

    def active(self) -> bool:
        isatty = getattr(self.stream, "isatty", None)
        return bool(isatty and isatty())

    def __enter__(self) -> Line:
        if self.active():
            self.started = self.clock()
            self.thread = threading.Thread(target=self._run, name="progress", daemon=True)
            self.thread.start()
        return self

    def _run(self) -> None:
        if self.stop.wait(self.after_s):
            return
        while not self.stop.is_set():
            self._write(ERASE + self.text(self.clock() - self.started))
            self.shown = True
            self.stop.wait(self.every_s)

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # the terminal went away: the run goes on without it
            self.stop.set()

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join()
            if self.shown:
                self._write(ERASE)
