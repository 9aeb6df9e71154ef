"""Host error counters: PCIe AER (sysfs), EDAC memory controllers (sysfs), D-state holders of /dev/nvidia*.

What is trusted: the kernel's own files under the configured ``sysfs_root`` / ``procfs_root``. What is
refused: an attribute that is not a regular file with one name (a FIFO, a device, a symbolic link as the
last component: ``platform.ground.read_regular``, ``O_NOFOLLOW|O_NONBLOCK``), a file past ``MAX_ATTR``
bytes, a device whose sysfs directory resolves outside ``<sysfs_root>/devices``, a line that has not the
kernel's shape (the whole file is then an error, never a zero). Counts of entries are bounded. Sysfs
counters are in memory and do not block; the /proc scan runs in a killable child (a process in D state
is exactly the one whose /proc files may hang a reader), abandoned at the deadline.

Formats: Documentation/ABI/testing/sysfs-bus-pci-devices-aer (``Receiver Error 2`` ... ``TOTAL_ERR_COR
2``; the fatal and non-fatal files end ``TOTAL_ERR_FATAL`` / ``TOTAL_ERR_NONFATAL``), and
Documentation/admin-guide/ras.rst (``mc/mcN/{ce,ue}_count``, ``{ce,ue}_noinfo_count``,
``dimmM/dimm_{ce,ue}_count``, ``dimm_label``); proc(5) for ``/proc/<pid>/stat``.
"""

from __future__ import annotations

import os
import re
import time
from typing import Any, Callable, Optional, Union

from nodehealth.observations import ProbeError
from nodehealth.observations.host_errors import (
    AerDevice,
    AerObservation,
    DstateObservation,
    DstateProcess,
    EdacController,
    EdacObservation,
)
from nodehealth.platform import child, ground

MAX_ATTR = 8192  # an AER file is about 500 bytes
MAX_DEVICES = 4096  # PCI functions looked at
MAX_ENTRIES = 512  # memory controllers, DIMMs per controller
MAX_PROCESSES = 65536
MAX_FDS = 4096  # descriptors looked at per D-state process
_COUNT = re.compile(r"^([\x21-\x7e](?:[\x20-\x7e]{0,62}[\x21-\x7e])?) ([0-9]{1,19})$")  # printable ASCII names
_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_PRINTABLE = re.compile(r"[^\x20-\x7e]")
AER_FILES = (("correctable", "TOTAL_ERR_COR"), ("nonfatal", "TOTAL_ERR_NONFATAL"), ("fatal", "TOTAL_ERR_FATAL"))
NVIDIA, MELLANOX = "0x10de", "0x15b3"


class Malformed(ValueError):
    """A kernel file without the kernel's shape."""


def read_attr(path: str) -> Optional[str]:
    """A sysfs/procfs attribute's text; None when it does not exist. Raises OSError, ground.Foreign."""
    try:
        raw = ground.read_regular(path, MAX_ATTR)
    except FileNotFoundError:
        return None
    return raw.decode("ascii", errors="replace")


def parse_aer(text: str, total_key: str) -> tuple[int, dict[str, int]]:
    """One ``aer_dev_*`` file -> (its ``TOTAL_ERR_*`` value, the named counters). Malformed: any line not
    ``<name> <count>``, a name twice, or no total line."""
    named: dict[str, int] = {}
    total: Optional[int] = None
    for line in text.splitlines():
        if not line.strip():
            continue
        m = _COUNT.match(line.strip())
        if m is None:
            raise Malformed(f"line {_PRINTABLE.sub('?', line[:80])!r} is not '<error name> <count>'")
        name, count = m.group(1), int(m.group(2))
        if name == total_key:
            total = count
        elif name in named:
            raise Malformed(f"{name!r} twice")
        else:
            named[name] = count
    if total is None:
        raise Malformed(f"no {total_key} line")
    return total, named


def device_kind(vendor: str, klass: str) -> Optional[str]:
    """``gpu`` (NVIDIA display/3D controller), ``nvswitch`` (NVIDIA bridge 0x0680), ``nic`` (any network
    controller, class 0x02: Ethernet 0x0200, InfiniBand 0x0207), else None (not watched)."""
    vendor, klass = vendor.strip().lower(), klass.strip().lower()
    if vendor == NVIDIA and klass.startswith(("0x0300", "0x0302")):
        return "gpu"
    if vendor == NVIDIA and klass.startswith("0x0680"):
        return "nvswitch"
    if klass.startswith("0x02"):
        return "nic"
    return None


def pcie_aer(sysfs_root: str, timeout_s: float, upstream: bool = True) -> Union[AerObservation, ProbeError]:
    """The AER counters of the GPUs, NVSwitches and network controllers under ``<sysfs_root>/bus/pci/devices``,
    and (``upstream``) of the port above each one: the kernel counts an endpoint's errors at its link partner
    too, and the endpoint itself may show none (sysfs-bus-pci-devices-aer)."""
    stop = time.monotonic() + timeout_s
    base = os.path.join(sysfs_root, "bus", "pci", "devices")
    devices_root = os.path.realpath(os.path.join(sysfs_root, "devices"))
    try:
        entries = sorted(os.listdir(base))[:MAX_DEVICES]
    except FileNotFoundError:
        return AerObservation(())  # no PCI bus in this sysfs (a container): no device to judge
    except OSError as exc:
        return ProbeError("pcie_aer", "error", f"{base}: {child.describe(exc)}")
    out: list[AerDevice] = []
    seen: set[str] = set()
    for entry in entries:
        if time.monotonic() > stop:
            return AerObservation(tuple(out), complete=False)
        if not _BDF.match(entry):
            continue
        try:
            kind = device_kind(
                read_attr(os.path.join(base, entry, "vendor")) or "",
                read_attr(os.path.join(base, entry, "class")) or "",
            )
        except (OSError, ground.Foreign):
            continue
        if kind is None:
            continue
        where = os.path.realpath(os.path.join(base, entry))
        if not where.startswith(devices_root + os.sep):
            out.append(AerDevice(entry, kind, error=f"{os.path.join(base, entry)} resolves outside {devices_root}"))
            continue
        if entry not in seen:
            seen.add(entry)
            out.append(_aer_of(entry, kind, where))
        parent = os.path.dirname(where)
        name = os.path.basename(parent)
        if upstream and _BDF.match(name) and name not in seen:
            seen.add(name)
            out.append(_aer_of(name, f"upstream of {entry}", parent))
    return AerObservation(tuple(out))


def _aer_of(bus_id: str, kind: str, where: str) -> AerDevice:
    values: dict[str, Optional[int]] = {}
    named: list[tuple[str, int]] = []
    errors: list[str] = []
    for key, total_key in AER_FILES:
        path = os.path.join(where, f"aer_dev_{key}")
        values[key] = None
        try:
            text = read_attr(path)
            if text is None:
                continue
            values[key], counts = parse_aer(text, total_key)
        except (OSError, ground.Foreign, Malformed) as exc:
            errors.append(f"{path}: {_why(exc)}")
            continue
        named.extend((f"{key}: {name}", n) for name, n in counts.items() if n)
    return AerDevice(
        bus_id,
        kind,
        correctable=values["correctable"],
        nonfatal=values["nonfatal"],
        fatal=values["fatal"],
        by_error=tuple(named),
        error="; ".join(errors) or None,
    )


def _why(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, (ground.Foreign, Malformed)) else child.describe(exc)


def _count(path: str) -> Optional[int]:
    """A decimal counter file; None when absent. Raises Malformed, OSError, ground.Foreign."""
    text = read_attr(path)
    if text is None:
        return None
    value = text.strip()
    if not value.isdigit() or len(value) > 19:
        raise Malformed(f"{_PRINTABLE.sub('?', value[:40])!r} is not a count")
    return int(value)


def edac(sysfs_root: str) -> EdacObservation:
    """Every memory controller under ``<sysfs_root>/devices/system/edac/mc``; none loaded: ``loaded=False``."""
    base = os.path.join(sysfs_root, "devices", "system", "edac", "mc")
    try:
        names = sorted(n for n in os.listdir(base) if re.match(r"^mc[0-9]{1,4}$", n))[:MAX_ENTRIES]
    except OSError:
        return EdacObservation((), loaded=False)
    return EdacObservation(tuple(_controller(name, os.path.join(base, name)) for name in names))


def _controller(name: str, where: str) -> EdacController:
    errors: list[str] = []

    def count(path: str) -> Optional[int]:
        try:
            return _count(path)
        except (OSError, ground.Foreign, Malformed) as exc:
            errors.append(f"{path}: {_why(exc)}")
            return None

    ce, ue = count(os.path.join(where, "ce_count")), count(os.path.join(where, "ue_count"))
    if ce is None and ue is None and not errors:
        errors.append(f"{where}: no ce_count or ue_count")
    ce_noinfo = count(os.path.join(where, "ce_noinfo_count"))
    ue_noinfo = count(os.path.join(where, "ue_noinfo_count"))
    dimms: list[tuple[str, int, int]] = []
    try:
        parts = sorted(n for n in os.listdir(where) if re.match(r"^(dimm|rank)[0-9]{1,4}$", n))[:MAX_ENTRIES]
    except OSError:
        parts = []
    for part in parts:
        d_ce = count(os.path.join(where, part, "dimm_ce_count")) or 0
        d_ue = count(os.path.join(where, part, "dimm_ue_count")) or 0
        if d_ce or d_ue:
            try:
                label = _PRINTABLE.sub("?", (read_attr(os.path.join(where, part, "dimm_label")) or "").strip())[:64]
            except (OSError, ground.Foreign):
                label = ""
            dimms.append((f"{part} {label}".strip(), d_ce, d_ue))
    return EdacController(name, ce, ue, ce_noinfo, ue_noinfo, tuple(dimms), "; ".join(errors) or None)


# --------------------------------------------------------------------------- D-state holders of a GPU


def parse_stat(text: str) -> Optional[tuple[str, str, int]]:
    """``/proc/<pid>/stat`` -> (comm, state, starttime); None when malformed. The name may hold spaces and
    parentheses: it ends at the last ``)`` (proc(5)); starttime is field 22."""
    left, right = text.find("("), text.rfind(")")
    if left < 0 or right < left:
        return None
    rest = text[right + 1 :].split()
    if len(rest) < 20 or len(rest[0]) != 1 or not rest[19].isdigit():
        return None
    return _PRINTABLE.sub("?", text[left + 1 : right])[:64], rest[0], int(rest[19])


def _nvidia_fds(procfs_root: str, pid: str) -> tuple[str, ...]:
    fd_dir = os.path.join(procfs_root, pid, "fd")
    found: set[str] = set()
    try:
        fds = os.listdir(fd_dir)[:MAX_FDS]
    except OSError:
        return ()
    for fd in fds:
        try:
            target = os.readlink(os.path.join(fd_dir, fd))
        except OSError:
            continue
        if target.startswith("/dev/nvidia"):
            found.add(_PRINTABLE.sub("?", target)[:64])
    return tuple(sorted(found))


def _stat_of(procfs_root: str, pid: str) -> Optional[tuple[str, str, int]]:
    try:
        text = read_attr(os.path.join(procfs_root, pid, "stat"))
    except (OSError, ground.Foreign):
        return None
    return parse_stat(text) if text is not None else None


def scan_dstate(procfs_root: str, confirm_s: float, budget_s: float) -> tuple[tuple[Any, ...], int, bool]:
    """In the child: ((pid, comm, devices) ...) of the processes in D state with /dev/nvidia* open in a first
    pass and still in D state (same start time: not a new process with the pid) ``confirm_s`` later; the
    number scanned; whether the scan finished within ``budget_s``."""
    stop = time.monotonic() + budget_s
    try:
        pids = [p for p in os.listdir(procfs_root) if p.isdigit()][:MAX_PROCESSES]
    except OSError:
        return (), 0, False
    first: dict[str, tuple[str, int, tuple[str, ...]]] = {}
    scanned = 0
    for pid in pids:
        if time.monotonic() > stop:
            return (), scanned, False
        scanned += 1
        stat = _stat_of(procfs_root, pid)
        if stat is None or stat[1] != "D":
            continue
        devices = _nvidia_fds(procfs_root, pid)
        if devices:
            first[pid] = (stat[0], stat[2], devices)
    if first and confirm_s > 0:
        time.sleep(max(0.0, min(confirm_s, stop - time.monotonic())))
    held = []
    for pid, (comm, start, devices) in sorted(first.items(), key=lambda kv: int(kv[0])):
        again = _stat_of(procfs_root, pid)
        if again is not None and again[1] == "D" and again[2] == start:
            held.append((int(pid), comm, devices))
    return tuple(held), scanned, True


Scan = Callable[[str, float, float], tuple[tuple[Any, ...], int, bool]]


class PendingDstate:
    """The /proc scan running in a child; ``collect()`` waits until the deadline, never longer."""

    def __init__(self, worker: child.Child, timeout_s: float) -> None:
        self.worker, self.timeout_s = worker, timeout_s

    def collect(self) -> Union[DstateObservation, ProbeError]:
        (end,) = child.wait_all([self.worker], self.timeout_s)
        if end.timed_out:
            return DstateObservation(
                (), 0, complete=False, note=f"the /proc scan did not answer within {self.timeout_s:g} s"
            )
        if not end.ok:
            return ProbeError("dstate", "error", f"the /proc scan failed: {end.value}")
        held, scanned, finished = end.value
        procs = tuple(DstateProcess(pid, comm, devices) for pid, comm, devices in held)
        note = None if finished else "the /proc scan stopped at its deadline"
        return DstateObservation(procs, scanned, complete=finished, note=note)


def start_dstate(procfs_root: str, timeout_s: float, confirm_s: float, scan: Scan = scan_dstate) -> PendingDstate:
    """Fork the scan (the runner calls this before any thread starts). Its own budget ends before the
    parent's deadline, so a slow but live scan still answers with what it saw; ``scan`` is injectable so a
    test can make it hang for real."""
    budget = max(0.0, timeout_s * 0.8 - 0.05)
    confirm = min(confirm_s, budget / 2)
    return PendingDstate(child.start(lambda: scan(procfs_root, confirm, budget)), timeout_s)
