"""``nodehealth nccl parse`` and ``nodehealth nccl transport``: the NCCL parsers as commands.

    nodehealth nccl parse FILE|- [--format text|json]
    nodehealth nccl transport FILE|- [--format text|json]

``parse`` reads nccl-tests output (any version, or its ``-J`` JSON file) and prints the table's
numbers; ``transport`` reads an ``NCCL_DEBUG=INFO`` log and says what carried the traffic.
Input is read as bytes, at most 256 MiB, decoded as UTF-8 with undecodable bytes replaced.

Exit codes: 0 parsed, 2 usage error, unreadable input or output that could not be parsed (one
line on stderr naming the line).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import IO, Any, Callable, Optional

from nodehealth import SCHEMA_VERSION
from nodehealth.nccl.parse import parse_perf
from nodehealth.nccl.results import ParseError, PerfResult, PerfRow, TransportResult
from nodehealth.nccl.transport import classify

EXIT_OK = 0
EXIT_USAGE = 2
MAX_INPUT_BYTES = 256 << 20
_CHUNK = 1 << 20
_Out = Optional[IO[str]]
_In = Optional[IO[bytes]]

ROW_KEYS = (
    "size_bytes",
    "count",
    "type",
    "redop",
    "oop_time_us",
    "oop_algbw_gbps",
    "oop_busbw_gbps",
    "ip_time_us",
    "ip_algbw_gbps",
    "ip_busbw_gbps",
)


class InputError(Exception):
    """The input could not be read (missing, unreadable, too large)."""


def add_commands(sub: Any) -> None:
    """Add ``parse`` and ``transport`` to the ``nccl`` command's subparsers."""
    _add(
        sub,
        "parse",
        run_parse,
        "read nccl-tests output (text or -J JSON) and print its bandwidth table",
        "Read the output of an nccl-tests program (all_reduce_perf and the others, any "
        "version, or the -J JSON file) and print each size row, the largest size and the average "
        "bus bandwidth.",
        "the output to read ('-' for standard input)",
        "a readable table, or one JSON object (default: %(default)s)",
    )
    _add(
        sub,
        "transport",
        run_transport,
        "say from an NCCL_DEBUG=INFO log what carried NCCL's traffic (IB, sockets, P2P)",
        "Read an NCCL_DEBUG=INFO log (any NCCL version, any line prefix) and say which "
        "transport carried the traffic: ib (InfiniBand, RoCE, SHARP/IBext, RDMA plugins), socket "
        "(TCP), p2p (only intra-node paths) or unknown, with the NCCL errors and whether NCCL gave up.",
        "the log to read ('-' for standard input)",
        "readable lines, or one JSON object (default: %(default)s)",
    )


def _add(sub: Any, name: str, func: Callable[..., int], summary: str, description: str, source: str, fmt: str) -> None:
    """One subcommand that reads ``FILE|-`` and prints text or JSON."""
    p = sub.add_parser(name, help=summary, description=description)
    p.add_argument("source", metavar="FILE|-", help=source)
    p.add_argument("--format", choices=("text", "json"), default="text", help=fmt)
    p.set_defaults(func=func)


def read_input(source: str, stdin: Optional[IO[bytes]] = None, limit: int = MAX_INPUT_BYTES) -> str:
    """The text of ``source`` (a path, or ``-`` for ``stdin``), bounded by ``limit`` bytes."""
    try:
        if source == "-":
            stream = stdin if stdin is not None else sys.stdin.buffer
            return _read_bounded(stream, "standard input", limit)
        with open(source, "rb") as fh:
            return _read_bounded(fh, source, limit)
    except OSError as err:
        raise InputError(f"{source}: {err.strerror or err}") from None


def _read_bounded(stream: IO[bytes], name: str, limit: int) -> str:
    chunks: list[bytes] = []
    total = 0
    while True:
        chunk = stream.read(min(_CHUNK, limit + 1 - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
        if total > limit:
            raise InputError(f"{name}: larger than {limit >> 20} MiB; refusing to read it")
    return b"".join(chunks).decode("utf-8", errors="replace")


def _finite(v: Any) -> Any:
    return v if not isinstance(v, float) or math.isfinite(v) else None


def row_dict(row: PerfRow) -> dict[str, Any]:
    d = {k: _finite(getattr(row, k)) for k in ROW_KEYS}
    d["oop_wrong"] = row.oop_wrong
    d["ip_wrong"] = row.ip_wrong
    return d


def perf_dict(res: PerfResult) -> dict[str, Any]:
    """The JSON document of ``nccl parse``."""
    largest = res.largest
    return {
        "avg_busbw_gbps": _finite(res.avg_busbw_gbps),
        "wrong": res.wrong,
        "rows": [row_dict(r) for r in res.rows],
        "largest": row_dict(largest) if largest else None,
        "collective": res.collective,
        "nccl_version": res.nccl_version,
        "tests_version": res.tests_version,
        "ranks": res.ranks,
        "devices": list(res.devices),
        "avg_busbw_verdict": res.avg_busbw_verdict,
        "complete": res.complete,
        "skipped_lines": list(res.skipped_lines),
        "warnings": list(res.warnings),
    }


def transport_dict(res: TransportResult) -> dict[str, Any]:
    """The JSON document of ``nccl transport``."""
    return {
        "transport": res.transport,
        "errors": list(res.errors),
        "fatal": res.fatal,
        "fatal_line": res.fatal_line or None,
        "paths": list(res.paths),
        "network": res.network,
        "nccl_version": res.nccl_version,
        "evidence": list(res.evidence),
    }


def _fmt(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:g}"


def _print_perf_text(res: PerfResult, out: IO[str]) -> None:
    out.write(
        f"{'size_bytes':>14} {'type':>8} {'redop':>6} {'oop_us':>10} {'oop_algbw':>9} {'oop_busbw':>9} "
        f"{'ip_us':>10} {'ip_algbw':>9} {'ip_busbw':>9}\n"
    )
    for r in res.rows:
        out.write(
            f"{r.size_bytes:>14} {r.type:>8} {r.redop:>6} {_fmt(r.oop_time_us):>10} "
            f"{_fmt(r.oop_algbw_gbps):>9} {_fmt(r.oop_busbw_gbps):>9} {_fmt(r.ip_time_us):>10} "
            f"{_fmt(r.ip_algbw_gbps):>9} {_fmt(r.ip_busbw_gbps):>9}\n"
        )
    largest = res.largest
    if largest is not None:
        out.write(
            f"largest size {largest.size_bytes} B: busbw {_fmt(largest.oop_busbw_gbps)} GB/s out-of-place, "
            f"{_fmt(largest.ip_busbw_gbps)} GB/s in-place\n"
        )
    out.write(f"avg bus bandwidth: {_fmt(res.avg_busbw_gbps)} GB/s; wrong values: {res.wrong}\n")
    if res.ranks:
        out.write(f"ranks: {res.ranks}" + (f" ({res.devices[0]})" if res.devices else "") + "\n")
    if not res.complete:
        out.write("note: no footer (# Out of bounds / # Avg bus bandwidth): the output looks truncated\n")
    for w in res.warnings:
        out.write(f"warning: {w}\n")


def _print_transport_text(res: TransportResult, out: IO[str]) -> None:
    out.write(f"transport: {res.transport}" + (f" (network {res.network})" if res.network else "") + "\n")
    if res.paths:
        out.write("paths: " + ", ".join(res.paths) + "\n")
    for e in res.evidence:
        out.write(f"evidence: {e}\n")
    out.write(f"fatal: {'yes' if res.fatal else 'no'}" + (f" (line {res.fatal_line})" if res.fatal_line else "") + "\n")
    for e in res.errors:
        out.write(f"error: {e}\n")


def _fail(command: str, message: str, err: IO[str]) -> int:
    err.write(f"nodehealth nccl {command}: {message}\n")
    return EXIT_USAGE


# each command: its parser, its JSON document and its readable text
_COMMANDS: dict[str, tuple[Callable[[str], Any], Callable[[Any], dict[str, Any]], Callable[[Any, IO[str]], None]]] = {
    "parse": (parse_perf, perf_dict, _print_perf_text),
    "transport": (classify, transport_dict, _print_transport_text),
}


def run_parse(args: argparse.Namespace, out: _Out = None, err: _Out = None, stdin: _In = None) -> int:
    return _run("parse", args, out or sys.stdout, err or sys.stderr, stdin)


def run_transport(args: argparse.Namespace, out: _Out = None, err: _Out = None, stdin: _In = None) -> int:
    return _run("transport", args, out or sys.stdout, err or sys.stderr, stdin)


def _run(command: str, args: argparse.Namespace, out: IO[str], err: IO[str], stdin: _In) -> int:
    """Read ``args.source`` and print what ``command``'s parser makes of it, as ``args.format``."""
    parse, document, print_text = _COMMANDS[command]
    try:
        res = parse(read_input(args.source, stdin))
    except InputError as e:
        return _fail(command, str(e), err)
    except ParseError as e:  # parse_perf's; classify takes any text
        return _fail(command, f"{args.source}: could not parse: {e}", err)
    if args.format == "json":
        out.write(json.dumps({"schema_version": SCHEMA_VERSION, **document(res)}) + "\n")
    else:
        print_text(res, out)
    return EXIT_OK


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line, exit 2 (argparse's own code), no usage dump
        self.exit(EXIT_USAGE, f"{self.prog}: {message}\n")


def main(
    argv: Optional[list[str]] = None,
    out: Optional[IO[str]] = None,
    err: Optional[IO[str]] = None,
    stdin: Optional[IO[bytes]] = None,
) -> int:
    """``nodehealth nccl {parse,transport} ...`` without the rest of the CLI (for tests and scripts)."""
    parser = _Parser(prog="nodehealth nccl")
    sub = parser.add_subparsers(dest="nccl_command", metavar="{parse,transport}", parser_class=_Parser)
    sub.required = True
    add_commands(sub)
    saved = sys.stderr
    if err is not None:
        sys.stderr = err
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return int(e.code) if isinstance(e.code, int) else EXIT_USAGE
    finally:
        sys.stderr = saved
    return int(args.func(args, out=out, err=err, stdin=stdin))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
