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

The sweep and nccl-tests' layout are ``nccl/builtin_sweep.py``'s, the GPU backends
``nccl/builtin_gpu.py``'s (imported only when one is asked for); this module is the command line,
the ``cpu`` backend and the choice of backend.

Exit status: 0 done, 1 an error (the message on stderr), 69 no backend can be imported.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Optional, Sequence

from nodehealth.nccl.builtin_sweep import Backend, sweep

EXIT_NO_BACKEND = 69


def parse_size(text: str) -> int:
    """nccl-tests' size syntax: a number with an optional K, M, G (powers of 1024)."""
    t = text.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(t[-1:], 1)
    digits = t[:-1] if t[-1:] in "KMGT" else t
    value = int(float(digits) * mult)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text}: negative size")
    return value


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


def make_backend(name: str, n: int, args: argparse.Namespace) -> Backend:
    """The backend ``name`` (``auto``: nccl4py, then torch); ImportError when none can be imported."""
    if name == "cpu":
        return CpuBackend(n)
    errors = []
    for candidate in ("nccl4py", "torch") if name == "auto" else (name,):
        try:
            if candidate == "nccl4py":
                from nodehealth.nccl.builtin_gpu import Nccl4pyBackend

                return Nccl4pyBackend(n)
            if candidate in ("torch", "torch-gloo"):
                from nodehealth.nccl.builtin_gpu import TorchBackend

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
        run_sweep = getattr(backend, "run_sweep", None)  # torch: its own processes, one per GPU
        if run_sweep is not None:
            run_sweep(args, out)
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
