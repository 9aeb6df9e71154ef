"""GPU services: Fabric Manager, persistenced, IMEX running and nvidia_peermem loaded where this node needs them.

Why the defaults are what they are (on by default: no default demands a service a healthy node lacks):

* ``fabricmanager = "auto"``: demanded only where NVSwitches are on the PCI bus (HGX/DGX baseboards: vendor
  0x10de, class 0x0680). There, without Fabric Manager, CUDA initialisation fails with cudaErrorSystemNotReady
  and the GPUs have no NVLink peers (NVIDIA Fabric Manager User Guide); a PCIe node never runs it, and many
  images install and enable the unit everywhere, where it fails to start: "auto" does not judge it there.
  NVSwitches a node does not see on its PCI bus (GB200 NVL72 compute trays, HGX B200 with NVLSM) need
  ``"required"`` in the site's config.
* ``persistenced``, ``imex = "enabled"``: judged where the unit is enabled at boot (the site chose it: IMEX
  is configured only on multi-node NVLink systems, and sites that use ``nvidia-smi -pm 1`` instead of the
  daemon disable it); an enabled unit that is not running is a FAIL.
* ``peermem = "auto"``: a WARN (never a drain) where RDMA devices and NVIDIA GPUs share the node and the
  ``nvidia_peermem`` module is not loaded: GPUDirect RDMA through it is off, but NCCL 2.19+ on the open
  kernel modules uses DMA-BUF instead, which needs no module; ``"required"`` makes it a FAIL.
* Only on a node with an NVIDIA device on its PCI bus; ``units`` and ``modules`` (the site's own) anywhere.
Every FAIL names the command that starts what is missing.
"""

from __future__ import annotations

import re
from typing import Any, Optional

from nodehealth.checks.base import CheckSettings, Context, probe_data, result, setting
from nodehealth.model import CheckResult, Finding, Status, fold
from nodehealth.observations import Observations
from nodehealth.observations.record import record
from nodehealth.observations.services import ServicesObservation, UnitState

# The drain reason's code (``nh:<code>``, a published contract: never changes meaning) and what it says.
REASON = ("svc", "a GPU service not running or a kernel module not loaded")

FABRICMANAGER = "nvidia-fabricmanager.service"
PERSISTENCED = "nvidia-persistenced.service"
IMEX = "nvidia-imex.service"
PEERMEM = "nvidia_peermem"
ENABLED = ("enabled", "enabled-runtime")
RUNNING = ("active", "reloading")
_UNIT = re.compile(r"^[A-Za-z0-9:_.@\\-]{1,200}\.(service|socket|path|target|mount|timer|device|scope)$")
_MODULE = re.compile(r"^[A-Za-z0-9_-]{1,56}$")


def valid_unit(name: str) -> bool:
    """A unit name systemd accepts and argv can carry (no leading '-', a known type suffix)."""
    return bool(_UNIT.match(name)) and not name.startswith("-")


def valid_module(name: str) -> bool:
    return bool(_MODULE.match(name)) and not name.startswith("-")


def module_key(name: str) -> str:
    """The name under /sys/module: modprobe takes ``nvidia-peermem`` and ``nvidia_peermem`` alike."""
    return name.replace("-", "_")


@record
class Settings(CheckSettings):
    timeout_s: float = setting(
        5.0, "deadline for reading the units (one systemctl show) and modules", unit="s", min=0.1, max=60
    )
    fabricmanager: str = setting(
        "auto",
        f"{FABRICMANAGER} must be active: auto = where NVSwitches are on the PCI bus, required = always, off = never",
        choices=("auto", "required", "off"),
    )
    persistenced: str = setting(
        "enabled",
        f"{PERSISTENCED} must be active: enabled = where the unit is enabled at boot, required = always, off = never",
        choices=("enabled", "required", "off"),
    )
    imex: str = setting(
        "enabled",
        f"{IMEX} (multi-node NVLink, GB200) must be active: enabled = where enabled at boot, required, off",
        choices=("enabled", "required", "off"),
    )
    peermem: str = setting(
        "auto",
        f"the {PEERMEM} module (GPUDirect RDMA): auto = a WARN where RDMA devices and GPUs are present and it is "
        "not loaded (NCCL's DMA-BUF path needs no module), required = a FAIL, off = never",
        choices=("auto", "required", "off"),
    )
    units: tuple[str, ...] = setting((), 'more systemd units that must be active, e.g. ["nvidia-dcgm.service"]')
    modules: tuple[str, ...] = setting(
        (), 'more kernel modules that must be loaded (as in /sys/module), e.g. ["nvidia_uvm"]'
    )
    systemctl: str = setting("/usr/bin/systemctl", "systemctl, by absolute path (root's own: it runs as root)")
    systemd_run_dir: str = setting(
        "/run/systemd/system",
        "the directory whose presence says systemd is the running init (sd_booted(3)); without it no unit is "
        "asked about: a unit demanded by required is UNKNOWN, one judged where enabled does not apply",
    )

    def validate(self) -> None:
        for unit in self.units:
            if not valid_unit(unit):
                raise ValueError(f"units: {unit!r} is not a unit name (name.service, .socket, .mount, ...)")
        for module in self.modules:
            if not valid_module(module):
                raise ValueError(f"modules: {module!r} is not a module name (letters, digits, _ and -)")
        for key in ("systemctl", "systemd_run_dir"):
            if not getattr(self, key).startswith("/"):
                raise ValueError(f"{key}: {getattr(self, key)!r} is not an absolute path")

    def gpu_units(self) -> tuple[str, ...]:
        """The units the probe asks about on a node with NVIDIA devices (those whose mode is not off)."""
        modes = ((FABRICMANAGER, self.fabricmanager), (PERSISTENCED, self.persistenced), (IMEX, self.imex))
        return tuple(unit for unit, mode in modes if mode != "off")

    def all_modules(self) -> tuple[str, ...]:
        return ((PEERMEM,) if self.peermem != "off" else ()) + tuple(module_key(m) for m in self.modules)


def evaluate(obs: Observations, settings: Settings, ctx: Context) -> Any:
    seen = probe_data(obs.services, ctx, "cannot read the node's services", "the node's services were not probed")
    if isinstance(seen, CheckResult):
        return seen
    if not isinstance(seen, ServicesObservation):
        return result(ctx, Status.UNKNOWN, "the node's services were not probed")
    findings: list[Finding] = []
    judged: dict[str, Any] = {}
    not_needed: dict[str, str] = {}
    nvidia = seen.nvidia_gpus is None or bool(seen.nvidia_gpus or seen.nvswitches)
    if seen.pci_error:
        findings.append(Finding(Status.UNKNOWN, f"cannot tell which services this node needs: {seen.pci_error}"))
    # (unit, "required" or "enabled", why it is demanded)
    demands: list[tuple[str, str, str]] = []
    if nvidia:
        if settings.fabricmanager == "required":
            demands.append((FABRICMANAGER, "required", "required by config"))
        elif settings.fabricmanager == "auto" and seen.nvswitches:
            demands.append((FABRICMANAGER, "required", f"{seen.nvswitches} NVSwitch(es) on the PCI bus"))
        elif settings.fabricmanager == "auto" and seen.nvswitches == 0:
            not_needed[FABRICMANAGER] = "no NVSwitch on the PCI bus"
        for unit, mode in ((PERSISTENCED, settings.persistenced), (IMEX, settings.imex)):
            if mode != "off":
                demands.append((unit, mode, "required by config" if mode == "required" else "enabled at boot"))
    demands.extend((unit, "required", "listed in units") for unit in settings.units)
    for unit, mode, why in dict((d[0], d) for d in demands).values():
        finding = _judge_unit(seen, unit, mode, not_needed)
        if finding is not None:
            findings.append(finding)
        state = seen.unit(unit)
        if state is not None and unit not in not_needed:
            judged[unit] = {
                "why": why,
                "load": state.load_state,
                "active": state.active_state,
                "sub": state.sub_state,
                "ok": finding is None,
            }
    modules = _module_demands(seen, settings, nvidia, not_needed)
    for name, status in modules:
        finding = _judge_module(seen, name, status)
        if finding is not None:
            findings.append(finding)
        judged[name] = {"loaded": getattr(seen.module(name), "loaded", None), "ok": finding is None}
    details: dict[str, Any] = {
        "nvidia_gpus": seen.nvidia_gpus,
        "nvswitches": seen.nvswitches,
        "rdma_devices": seen.rdma_devices,
        "judged": judged,
    }
    if not_needed:
        details["not_needed"] = not_needed
    if not judged and not findings:
        why = "no NVIDIA device on the PCI bus" if not nvidia else "; ".join(f"{k}: {v}" for k, v in not_needed.items())
        return result(ctx, Status.SKIPPED, f"no GPU service needed here ({why or 'none configured'})", **details)
    names = ", ".join(judged)
    return fold(ctx.name, findings, f"{len(judged)} needed: {names} running/loaded", details)


def _judge_unit(seen: ServicesObservation, unit: str, mode: str, not_needed: dict[str, str]) -> Optional[Finding]:
    required = mode == "required"
    if not seen.systemd:
        if required:
            return Finding(Status.UNKNOWN, f"{unit}: systemd is not running here: cannot tell whether it runs")
        not_needed[unit] = "systemd is not running"
        return None
    state = seen.unit(unit)
    if state is None:
        return Finding(Status.UNKNOWN, f"{unit}: cannot read its state: {seen.units_error or 'not reported'}")
    if not required and state.unit_file_state not in ENABLED:
        not_needed[unit] = f"not enabled at boot ({state.unit_file_state or state.load_state or 'unknown'})"
        return None
    return _unit_finding(state)


def _unit_finding(state: UnitState) -> Optional[Finding]:
    unit, active, sub = state.name, state.active_state, state.sub_state
    start = f"systemctl start {unit}"
    logs = f"journalctl -b -u {unit}"
    if state.load_state == "not-found":
        return Finding(
            Status.FAIL, f"{unit} is not installed (install its package, then systemctl enable --now {unit})"
        )
    if state.load_state == "masked" or state.unit_file_state == "masked":
        return Finding(Status.FAIL, f"{unit} is masked: systemctl unmask {unit} && {start}")
    if active in RUNNING:
        return None
    if active == "activating":
        if sub == "auto-restart":
            return Finding(Status.FAIL, f"{unit} keeps failing and restarting ({state.result}): {logs}")
        return Finding(Status.WARN, f"{unit} is starting ({sub})")
    if active == "failed":
        return Finding(Status.FAIL, f"{unit} failed ({state.result}): {logs}; systemctl restart {unit}")
    if active in ("inactive", "deactivating"):
        enable = f"systemctl enable --now {unit}" if state.unit_file_state == "disabled" else start
        return Finding(Status.FAIL, f"{unit} is not running ({active}): {enable}")
    return Finding(Status.UNKNOWN, f"{unit}: state {active!r}/{sub!r} not understood")


def _module_demands(
    seen: ServicesObservation, settings: Settings, nvidia: bool, not_needed: dict[str, str]
) -> list[tuple[str, Status]]:
    out: list[tuple[str, Status]] = []
    if settings.peermem == "required":
        out.append((PEERMEM, Status.FAIL))
    elif settings.peermem == "auto" and nvidia:
        if seen.rdma_devices is None:
            out.append((PEERMEM, Status.UNKNOWN))
        elif seen.rdma_devices:
            out.append((PEERMEM, Status.WARN))
        else:
            not_needed[PEERMEM] = "no RDMA device"
    out.extend((module_key(m), Status.FAIL) for m in settings.modules if module_key(m) != PEERMEM)
    return out


def _judge_module(seen: ServicesObservation, name: str, status: Status) -> Optional[Finding]:
    if status == Status.UNKNOWN:
        return Finding(Status.UNKNOWN, f"{name}: cannot tell whether RDMA devices are present")
    module = seen.module(name)
    if module is None or module.loaded is None:
        why = module.detail if module is not None else "not read"
        return Finding(Status.UNKNOWN, f"module {name}: cannot tell whether it is loaded ({why})")
    if module.loaded:
        return None
    if name == PEERMEM and status == Status.WARN:
        return Finding(Status.WARN, f"module {name} not loaded: GPUDirect RDMA only through DMA-BUF (modprobe {name})")
    return Finding(status, f"module {name} not loaded: modprobe {name}")
