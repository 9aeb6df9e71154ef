"""The built-in runner: an all-reduce across the node's GPUs without a compiled nccl-tests.

Run as a child process (``python -m nodehealth.nccl.builtin -b 8M -e 1G -f 2 -g 8 -c 1``) by the
``nccl_selftest`` check's runner, which kills its process group at the deadline. It prints its
results in nccl-tests' layout (the same header, the same size rows, ``# Out of bounds values``
and ``# Avg bus bandwidth``), so the one nccl-tests parser reads both; NCCL's own
``NCCL_DEBUG`` lines go to the same standard output, as with nccl-tests.

Backends, in the order ``--backend auto`` tries them:

* ``nccl4py``: NVIDIA's NCCL bindings (PyPI ``nccl4py``, Python 3.10+) in this one process:
  ``Communicator.init_all`` over the GPUs (NCCL's single-process, multi-GPU mode, as
  ``all_reduce_perf -g N``), buffers and CUDA events from ``cuda.bindings``' driver API.
* ``torch``: ``torch.distributed`` with the NCCL backend, one process per GPU
  (``torch.multiprocessing`` spawn), CUDA events for the timing.
* ``cpu``: no GPU, no NCCL: the same sweep over ``-g`` host buffers in this process. It exists to
  test the runner's orchestration and output on machines without GPUs; ``auto`` never picks it.

Timing as nccl-tests: per size, ``-w`` warm-up iterations, then ``-n`` timed iterations, the time
of one the mean; algbw = bytes / time, busbw = algbw x 2(n-1)/n (``nccl.parse.busbw``).
``-c 1`` checks the result of one out-of-place and one in-place all-reduce: every element must
be the sum of the ranks' inputs; the count of elements that are not is ``#wrong``.

Exit status: 0 done, 1 an error (the message on stderr), 69 no backend can be imported.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from typing import Any, Callable, Optional, Sequence

EXIT_NO_BACKEND = 69
VERSION = "nodehealth-builtin 1"
FLOAT_BYTES = 4


def parse_size(text: str) -> int:
    """nccl-tests' size syntax: a number with an optional K, M, G (powers of 1024)."""
    t = text.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(t[-1:], 1)
    digits = t[:-1] if t[-1:] in "KMGT" else t
    value = int(float(digits) * mult)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text}: negative size")
    return value


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
    lines = [f"# nccl-tests version {VERSION} (nodehealth built-in runner, backend {args.backend})",
             "# Collective test starting: all_reduce_perf",
             f"# nThread 1 nGpus {args.ngpus} minBytes {args.minbytes} maxBytes {args.maxbytes} step: "
             f"{args.stepfactor}(factor) warmup iters: {args.warmup_iters} iters: {args.iters} agg iters: 1 "
             f"validation: {1 if args.check else 0} graph: 0", "#", "# Using devices"]
    pid = os.getpid()
    for rank, (dev, bus, name) in enumerate(devices):
        lines.append(f"#  Rank {rank:2d} Group  0 Pid {pid:6d} on {host:>10s} device {dev:2d} [{bus}] {name}")
    lines += [f"NCCL version {nccl_version}", "#",
              "#                                                              out-of-place                       "
              "in-place          ",
              "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw"
              "   busbw #wrong ",
              "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)"
              "  (GB/s)        "]
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

    return f"{size:12d}  {size // FLOAT_BYTES:12d}  {'float':>8s}  {'sum':>6s}  {-1:6d}" + half(oop_us, oop_wrong) \
        + half(ip_us, ip_wrong)


def footer(results: Sequence[tuple[int, float, float]], n: int, wrong: int) -> str:
    factor = bus_factor(n)
    bws = [size / (us * 1e-6) / 1e9 * factor for size, a, b in results for us in (a, b) if us > 0]
    avg = sum(bws) / len(bws) if bws else 0.0
    return "\n".join([f"# {'Out of bounds values':<20s} : {wrong} {'FAILED' if wrong else 'OK'}",
                      f"# {'Avg bus bandwidth':<20s} : {avg:g} ", "#",
                      "# Collective test concluded: all_reduce_perf", ""])


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


class CpuBackend(Backend):
    """Host buffers in this process (no GPU, no NCCL): the sweep's orchestration and output only."""

    name = "cpu"

    def __init__(self, n: int) -> None:
        self.n = n

    def devices(self) -> list[tuple[int, str, str]]:
        return [(i, "0000:00:00", "host memory (cpu backend)") for i in range(self.n)]

    def version(self) -> str:
        return "none (cpu backend)"

    def _reduce(self, count: int) -> list[float]:
        inputs = [[float(r + 1)] * min(count, 1 << 16) for r in range(self.n)]
        return [sum(col) for col in zip(*inputs)]

    def time_us(self, count: int, in_place: bool, warmup: int, iters: int) -> float:
        t0 = time.perf_counter()
        for _ in range(max(1, iters)):
            self._reduce(count)
        return (time.perf_counter() - t0) / max(1, iters) * 1e6

    def wrong(self, count: int, in_place: bool) -> int:
        expected = self.n * (self.n + 1) / 2
        return sum(1 for v in self._reduce(count) if v != expected)


class Nccl4pyBackend(Backend):  # pragma: no cover - needs GPUs and nccl4py
    """nccl4py's ``Communicator.init_all`` over ``n`` GPUs in this process; memory and events
    through the CUDA driver API (``cuda.bindings``)."""

    name = "nccl4py"

    def __init__(self, n: int) -> None:
        import importlib

        import nccl.core as nccl

        try:
            driver = importlib.import_module("cuda.bindings.driver")
        except ImportError:  # cuda-python before 12.6: cuda.cuda
            driver = importlib.import_module("cuda.cuda")
        self.nccl, self.cu = nccl, driver
        self._ok(driver.cuInit(0))
        self.n = n
        self.ctx, self.streams = [], []
        for i in range(n):
            dev = self._ok(driver.cuDeviceGet(i))
            ctx = self._ok(driver.cuDevicePrimaryCtxRetain(dev))
            self._ok(driver.cuCtxSetCurrent(ctx))
            self.ctx.append(ctx)
            self.streams.append(self._ok(driver.cuStreamCreate(0)))
        self.comms = nccl.Communicator.init_all(n)
        self.bufs: dict[int, list[tuple[int, int]]] = {}

    def _ok(self, result: Any) -> Any:
        err, *rest = result if isinstance(result, tuple) else (result,)
        if int(err) != 0:
            raise RuntimeError(f"CUDA driver error {err}")
        return rest[0] if len(rest) == 1 else tuple(rest)

    def devices(self) -> list[tuple[int, str, str]]:
        cu = self.cu
        out = []
        for i in range(self.n):
            dev = self._ok(cu.cuDeviceGet(i))
            name = self._ok(cu.cuDeviceGetName(64, dev))
            bus = self._ok(cu.cuDeviceGetPCIBusId(16, dev))
            out.append((i, bytes(bus).split(b"\0")[0].decode(), bytes(name).split(b"\0")[0].decode()))
        return out

    def version(self) -> str:
        return str(self.nccl.get_version())

    class _Array:
        """A CUDA Array Interface view of a device allocation, which nccl4py accepts as a buffer."""

        def __init__(self, ptr: int, count: int) -> None:
            self.__cuda_array_interface__ = {"shape": (count,), "typestr": "<f4", "data": (ptr, False),
                                             "version": 3, "strides": None, "stream": None}

    def _buffers(self, count: int) -> list[tuple[int, int]]:
        if count not in self.bufs:
            for old in self.bufs.values():
                for s, r in old:
                    self.cu.cuMemFree(s)
                    self.cu.cuMemFree(r)
            self.bufs = {}
            pairs = []
            for i in range(self.n):
                self._ok(self.cu.cuCtxSetCurrent(self.ctx[i]))
                pairs.append((int(self._ok(self.cu.cuMemAlloc(count * FLOAT_BYTES))),
                              int(self._ok(self.cu.cuMemAlloc(count * FLOAT_BYTES)))))
            self.bufs[count] = pairs
        return self.bufs[count]

    def _fill(self, count: int) -> None:
        import struct

        for i, (s, r) in enumerate(self._buffers(count)):
            self._ok(self.cu.cuCtxSetCurrent(self.ctx[i]))
            bits = struct.unpack("<I", struct.pack("<f", float(i + 1)))[0]
            self._ok(self.cu.cuMemsetD32Async(s, bits, count, self.streams[i]))
            self._ok(self.cu.cuMemsetD32Async(r, bits, count, self.streams[i]))
        self._sync()

    def _sync(self) -> None:
        for i in range(self.n):
            self._ok(self.cu.cuCtxSetCurrent(self.ctx[i]))
            self._ok(self.cu.cuStreamSynchronize(self.streams[i]))

    def _launch(self, count: int, in_place: bool) -> None:
        pairs = self._buffers(count)
        with self.nccl.group():
            for i, comm in enumerate(self.comms):
                s, r = pairs[i]
                dst = s if in_place else r
                comm.allreduce(self._Array(s, count), self._Array(dst, count), self.nccl.SUM,
                               stream=int(self.streams[i]))

    def time_us(self, count: int, in_place: bool, warmup: int, iters: int) -> float:
        self._fill(count)
        for _ in range(warmup):
            self._launch(count, in_place)
        self._sync()
        cu = self.cu
        events = []
        for i in range(self.n):
            self._ok(cu.cuCtxSetCurrent(self.ctx[i]))
            start, stop = self._ok(cu.cuEventCreate(0)), self._ok(cu.cuEventCreate(0))
            self._ok(cu.cuEventRecord(start, self.streams[i]))
            events.append((start, stop))
        for _ in range(max(1, iters)):
            self._launch(count, in_place)
        worst = 0.0
        for i, (start, stop) in enumerate(events):
            self._ok(cu.cuCtxSetCurrent(self.ctx[i]))
            self._ok(cu.cuEventRecord(stop, self.streams[i]))
            self._ok(cu.cuEventSynchronize(stop))
            worst = max(worst, float(self._ok(cu.cuEventElapsedTime(start, stop))))
        return worst * 1000.0 / max(1, iters)

    def wrong(self, count: int, in_place: bool) -> int:
        import array

        self._fill(count)
        self._launch(count, in_place)
        self._sync()
        expected = self.n * (self.n + 1) / 2
        bad = 0
        sample = min(count, 1 << 20)  # the first 4 MiB of each result
        for i, (s, r) in enumerate(self._buffers(count)):
            self._ok(self.cu.cuCtxSetCurrent(self.ctx[i]))
            host = array.array("f", bytes(sample * FLOAT_BYTES))
            addr, _ = host.buffer_info()
            self._ok(self.cu.cuMemcpyDtoH(addr, s if in_place else r, sample * FLOAT_BYTES))
            bad += sum(1 for v in host if v != expected)
        return bad

    def close(self) -> None:
        for comm in getattr(self, "comms", []):
            comm.destroy()


def _torch_worker(rank: int, n: int, port: int, args: argparse.Namespace, queue: Any) -> None:  # pragma: no cover
    """One rank of the torch backend: its GPU, the sweep, its times and #wrong to rank 0 over the queue."""
    import torch
    import torch.distributed as dist

    backend = "gloo" if args.backend == "torch-gloo" else "nccl"
    device = torch.device("cpu") if backend == "gloo" else torch.device("cuda", rank)
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n)
    try:
        for size in sizes(args.minbytes, args.maxbytes, args.stepfactor):
            count = size // FLOAT_BYTES
            send = torch.full((count,), float(rank + 1), dtype=torch.float32, device=device)
            recv = send.clone()
            times = []
            for in_place in (False, True):
                buf = send if in_place else recv

                def once(buf: Any = buf, in_place: bool = in_place, send: Any = send) -> None:
                    if not in_place:
                        buf.copy_(send)
                    dist.all_reduce(buf)

                for _ in range(args.warmup_iters):
                    once()
                if backend == "nccl":
                    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    torch.cuda.synchronize()
                    start.record()
                    for _ in range(max(1, args.iters)):
                        once()
                    stop.record()
                    stop.synchronize()
                    us = start.elapsed_time(stop) * 1000.0 / max(1, args.iters)
                else:
                    t0 = time.perf_counter()
                    for _ in range(max(1, args.iters)):
                        once()
                    us = (time.perf_counter() - t0) / max(1, args.iters) * 1e6
                times.append(us)
            wrong = [0, 0]
            if args.check:
                expected = n * (n + 1) / 2
                for k, in_place in enumerate((False, True)):
                    send.fill_(float(rank + 1))
                    buf = send if in_place else recv
                    if not in_place:
                        buf.copy_(send)
                    dist.all_reduce(buf)
                    wrong[k] = int((buf != expected).sum().item())
            t = torch.tensor(times + wrong, dtype=torch.float64, device=device)
            dist.all_reduce(t[:2], op=dist.ReduceOp.MAX)
            dist.all_reduce(t[2:], op=dist.ReduceOp.SUM)
            if rank == 0:
                queue.put((size, *[float(x) for x in t.tolist()]))
    finally:
        dist.destroy_process_group()


class TorchBackend(Backend):  # pragma: no cover - needs torch
    """torch.distributed, one process per GPU (``torch.multiprocessing`` spawn)."""

    name = "torch"

    def __init__(self, n: int, args: argparse.Namespace) -> None:
        import torch

        self.torch, self.n, self.args = torch, n, args
        self.gloo = args.backend == "torch-gloo"

    def devices(self) -> list[tuple[int, str, str]]:
        if self.gloo:
            return [(i, "0000:00:00", "host memory (gloo)") for i in range(self.n)]
        out = []
        for i in range(self.n):
            p = self.torch.cuda.get_device_properties(i)
            bus = f"{getattr(p, 'pci_domain_id', 0):04x}:{getattr(p, 'pci_bus_id', 0):02x}:" \
                  f"{getattr(p, 'pci_device_id', 0):02x}"
            out.append((i, bus, p.name))
        return out

    def version(self) -> str:
        if self.gloo:
            return "none (gloo)"
        v = self.torch.cuda.nccl.version()
        return ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)

    def run_sweep(self, args: argparse.Namespace, out: Callable[[str], None]) -> int:
        import torch.multiprocessing as mp

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        ctx = mp.get_context("spawn")
        queue = ctx.SimpleQueue()
        procs = mp.spawn(_torch_worker, args=(self.n, port, args, queue), nprocs=self.n, join=False)
        out(header(args, self.devices(), self.version()))
        results, total = [], 0
        for size in sizes(args.minbytes, args.maxbytes, args.stepfactor):
            got = queue.get()
            _, oop, ip, ow, iw = got
            results.append((size, oop, ip))
            total += int(ow + iw)
            out(row(size, oop, ip, self.n, int(ow) if args.check else None, int(iw) if args.check else None))
        procs.join()
        out(footer(results, self.n, total))
        return total


def make_backend(name: str, n: int, args: argparse.Namespace) -> Backend:
    """The backend ``name`` (``auto``: nccl4py, then torch); ImportError when none can be imported."""
    if name == "cpu":
        return CpuBackend(n)
    errors = []
    for candidate in (("nccl4py", "torch") if name == "auto" else (name,)):
        try:
            if candidate == "nccl4py":
                return Nccl4pyBackend(n)
            if candidate in ("torch", "torch-gloo"):
                return TorchBackend(n, args)
        except ImportError as exc:
            errors.append(f"{candidate}: {exc}")
    raise ImportError("; ".join(errors) or f"unknown backend {name}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m nodehealth.nccl.builtin", description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=("auto", "nccl4py", "torch", "torch-gloo", "cpu"), default="auto")
    p.add_argument("-b", "--minbytes", type=parse_size, default=32 << 20)
    p.add_argument("-e", "--maxbytes", type=parse_size, default=32 << 20)
    p.add_argument("-f", "--stepfactor", type=int, default=2)
    p.add_argument("-g", "--ngpus", type=int, default=1)
    p.add_argument("-n", "--iters", type=int, default=20)
    p.add_argument("-w", "--warmup_iters", type=int, default=5)
    p.add_argument("-c", "--check", type=int, default=1)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.ngpus < 1 or args.minbytes > args.maxbytes:
        print(f"invalid arguments: -g {args.ngpus}, -b {args.minbytes} > -e {args.maxbytes}?", file=sys.stderr)
        return 1

    def out(text: str) -> None:
        print(text, flush=True)

    try:
        backend = make_backend(args.backend, args.ngpus, args)
    except ImportError as exc:
        print(f"nodehealth built-in runner: no backend: {exc}", file=sys.stderr)
        return EXIT_NO_BACKEND
    except Exception as exc:  # noqa: BLE001 - CUDA/NCCL init: one line, exit 1
        print(f"nodehealth built-in runner: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    try:
        if isinstance(backend, TorchBackend):
            backend.run_sweep(args, out)
        else:
            sweep(backend, args, out)
    except Exception as exc:  # noqa: BLE001
        print(f"nodehealth built-in runner: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
