"""The ``services`` probe: systemd units and kernel modules a GPU node needs, and the devices that decide it.

What it reads, all bounded: ``<sysfs_root>/bus/pci/devices/*/{vendor,class}`` (NVIDIA GPUs and NVSwitches),
``<sysfs_root>/class/infiniband`` (RDMA devices), ``<sysfs_root>/module/<name>[/initstate]`` (modules), and
the units' state from one ``systemctl show`` run through the one runner (``platform/proc.py``: absolute,
trusted path, no shell, the deadline, output capped). It trusts the kernel's formats only: a value of another
shape is "could not tell", never "loaded" or "active". A module directory that is a symlink is refused
(sysfs has none there). systemd's presence is ``sd_booted(3)``'s test (its run directory is a directory);
without systemd no program is started. Parsing is pure (``parse_show``), tested with published output.
"""

from __future__ import annotations

import os
import re
import stat
from typing import TYPE_CHECKING, Callable, Optional, Sequence, Union

from nodehealth.checks.host_services import module_key, valid_module, valid_unit
from nodehealth.observations import ProbeError
from nodehealth.observations.services import ModuleState, ServicesObservation, UnitState

if TYPE_CHECKING:
    from nodehealth.platform.proc import CommandResult

SYSTEMCTL = "/usr/bin/systemctl"
SYSTEMD_RUN_DIR = "/run/systemd/system"
# Asked of systemctl show (systemctl(1) --property; NRestarts since systemd 235: an older one leaves it out).
PROPERTIES = ("Id", "LoadState", "ActiveState", "SubState", "UnitFileState", "Result", "NRestarts")
MAX_OUTPUT = 64 * 1024  # seven short properties a unit: a few hundred bytes; more is not systemctl's answer
MAX_PCI_DEVICES = 4096
NVIDIA_VENDOR = "0x10de"
GPU_CLASSES = ("0x0300", "0x0302")  # VGA compatible, 3D controller (data-centre GPUs)
NVSWITCH_CLASS = "0x0680"  # bridge, other: lspci -nn prints "Bridge [0680]: NVIDIA Corporation ... NVSwitch"
# nForce chipsets (MCP51/MCP61 Ethernet: 10de:0269, 10de:03ef) are NVIDIA bridges of that class too; every
# NVSwitch's device id is above theirs (first generation 10de:1ac0-1ac2, A100's 10de:1af1, H100's 10de:22a3).
NVSWITCH_MIN_DEVICE = 0x1A00
_VALUE = re.compile(r"^[A-Za-z0-9._@:+-]{0,64}$")

# platform.proc.run, imported when a unit is asked about (a node with nothing to ask starts nothing).
Runner = Callable[..., "CommandResult"]


def parse_show(text: str, units: Sequence[str]) -> Union[tuple[UnitState, ...], str]:
    """``systemctl show --property=... -- u1 u2`` -> one UnitState per unit asked, in order; or why not.

    systemctl prints one block of ``Key=Value`` lines per unit, in the order given, blocks separated by an
    empty line, and exits 0 even for a unit that does not exist (``LoadState=not-found``; systemd/systemd#1105).
    Keys not asked for are ignored; a value of a shape systemd does not write becomes None.
    """
    blocks: list[dict[str, str]] = []
    current: dict[str, str] = {}
    for line in text.split("\n"):
        if not line.strip():
            if current:
                blocks.append(current)
                current = {}
            continue
        key, sep, value = line.partition("=")
        if not sep:
            return f"systemctl show: a line that is not Key=Value: {line[:80]!r}"
        if key in PROPERTIES:
            current[key] = value
    if current:
        blocks.append(current)
    if len(blocks) != len(units):
        return f"systemctl show answered {len(blocks)} unit(s) for the {len(units)} asked"
    out = []
    for name, block in zip(units, blocks):
        if "LoadState" not in block or "ActiveState" not in block:
            return f"systemctl show: no LoadState/ActiveState for {name}"
        out.append(
            UnitState(
                name=name,
                load_state=_value(block.get("LoadState")),
                active_state=_value(block.get("ActiveState")),
                sub_state=_value(block.get("SubState")),
                unit_file_state=_value(block.get("UnitFileState")),
                result=_value(block.get("Result")),
                restarts=int(block["NRestarts"]) if block.get("NRestarts", "").isdigit() else None,
            )
        )
    return tuple(out)


def _value(text: Optional[str]) -> Optional[str]:
    if text is None or not _VALUE.match(text):
        return None
    return text


def _read_small(path: str, limit: int = 64) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        return os.read(fd, limit).decode("ascii", "replace").strip()
    finally:
        os.close(fd)


def pci_inventory(sysfs_root: str) -> tuple[Optional[int], Optional[int], Optional[str]]:
    """(NVIDIA GPUs, NVSwitches, error) from ``<sysfs_root>/bus/pci/devices``."""
    base = os.path.join(sysfs_root, "bus", "pci", "devices")
    try:
        entries = sorted(os.listdir(base))
    except FileNotFoundError:
        return 0, 0, None  # no PCI bus in this tree: no NVIDIA device
    except OSError as exc:
        return None, None, f"{base}: {exc.strerror or exc}"
    if len(entries) > MAX_PCI_DEVICES:
        return None, None, f"{base}: {len(entries)} entries, more than a PCI bus holds ({MAX_PCI_DEVICES})"
    gpus = switches = 0
    for entry in entries:
        try:
            vendor = _read_small(os.path.join(base, entry, "vendor")).lower()
            klass = _read_small(os.path.join(base, entry, "class")).lower()
        except OSError:
            continue  # a function that went away while we looked, or not a device directory
        if vendor != NVIDIA_VENDOR:
            continue
        if klass.startswith(GPU_CLASSES):
            gpus += 1
        elif klass.startswith(NVSWITCH_CLASS) and _device_id(os.path.join(base, entry)) >= NVSWITCH_MIN_DEVICE:
            switches += 1
    return gpus, switches, None


def _device_id(where: str) -> int:
    try:
        text = _read_small(os.path.join(where, "device"))
        return int(text, 16) if text.startswith("0x") else -1
    except (OSError, ValueError):
        return -1


def rdma_devices(sysfs_root: str) -> Optional[int]:
    """How many RDMA devices (/sys/class/infiniband entries): 0 without the directory, None unreadable."""
    try:
        return len(os.listdir(os.path.join(sysfs_root, "class", "infiniband")))
    except FileNotFoundError:
        return 0
    except OSError:
        return None


def module_state(sysfs_root: str, name: str) -> ModuleState:
    """Whether ``name`` is loaded: ``/sys/module/<name>`` a directory, its ``initstate`` "live" (a loadable
    module) or absent (built in). A symlink or another kind of file there is not sysfs: could not tell."""
    key = module_key(name)
    if not valid_module(key):
        return ModuleState(key, None, "not a module name")
    where = os.path.join(sysfs_root, "module", key)
    try:
        st = os.lstat(where)
    except FileNotFoundError:
        return ModuleState(key, False)
    except OSError as exc:
        return ModuleState(key, None, f"{where}: {exc.strerror or exc}")
    if not stat.S_ISDIR(st.st_mode):
        return ModuleState(key, None, f"{where} is not a directory")
    try:
        state = _read_small(os.path.join(where, "initstate"), 16)
    except FileNotFoundError:
        return ModuleState(key, True, "built in")
    except OSError as exc:
        return ModuleState(key, None, f"{where}/initstate: {exc.strerror or exc}")
    if state == "live":
        return ModuleState(key, True)
    if state in ("coming", "going"):
        return ModuleState(key, False, f"initstate {state}")
    return ModuleState(key, None, f"{where}/initstate: unexpected {state[:16]!r}")


def unit_states(
    units: Sequence[str], timeout_s: float, systemctl: str = SYSTEMCTL, run: Optional[Runner] = None
) -> Union[tuple[UnitState, ...], str]:
    """The units' state from one ``systemctl show`` under ``timeout_s``; or why it could not be read."""
    if not units:
        return ()
    bad = [u for u in units if not valid_unit(u)]
    if bad:
        return f"not a unit name: {bad[0][:80]!r}"
    from nodehealth.platform import proc

    argv = [systemctl, "show", "--no-pager", f"--property={','.join(PROPERTIES)}", "--", *units]
    try:
        answer = (run or proc.run)(argv, timeout_s, max_output=MAX_OUTPUT, allow=())
    except proc.CommandError as exc:
        return f"cannot run systemctl: {exc}"
    if answer.timed_out:
        return f"{systemctl} show did not answer within {timeout_s:g} s"
    if answer.truncated:
        return f"{systemctl} show printed more than {MAX_OUTPUT} bytes: not its answer"
    if answer.returncode != 0:
        why = (answer.stderr.strip().splitlines() or [""])[0][:200]
        return f"{systemctl} show exited {answer.returncode}: {why}"
    return parse_show(answer.stdout, units)


def gather(
    sysfs_root: str,
    gpu_units: Sequence[str],
    site_units: Sequence[str],
    modules: Sequence[str],
    timeout_s: float,
    systemctl: str = SYSTEMCTL,
    systemd_dir: str = SYSTEMD_RUN_DIR,
    run: Optional[Runner] = None,
) -> Union[ServicesObservation, ProbeError]:
    """The observation: ``gpu_units`` are asked only on a node with an NVIDIA device on its PCI bus (or when
    that could not be read), ``site_units`` always; every module in ``modules``."""
    gpus, switches, pci_error = pci_inventory(sysfs_root)
    nvidia = gpus is None or bool(gpus or switches)
    wanted = list(dict.fromkeys([*(gpu_units if nvidia else ()), *site_units]))
    systemd = os.path.isdir(systemd_dir) and not os.path.islink(systemd_dir)
    units: Union[tuple[UnitState, ...], str] = ()
    if systemd and wanted:
        units = unit_states(wanted, timeout_s, systemctl, run)
    return ServicesObservation(
        nvidia_gpus=gpus,
        nvswitches=switches,
        rdma_devices=rdma_devices(sysfs_root),
        systemd=systemd,
        units=units if isinstance(units, tuple) else (),
        modules=tuple(module_state(sysfs_root, m) for m in dict.fromkeys(modules)),
        units_error=units if isinstance(units, str) else None,
        pci_error=pci_error,
    )
