"""Per-GPU-model defaults for the simulator, taken from published data.

``MODELS[model_id]`` holds a model's scenario values (the ``[[gpu]]`` keys of docs/simulation.md,
plus the model's identity: ``pci_device_id``, ``architecture``, ``cc``, ``form_factor``). A key a
model lacks is one no source gave; the simulator then keeps its own default.

Where each value comes from is ``nodehealth_sim.model_sources``'s: ``SOURCES``, ``SAMPLES`` and
``PROVENANCE`` (importable from here too). docs/gpu-models.md is the same table for people.
"""

from __future__ import annotations

from typing import Any, Dict

from nodehealth_sim.model_sources import PROVENANCE as PROVENANCE
from nodehealth_sim.model_sources import SAMPLES as SAMPLES
from nodehealth_sim.model_sources import SOURCES as SOURCES

DEFAULT_MODEL = "H100-SXM5-80GB"

# NVML_DEVICE_ARCH_* (nvml.h: VOLTA 5, TURING 6, AMPERE 7, ADA 8, HOPPER 9, BLACKWELL 10)
ARCH_VOLTA = 5
ARCH_AMPERE = 7
ARCH_HOPPER = 9
ARCH_BLACKWELL = 10


def _model(base: Dict[str, Any], name: str, pci_device_id: int, **values: Any) -> Dict[str, Any]:
    """A model's identity and ``values`` over ``base``; each model has its own ``pcie`` and ``nvlink`` tables."""
    out = {**base, "name": name, "pci_device_id": pci_device_id, **values}
    return {key: dict(value) if isinstance(value, dict) else value for key, value in out.items()}


def _sampled(memory_total_mib: int, power_w: float, temperature_c: int, memory_temp_c: int) -> Dict[str, Any]:
    """What a model's nvidia-smi -q sample gives beyond its identity: memory, idle power and temperatures."""
    return {
        "memory_total_mib": memory_total_mib,
        "power_w": power_w,
        "temperature_c": temperature_c,
        "memory_temp_c": memory_temp_c,
    }


def _pcie_x16(gen: int) -> Dict[str, int]:
    return {"gen": gen, "max_gen": gen, "width": 16, "max_width": 16}


def _architecture(architecture: int, cc: str, nvlinks: int, **values: Any) -> Dict[str, Any]:
    """What the boards of one architecture share, with ``values`` over it."""
    return {
        "architecture": architecture,
        "cc": cc,
        # NVLink error counters are unsupported for Blackwell+ (nvml.h)
        "nvlink": {"links": nvlinks, "counters": architecture < ARCH_BLACKWELL},
        # Ampere replaced page retirement with row remapping (nvml.h)
        "retired_pages_supported": architecture < ARCH_AMPERE,
        "remapped_rows_supported": architecture >= ARCH_AMPERE,
        # what every board ships with: a scenario of a node run otherwise sets its own
        "ecc_enabled": True,
        "persistence_mode": True,
        # GPU fabric info is Hopper+ (nvml.h), and on NVSwitch boards only: Ampere's HGX prints N/A too
        "fabric": "not_supported",
        **values,
    }


_VOLTA_SXM2 = _architecture(
    ARCH_VOLTA,
    "7.0",
    6,
    power_limit_w=300.0,
    **{"shutdown_c": 90, "slowdown_c": 87, "gpu_max_c": 83, "mem_max_c": 85},
    pcie=_pcie_x16(3),
    form_factor="sxm",
)
_AMPERE = _architecture(ARCH_AMPERE, "8.0", 12, pcie=_pcie_x16(4))
_AMPERE_SXM4 = {
    **_AMPERE,
    "power_limit_w": 400.0,
    **{"shutdown_c": 92, "slowdown_c": 89, "gpu_max_c": 85, "mem_max_c": 95},
    "form_factor": "sxm",
}
_HOPPER = _architecture(ARCH_HOPPER, "9.0", 18, memory_total_mib=81559, pcie=_pcie_x16(5))
# the H800's absolute thresholds under driver 525 (model_sources._HOPPER_TEMPS)
_HOPPER_THRESHOLDS = {"shutdown_c": 92, "slowdown_c": 89, "gpu_max_c": 87, "mem_max_c": 95}
_HOPPER_SXM5 = {**_HOPPER, **_HOPPER_THRESHOLDS, "power_limit_w": 700.0, "fabric": "completed", "form_factor": "sxm"}
_BLACKWELL = _architecture(ARCH_BLACKWELL, "10.0", 18, fabric="completed")

MODELS: Dict[str, Dict[str, Any]] = {
    # model id: _model(base, name, PCI device ID, **_sampled(MiB, idle W, idle C, idle memory C), other values)
    "V100-SXM2-16GB": _model(_VOLTA_SXM2, "Tesla V100-SXM2-16GB", 0x1DB110DE, **_sampled(16384, 44.5, 37, 33)),
    # the sample (POWER9 with NVLink to the CPU) idles at x2 of x16
    "V100-SXM2-32GB": _model(_VOLTA_SXM2, "Tesla V100-SXM2-32GB", 0x1DB510DE, **_sampled(32480, 39.78, 38, 34)),
    # Driver 460 names it "A100-SXM4-40GB"; later drivers prefix "NVIDIA " (driver table). The Azure
    # sample runs without persistence mode, a host setting (nvidia-persistenced): the model's default
    # is a well-run node's, persistence on (a scenario of that VM sets it off).
    "A100-SXM4-40GB": _model(_AMPERE_SXM4, "NVIDIA A100-SXM4-40GB", 0x20B010DE, **_sampled(40536, 55.63, 41, 40)),
    "A100-SXM4-80GB": _model(_AMPERE_SXM4, "NVIDIA A100-SXM4-80GB", 0x20B210DE, **_sampled(81920, 67.97, 28, 47)),
    # the 500 W board of HGX A100 80GB (same name and device ID as the 400 W one)
    "A100-SXM4-80GB-500W": _model(
        _AMPERE_SXM4, "NVIDIA A100-SXM4-80GB", 0x20B210DE, **_sampled(81920, 59.77, 25, 43), power_limit_w=500.0
    ),
    "A100-PCIE-40GB": _model(_AMPERE, "NVIDIA A100-PCIE-40GB", 0x20F110DE, power_limit_w=250.0, form_factor="pcie"),
    "A100-PCIE-80GB": _model(_AMPERE, "NVIDIA A100 80GB PCIe", 0x20B510DE, power_limit_w=300.0, form_factor="pcie"),
    "H100-SXM5-80GB": _model(_HOPPER_SXM5, "NVIDIA H100 80GB HBM3", 0x233010DE, **_sampled(81559, 72.02, 33, 41)),
    # The published node runs with ECC disabled, an operator's choice (data-center GPUs ship with
    # ECC on): the model's default is on, so a healthy H800 scenario is healthy.
    "H800-SXM5-80GB": _model(
        _HOPPER_SXM5, "NVIDIA H800", 0x232410DE, **_sampled(81559, 74.71, 35, 44), nvlink={"links": 8, "counters": True}
    ),
    "H100-PCIE-80GB": _model(_HOPPER, "NVIDIA H100 PCIe", 0x233110DE, power_limit_w=350.0, form_factor="pcie"),
    # default (enforced) limit 310 W of a 200-400 W range in the sample
    "H100-NVL-94GB": _model(
        {**_HOPPER, **_HOPPER_THRESHOLDS},
        "NVIDIA H100 NVL",
        0x232110DE,
        **_sampled(95830, 61.62, 32, 40),
        power_limit_w=310.0,
        form_factor="nvl",
    ),
    "H200-SXM-141GB": _model(_HOPPER_SXM5, "NVIDIA H200", 0x233510DE, **_sampled(143771, 74.58, 28, 25)),
    "B200": _model(_BLACKWELL, "NVIDIA B200", 0x290110DE, power_limit_w=1000.0, form_factor="sxm"),
    "GB200": _model(_BLACKWELL, "NVIDIA GB200", 0x294110DE, power_limit_w=1200.0, form_factor="superchip"),
}
