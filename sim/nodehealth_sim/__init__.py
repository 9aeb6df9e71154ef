"""Simulated GPUs for development and tests (docs/simulation.md): the ``nodehealth-sim`` distribution.

The product (``nodehealth``) never imports this package by a static import: ``nodehealth.probes.source``
imports it by name when ``[nvml] simulate`` is set and calls :func:`nvml_source`. The fake
``libnvidia-ml.so.1`` of every driver branch is compiled when the distribution is installed (``sim/setup.py``).
"""

from __future__ import annotations

from typing import Any

from nodehealth_sim.nvml import ScenarioError

__version__ = "0.2.0"
__all__ = ["ScenarioError", "nvml_source"]


def nvml_source(path: str) -> Any:
    """The NVML source of the scenario file ``path``: a ``nodehealth.probes.source.NvmlSource`` whose loader
    binds the real pynvml to the fake library of the scenario's driver branch, with the scenario's PCI bus
    ids and the label ``"simulated: <path>"``.

    ScenarioError (one line naming the file and the key) for a file that does not parse or validate, or when
    the library of its branch is not built."""
    from nodehealth_sim import nvml

    scenario = nvml.parse(path)
    nvml.check_built(scenario)
    from nodehealth.probes.source import NvmlSource  # the product's type, imported when asked for

    return NvmlSource(label=f"simulated: {path}", loader=nvml.loader(scenario), pci_bus_ids=scenario.pci_bus_ids)
