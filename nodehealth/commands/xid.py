"""``nodehealth xid``: scan a kernel log for XIDs, explain an XID.

    nodehealth xid scan [--from FILE|-|--journal] [--format text|json] [--config FILE] [--no-nvml]
    nodehealth xid explain N [--format text|json]
    nodehealth xid watch [--config FILE] [--format text|json]
    nodehealth xid clear [--config FILE] [--state-dir DIR]

Exit codes: 0 success (whether or not XIDs were found), 2 usage error or unreadable input.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
import time
from collections.abc import Iterable, Iterator
from typing import IO, TYPE_CHECKING, Any, Callable, Optional

from nodehealth import SCHEMA_VERSION
from nodehealth.checks.gpu_xid import xid_settings
from nodehealth.commands.options import ExitCode, add_config, add_format
from nodehealth.platform.wake import WakeEvent
from nodehealth.probes.kernel_log import KernelLogUnavailable, KmsgReader, boot_time
from nodehealth.xid.attribution import GpuMap, attribute, gpu_map
from nodehealth.xid.catalog import Catalog, CatalogEntry, enrich, load_catalog
from nodehealth.xid.chunk_scan import scan_chunks
from nodehealth.xid.events import XidEvent
from nodehealth.xid.parse import ScanStats, scan
from nodehealth.xid.patterns import KMSG_PATH
from nodehealth.xid.sxid import KIND_SXID
from nodehealth.xid.text import MAX_MESSAGE_CHARS, MAX_PROCESS_CHARS, printable

if TYPE_CHECKING:
    from nodehealth.config.schema import Config
    from nodehealth.probes.xid_store import XidStore

EXIT_OK, EXIT_USAGE = ExitCode.OK, ExitCode.USAGE

_READ_CHUNK = 1 << 20


def register(subparsers: Any) -> None:
    """Add the ``xid`` command (with ``scan`` and ``explain``) to a CLI's subparsers."""
    parser = subparsers.add_parser(
        "xid",
        help="find GPU XID errors in a kernel log; explain an XID",
        description="Find GPU XID errors in a kernel log, or explain what an XID means.",
    )
    sub = parser.add_subparsers(dest="xid_command", metavar="{scan,explain,watch,clear}")
    sub.required = True

    scan_p = sub.add_parser(
        "scan",
        help="print the XID events in a kernel log, one per line",
        description="Print the XID events in a kernel log, one per line. Reads /dev/kmsg (the "
        "kernel's buffer since boot, no waiting) unless --from is given. Any mix of raw kmsg "
        "records, dmesg, dmesg -T, syslog and journalctl -k text is understood.",
    )
    scan_p.add_argument(
        "--from",
        dest="source",
        metavar="FILE|-",
        default=None,
        help="read this file ('-' for standard input) instead of /dev/kmsg",
    )
    scan_p.add_argument(
        "--kmsg",
        default=KMSG_PATH,
        metavar="PATH",
        help="kernel log device to read when --from is not given (default: %(default)s)",
    )
    scan_p.add_argument(
        "--journal", action="store_true", help="read this boot's kernel messages from journald (needs python3-systemd)"
    )
    add_format(scan_p, help="text lines, or one JSON object per line (default: %(default)s)")
    _config_args(scan_p)
    scan_p.add_argument("--no-nvml", action="store_true", help="do not ask NVML for GPU indices and UUIDs")
    scan_p.set_defaults(func=run_scan)

    watch_p = sub.add_parser(
        "watch",
        help="follow the kernel log into the XID event store, printing each new event",
        description="Follow the kernel log (the [checks.gpu_xid] kmsg_path, /dev/kmsg by default) "
        "from the event store's position: this boot's backlog first, then new records as they "
        "come, until interrupted. Each new event is recorded in the store the gpu_xid check reads.",
    )
    add_format(watch_p, help="text lines, or one JSON object per line (default: %(default)s)")
    _config_args(watch_p)
    watch_p.set_defaults(func=run_watch)

    clear_p = sub.add_parser(
        "clear",
        help="forget the recorded XID events (after the GPU was repaired or reset)",
        description="Read what the kernel log holds into the event store, then forget every "
        "recorded XID event, so the gpu_xid check passes again. For faults a reboot does not "
        "clear (action inspect), and for a GPU reset without a reboot.",
    )
    _config_args(clear_p)
    clear_p.set_defaults(func=run_clear)

    explain_p = sub.add_parser(
        "explain",
        help="print the catalog entry of an XID",
        description="Print what an XID means, NVIDIA's recommended action and ours. Exit 0, or 2 for an XID the "
        "catalog does not list (its stand-in entry shown: how the gpu_xid check judges it).",
    )
    explain_p.add_argument("xid", metavar="N", type=_xid_number, help="XID number")
    add_format(explain_p)
    explain_p.set_defaults(func=run_explain)


def _config_args(parser: argparse.ArgumentParser) -> None:
    add_config(parser)
    parser.add_argument(
        "--state-dir", metavar="DIR", default=None, help="where the XID event store lives (default: [paths] state_dir)"
    )


def _config(command: str, args: argparse.Namespace) -> Optional[Config]:
    from nodehealth.commands.common import UsageError, load_config

    try:
        cfg = load_config(args)
    except UsageError as exc:
        _error(command, str(exc))
        return None
    if args.state_dir:
        cfg = dataclasses.replace(cfg, paths=dataclasses.replace(cfg.paths, state_dir=args.state_dir))
    return cfg


def _store(cfg: Config) -> XidStore:
    from nodehealth.probes.xid_store import XidStore

    return XidStore.configured(cfg)


_NVML_TIMEOUT_S = 5.0


def _gpus(cfg: Config) -> GpuMap:
    """PCI address → (NVML index, UUID) from a bounded NVML probe; empty when NVML does not answer."""
    from nodehealth.observations import NvmlSnapshot
    from nodehealth.probes import PROBES, ProbeContext, ProbeSetupError

    try:
        pending = PROBES["nvml"].gather(ProbeContext(config=cfg, node=""), _NVML_TIMEOUT_S)
    except ProbeSetupError:
        return {}
    snap = pending.collect() if hasattr(pending, "collect") else pending
    return gpu_map(snap.gpus) if isinstance(snap, NvmlSnapshot) else {}


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
    cfg = _config("scan", args)
    if cfg is None:
        return EXIT_USAGE
    if args.journal and args.source is not None:
        return _error("scan", "--journal and --from cannot be combined")
    gpus: GpuMap = {} if args.no_nvml else _gpus(cfg)
    # The blamed process and the job ledger describe this node's current boot: only its own
    # live log (kmsg, journal) is matched against them.
    live = args.source is None
    kernel_only = xid_settings(cfg).kernel_facility_only  # the live sources: kmsg and the journal
    stats = ScanStats()
    out = sys.stdout
    try:
        if args.journal:
            from nodehealth.probes.kernel_log import journal_lines

            events: Iterable[XidEvent] = scan(journal_lines(kernel_only=kernel_only), stats)
        elif args.source is None:
            events = scan(KmsgReader(args.kmsg, kernel_only=kernel_only).lines(), stats)
        elif args.source == "-":
            # A recorded log: searched chunk by chunk for the driver's marker (the lines of a live
            # source are filtered record by record, so they are read line by line).
            events = scan_chunks(_file_chunks(sys.stdin.buffer), stats)
        else:
            fh = open(args.source, "rb")  # noqa: SIM115 - closed below
            events = scan_chunks(_file_chunks(fh), stats)
        attribute_fn = _attributor(cfg, gpus, live)
        try:
            _emit(
                events,
                catalog,
                args.format,
                out,
                attribute_fn,
                booted=boot_time(cfg.paths.procfs_root) if live and not args.journal else None,
            )
        finally:
            if args.source not in (None, "-") and not args.journal:
                fh.close()
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
    where = (
        "the journal"
        if args.journal
        else args.kmsg
        if args.source is None
        else "standard input"
        if args.source == "-"
        else args.source
    )
    found = f"{stats.events} XID event(s)" if stats.events else "no XID event"
    print(f"nodehealth xid scan: read {stats.lines} line(s) from {where}: {found}", file=sys.stderr)
    if stats.skipped:
        print(
            f"nodehealth xid scan: skipped {stats.skipped} of {stats.lines} lines "
            f"({stats.too_long} too long, {stats.invalid} not text)",
            file=sys.stderr,
        )
    return EXIT_OK


Attributor = Callable[[XidEvent], XidEvent]


def _attributor(cfg: Config, gpus: GpuMap, live: bool) -> Attributor:
    """GPU index/UUID from NVML; for this node's live log also the job (live process, ledger)."""
    if not live:
        return lambda event: attribute(event, gpus)
    from nodehealth.probes.process_job import live_job
    from nodehealth.statedir import ledger as job_ledger

    btime = boot_time(cfg.paths.procfs_root)
    ledger = job_ledger.entries(job_ledger.read(cfg.paths.state_dir))

    def fn(event: XidEvent) -> XidEvent:
        if event.pid is not None and event.job_id is None:
            job = live_job(event.pid, cfg.paths.procfs_root, event.uptime_s)
            if job is not None:
                event = dataclasses.replace(event, job_id=job)
        at = btime + event.uptime_s if btime is not None and event.uptime_s is not None else None
        return attribute(event, gpus, ledger, at)

    return fn


def _emit(
    events: Iterable[XidEvent],
    catalog: Catalog,
    fmt: str,
    out: IO[str],
    attribute_fn: Optional[Attributor] = None,
    booted: Optional[float] = None,
) -> None:
    for event in events:
        judged = enrich(attribute_fn(event) if attribute_fn is not None else event, catalog)
        _print_event(judged, fmt, out, booted=booted)
    out.flush()


def _print_event(event: XidEvent, fmt: str, out: IO[str], flush: bool = False, booted: Optional[float] = None) -> None:
    if fmt == "json":
        out.write(json.dumps({"schema_version": SCHEMA_VERSION, **event.to_json()}, sort_keys=False) + "\n")
    else:
        out.write(format_event(event, booted) + "\n")
    if flush:
        out.flush()


def run_watch(args: argparse.Namespace) -> int:
    from nodehealth.probes.xid_store import StoreError

    cfg = _config("watch", args)
    if cfg is None:
        return EXIT_USAGE
    try:
        store = _store(cfg)
    except (OSError, ValueError) as exc:
        return _error("watch", f"cannot load the XID catalog: {exc}")
    gpus = _gpus(cfg)
    stop = WakeEvent()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        store.follow(
            stop,
            on_event=lambda record: _print_event(attribute(record.event, gpus), args.format, sys.stdout, flush=True),
        )
    except (KernelLogUnavailable, StoreError) as exc:
        return _error("watch", str(exc))
    finally:
        signal.signal(signal.SIGTERM, previous)
    return EXIT_OK


def run_clear(args: argparse.Namespace) -> int:
    from nodehealth.probes.xid_store import StoreError, store_path

    cfg = _config("clear", args)
    if cfg is None:
        return EXIT_USAGE
    try:
        store = _store(cfg)
        total, drain = store.clear(deadline=time.monotonic() + 30)
    except (OSError, ValueError, StoreError) as exc:
        return _error("clear", str(exc))
    print(f"cleared {total} XID event(s), {drain} of them drain-class, from {store_path(cfg.paths.state_dir)}")
    return EXIT_OK


def format_event(event: XidEvent, booted: Optional[float] = None) -> str:
    """One readable line: when, what, which GPU, our verdict, who, and the driver's words.

    ``booted``: this boot's start, to give a kernel record (uptime seconds) its wall-clock time.
    Everything that comes from the kernel log (or the job ledger) is made printable and bounded
    (``nodehealth.xid.text``): no control character or terminal escape reaches the terminal.
    """
    if event.time is not None:
        when = printable(event.time)
    elif event.uptime_s is not None and booted is not None:
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(booted + event.uptime_s))
    else:
        when = "-"
    parts = [when]
    parts.append(f"SXid {event.xid}" if event.kind == KIND_SXID else f"XID {event.xid}")  # an NVSwitch's own number
    if event.mnemonic:
        parts.append(printable(event.mnemonic))
    parts.append(f"pci={printable(event.pci) if event.pci else '?'}")
    if event.gpu is not None:
        parts.append(f"gpu={event.gpu}")
    if event.severity is not None:
        parts.append(f"severity={event.severity.value}")
    if event.action is not None:
        parts.append(f"action={event.action.value}")
    if event.pid is not None:
        parts.append(f"pid={event.pid}")
    if event.process is not None:
        parts.append(f"process={printable(event.process, MAX_PROCESS_CHARS)}")
    if event.job_id is not None:
        parts.append(f"job={printable(event.job_id)}")
    line = " ".join(parts)
    return f"{line}: {printable(event.message, MAX_MESSAGE_CHARS)}" if event.message else line


def run_explain(args: argparse.Namespace) -> int:
    catalog = _load("explain")
    if catalog is None:
        return EXIT_USAGE
    entry = catalog.entry(args.xid)
    if args.format == "json":
        data = {"schema_version": SCHEMA_VERSION, **entry.to_json()}
        data["source"] = catalog.source
        if args.xid == 154:
            data["recovery_actions"] = [
                {"code": r.code, "name": r.name, "severity": r.severity.value, "action": r.action.value}
                for r in sorted(catalog.recovery_actions.values(), key=lambda r: r.code)
            ]
        print(json.dumps(data))
    else:
        print(format_entry(entry, catalog))
    if entry.known:
        return EXIT_OK
    sys.stdout.flush()  # an unlisted number is most often a typo: said after the stand-in entry, and exit 2
    print(f"nodehealth xid explain: XID {args.xid} is not in the catalog: above, how it is judged", file=sys.stderr)
    return EXIT_USAGE


def format_entry(entry: CatalogEntry, catalog: Catalog) -> str:
    """The catalog entry as a few readable lines."""
    rows = [f"XID {entry.xid}  {entry.mnemonic}"]
    rows.append(f"  meaning:        {entry.meaning}")
    if entry.known:
        rows.append(f"  NVIDIA action:  {nvidia_words(entry.nvidia_action)}")
    override = "  (site override)" if entry.overridden else ""
    rows.append(f"  severity:       {entry.severity.value}{override}")
    rows.append(f"  action:         {entry.action.value}")
    if entry.fatal_severity is not None and entry.fatal_action is not None:
        rows.append(f"  when Fatal:     severity {entry.fatal_severity.value}, action {entry.fatal_action.value}")
    if entry.xid == 154 and catalog.recovery_actions:
        rows.append("  (the above only when the payload names no recovery action; otherwise it decides:)")
        for r in sorted(catalog.recovery_actions.values(), key=lambda r: r.code):
            rows.append(f"    0x{r.code:x} {r.name}: severity {r.severity.value}, action {r.action.value}")
    if entry.xid in catalog.application_xids:
        rows.append("  counted by the application-XID rate rule (repeats become a warning)")
    rows.append(f"  source:         {catalog.source}")
    return "\n".join(rows)


# NVIDIA's immediate-resolution buckets (XID catalog, docs.nvidia.com/deploy/xid-errors), in words.
NVIDIA_WORDS = {
    "RESET_GPU": "reset the GPU",
    "RESTART_APP": "restart the application",
    "IGNORE": "none needed",
    "RESTART_VM": "restart the VM",
    "RESTART_BM": "restart the bare-metal node",
    "CONTACT_SUPPORT": "contact NVIDIA support",
    "CHECK_UVM": "check the UVM driver (nvidia-uvm)",
    "CHECK_MECHANICALS": "check cooling, power and seating",
    "WORKFLOW_XID_48": "follow NVIDIA's Xid 48 workflow (uncorrectable ECC: reset, then check row remapping)",
    "WORKFLOW_XID_45": "follow NVIDIA's Xid 45 workflow (preemptive cleanup: usually follows another Xid)",
    "WORKFLOW_NVLINK_ERR": "follow NVIDIA's NVLink error workflow (check links and counters, reset)",
    "WORKFLOW_NVLINK5_ERR": "follow NVIDIA's NVLink 5 error workflow (check links and the NVSwitch tray)",
    "XID_154": "act on Xid 154's recovery action (the driver says which)",
}


def nvidia_words(bucket: str) -> str:
    """NVIDIA's bucket name in words, with the name itself for reference."""
    if not bucket:
        return "not given"
    words = NVIDIA_WORDS.get(bucket)
    return f"{words} ({bucket})" if words else bucket
