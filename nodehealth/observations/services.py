"""What the ``services`` probe saw: systemd units, kernel modules, and the devices that say which a node needs.

Plain records, importing nothing of ours but ``record``; ``None`` in a field = could not tell.
"""

from __future__ import annotations

from typing import Optional

from nodehealth.observations.record import record


@record
class UnitState:
    """One systemd unit as ``systemctl show`` tells it (systemctl(1), the properties of org.freedesktop.systemd1.Unit).

    ``load_state``: loaded, not-found, masked, error, bad-setting; ``active_state``: active, reloading,
    inactive, failed, activating, deactivating; ``sub_state``: running, exited, dead, failed, auto-restart, ...;
    ``unit_file_state``: enabled, enabled-runtime, disabled, static, masked, ... ("" for a unit with no file);
    ``result``: success, exit-code, signal, core-dump, timeout, ...; ``restarts``: NRestarts (systemd 235+).
    A value systemctl did not give, or gave in a shape no systemd writes, is None.
    """

    name: str
    load_state: Optional[str]
    active_state: Optional[str]
    sub_state: Optional[str] = None
    unit_file_state: Optional[str] = None
    result: Optional[str] = None
    restarts: Optional[int] = None


@record
class ModuleState:
    """One kernel module under ``/sys/module/<name>``: ``loaded`` True (a live or built-in module), False (no
    such directory, or ``initstate`` coming/going), None (could not tell: ``detail`` says why)."""

    name: str
    loaded: Optional[bool]
    detail: Optional[str] = None


@record
class ServicesObservation:
    """The units and modules asked about, and the node's facts that decide which it needs.

    ``nvidia_gpus`` / ``nvswitches``: NVIDIA functions on the PCI bus of class display (0x0300/0x0302) and
    bridge-other (0x0680, NVSwitch); ``rdma_devices``: entries of /sys/class/infiniband; None where the
    directory could not be read (``pci_error``). ``systemd``: systemd is the running init (sd_booted(3): its
    run directory exists); without it no unit is queried. ``units_error``: systemctl could not answer (not
    run, timed out, refused, output cut or in no shape it writes); then ``units`` is empty.
    """

    nvidia_gpus: Optional[int]
    nvswitches: Optional[int]
    rdma_devices: Optional[int]
    systemd: bool
    units: tuple[UnitState, ...] = ()
    modules: tuple[ModuleState, ...] = ()
    units_error: Optional[str] = None
    pci_error: Optional[str] = None

    def unit(self, name: str) -> Optional[UnitState]:
        for u in self.units:
            if u.name == name:
                return u
        return None

    def module(self, name: str) -> Optional[ModuleState]:
        for m in self.modules:
            if m.name == name:
                return m
        return None
