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


class Process:
    """The daemon's own ``process_*`` figures, as prometheus_client's ProcessCollector reads them."""

    def __init__(self, proc: str = "/proc") -> None:
        self.proc = proc
        self.ticks = float(os.sysconf("SC_CLK_TCK"))
        self.page = os.sysconf("SC_PAGE_SIZE")
        self.btime = 0.0
        try:
            with open(os.path.join(proc, "stat"), "rb") as f:
                for line in f:
                    if line.startswith(b"btime "):
                        self.btime = float(line.split()[1])
        except OSError:
            pass

    def families(self) -> list[Metric]:
        if not self.btime:
            return []
        me = os.path.join(self.proc, "self")
        out: list[Metric] = []
        try:
            with open(os.path.join(me, "stat"), "rb") as f:
                parts = f.read().split(b")")[-1].split()
            out += [
                _gauge("process_virtual_memory_bytes", "Virtual memory size in bytes.", float(parts[20])),
                _gauge("process_resident_memory_bytes", "Resident memory size in bytes.", float(parts[21]) * self.page),
                _gauge(
                    "process_start_time_seconds",
                    "Start time of the process since unix epoch in seconds.",
                    float(parts[19]) / self.ticks + self.btime,
                ),
                _gauge(
                    "process_cpu_seconds_total",
                    "Total user and system CPU time spent in seconds.",
                    (float(parts[11]) + float(parts[12])) / self.ticks,
                    "counter",
                ),
            ]
        except OSError:
            pass
        try:
            max_fds = None
            with open(os.path.join(me, "limits"), "rb") as f:
                for line in f:
                    if line.startswith(b"Max open file"):
                        max_fds = float(line.split()[3])
                        break
            out.append(_gauge("process_open_fds", "Number of open file descriptors.", len(os.listdir(f"{me}/fd"))))
            if max_fds is not None:
                out.append(_gauge("process_max_fds", "Maximum number of open file descriptors.", max_fds))
        except OSError:
            pass
        return out
