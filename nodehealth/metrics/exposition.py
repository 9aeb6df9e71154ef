"""The Prometheus text format (0.0.4), written by us: what the daemon needs of prometheus_client.

The daemon renders its page once per round, so all it needs is a family type with samples and the
writer of the text format, plus the standard ``process_*`` figures. Importing prometheus_client for
them cost the daemon 12 MiB of its resident memory (its package imports an HTTP server, WSGI, ASGI,
``ssl`` and ``email``) for two functions. The output is byte for byte what prometheus_client's
``generate_latest`` writes for the same families (tests/test_metrics.py compares them), and
``Process`` reads what its ``ProcessCollector`` reads, from ``/proc`` (an injectable root).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from typing import NamedTuple

_SUFFIX = {"counter": "_total", "info": "_info"}


class Sample(NamedTuple):
    name: str
    labels: dict[str, str]
    value: float


class Metric:
    """One family being filled: its base name (without ``_total``/``_info``), HELP text, type, samples."""

    def __init__(self, name: str, documentation: str, typ: str, unit: str = "") -> None:
        self.name, self.documentation, self.type, self.unit = name, documentation, typ, unit
        self.samples: list[Sample] = []

    def add_sample(self, name: str, labels: dict[str, str], value: float) -> None:
        self.samples.append(Sample(name, labels, value))


def go_float(d: float) -> str:
    """A value as Prometheus (Go) writes it: ``+Inf``, ``NaN``, an exponent past 1e6."""
    d = float(d)
    if math.isinf(d):
        return "+Inf" if d > 0 else "-Inf"
    if math.isnan(d):
        return "NaN"
    s = repr(d)
    dot = s.find(".")
    if d > 0 and dot > 6:
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return s


def _label(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def render(metrics: Iterable[Metric]) -> bytes:
    """The families as the text format: HELP, TYPE (an info family is a gauge), a line per sample."""
    out: list[str] = []
    for m in metrics:
        name = m.name + _SUFFIX.get(m.type, "")
        typ = "gauge" if m.type == "info" else m.type
        doc = m.documentation.replace("\\", r"\\").replace("\n", r"\n")
        out.append(f"# HELP {name} {doc}\n")
        out.append(f"# TYPE {name} {typ}\n")
        for s in m.samples:
            if s.labels:
                labels = ",".join(f'{k}="{_label(v)}"' for k, v in sorted(s.labels.items()))
                out.append(f"{s.name}{{{labels}}} {go_float(s.value)}\n")
            else:
                out.append(f"{s.name} {go_float(s.value)}\n")
    return "".join(out).encode("utf-8")


def _gauge(name: str, help: str, value: float, typ: str = "gauge") -> Metric:
    m = Metric(name[: -len("_total")] if typ == "counter" else name, help, typ)
    m.add_sample(name, {}, value)
    return m


def _slurp(path: str) -> bytes:
    """A small /proc file, read without a file object (half the time of ``open().read()``)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks: list[bytes] = []
        while True:
            data = os.read(fd, 65536)
            if not data:
                return b"".join(chunks)
            chunks.append(data)
    finally:
        os.close(fd)


# The process_* families as prometheus_client's ProcessCollector names and documents them, in its order.
_PROCESS = (
    ("process_virtual_memory_bytes", "Virtual memory size in bytes.", "gauge"),
    ("process_resident_memory_bytes", "Resident memory size in bytes.", "gauge"),
    ("process_start_time_seconds", "Start time of the process since unix epoch in seconds.", "gauge"),
    ("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.", "counter"),
    ("process_open_fds", "Number of open file descriptors.", "gauge"),
    ("process_max_fds", "Maximum number of open file descriptors.", "gauge"),
)


class Process:
    """The daemon's own ``process_*`` figures, as prometheus_client's ProcessCollector reads them.

    A scrape re-reads them (Prometheus scrapes less often than NodeMetrics' PROCESS_EVERY_S), so
    ``text()`` writes them without building families: each family's HELP, TYPE and sample name are
    rendered once (by ``render``, so the bytes are the same) and only the values are written."""

    def __init__(self, proc: str = "/proc") -> None:
        self.proc = proc
        self.ticks = float(os.sysconf("SC_CLK_TCK"))
        self.page = os.sysconf("SC_PAGE_SIZE")
        self.btime = 0.0
        me = os.path.join(proc, "self")
        self._stat, self._limits, self._fd = (os.path.join(me, x) for x in ("stat", "limits", "fd"))
        try:
            with open(os.path.join(proc, "stat"), "rb") as f:
                for line in f:
                    if line.startswith(b"btime "):
                        self.btime = float(line.split()[1])
        except OSError:
            pass
        self._heads = []
        for name, help, typ in _PROCESS:
            head = render([_gauge(name, help, 0.0, typ)])
            self._heads.append(head[: head.rindex(b" ") + 1])

    def read(self) -> list[tuple[int, float]]:
        """(index in ``_PROCESS``, value) for each figure read; none without ``/proc``."""
        if not self.btime:
            return []
        out: list[tuple[int, float]] = []
        try:
            parts = _slurp(self._stat).split(b")")[-1].split()
            out += [
                (0, float(parts[20])),
                (1, float(parts[21]) * self.page),
                (2, float(parts[19]) / self.ticks + self.btime),
                (3, (float(parts[11]) + float(parts[12])) / self.ticks),
            ]
        except OSError:
            pass
        try:
            max_fds = None
            for line in _slurp(self._limits).split(b"\n"):
                if line.startswith(b"Max open file"):
                    max_fds = float(line.split()[3])
                    break
            out.append((4, float(len(os.listdir(self._fd)))))
            if max_fds is not None:
                out.append((5, max_fds))
        except OSError:
            pass
        return out

    def families(self) -> list[Metric]:
        return [_gauge(_PROCESS[i][0], _PROCESS[i][1], v, _PROCESS[i][2]) for i, v in self.read()]

    def text(self) -> bytes:
        """``render(self.families())``, without the families."""
        heads = self._heads
        return b"".join([heads[i] + go_float(v).encode() + b"\n" for i, v in self.read()])
