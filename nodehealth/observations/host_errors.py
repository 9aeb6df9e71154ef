"""Host error counters the kernel keeps: PCIe AER per device, EDAC per memory controller, D-state holders.

Plain frozen records (``observations`` imports nothing of ours). Counters are the kernel's, cumulative
since boot (or since the driver bound); ``None`` = the file is not there (no AER capability, an older
kernel), never 0.
"""

from __future__ import annotations

from typing import Optional

from nodehealth.observations.record import record


@record
class AerDevice:
    """One PCI function's AER counters (``/sys/bus/pci/devices/<bdf>/aer_dev_{correctable,nonfatal,fatal}``).

    ``kind``: ``gpu``, ``nvswitch``, ``nic`` or ``other`` (from vendor and class). Each total is the file's
    ``TOTAL_ERR_*`` line; ``by_error`` keeps the non-zero named lines (``"fatal: Surprise Down Error": 1``).
    ``error``: a file that was there but could not be read or parsed (named with its path).
    """

    bus_id: str
    kind: str
    correctable: Optional[int] = None
    nonfatal: Optional[int] = None
    fatal: Optional[int] = None
    by_error: tuple[tuple[str, int], ...] = ()
    error: Optional[str] = None


@record
class AerObservation:
    """The watched PCI functions (GPUs, NVSwitches, network controllers). ``complete``: False when the
    probe's deadline came before every device was read (those read are kept)."""

    devices: tuple[AerDevice, ...]
    complete: bool = True


@record
class EdacController:
    """One memory controller (``/sys/devices/system/edac/mc/mc<N>``): corrected and uncorrected errors,
    ``*_noinfo``: those the driver could not place on a DIMM. ``dimms``: (label, ce, ue) of DIMMs with errors."""

    name: str
    ce: Optional[int]
    ue: Optional[int]
    ce_noinfo: Optional[int] = None
    ue_noinfo: Optional[int] = None
    dimms: tuple[tuple[str, int, int], ...] = ()
    error: Optional[str] = None


@record
class EdacObservation:
    """``loaded``: False when ``/sys/devices/system/edac/mc`` is absent (no EDAC driver: not "no errors")."""

    controllers: tuple[EdacController, ...]
    loaded: bool = True


@record
class DstateProcess:
    """A process in uninterruptible sleep (``D`` in ``/proc/<pid>/stat``) with ``/dev/nvidia*`` open,
    seen in both of the probe's samples. ``comm``: the kernel's name (``stat``'s second field, never
    ``cmdline``, which takes the process's memory lock and would hang on it)."""

    pid: int
    comm: str
    devices: tuple[str, ...]


@record
class DstateObservation:
    """``scanned``: processes looked at; ``complete``: False when the deadline came first (or the scan was
    abandoned as hung: ``note`` says which); ``processes``: the D-state holders of an NVIDIA device."""

    processes: tuple[DstateProcess, ...]
    scanned: int
    complete: bool = True
    note: Optional[str] = None
