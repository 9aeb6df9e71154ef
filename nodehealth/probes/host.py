"""Host probes: memory (/proc/meminfo), mounts (procfs + statvfs), shared-directory round trips, InfiniBand.

Anything that can touch a network file system (``statvfs``, the write/fsync/read/delete
round trip) runs in a killable child (``nodehealth.platform.child``): a hung NFS or Lustre
mount becomes an observation that says so, never a hang. Those probes come in two halves,
``start_*`` (forks; the runner calls it before it starts any thread) and ``collect()``
(waits until the deadline, never longer). Parsing is pure functions over text, tested with
real sample lines.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Union

from nodehealth.observations import (
    IbPort,
    MemoryObservation,
    MountObservation,
    ProbeError,
    SharedDirObservation,
)
from nodehealth.observations.record import record
from nodehealth.platform import child

# --------------------------------------------------------------------------- memory


_MEMINFO_KEYS = ("MemTotal", "MemAvailable", "SwapTotal", "SwapFree")


def parse_meminfo(text: str) -> Optional[MemoryObservation]:
    """``/proc/meminfo`` (proc(5): ``MemTotal:  16303428 kB``) -> the observation; None when a key is missing
    (``MemAvailable`` came with Linux 3.14) or not a number of kB. Swap used is total minus free, as psutil
    counts it."""
    found: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, rest = line.partition(":")
        if sep and key in _MEMINFO_KEYS:
            parts = rest.split()
            if len(parts) != 2 or parts[1] != "kB" or not parts[0].isdigit():
                return None
            found[key] = int(parts[0]) * 1024
    if len(found) != len(_MEMINFO_KEYS):
        return None
    return MemoryObservation(
        total_bytes=found["MemTotal"],
        available_bytes=found["MemAvailable"],
        swap_total_bytes=found["SwapTotal"],
        swap_used_bytes=max(0, found["SwapTotal"] - found["SwapFree"]),
    )


def memory(procfs_root: str = "/proc") -> Union[MemoryObservation, ProbeError]:
    """Physical and available memory (MemAvailable) and swap: ``<procfs_root>/meminfo`` read directly (no
    psutil import on a prolog's path), psutil where that file lacks what is needed (a kernel before 3.14)."""
    try:
        with open(os.path.join(procfs_root, "meminfo"), encoding="ascii", errors="replace") as f:
            parsed = parse_meminfo(f.read(1 << 16))
    except OSError:
        parsed = None
    if parsed is not None:
        return parsed
    try:
        import psutil
    except ImportError as exc:  # pragma: no cover - psutil is a dependency
        return ProbeError("memory", "unavailable", f"psutil is not installed ({exc})")
    try:
        vm = psutil.virtual_memory()
        swap = psutil.swap_memory()
    except (OSError, RuntimeError) as exc:
        return ProbeError("memory", "error", f"cannot read memory usage: {child.describe(exc)}")
    return MemoryObservation(
        total_bytes=int(vm.total),
        available_bytes=int(vm.available),
        swap_total_bytes=int(swap.total),
        swap_used_bytes=int(swap.used),
    )


# --------------------------------------------------------------------------- mounts


@record
class MountEntry:
    """One line of /proc/<pid>/mountinfo (escapes decoded)."""

    mount_point: str
    fstype: str
    source: str
    read_only: bool


_OCTAL = re.compile(r"\\([0-7]{3})")


def unescape(field: str) -> str:
    r"""Undo the kernel's octal escapes in mountinfo: ``\040`` space, ``\011`` tab, ``\134`` backslash."""
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[MountEntry]:
    """Parse mountinfo (proc(5)); lines that do not have its shape are skipped.

    ``36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue``:
    mount id, parent id, major:minor, root, mount point, mount options, optional fields up
    to ``-``, file-system type, source, super-block options. Read-only when either the mount
    or the super block says ``ro``.
    """
    out = []
    for line in text.splitlines():
        fields = line.split(" ")
        try:
            sep = fields.index("-", 6)
        except ValueError:
            continue
        if len(fields) < sep + 3:
            continue
        mount_opts = fields[5].split(",")
        super_opts = fields[sep + 3].split(",") if len(fields) > sep + 3 else []
        out.append(
            MountEntry(
                mount_point=unescape(fields[4]),
                fstype=fields[sep + 1],
                source=unescape(fields[sep + 2]),
                read_only="ro" in mount_opts or "ro" in super_opts,
            )
        )
    return out


def find_mount(entries: Sequence[MountEntry], path: str) -> Optional[MountEntry]:
    """The file system mounted exactly at ``path``; the last one wins (it hides the others)."""
    want = os.path.normpath(path)
    found = None
    for entry in entries:
        if entry.mount_point == want:
            found = entry
    return found


StatVfs = Callable[[str], Any]


@dataclass
class PendingMounts:
    """Mount points looked up in mountinfo, their ``statvfs`` running in children."""

    paths: tuple[str, ...]
    entries: dict[str, Optional[MountEntry]]
    children: dict[str, child.Child]
    timeout_s: float
    error: Optional[ProbeError] = None

    def collect(self) -> Union[tuple[MountObservation, ...], ProbeError]:
        if self.error is not None:
            return self.error
        names = list(self.children)
        outcomes = dict(zip(names, child.wait_all([self.children[n] for n in names], self.timeout_s)))
        out = []
        for path in self.paths:
            entry = self.entries[path]
            if entry is None:
                out.append(MountObservation(path=path, present=False))
                continue
            total = free = None
            error = None
            outcome = outcomes[path]
            if outcome.ok:
                total, free = outcome.value
            elif outcome.timed_out:
                error = f"statvfs did not answer within {self.timeout_s:g} s (hung mount?)"
            else:
                error = f"statvfs failed: {outcome.value}"
            out.append(
                MountObservation(
                    path=path,
                    present=True,
                    fstype=entry.fstype,
                    source=entry.source,
                    read_only=entry.read_only,
                    total_bytes=total,
                    free_bytes=free,
                    error=error,
                )
            )
        return tuple(out)


def start_mounts(
    paths: Sequence[str], timeout_s: float, procfs_root: str = "/proc", statvfs: StatVfs = os.statvfs
) -> PendingMounts:
    """Look ``paths`` up in ``<procfs_root>/self/mountinfo`` and start a ``statvfs`` child for
    each one mounted. ``statvfs`` is injectable so tests can make it block for real."""
    wanted = tuple(paths)
    source = os.path.join(procfs_root, "self", "mountinfo")
    if not wanted:
        return PendingMounts((), {}, {}, timeout_s)
    try:
        with open(source, encoding="utf-8", errors="surrogateescape") as fh:
            entries = parse_mountinfo(fh.read())
    except OSError as exc:
        return PendingMounts(
            wanted, {}, {}, timeout_s, ProbeError("mounts", "unavailable", f"{source}: {child.describe(exc)}")
        )
    found = {p: find_mount(entries, p) for p in wanted}
    children = {p: child.start(_space_of(p, statvfs)) for p, e in found.items() if e is not None}
    return PendingMounts(wanted, found, children, timeout_s)


def mounts(
    paths: Sequence[str], timeout_s: float, procfs_root: str = "/proc", statvfs: StatVfs = os.statvfs
) -> Union[tuple[MountObservation, ...], ProbeError]:
    """The configured mount points as found on this node (``start_mounts`` + ``collect``)."""
    return start_mounts(paths, timeout_s, procfs_root, statvfs).collect()


def _space_of(path: str, statvfs: StatVfs) -> Callable[[], tuple[int, int]]:
    def run() -> tuple[int, int]:
        st = statvfs(path)
        # f_bavail: blocks an unprivileged job may still use (the root reserve excluded).
        return int(st.f_blocks * st.f_frsize), int(st.f_bavail * st.f_frsize)

    return run


# --------------------------------------------------------------------------- shared directories

ROUND_TRIP_PREFIX = ".nodehealth-roundtrip-"


def round_trip_name() -> str:
    """A file name no other node, process or run will use: hostname, pid and 64 random bits."""
    # os.uname() and os.urandom are what socket.gethostname() and secrets.token_hex() read, without
    # importing socket and hashlib (OpenSSL) on every prolog's path.
    host = os.uname().nodename.split(".")[0] or "host"
    return f"{ROUND_TRIP_PREFIX}{host}-{os.getpid()}-{os.urandom(8).hex()}"


def _round_trip(path: str, name: str) -> Callable[[], Optional[str]]:
    """Write, fsync, read back, compare, delete. Runs in the child; returns None or the failure."""
    payload = f"nodehealth round trip {name}\n".encode()

    def run() -> Optional[str]:
        target = os.path.join(path, name)
        step = "create"
        try:
            # O_NOFOLLOW: a shared directory is writable by others; never write through their link.
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            try:
                step = "write"
                view = memoryview(payload)
                while view:
                    view = view[os.write(fd, view) :]
                step = "fsync"
                os.fsync(fd)
            finally:
                os.close(fd)
            step = "read"
            fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW)
            try:
                back = os.read(fd, len(payload) + 1)
            finally:
                os.close(fd)
            step = "delete"
            os.unlink(target)
        except OSError as exc:
            return f"{step}: {child.describe(exc)}"
        if back != payload:
            return f"read: {len(back)} bytes read back differ from the {len(payload)} written"
        return None

    return run


@dataclass
class PendingRoundTrips:
    """Round trips running in children, one per directory, all under one deadline."""

    paths: tuple[str, ...]
    children: list[child.Child]
    timeout_s: float

    def collect(self) -> tuple[SharedDirObservation, ...]:
        outcomes = child.wait_all(self.children, self.timeout_s)
        out = []
        for path, outcome in zip(self.paths, outcomes):
            if outcome.timed_out:
                out.append(
                    SharedDirObservation(
                        path,
                        ok=False,
                        elapsed_s=outcome.elapsed_s,
                        timed_out=True,
                        error=f"did not answer within {self.timeout_s:g} s",
                    )
                )
            elif not outcome.ok:
                out.append(SharedDirObservation(path, ok=False, elapsed_s=outcome.elapsed_s, error=outcome.value))
            else:
                failure = outcome.value
                out.append(SharedDirObservation(path, ok=failure is None, elapsed_s=outcome.elapsed_s, error=failure))
        return tuple(out)


def start_shared_dirs(
    paths: Sequence[str], timeout_s: float, name_for: Callable[[str], str] = lambda _path: round_trip_name()
) -> PendingRoundTrips:
    """Start one round-trip child per directory. ``name_for`` picks the file name (tests
    point it at a FIFO to make the round trip block for real)."""
    wanted = tuple(paths)
    return PendingRoundTrips(wanted, [child.start(_round_trip(p, name_for(p))) for p in wanted], timeout_s)


def shared_dirs(
    paths: Sequence[str], timeout_s: float, name_for: Callable[[str], str] = lambda _path: round_trip_name()
) -> tuple[SharedDirObservation, ...]:
    """A write/fsync/read/delete round trip in each directory, under ``timeout_s``."""
    return start_shared_dirs(paths, timeout_s, name_for).collect()


# --------------------------------------------------------------------------- InfiniBand

# The kernel's formats (drivers/infiniband/core/sysfs.c, state_show / phys_state_show / rate_show):
#   state       "%d: %s"              "4: ACTIVE", "1: DOWN", "2: INIT", "3: ARMED", "5: ACTIVE_DEFER"
#   phys_state  "%u: %s"              "5: LinkUp", "2: Polling", "3: Disabled", "7: Phy Test", "0: <unknown>"
#   rate        "%d%s Gb/sec (%dX%s)" "400 Gb/sec (4X NDR)", "100 Gb/sec (4X EDR)", "25 Gb/sec (1X EDR)",
#                                     "2.5 Gb/sec (1X SDR)"; kernels before the SDR suffix: "10 Gb/sec (4X)"
#   link_layer  "InfiniBand", "Ethernet"
_STATE = re.compile(r"^\d+: (\S+)$")
_PHYS_STATE = re.compile(r"^\d+: (\S.*)$")
_RATE = re.compile(r"^(\d+(?:\.5)?) Gb/sec \(\d+X[^)]*\)$")
_LINK_LAYER = re.compile(r"^[A-Za-z]+$")


def parse_state(text: str) -> Optional[str]:
    """``"4: ACTIVE"`` -> ``"ACTIVE"``; None when malformed."""
    m = _STATE.match(text.strip())
    return m.group(1) if m else None


def parse_phys_state(text: str) -> Optional[str]:
    """``"5: LinkUp"`` -> ``"LinkUp"``; None when malformed."""
    m = _PHYS_STATE.match(text.strip())
    return m.group(1) if m else None


def parse_rate(text: str) -> Optional[float]:
    """``"400 Gb/sec (4X NDR)"`` -> ``400.0``; None when malformed."""
    m = _RATE.match(text.strip())
    return float(m.group(1)) if m else None


def parse_link_layer(text: str) -> Optional[str]:
    value = text.strip()
    return value if _LINK_LAYER.match(value) else None


def infiniband(sysfs_root: str = "/sys") -> tuple[IbPort, ...]:
    """Every port of every RDMA device under ``<sysfs_root>/class/infiniband``.

    No such directory (no HCA, no driver): no ports. A missing or malformed value leaves
    that field None and is named, with its file, in the port's ``error``.
    """
    base = os.path.join(sysfs_root, "class", "infiniband")
    try:
        devices = sorted(os.listdir(base))
    except OSError:
        return ()
    ports = []
    for device in devices:
        ports_dir = os.path.join(base, device, "ports")
        try:
            numbers = sorted(int(n) for n in os.listdir(ports_dir) if n.isdigit())
        except OSError:
            continue
        for number in numbers:
            ports.append(_port(device, number, os.path.join(ports_dir, str(number))))
    return tuple(ports)


def _port(device: str, number: int, where: str) -> IbPort:
    errors: list[str] = []

    def field(name: str, parse: Callable[[str], Any]) -> Any:
        path = os.path.join(where, name)
        try:
            with open(path, encoding="ascii", errors="replace") as fh:
                text = fh.read(256)
        except OSError as exc:
            errors.append(f"{path}: {child.describe(exc)}")
            return None
        value = parse(text)
        if value is None:
            errors.append(f"{path}: malformed value {text.strip()!r}")
        return value

    return IbPort(
        device=device,
        port=number,
        state=field("state", parse_state),
        phys_state=field("phys_state", parse_phys_state),
        rate_gbps=field("rate", parse_rate),
        link_layer=field("link_layer", parse_link_layer),
        error="; ".join(errors) or None,
    )
