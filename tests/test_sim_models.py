"""The simulator's GPU models agree with the real nvidia-smi -q outputs they were taken from."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

import pytest
from nodehealth_sim import models
from nodehealth_sim.smi import parse_smi_q

FIXTURES = Path(__file__).parent / "fixtures" / "real-world" / "nvidia_smi"
SAMPLED = [(m, f) for m, files in models.SAMPLES.items() for f in files]
ALL_KEYS = {
    "name",
    "pci_device_id",
    "architecture",
    "cc",
    "memory_total_mib",
    "power_limit_w",
    "power_w",
    "temperature_c",
    "shutdown_c",
    "slowdown_c",
    "gpu_max_c",
    "mem_max_c",
    "memory_temp_c",
    "pcie",
    "nvlink",
    "retired_pages_supported",
    "remapped_rows_supported",
    "ecc_enabled",
    "persistence_mode",
    "fabric",
    "form_factor",
}
PROVENANCE_KINDS = ("sample", "sibling ", "derived", "driver-table", "nvml.h", "datasheet", "issue", "assumed")

# Where a published sample shows an operator's setting rather than the product's default: the
# model keeps a well-run node's setting (the H800 sample runs with ECC off, the product ships with it
# on; the Azure A100 40GB VM runs without nvidia-persistenced).
OPERATOR_SETTINGS = {("H800-SXM5-80GB", "ecc_enabled"), ("A100-SXM4-40GB", "persistence_mode")}


def gpus(name: str) -> List[Dict[str, Any]]:
    parsed = parse_smi_q((FIXTURES / name).read_text(encoding="utf-8"))
    assert parsed, f"{name}: no GPU section parsed"
    return parsed


def sample_says(model_id: str, key: str) -> bool:
    return models.PROVENANCE[model_id].get(key) == "sample"


# --- the samples themselves --------------------------------------------------------------------


def test_every_committed_sample_is_used_and_documented() -> None:
    files = {p.name for p in FIXTURES.glob("*.txt")}
    used = {f for _, f in SAMPLED}
    assert used <= files
    readme = (FIXTURES / "README.md").read_text(encoding="utf-8")
    for name in used:
        assert name in readme, f"{name} is not described in the fixtures README"


def test_parser_reads_a_full_gpu_section() -> None:
    g = gpus("hf_m4logs_jeanzay_8xA100_80GB_driver525.txt")
    assert len(g) == 8
    first = g[0]
    assert first["bus_id"] == "00000000:07:00.0"
    assert first["product_name"] == "NVIDIA A100-SXM4-80GB"
    assert first["pci_device_id"] == 0x20B210DE
    assert (first["shutdown_c"], first["slowdown_c"], first["gpu_max_c"], first["mem_max_c"]) == (92, 89, 85, 95)
    assert first["power_limit_w"] == 400.0 and first["memory_total_mib"] == 81920
    assert first["retired_pages_supported"] is False and first["remapped_rows_supported"] is True
    # GPU 00000000:8B:00.0 has one correctable remapped row in this sample
    assert [x["remapped_rows_correctable"] for x in g].count(1) == 1


def test_parser_reads_the_new_power_and_tlimit_layout() -> None:
    g = gpus("princeton_della_1xH100_SXM5_80GB_driver545.txt")[0]
    assert g["power_limit_w"] == 700.0 and g["power_w"] == 72.02
    assert g["shutdown_c"] is None and g["shutdown_tlimit_c"] == -8 and g["slowdown_tlimit_c"] == -2
    assert g["tlimit_c"] == 54 and g["fabric_state"] == "Completed"


def test_parser_reads_volta_retired_pages() -> None:
    old = gpus("princeton_traverse_V100_SXM2_32GB_driver418_excerpt.txt")[0]
    assert old["retired_pages_supported"] is True and old["retired_pages_sbe"] == 0
    assert old["retired_pages_pending"] is False and old["remapped_rows_supported"] is False
    assert old["pcie_width"] == 2 and old["pcie_max_width"] == 16
    new = gpus("thamada_gls_8xV100_SXM2_16GB_driver550.txt")[0]
    assert new["fields"]["Remapped Rows"] == "N/A" and new["remapped_rows_supported"] is False


# --- each model against its own samples ----------------------------------------------------------


@pytest.mark.parametrize("model_id,sample", SAMPLED)
def test_model_matches_its_sample(model_id: str, sample: str) -> None:
    m = models.MODELS[model_id]
    for g in gpus(sample):
        if sample_says(model_id, "name"):
            assert g["product_name"] == m["name"], sample
        else:
            # drivers before ~470 print the name without the "NVIDIA " prefix that NVML now returns
            assert m["name"] in (g["product_name"], "NVIDIA " + g["product_name"]), sample
        assert g["pci_device_id"] == m["pci_device_id"]
        assert g["memory_total_mib"] == m["memory_total_mib"]
        assert g["power_limit_w"] == m["power_limit_w"]
        assert g["pcie_max_gen"] == m["pcie"]["max_gen"] and g["pcie_max_width"] == m["pcie"]["max_width"]
        assert g["retired_pages_supported"] is m["retired_pages_supported"]
        assert g["remapped_rows_supported"] is m["remapped_rows_supported"]
        if (model_id, "ecc_enabled") not in OPERATOR_SETTINGS:
            assert g["ecc_enabled"] is m["ecc_enabled"]
        if (model_id, "persistence_mode") not in OPERATOR_SETTINGS:
            assert g["persistence_mode"] is m["persistence_mode"]
        for key in ("shutdown_c", "slowdown_c", "gpu_max_c", "mem_max_c"):
            if sample_says(model_id, key):
                assert g[key] == m[key], f"{sample} {g['bus_id']} {key}"
        if g["fabric_state"] == "Completed":
            assert m["fabric"] == "completed"
        elif g["fabric_state"] is None and sample_says(model_id, "fabric"):
            assert m["fabric"] == "not_supported"


@pytest.mark.parametrize("model_id", [m for m, files in models.SAMPLES.items() if files])
def test_idle_values_were_seen(model_id: str) -> None:
    m = models.MODELS[model_id]
    seen = [g for f in models.SAMPLES[model_id] for g in gpus(f)]
    for key in ("temperature_c", "power_w", "memory_temp_c"):
        assert m[key] in {g[key] for g in seen}, f"{model_id} {key}={m[key]} is not in its samples"


@pytest.mark.parametrize(
    "model_id",
    [
        m
        for m, p in models.PROVENANCE.items()
        if p.get("gpu_max_c") == "derived" or p.get("shutdown_c", "").startswith("sibling")
    ],
)
def test_hopper_thresholds_agree_with_tlimit_offsets(model_id: str) -> None:
    """Newer drivers print T.Limit offsets on Hopper: current + margin is the max operating temperature."""
    m = models.MODELS[model_id]
    seen = [g for f in models.SAMPLES[model_id] for g in gpus(f) if g["tlimit_c"] is not None]
    assert seen
    sums = [g["temperature_c"] + g["tlimit_c"] for g in seen]
    # readings are taken a moment apart: most GPUs give exactly gpu_max_c, none more than 1 above
    assert max(sums) <= m["gpu_max_c"] + 1
    assert sums.count(m["gpu_max_c"]) * 2 >= len(sums)
    for g in seen:
        if g["slowdown_tlimit_c"] is not None:
            assert m["slowdown_c"] - m["gpu_max_c"] == -g["slowdown_tlimit_c"]


def test_sibling_thresholds_exist_in_the_sibling_sample() -> None:
    for model_id, prov in models.PROVENANCE.items():
        for key, how in prov.items():
            if how.startswith("sibling ") and key in ("shutdown_c", "slowdown_c", "gpu_max_c", "mem_max_c"):
                sibling = how.split(" ", 1)[1]
                assert models.PROVENANCE[sibling][key] == "sample"
                assert models.MODELS[model_id][key] == models.MODELS[sibling][key], (model_id, key)


# --- every model ------------------------------------------------------------------------------


@pytest.mark.parametrize("model_id", sorted(models.MODELS))
def test_model_sanity(model_id: str) -> None:
    m = models.MODELS[model_id]
    assert set(m) <= ALL_KEYS, set(m) - ALL_KEYS
    for key in (
        "name",
        "pci_device_id",
        "architecture",
        "cc",
        "power_limit_w",
        "nvlink",
        "retired_pages_supported",
        "remapped_rows_supported",
        "ecc_enabled",
        "fabric",
        "form_factor",
    ):
        assert key in m, f"{model_id}: {key} missing"
    assert m["pci_device_id"] & 0xFFFF == 0x10DE  # NVIDIA's vendor ID in the low half
    assert m["architecture"] in (5, 7, 9, 10)
    major = int(m["cc"].split(".")[0])
    assert {5: 7, 7: 8, 9: 9, 10: 10}[m["architecture"]] == major
    # Ampere replaced page retirement with row remapping
    assert m["retired_pages_supported"] is (m["architecture"] < 7)
    assert m["remapped_rows_supported"] is (m["architecture"] >= 7)
    assert m["nvlink"]["counters"] is (m["architecture"] < 10)
    assert m["nvlink"]["links"] > 0
    assert m["form_factor"] in ("sxm", "pcie", "nvl", "superchip")
    assert m["fabric"] in ("completed", "not_supported")
    if m["form_factor"] in ("pcie", "nvl") or m["architecture"] < 9:
        assert m["fabric"] == "not_supported"  # no NVSwitch, or GPU fabric info predates the GPU (Hopper+)
    if "shutdown_c" in m:
        assert m["gpu_max_c"] < m["slowdown_c"] < m["shutdown_c"]
        assert "mem_max_c" in m, "HBM parts report a memory max operating temperature"
        assert m["temperature_c"] < m["gpu_max_c"]
    if "power_w" in m:
        assert 0 < m["power_w"] < m["power_limit_w"]
    if "pcie" in m:
        p = m["pcie"]
        assert p["gen"] <= p["max_gen"] and p["width"] <= p["max_width"]
    assert model_id in models.SOURCES and models.SOURCES[model_id]
    assert model_id in models.SAMPLES


@pytest.mark.parametrize("model_id", sorted(models.MODELS))
def test_every_value_has_a_provenance(model_id: str) -> None:
    m = models.MODELS[model_id]
    prov = models.PROVENANCE[model_id]
    for key in m:
        assert key in prov, f"{model_id}: no provenance for {key}"
        assert prov[key].startswith(PROVENANCE_KINDS), prov[key]
    for key, how in prov.items():
        if how == "sample":
            assert models.SAMPLES[model_id], f"{model_id}: {key} marked sample, but the model has no sample"


def test_default_model() -> None:
    assert models.DEFAULT_MODEL == "H100-SXM5-80GB"
    assert models.DEFAULT_MODEL in models.MODELS
