"""What the NCCL parsers return: plain frozen dataclasses, no behaviour beyond derived values.

``parse.parse_perf`` turns nccl-tests output (``all_reduce_perf`` and friends, text or ``-J``
JSON) into a ``PerfResult``; ``transport.classify`` turns an ``NCCL_DEBUG=INFO`` log into a
``TransportResult`` (``nodehealth.nccl.results`` re-exports them). Units are in the names
(``_gbps`` GB/s as nccl-tests prints them, ``_us`` microseconds, ``_bytes``).
"""

from __future__ import annotations

from dataclasses import field
from typing import Mapping, Optional

from nodehealth.observations.record import record


class ParseError(ValueError):
    """Output that could not be parsed; ``line`` is the 1-based line number (0: the whole input)."""

    def __init__(self, message: str, line: int = 0) -> None:
        super().__init__(f"line {line}: {message}" if line else message)
        self.line = line


@record
class PerfRow:
    """One size row of an nccl-tests table (out-of-place, then in-place columns)."""

    size_bytes: int
    count: int
    type: str
    redop: str
    oop_time_us: Optional[float]
    oop_algbw_gbps: Optional[float]
    oop_busbw_gbps: Optional[float]
    oop_wrong: Optional[int]  # None: "N/A" (-c 0) or not printed
    ip_time_us: Optional[float]
    ip_algbw_gbps: Optional[float]
    ip_busbw_gbps: Optional[float]
    ip_wrong: Optional[int]


@record
class PerfResult:
    """One nccl-tests run.

    ``avg_busbw_gbps`` is the value printed on ``# Avg bus bandwidth`` (nccl-tests: the mean of
    out-of-place and in-place busbw over all rows), None when the run did not print it.
    ``wrong`` is the sum of every row's #wrong (``# Out of bounds values`` when printed).
    """

    rows: tuple[PerfRow, ...]
    avg_busbw_gbps: Optional[float]
    wrong: int
    collective: Optional[str] = None  # "all_reduce_perf", from the header when it says
    nccl_version: Optional[str] = None  # "2.21.5+cuda12.4"
    tests_version: Optional[str] = None  # "# nccl-tests version 2.13.9"
    ranks: Optional[int] = None  # devices listed in the header
    warnings: tuple[str, ...] = ()  # lines that were neither table nor header (e.g. NCCL WARN)
    devices: tuple[str, ...] = ()  # GPU name of each rank in the header, in rank order
    skipped_lines: tuple[int, ...] = ()  # 1-based lines that started a row but did not make one
    avg_busbw_verdict: Optional[str] = None  # "OK"/"FAILED" after the average when NCCL_TESTS_MIN_BW was set
    tables: int = 1  # column headers read (several runs concatenated: rows of all of them, in order)
    complete: bool = True  # the footer (# Out of bounds / # Avg bus bandwidth) was read

    @property
    def largest(self) -> Optional[PerfRow]:
        return max(self.rows, key=lambda r: r.size_bytes) if self.rows else None


@record
class TransportResult:
    """What carried NCCL's traffic, from an NCCL_DEBUG=INFO log.

    ``transport``: ``ib`` (NET/IB, RoCE, SHARP, IBext plugins), ``socket`` (NET/Socket), ``p2p``
    (only intra-node paths: P2P, SHM, NVLS), ``unknown`` (nothing conclusive). ``paths`` names
    each distinct path seen (``NET/IB/GDRDMA``, ``P2P/CUMEM/read``, ``SHM/direct``, ``NVLS``),
    ``errors`` the NCCL WARN / error lines, ``fatal`` whether NCCL gave up.
    """

    transport: str
    paths: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    fatal: bool = False
    network: Optional[str] = None  # the "Using network ..." name: "IB", "Socket", "AWS Libfabric"
    nccl_version: Optional[str] = None
    evidence: tuple[str, ...] = ()  # the lines that decided ``transport`` (at most a few)
    fatal_line: int = 0  # 1-based line of the first sign that NCCL gave up (0: none)


# --------------------------------------------------------------------------- NCCL self-test


@record
class NcclRun:
    """One all-reduce run of the NCCL self-test in one mode (``nvlink`` or ``ib_loopback``).

    ``setup_error``: the run could not start as configured (no binary at the path, a binary root
    may not run, no built-in backend, no GPU): nothing about the node's health. Otherwise
    ``returncode`` is the runner's exit status (negative: killed by that signal; None: killed at
    the deadline, ``timed_out``; ``truncated``: its output reached the cap and it was killed there).
    ``perf`` and ``transport`` are what the parsers read from its
    output (None with ``perf_error`` when the output could not be parsed); ``output_tail`` is the
    end of the output, bounded, for the message and the log.
    """

    mode: str
    runner: str  # "nccl-tests" or "builtin"
    argv: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)  # the NCCL_* variables the run set
    gpus: Optional[int] = None  # GPUs the run was asked to use
    returncode: Optional[int] = None
    timed_out: bool = False
    truncated: bool = False
    timeout_s: float = 0.0
    elapsed_s: float = 0.0
    finished_at: float = 0.0  # Unix time
    output_bytes: int = 0
    output_tail: str = ""
    json_output: bool = False  # perf came from nccl-tests' -J file
    perf: Optional[PerfResult] = None
    perf_error: Optional[str] = None
    transport: Optional[TransportResult] = None
    setup_error: Optional[str] = None
    setup_kind: str = ""  # "missing" (not installed: SKIPPED) or "config" (configured wrong: UNKNOWN)


@record
class NcclObservation:
    """The NCCL self-test's runs, in the order they ran."""

    runs: tuple[NcclRun, ...]
