"""NVIDIA GPUs on the PCI bus, from sysfs (vendor 0x10de, class display controller)."""

from __future__ import annotations

import os
from typing import Union

from nodehealth.observations import PciGpus, ProbeError

NVIDIA_VENDOR = "0x10de"
# PCI class 0x0300xx (VGA compatible) and 0x0302xx (3D controller: data-centre GPUs).
GPU_CLASSES = ("0x0300", "0x0302")
SYSFS = "/sys"  # this host's own sysfs ([paths] sysfs_root's default)


def is_host_sysfs(sysfs_root: str) -> bool:
    """Whether ``sysfs_root`` is this host's sysfs (a recorded tree elsewhere is not)."""
    return os.path.realpath(sysfs_root) == SYSFS


def nvidia_gpus(sysfs_root: str = SYSFS) -> Union[PciGpus, ProbeError]:
    base = os.path.join(sysfs_root, "bus", "pci", "devices")
    try:
        entries = sorted(os.listdir(base))
    except OSError as exc:
        return ProbeError("pci_gpus", "unavailable", f"{base}: {exc.strerror or exc}")
    found = []
    for entry in entries:
        try:
            vendor = _read(os.path.join(base, entry, "vendor"))
            klass = _read(os.path.join(base, entry, "class"))
        except OSError:
            continue
        if vendor.lower() == NVIDIA_VENDOR and klass.lower().startswith(GPU_CLASSES):
            found.append(entry.lower())
    return PciGpus(tuple(found), "sysfs")


def _read(path: str) -> str:
    with open(path, encoding="ascii", errors="replace") as fh:
        return fh.read(64).strip()
