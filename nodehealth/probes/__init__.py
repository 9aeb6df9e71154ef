"""The only code that touches hardware and the OS.

``PROBES`` maps a probe name (what a check ``needs``) to the function that gathers it. A
probe returns frozen observations from ``nodehealth.observations`` or a ``ProbeError``; it
honours the deadline it is given. Modules are imported inside the functions, so a face pays
only for the probes it runs. Vendor and OS errors are translated here, at the boundary.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional

from nodehealth.observations import ProbeError

if TYPE_CHECKING:
    from nodehealth.config import Config


class ProbeSetupError(Exception):
    """The probes cannot be set up as configured (e.g. a bad scenario file): a usage error."""


@dataclass(frozen=True)
class ProbeContext:
    config: Config
    node: str


@dataclass(frozen=True)
class Probe:
    """``gather(ctx, timeout_s)`` returns the observation, or, for a probe with ``forks``,
    an object whose ``collect()`` returns it; forking probes are started before any thread."""

    name: str
    gather: Callable[[ProbeContext, float], Any]
    forks: bool = False


@functools.lru_cache(maxsize=8)
def _scenario(path: str) -> Any:
    from nodehealth.probes import simnvml

    try:
        return simnvml.parse(path)
    except simnvml.ScenarioError as exc:
        raise ProbeSetupError(str(exc)) from None


def validate(config: Config) -> None:
    """Raise ProbeSetupError for a configuration the probes cannot run with."""
    if config.nvml.simulate:
        _scenario(config.nvml.simulate)


def _nvml(ctx: ProbeContext, timeout_s: float) -> Any:
    from nodehealth.probes import nvml

    simulate = ctx.config.nvml.simulate
    if simulate:
        from nodehealth.probes import simnvml

        module = simnvml.module_for(_scenario(simulate))
    else:
        try:
            module = nvml.load_module()
        except nvml.NvmlUnavailable as exc:
            return ProbeError("nvml", exc.kind, str(exc))
    return nvml.start(module, timeout_s, simulated=bool(simulate))


def _pci_gpus(ctx: ProbeContext, timeout_s: float) -> Any:
    if ctx.config.nvml.simulate:
        from nodehealth.observations import PciGpus

        return PciGpus(_scenario(ctx.config.nvml.simulate).pci_bus_ids, "scenario")
    from nodehealth.probes import pci

    return pci.nvidia_gpus(ctx.config.paths.sysfs_root)


def _slurm_node(ctx: ProbeContext, timeout_s: float) -> Any:
    if ctx.config.gpu.expected_count != "auto":
        return ProbeError("slurm_node", "unavailable", "not needed: [gpu] expected_count is set")
    from nodehealth.probes import slurm

    return slurm.show_node(ctx.config.slurm.scontrol, ctx.node, min(timeout_s, ctx.config.slurm.timeout_s))


PROBES: dict[str, Probe] = {
    "nvml": Probe("nvml", _nvml, forks=True),
    "pci_gpus": Probe("pci_gpus", _pci_gpus),
    "slurm_node": Probe("slurm_node", _slurm_node),
}


def lookup(name: str, table: Optional[dict[str, Probe]] = None) -> Probe:
    return (table or PROBES)[name]
