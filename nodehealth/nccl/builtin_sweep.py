"""The built-in runner's sweep and its output in nccl-tests' layout (``nccl/builtin.py`` runs it).

The sizes of a sweep (``-b``, ``-e``, ``-f`` as nccl-tests), the lines nccl-tests prints (the
header, one row per size with time, algbw, busbw and #wrong for out-of-place and in-place, the
``# Out of bounds values`` and ``# Avg bus bandwidth`` footer) and the ``Backend`` interface every
backend implements. Standard library and ``nccl.parse`` only: it is imported by a child run as
``python -I -m nodehealth.nccl.builtin``, from the installed package.
"""

from __future__ import annotations

import argparse
import os
import socket
from typing import Callable, Optional, Sequence

VERSION = "nodehealth-builtin 1"
FLOAT_BYTES = 4


def sizes(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    out = []
    size = max(FLOAT_BYTES, min_bytes)
    while size <= max_bytes:
        out.append(size - size % FLOAT_BYTES)
        size = size * factor if factor > 1 else size + max_bytes
    return out or [max(FLOAT_BYTES, max_bytes - max_bytes % FLOAT_BYTES)]


def bus_factor(n: int) -> float:
    try:
        from nodehealth.nccl.parse import busbw
    except ImportError:  # pragma: no cover - the parsers ship with the package
        return 2.0 * (n - 1) / n if n else 0.0
    return float(busbw(1.0, n, "all_reduce"))


# --------------------------------------------------------------------------- nccl-tests' layout


def header(args: argparse.Namespace, devices: Sequence[tuple[int, str, str]], nccl_version: str) -> str:
    """The lines above the table: the run's parameters, one line per rank, the NCCL version."""
    host = socket.gethostname()
    lines = [
        f"# nccl-tests version {VERSION} (nodehealth built-in runner, backend {args.backend})",
        "# Collective test starting: all_reduce_perf",
        f"# nThread 1 nGpus {args.ngpus} minBytes {args.minbytes} maxBytes {args.maxbytes} step: "
        f"{args.stepfactor}(factor) warmup iters: {args.warmup_iters} iters: {args.iters} agg iters: 1 "
        f"validation: {1 if args.check else 0} graph: 0",
        "#",
        "# Using devices",
    ]
    pid = os.getpid()
    for rank, (dev, bus, name) in enumerate(devices):
        lines.append(f"#  Rank {rank:2d} Group  0 Pid {pid:6d} on {host:>10s} device {dev:2d} [{bus}] {name}")
    lines += [
        f"NCCL version {nccl_version}",
        "#",
        "#                                                              out-of-place                       "
        "in-place          ",
        "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw"
        "   busbw #wrong ",
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)"
        "  (GB/s)        ",
    ]
    return "\n".join(lines)


def _num(value: float, width: int) -> str:
    for digits in (2, 1, 0):
        text = f"{value:{width}.{digits}f}"
        if len(text) <= width:
            return text
    return f"{value:{width}.1e}"


def row(size: int, oop_us: float, ip_us: float, n: int, oop_wrong: Optional[int], ip_wrong: Optional[int]) -> str:
    """One size row, laid out as nccl-tests prints it (time, algbw, busbw, #wrong twice)."""
    factor = bus_factor(n)

    def half(us: float, wrong: Optional[int]) -> str:
        algbw = size / (us * 1e-6) / 1e9 if us > 0 else 0.0
        w = "   N/A" if wrong is None else f"{wrong:6d}"
        return f"  {_num(us, 7)}  {_num(algbw, 6)}  {_num(algbw * factor, 6)}  {w}"

    return (
        f"{size:12d}  {size // FLOAT_BYTES:12d}  {'float':>8s}  {'sum':>6s}  {-1:6d}"
        + half(oop_us, oop_wrong)
        + half(ip_us, ip_wrong)
    )


def footer(results: Sequence[tuple[int, float, float]], n: int, wrong: int) -> str:
    factor = bus_factor(n)
    bws = [size / (us * 1e-6) / 1e9 * factor for size, a, b in results for us in (a, b) if us > 0]
    avg = sum(bws) / len(bws) if bws else 0.0
    return "\n".join(
        [
            f"# {'Out of bounds values':<20s} : {wrong} {'FAILED' if wrong else 'OK'}",
            f"# {'Avg bus bandwidth':<20s} : {avg:g} ",
            "#",
            "# Collective test concluded: all_reduce_perf",
            "",
        ]
    )


# --------------------------------------------------------------------------- the sweep


class Backend:
    """One way of running an all-reduce across ``n`` devices of this node."""

    name = ""

    def devices(self) -> list[tuple[int, str, str]]:
        """(device index, PCI bus id, name) per rank."""
        raise NotImplementedError

    def version(self) -> str:
        raise NotImplementedError

    def time_us(self, count: int, in_place: bool, warmup: int, iters: int) -> float:
        """Mean time of one all-reduce of ``count`` floats (microseconds)."""
        raise NotImplementedError

    def wrong(self, count: int, in_place: bool) -> int:
        """Elements not equal to the sum of the ranks' inputs after one all-reduce."""
        raise NotImplementedError

    def close(self) -> None:
        pass


def sweep(backend: Backend, args: argparse.Namespace, out: Callable[[str], None]) -> int:
    """Every size of the sweep, printed as it completes; returns the total #wrong."""
    n = args.ngpus
    out(header(args, backend.devices(), backend.version()))
    results: list[tuple[int, float, float]] = []
    total_wrong = 0
    for size in sizes(args.minbytes, args.maxbytes, args.stepfactor):
        count = size // FLOAT_BYTES
        oop = backend.time_us(count, False, args.warmup_iters, args.iters)
        ip = backend.time_us(count, True, args.warmup_iters, args.iters)
        ow = iw = None
        if args.check:
            ow, iw = backend.wrong(count, False), backend.wrong(count, True)
            total_wrong += ow + iw
        results.append((size, oop, ip))
        out(row(size, oop, ip, n, ow, iw))
    out(footer(results, n, total_wrong))
    return total_wrong
