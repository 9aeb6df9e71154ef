"""The built-in runner's GPU backends: nccl4py in this process, torch.distributed one process per GPU.

Imported by ``nccl/builtin.py`` only when a GPU backend is asked for (``--backend auto``,
``nccl4py``, ``torch``, ``torch-gloo``); neither nccl4py, ``cuda.bindings`` nor torch is imported
before a backend is built. The torch workers are spawned by ``torch.multiprocessing``, which
imports this module in each worker: it must be importable from the installed package (the
runner is ``python -I``), never from the caller's directory.
"""

from __future__ import annotations

import argparse
import socket
import time
from typing import Any, Callable

from nodehealth.nccl.builtin_sweep import FLOAT_BYTES, Backend, footer, header, row, sizes


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
            self.__cuda_array_interface__ = {
                "shape": (count,),
                "typestr": "<f4",
                "data": (ptr, False),
                "version": 3,
                "strides": None,
                "stream": None,
            }

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
                pairs.append(
                    (
                        int(self._ok(self.cu.cuMemAlloc(count * FLOAT_BYTES))),
                        int(self._ok(self.cu.cuMemAlloc(count * FLOAT_BYTES))),
                    )
                )
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
                comm.allreduce(
                    self._Array(s, count), self._Array(dst, count), self.nccl.SUM, stream=int(self.streams[i])
                )

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
            bus = (
                f"{getattr(p, 'pci_domain_id', 0):04x}:{getattr(p, 'pci_bus_id', 0):02x}:"
                f"{getattr(p, 'pci_device_id', 0):02x}"
            )
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
