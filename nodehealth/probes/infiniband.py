"""The InfiniBand probe: every port's state and rate (``probes.host.infiniband``), its error counters
(``ports/<n>/counters/``), and what earlier rounds saw of it (``probes.ib_history``).

The sysfs reads run in a killable child (``platform.child``), bounded by the probe's deadline: a
PMA counter is read from the HCA's firmware when the file is read (the kernel's ``show_pma_counter``
sends a MAD and waits), so a wedged HCA may block that read. Past the deadline the port table is a
``ProbeError`` (timeout): the check says UNKNOWN, never OK.

The counter files (drivers/infiniband/core/sysfs.c ``show_pma_counter``: ``"%llu\\n"``; their names in
Documentation/ABI/stable/sysfs-class-infiniband) are read by name from ``COUNTERS``, never by a
listing; each read is at most 32 bytes, must be digits only, and a file that is a symlink or not a
regular file is refused (``O_NOFOLLOW``, ``fstat``). A missing file is a counter this port does not
have (a RoCE port, an old kernel): absent, not an error. So is ``N/A (no PMA)``, what the kernel's
``show_pma_counter`` writes for a device without a performance-management agent (iWARP devices such as
i40iw: node_exporter #966). A refused or malformed one is named in the port's ``error``.
"""

from __future__ import annotations

import dataclasses
import os
import stat
import time
from typing import Any, Callable, Optional, Union

from nodehealth.observations import IbPort, ProbeError
from nodehealth.platform import child
from nodehealth.probes import host, ib_history

# The IB PMA PortCounters a flap or a bad link moves (IBA vol. 1, 16.1.3.5), as the kernel names them.
COUNTERS = (
    "symbol_error",
    "link_error_recovery",
    "link_downed",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "port_xmit_discards",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
)
_READ_MAX = 32  # "18446744073709551615\n" is 21 bytes
NO_PMA = "N/A (no PMA)"  # the device answers no PortCounters query: the counter does not exist here
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)


def parse_counter(text: str) -> Optional[int]:
    """``"42\\n"`` -> 42; None unless it is a u64 in decimal digits."""
    value = text.strip()
    if not value.isdigit() or not value.isascii() or len(value) > 20:
        return None
    number = int(value)
    return number if number <= ib_history.MAX_COUNTER else None


def read_counters(port_dir: str) -> tuple[tuple[tuple[str, int], ...], list[str]]:
    """The counters of one port (name, value), and what was refused or malformed."""
    values, errors = [], []
    for name in COUNTERS:
        path = os.path.join(port_dir, "counters", name)
        try:
            fd = os.open(path, _OPEN_FLAGS)
        except FileNotFoundError:
            continue
        except OSError as exc:
            errors.append(f"{path}: {child.describe(exc)}")
            continue
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                errors.append(f"{path}: not a regular file")
                continue
            text = os.read(fd, _READ_MAX).decode("ascii", errors="replace")
        except OSError as exc:
            errors.append(f"{path}: {child.describe(exc)}")
            continue
        finally:
            os.close(fd)
        number = parse_counter(text)
        if number is None and text.strip() == NO_PMA:
            continue
        if number is None:
            errors.append(f"{path}: malformed value {text.strip()[:24]!r}")
        else:
            values.append((name, number))
    return tuple(values), errors


def read_ports(sysfs_root: str) -> tuple[IbPort, ...]:
    """Every port with its counters (what the child runs)."""
    out = []
    for port in host.infiniband(sysfs_root):
        where = os.path.join(sysfs_root, "class", "infiniband", port.device, "ports", str(port.port))
        counters, errors = read_counters(where)
        error = "; ".join(([port.error] if port.error else []) + errors) or None
        out.append(dataclasses.replace(port, counters=counters, error=error))
    return tuple(out)


@dataclasses.dataclass
class PendingPorts:
    """The started child; ``collect()`` waits for it until the deadline and adds the history."""

    child: Any
    timeout_s: float
    paths: Any  # the config's [paths], or one directory (tests)
    persist: bool
    clock: Callable[[], float] = time.time

    def collect(self) -> Union[tuple[IbPort, ...], ProbeError]:
        if self.child is None:
            return ()
        (end,) = child.wait_all([self.child], self.timeout_s)
        if not end.ok:
            kind = "timeout" if end.timed_out else "error"
            return ProbeError("infiniband", kind, f"reading /sys/class/infiniband: {end.value}")
        ports: tuple[IbPort, ...] = end.value
        if not ports:
            return ports
        now = self.clock()
        if self.persist:
            return ib_history.update(self.paths, ports, now)
        return ib_history.attach(ports, ib_history.read(self.paths), now)[0]


def start(
    sysfs_root: str,
    paths: Any,
    timeout_s: float,
    persist: bool = True,
    read: Callable[[str], tuple[IbPort, ...]] = read_ports,
) -> PendingPorts:
    """Fork the child that reads the ports. ``read`` is injectable so a test can make it block for real.
    No ``class/infiniband`` directory (no HCA, no driver: most nodes of a CPU partition): no ports and
    no child (a directory's lookup in sysfs does not wait on a device)."""
    if read is read_ports and not os.path.isdir(os.path.join(sysfs_root, "class", "infiniband")):
        return PendingPorts(None, timeout_s, paths, persist)
    return PendingPorts(child.start(lambda: read(sysfs_root)), timeout_s, paths, persist)
