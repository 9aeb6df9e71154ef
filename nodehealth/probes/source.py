"""Where the NVML probe's library comes from: the real driver, or a source injected by name.

The probe reads through whatever module its source's ``loader`` returns (pynvml bound to a
``libnvidia-ml.so.1``) and never knows which one. Production uses the real driver: ``REAL``,
whose label is empty. ``[nvml] simulate = "<scenario>"`` asks the simulator for its source: the
``nodehealth-sim`` distribution (package ``nodehealth_sim``, ``./sim`` in the source tree), which
this module imports by name, so the product carries no import of it and runs without it. A
simulated run is visible in one place: the report's header (``Report.source`` = the label).
"""

from __future__ import annotations

import functools
import importlib
import os
from types import ModuleType
from typing import TYPE_CHECKING, Callable, Optional

from nodehealth.observations.record import record

if TYPE_CHECKING:
    from nodehealth.config.schema import Config

SIM_PACKAGE = "nodehealth_sim"
# Where the Debian package puts nodehealth: there the simulator is its sibling .deb, and pip into the
# distribution's Python is refused (PEP 668), so "pip install" would be the wrong advice.
DEB_SITE = "/usr/lib/python3/dist-packages"
PIP_SIM = "pip install nodehealth-sim (./sim in the source tree)"
DEB_SIM = "apt install nodehealth-sim (the nodehealth-sim .deb that make deb builds beside nodehealth's)"
# The scenarios the .deb and the RPM ship (packaging/debian/nodehealth.install, the spec's %files).
SHIPPED_SCENARIOS = "/usr/share/nodehealth/scenarios"


def install_sim(package_dir: Optional[str] = None) -> str:
    """How to install the simulator, in the words of how nodehealth itself was installed:
    ``package_dir`` is nodehealth's own directory (default: this installation's)."""
    here = package_dir or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return DEB_SIM if os.path.dirname(os.path.normpath(here)) == DEB_SITE else PIP_SIM


def needs_sim() -> str:
    """The usage error of ``--simulate`` without the simulator installed: what to install."""
    return f"--simulate needs the simulator: {install_sim()}"


class ProbeSetupError(Exception):
    """The probes cannot be set up as configured (e.g. a bad scenario file): a usage error."""


def _real_loader() -> ModuleType:
    from nodehealth.probes.nvml_lib import load_module

    return load_module()


@record
class NvmlSource:
    """The library the NVML probe reads through.

    ``label``: "" for the real driver, else what the report's header says (e.g.
    "simulated: /path/x.toml"). ``loader``: runs in the probe's child and returns the pynvml
    module bound to the library to use. ``pci_bus_ids``: the NVIDIA GPUs on this source's PCI
    bus; None to read them from sysfs (the real node).
    """

    label: str
    loader: Callable[[], ModuleType]
    pci_bus_ids: Optional[tuple[str, ...]] = None


REAL = NvmlSource(label="", loader=_real_loader)


def resolve(config: Config) -> NvmlSource:
    """The NVML source ``config`` asks for: ``REAL`` unless ``[nvml] simulate`` is set.

    ProbeSetupError when the simulator is not installed or its scenario does not validate.
    One answer per scenario path for the life of the process (the scenario is parsed once)."""
    path = config.nvml.simulate
    return _simulated(path) if path else REAL


def label(config: Config) -> str:
    """The report header's word on the NVML source: its label ("" for the real driver)."""
    try:
        return resolve(config).label
    except ProbeSetupError as exc:
        return f"simulated: {config.nvml.simulate} (not usable: {exc})"


@functools.lru_cache(maxsize=8)
def _simulated(path: str) -> NvmlSource:
    try:
        sim = importlib.import_module(SIM_PACKAGE)
    except ImportError:
        raise ProbeSetupError(needs_sim()) from None
    try:
        source = sim.nvml_source(path)
    except sim.ScenarioError as exc:
        raise ProbeSetupError(str(exc) + _shipped_hint(path)) from None
    if not isinstance(source, NvmlSource):
        raise ProbeSetupError(f"{SIM_PACKAGE}.nvml_source gave {type(source).__name__}, not an NvmlSource")
    return source


def _shipped_hint(path: str) -> str:
    """Where the packages' scenarios are, for a scenario path that names no file (a .deb user who
    followed a source tree's ``examples/scenarios/...``): the same name there when it exists."""
    shipped = SHIPPED_SCENARIOS
    if os.path.lexists(path) or not os.path.isdir(shipped):
        return ""
    same = os.path.join(shipped, os.path.basename(path))
    if os.path.isfile(same):
        return f" (the packages ship it: --simulate {same})"
    return f" (the packages' scenarios: {shipped}/*.toml)"


def forget() -> None:
    """Forget every simulated source resolved so far: a scenario file rewritten in place is read
    again (the tests switch a node's scenario so)."""
    _simulated.cache_clear()
