"""``nodehealth xid``: scan a kernel log for XIDs, explain an XID.

    nodehealth xid scan [--from FILE|-] [--format text|json]
    nodehealth xid explain N [--format text|json]

Exit codes: 0 success (whether or not XIDs were found), 2 usage error or unreadable input.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator
from typing import IO, Any, Optional

from nodehealth.probes.kernel_log import (
    KMSG_PATH,
    KernelLogUnavailable,
    ScanStats,
    read_kmsg_backlog,
    scan,
    split_lines,
)
from nodehealth.xid.catalog import Catalog, CatalogEntry, enrich, load_catalog
from nodehealth.xid.events import XidEvent

EXIT_OK = 0
EXIT_USAGE = 2

_READ_CHUNK = 1 << 20


def register(subparsers: Any) -> None:
    """Add the ``xid`` command (with ``scan`` and ``explain``) to a CLI's subparsers."""
    parser = subparsers.add_parser(
        "xid",
        help="find GPU XID errors in a kernel log; explain an XID",
        description="Find GPU XID errors in a kernel log, or explain what an XID means.",
    )
    sub = parser.add_subparsers(dest="xid_command", metavar="{scan,explain}")
    sub.required = True

    scan_p = sub.add_parser(
        "scan",
        help="print the XID events in a kernel log, one per line",
        description="Print the XID events in a kernel log, one per line. Reads /dev/kmsg (the "
        "kernel's buffer since boot, no waiting) unless --from is given. Any mix of raw kmsg "
        "records, dmesg, dmesg -T, syslog and journalctl -k text is understood.",
    )
    scan_p.add_argument("--from", dest="source", metavar="FILE|-", default=None,
                        help="read this file ('-' for standard input) instead of /dev/kmsg")
    scan_p.add_argument("--kmsg", default=KMSG_PATH, metavar="PATH",
                        help="kernel log device to read when --from is not given (default: %(default)s)")
    scan_p.add_argument("--format", choices=("text", "json"), default="text",
                        help="text lines, or one JSON object per line (default: %(default)s)")
    scan_p.set_defaults(func=run_scan)

    explain_p = sub.add_parser(
        "explain",
        help="print the catalog entry of an XID",
        description="Print what an XID means, NVIDIA's recommended action and ours.",
    )
    explain_p.add_argument("xid", metavar="N", type=_xid_number, help="XID number")
    explain_p.add_argument("--format", choices=("text", "json"), default="text",
                           help="output format (default: %(default)s)")
    explain_p.set_defaults(func=run_explain)


def _xid_number(text: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an XID number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"not an XID number: {text!r}")
    return value


def _error(command: str, message: str) -> int:
    print(f"nodehealth xid {command}: {message}", file=sys.stderr)
    return EXIT_USAGE


def _load(command: str) -> Optional[Catalog]:
    try:
        return load_catalog()
    except (OSError, ValueError) as exc:
        _error(command, f"cannot load the XID catalog: {exc}")
        return None


def _file_chunks(stream: IO[bytes]) -> Iterator[bytes]:
    while True:
        chunk = stream.read(_READ_CHUNK)
        if not chunk:
            return
        yield chunk


def run_scan(args: argparse.Namespace) -> int:
    catalog = _load("scan")
    if catalog is None:
        return EXIT_USAGE
    stats = ScanStats()
    out = sys.stdout
    try:
        if args.source is None:
            lines: Iterator[bytes] = read_kmsg_backlog(args.kmsg)
            _emit(scan(lines, stats), catalog, args.format, out)
        elif args.source == "-":
            _emit(scan(split_lines(_file_chunks(sys.stdin.buffer)), stats), catalog, args.format, out)
        else:
            with open(args.source, "rb") as fh:
                _emit(scan(split_lines(_file_chunks(fh)), stats), catalog, args.format, out)
    except KernelLogUnavailable as exc:
        return _error("scan", str(exc))
    except BrokenPipeError:
        # The reader went away (``| head``): not an error; keep Python's exit flush quiet.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except OSError as exc:
        where = args.source if args.source not in (None, "-") else "standard input"
        return _error("scan", f"cannot read {where}: {exc.strerror or exc}")
    if stats.skipped:
        print(f"nodehealth xid scan: skipped {stats.skipped} of {stats.lines} lines "
              f"({stats.too_long} too long, {stats.invalid} not text)", file=sys.stderr)
    return EXIT_OK


def _emit(events: Iterator[XidEvent], catalog: Catalog, fmt: str, out: IO[str]) -> None:
    for event in events:
        judged = enrich(event, catalog)
        if fmt == "json":
            out.write(json.dumps(judged.to_json(), sort_keys=False) + "\n")
        else:
            out.write(format_event(judged) + "\n")
    out.flush()


def format_event(event: XidEvent) -> str:
    """One readable line: when, what, which GPU, our verdict, who, and the driver's words."""
    parts = [event.time if event.time is not None else "-"]
    parts.append(f"XID {event.xid}")
    if event.mnemonic:
        parts.append(event.mnemonic)
    parts.append(f"pci={event.pci or '?'}")
    if event.gpu is not None:
        parts.append(f"gpu={event.gpu}")
    if event.severity is not None:
        parts.append(f"severity={event.severity.value}")
    if event.action is not None:
        parts.append(f"action={event.action.value}")
    if event.pid is not None:
        parts.append(f"pid={event.pid}")
    if event.process is not None:
        parts.append(f"process={event.process}")
    if event.job_id is not None:
        parts.append(f"job={event.job_id}")
    line = " ".join(parts)
    return f"{line}: {event.message}" if event.message else line


def run_explain(args: argparse.Namespace) -> int:
    catalog = _load("explain")
    if catalog is None:
        return EXIT_USAGE
    entry = catalog.entry(args.xid)
    if args.format == "json":
        data = entry.to_json()
        data["source"] = catalog.source
        if args.xid == 154:
            data["recovery_actions"] = [
                {"code": r.code, "name": r.name, "severity": r.severity.value, "action": r.action.value}
                for r in sorted(catalog.recovery_actions.values(), key=lambda r: r.code)
            ]
        print(json.dumps(data))
        return EXIT_OK
    print(format_entry(entry, catalog))
    return EXIT_OK


def format_entry(entry: CatalogEntry, catalog: Catalog) -> str:
    """The catalog entry as a few readable lines."""
    rows = [f"XID {entry.xid}  {entry.mnemonic}"]
    rows.append(f"  meaning:        {entry.meaning}")
    if entry.known:
        rows.append(f"  NVIDIA action:  {entry.nvidia_action}")
    override = "  (site override)" if entry.overridden else ""
    rows.append(f"  severity:       {entry.severity.value}{override}")
    rows.append(f"  action:         {entry.action.value}")
    if entry.fatal_severity is not None and entry.fatal_action is not None:
        rows.append(f"  when Fatal:     severity {entry.fatal_severity.value}, "
                    f"action {entry.fatal_action.value}")
    if entry.xid == 154 and catalog.recovery_actions:
        rows.append("  (the above only when the payload names no recovery action; otherwise it decides:)")
        for r in sorted(catalog.recovery_actions.values(), key=lambda r: r.code):
            rows.append(f"    0x{r.code:x} {r.name}: severity {r.severity.value}, action {r.action.value}")
    if entry.xid in catalog.application_xids:
        rows.append("  counted by the application-XID rate rule (repeats become a warning)")
    rows.append(f"  source:         {catalog.source}")
    return "\n".join(rows)
