"""Where each value of ``nodehealth_sim.models.MODELS`` comes from.

- ``SOURCES[model_id]``: the documents, as ``repository@commit:path`` or URL, and what they are.
- ``SAMPLES[model_id]``: the real ``nvidia-smi -q`` outputs committed under
  ``tests/fixtures/real-world/nvidia_smi/`` (their origins are in the README there);
  ``tests/test_sim_models.py`` checks every value marked ``sample`` against them.
- ``PROVENANCE[model_id][key]``: one of

  - ``sample``: read from the model's own ``nvidia-smi -q`` sample(s);
  - ``sibling <model_id>``: read from the sample of a closely related board (same die and memory,
    see the note in SOURCES), because the model's own samples do not print it;
  - ``derived``: computed from the model's own sample (the note in SOURCES says how);
  - ``driver-table``: NVIDIA's product-name/PCI-ID table in the open GPU kernel modules README;
  - ``nvml.h``: the NVML header (nvidia-nvml-dev 13.4.92 on PyPI);
  - ``datasheet``: an NVIDIA datasheet/product brief or a vendor spec page (URL in SOURCES);
  - ``issue``: output quoted in a public issue or pull request (URL in SOURCES);
  - ``assumed``: nothing published found; the value is the usual shipped state.

``tests/test_sim_models.py`` checks these tables against ``MODELS`` and the samples.
"""

from __future__ import annotations

from typing import Dict, List

_DRIVER_TABLE = (
    "NVIDIA/open-gpu-kernel-modules@df1c9a3de2be4b130f4fc7680f7198193d8ac6ad:README.md "
    "(595.45.04, 'Compatible GPUs' table: product name and PCI device ID)"
)
_NVML_H = (
    "nvml.h from PyPI nvidia-nvml-dev 13.4.92 (NVML_DEVICE_ARCH_*; NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY/RECOVERY/CRC: "
    "'This is unsupported for Blackwell+'; nvmlDeviceGetGpuFabricInfo: 'For Hopper or newer'; "
    "nvmlDeviceGetRemappedRows: 'For Ampere or newer')"
)
_CUDA_GPUS = "https://developer.nvidia.com/cuda-gpus (compute capability table)"
_HOPPER_TEMPS = (
    "Hopper thresholds: drivers >= 545 print only T.Limit offsets on Hopper (GPU Shutdown/Slowdown/Max Operating "
    "T.Limit Temp -8/-2/0 C), never the absolute values; the absolute 92/89/87 C and memory 95 C are those of the "
    "H800 (same GH100 SXM5 80 GB HBM3 board family) under driver 525. Checked against the H100 output: current "
    "temp + 'GPU T.Limit Temp' = 86-87 C (gpu_max) and slowdown = gpu_max + 2; the shutdown offset -8 would give "
    "95 C, not 92: the H800's absolute value is kept."
)
_NVLINK_PCIE = (
    "PCIe cards with NVLink bridges: NVML reports every link, down when no bridge is fitted: "
    "https://github.com/NVIDIA/NVSentinel/pull/1481 (A100 80GB PCIe, no bridge: all 12 links 'currently down'), "
    "https://github.com/NVIDIA/DCGM/issues/49 (A100, PCIe test fails on links 'currently down'), "
    "https://github.com/NVIDIA/DCGM/issues/198 (H100 NVL, device 2321: 18 links D, no NVSwitch)"
)

_FIXTURES = "tests/fixtures/real-world/nvidia_smi/"

SAMPLES: Dict[str, List[str]] = {
    "V100-SXM2-16GB": ["thamada_gls_8xV100_SXM2_16GB_driver550.txt"],
    "V100-SXM2-32GB": ["princeton_traverse_V100_SXM2_32GB_driver418_excerpt.txt"],
    "A100-SXM4-40GB": ["azhpc_diagnostics_8xA100_40GB_driver460.txt"],
    "A100-SXM4-80GB": ["hf_m4logs_jeanzay_8xA100_80GB_driver525.txt"],
    "A100-SXM4-80GB-500W": ["thamada_gls_4xA100_SXM4_80GB_500W_driver555.txt"],
    "A100-PCIE-40GB": [],
    "A100-PCIE-80GB": [],
    "H100-SXM5-80GB": ["princeton_della_1xH100_SXM5_80GB_driver545.txt", "thamada_gls_8xH100_SXM5_80GB_driver565.txt"],
    "H800-SXM5-80GB": ["llm_action_H800_SXM5_80GB_driver525_excerpt.txt"],
    "H100-PCIE-80GB": [],
    "H100-NVL-94GB": ["thamada_gls_2xH100_NVL_driver550.txt"],
    "H200-SXM-141GB": ["thamada_gls_1xH200_SXM_passthrough_driver550.txt"],
    "B200": [],
    "GB200": [],
}

_SAMPLE_KEYS = (
    "name",
    "pci_device_id",
    "memory_total_mib",
    "power_limit_w",
    "power_w",
    "temperature_c",
    "memory_temp_c",
    "pcie",
    "retired_pages_supported",
    "remapped_rows_supported",
    "ecc_enabled",
    "persistence_mode",
)
_SAMPLE_THRESHOLDS = ("shutdown_c", "slowdown_c", "gpu_max_c", "mem_max_c")


def _prov(common: Dict[str, str], **extra: str) -> Dict[str, str]:
    out = dict(common)
    out.update({k.replace("__", "."): v for k, v in extra.items()})
    return out


_IDENTITY = {"architecture": "nvml.h", "cc": "datasheet"}
_FROM_SAMPLE = {k: "sample" for k in _SAMPLE_KEYS + _SAMPLE_THRESHOLDS}
_HOPPER_SIBLING = {k: "sibling H800-SXM5-80GB" for k in _SAMPLE_THRESHOLDS}
# a model with samples: what they print, the form factor from the datasheet
_SAMPLED = {**_IDENTITY, **_FROM_SAMPLE, "form_factor": "datasheet"}
# a Hopper whose samples print T.Limit offsets: gpu_max_c and slowdown_c derived from them, the rest as the H800
_HOPPER_DERIVED = {**_SAMPLED, **_HOPPER_SIBLING, "gpu_max_c": "derived", "slowdown_c": "derived"}
# a model without a sample: name and ID from the driver table, the features from nvml.h, the settings assumed
_UNSAMPLED = {
    **_IDENTITY,
    "name": "driver-table",
    "pci_device_id": "driver-table",
    "power_limit_w": "datasheet",
    "nvlink": "issue",
    "retired_pages_supported": "nvml.h",
    "remapped_rows_supported": "nvml.h",
    "ecc_enabled": "assumed",
    "persistence_mode": "assumed",
    "fabric": "nvml.h",
    "form_factor": "datasheet",
}

PROVENANCE: Dict[str, Dict[str, str]] = {
    "V100-SXM2-16GB": _prov(_SAMPLED, nvlink="issue", fabric="nvml.h"),
    "V100-SXM2-32GB": _prov(_SAMPLED, nvlink="issue", fabric="nvml.h"),
    "A100-SXM4-40GB": _prov(_SAMPLED, name="driver-table", nvlink="issue", fabric="sample"),
    "A100-SXM4-80GB": _prov(_SAMPLED, nvlink="issue", fabric="sample"),
    "A100-SXM4-80GB-500W": _prov(_SAMPLED, nvlink="issue", fabric="sample"),
    "A100-PCIE-40GB": _prov(_UNSAMPLED, pcie="datasheet"),
    "A100-PCIE-80GB": _prov(_UNSAMPLED, pcie="datasheet"),
    "H100-SXM5-80GB": _prov({**_SAMPLED, **_HOPPER_SIBLING}, nvlink="issue", fabric="sample"),
    "H800-SXM5-80GB": _prov(_SAMPLED, nvlink="sample", fabric="sample"),
    "H100-PCIE-80GB": _prov(
        _UNSAMPLED,
        memory_total_mib="sibling H100-SXM5-80GB",
        pcie="datasheet",
        nvlink="sibling H100-NVL-94GB",
        fabric="issue",
    ),
    "H100-NVL-94GB": _prov(_HOPPER_DERIVED, nvlink="issue", fabric="sample"),
    "H200-SXM-141GB": _prov(_HOPPER_DERIVED, nvlink="datasheet", fabric="sample"),
    "B200": _prov(_UNSAMPLED, nvlink__counters="nvml.h", fabric="issue"),
    "GB200": _prov(_UNSAMPLED, nvlink__counters="nvml.h", fabric="issue"),
}

SOURCES: Dict[str, str] = {
    "V100-SXM2-16GB": (
        f"sample: thamada/gls@e20f22d0eec076b6eeed628fdb1312d84a6fb663:gls/V100_x8_smi.py (out_a: real 'nvidia-smi -a' "
        f"of 8x Tesla V100-SXM2-16GB, driver 550.127.05) -> {_FIXTURES}thamada_gls_8xV100_SXM2_16GB_driver550.txt; "
        "nvlink 6 links: https://github.com/Azure/azhpc-diagnostics/issues/73 (nvidia-smi nvlink -s of a "
        f"V100-SXM2: Link 0-5); fabric: {_NVML_H}; cc: {_CUDA_GPUS}"
    ),
    "V100-SXM2-32GB": (
        "sample: PrincetonUniversity/gpu_programming_intro@30eec9bd3e0277b7c9ba8f683c1cced9946df200:"
        "01_what_is_a_gpu/README.md (Traverse, IBM POWER9, 'nvidia-smi -q' of the first of 4 GPUs, driver 418.67; "
        f"idle link width x2 of x16) -> {_FIXTURES}princeton_traverse_V100_SXM2_32GB_driver418_excerpt.txt; "
        f"nvlink: https://github.com/Azure/azhpc-diagnostics/issues/73 (Tesla V100-SXM2-32GB, Link 0-5); "
        f"cc: {_CUDA_GPUS}"
    ),
    "A100-SXM4-40GB": (
        "sample: Azure/azhpc-diagnostics@8543969737acaea2d22219952d6d87ab43c3c090:Linux/test/samples/nvidia-smi-q.out "
        f"(Azure ND A100 v4, 8 GPUs, driver 460.32.03) -> {_FIXTURES}azhpc_diagnostics_8xA100_40GB_driver460.txt; "
        f"name with 'NVIDIA ' prefix: {_DRIVER_TABLE}; nvlink 12: https://github.com/NVIDIA/DCGM/issues/149 "
        f"(DGX A100 topology NV12); fabric: {_NVML_H} and the samples (Fabric State N/A); cc: {_CUDA_GPUS}"
    ),
    "A100-SXM4-80GB": (
        "sample: huggingface/m4-logs@6034608cda9b5c55f55a0559bcffabc7880c1dec:tr_141-hanging/"
        "tr_141_cm409xPMD01_scale_leap_of_faith_v5_num_workers_0-try3/gpu.query.all.txt (Jean Zay, 8 GPUs, "
        f"driver 525.60.13) -> {_FIXTURES}hf_m4logs_jeanzay_8xA100_80GB_driver525.txt; nvlink 12: "
        f"https://github.com/NVIDIA/DCGM/issues/149; fabric: {_NVML_H}; cc: {_CUDA_GPUS}"
    ),
    "A100-SXM4-80GB-500W": (
        "sample: thamada/gls@e20f22d0eec076b6eeed628fdb1312d84a6fb663:gls/A100SXMx4_smi.py (out_a: real "
        f"'nvidia-smi -a' of 4x A100-SXM4-80GB at 500 W, driver 555.42.02) -> "
        f"{_FIXTURES}thamada_gls_4xA100_SXM4_80GB_500W_driver555.txt; nvlink 12: "
        f"https://github.com/NVIDIA/DCGM/issues/149; fabric: {_NVML_H}; cc: {_CUDA_GPUS}"
    ),
    "A100-PCIE-40GB": (
        f"no nvidia-smi -q sample found. name, device ID 20F1: {_DRIVER_TABLE} (the 2023 pci.ids also lists 20B1 "
        "'A100 PCIe 40GB'); datasheet: https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
        "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf (250 W, PCIe Gen4 x16, 40 GB HBM2); "
        f"{_NVLINK_PCIE}; {_NVML_H}. "
        "Not sourced: memory_total_mib, idle temperature/power, every temperature threshold."
    ),
    "A100-PCIE-80GB": (
        f"no full nvidia-smi -q sample found (the product name 'NVIDIA A100 80GB PCIe' is also in a published "
        f"'nvidia-smi -q' head, driver 535.104.12). name, device ID 20B5: {_DRIVER_TABLE}; datasheet: "
        "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
        "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf (300 W, PCIe Gen4 x16, 80 GB HBM2e); "
        f"{_NVLINK_PCIE}; {_NVML_H}. "
        "Not sourced: memory_total_mib, idle temperature/power, every temperature threshold."
    ),
    "H100-SXM5-80GB": (
        "samples: PrincetonUniversity/gpu_programming_intro@6267fb95399e34acbda1525684cead416d8c2773:"
        "01_what_is_a_gpu/pli.md (della, 1 GPU of an HGX H100, driver 545.23.08) -> "
        f"{_FIXTURES}princeton_della_1xH100_SXM5_80GB_driver545.txt; "
        "thamada/gls@e20f22d0eec076b6eeed628fdb1312d84a6fb663:gls/H100SXMx8_smi.py "
        "(out_a: real 'nvidia-smi -a' of 8 GPUs, driver 565.57.01) -> "
        f"{_FIXTURES}thamada_gls_8xH100_SXM5_80GB_driver565.txt. {_HOPPER_TEMPS} nvlink 18: "
        "https://github.com/bottlerocket-os/bottlerocket/pull/4418 (nvidia-smi nvlink --status, Link 0-17) and the "
        f"della topology NV18 in pli.md; cc: {_CUDA_GPUS}"
    ),
    "H800-SXM5-80GB": (
        "sample: liguodongiot/llm-action@923449432b6bd00674efd5965fdb70365a88ce5e:docs/llm-base/nvidia-smi.md "
        "('nvidia-smi -q -i 0' of an 8x H800 node, driver 525.105.17; its nvlink --status shows Link 0-7 and the "
        f"topology NV8) -> {_FIXTURES}llm_action_H800_SXM5_80GB_driver525_excerpt.txt; cc: {_CUDA_GPUS}"
    ),
    "H100-PCIE-80GB": (
        f"no nvidia-smi -q sample found. name, device ID 2331: {_DRIVER_TABLE}; product brief PB-11133-001_v02 "
        "(NVIDIA H100 PCIe GPU, Nov 2022, "
        "https://manuals.plus/m/d4b5dc21484df3ba8fbe84918338461cc074a3fcebcc13423eadc2b10ac3bda4): "
        "350 W max TDP, PCI Express Gen5 dual-slot card, 80 GB; memory_total_mib as the H100 SXM5 (81559 MiB, "
        "the value published nvidia-smi --query-gpu outputs of H100 PCIe also show); "
        "nvlink 18 as the H100 NVL (same GH100, "
        f"bridge-capable; {_NVLINK_PCIE}); fabric: https://github.com/leptonai/gpud/pull/1147 (H100 PCIe fabric state "
        "'Not Supported'). Not sourced: idle temperature/power, every temperature threshold."
    ),
    "H100-NVL-94GB": (
        "sample: thamada/gls@e20f22d0eec076b6eeed628fdb1312d84a6fb663:gls/H100NVLx2_smi.py (out_a: real "
        f"'nvidia-smi -a' of 2x H100 NVL, driver 550.54.14) -> {_FIXTURES}thamada_gls_2xH100_NVL_driver550.txt. "
        "gpu_max_c 87 derived: current temp + 'GPU T.Limit Temp' = 86/87 C; slowdown_c 89 derived: gpu_max_c - "
        f"'GPU Slowdown T.Limit Temp' (-2); shutdown_c and mem_max_c as the H800 ({_HOPPER_TEMPS}) "
        f"{_NVLINK_PCIE}; cc: {_CUDA_GPUS}"
    ),
    "H200-SXM-141GB": (
        "sample: thamada/gls@e20f22d0eec076b6eeed628fdb1312d84a6fb663:gls/H200_smi.py (out_a: real 'nvidia-smi -a' "
        "of one H200 SXM passed through to a VM, driver 550.90.12; fabric Completed even there) -> "
        f"{_FIXTURES}thamada_gls_1xH200_SXM_passthrough_driver550.txt. gpu_max_c/slowdown_c derived as for the "
        f"H100 NVL (current 28 + T.Limit 59 = 87; slowdown offset -2); shutdown_c and mem_max_c as the H800 "
        f"({_HOPPER_TEMPS}) nvlink 18: datasheet https://www.nvidia.com/en-us/data-center/h200/ (NVLink 900 GB/s "
        f"= 18 NVLink4 links of 50 GB/s); cc: {_CUDA_GPUS}"
    ),
    "B200": (
        f"no nvidia-smi -q sample found. name, device ID 2901: {_DRIVER_TABLE}; 1000 W: "
        "https://docs.vultr.com/inference-cookbook/cuda/getting-started/hardware-overview (HGX B200: TDP 1000W, "
        "topology NV18 on every pair) and https://glennklockwood.com/garden/processors/B200 ('1000 W maximum'); "
        f"nvlink 18: same topology and https://github.com/vllm-project/vllm/issues/16336 (B200 node, NV18); "
        "fabric: https://github.com/siderolabs/extensions/pull/717 (quotes the Fabric Manager user guide: on "
        "DGX/HGX B200 the GPUs register with the NVLink fabric, 'Completed' once registered); "
        f"counters: {_NVML_H}; cc 10.0 (sm_100): {_CUDA_GPUS}. Not sourced: memory_total_mib (spec pages say "
        "179-192 GB, no MiB figure from nvidia-smi), PCIe link, idle temperature/power, every temperature threshold."
    ),
    "GB200": (
        f"no nvidia-smi -q sample found. name, device ID 2941: {_DRIVER_TABLE}; 1200 W: "
        "https://glennklockwood.com/garden/processors/B200 (GB200 variant 'configured to 1,200 W'); nvlink 18: "
        "https://github.com/NVIDIA/k8s-test-infra/issues/371 (nvidia-smi nvlink -s of GB200: Link 0-17); fabric "
        "Completed: https://github.com/leptonai/gpud/pull/1106 (GB200 fabric state Completed/Success); counters: "
        f"{_NVML_H}; cc: {_CUDA_GPUS}. Not sourced: memory_total_mib, PCIe link (GPU attached to Grace over "
        "NVLink-C2C), idle temperature/power, every temperature threshold."
    ),
}
