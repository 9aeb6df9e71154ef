"""A validated scenario as the fake ``libnvidia-ml.so.1`` reads it: the line-oriented spec (docs/fake-nvml.md).

``compile_spec`` writes the node (driver, GPUs, faults) one line per fact; ``nodehealth_sim.nvml.loader``
puts it in ``NODEHEALTH_FAKE_NVML_SPEC`` for the library of the scenario's branch.
"""

from __future__ import annotations

from nodehealth_sim.nvml import (
    FABRIC_STATES,
    FIELD_CALLS,
    NVML_STATES,
    RECOVERY_ACTIONS,
    THROTTLE_BITS,
    Scenario,
    SimGpu,
)


def nvml_bus_id(bus: str) -> str:
    """sysfs "0000:18:00.0" as NVML spells busId: "00000000:18:00.0" (8 hex digits of domain)."""
    domain, _, rest = bus.partition(":")
    return f"{domain.rjust(8, '0')}:{rest}".upper()


def compile_spec(scenario: Scenario) -> str:
    """The scenario as the fake libnvidia-ml.so.1 reads it (docs/fake-nvml.md)."""
    lines = [
        "version 1",
        f"driver_version {scenario.driver_version}",
        f"cuda_driver_version {scenario.cuda_driver_version}",
    ]
    code = NVML_STATES[scenario.nvml]
    if code is not None:
        lines.append(f"init_error {code}")
    visible = scenario.visible
    lines.append(f"gpus {len(visible)}")
    for index, gpu in enumerate(visible):
        lines.extend(f"gpu {index} {line}" for line in _gpu_lines(gpu))
    for call, where, err_code in scenario.errors:
        lines.append(f"error {_fault_call(call)} {'*' if where is None else where} {err_code}")
    for call, where in scenario.hangs:
        lines.append(f"hang {_fault_call(call)} {'*' if where is None else where}")
    if scenario.call_delay_s:
        lines.append(f"delay * * {int(scenario.call_delay_s * 1e6)}")
    for fid, where, err_code in scenario.field_errors:
        lines.append(f"field_error {fid} {'*' if where is None else where} {err_code}")
    for call, where, seconds in scenario.slow:
        name = call if call == "*" else _fault_call(call)
        lines.append(f"delay {name} {'*' if where is None else where} {int(seconds * 1e6)}")
    return "\n".join(lines) + "\n"


def _fault_call(call: str) -> str:
    return "nvmlDeviceGetFieldValues" if call in FIELD_CALLS else call


def _gpu_lines(gpu: SimGpu) -> list[str]:
    v = gpu.values
    gone = {FIELD_CALLS[c] for c in gpu.unsupported if c in FIELD_CALLS}
    if "nvmlDeviceGetGpuFabricInfo" in gpu.unsupported or "nvmlDeviceGetGpuFabricInfoV" in gpu.unsupported:
        gone.add("fabric")
    out = [f"name {v['name']}", f"uuid {v['uuid']}", f"pci_bus_id {nvml_bus_id(v['pci_bus_id'])}"]
    for key, spec_key in (
        ("temperature_c", "temperature_c"),
        ("slowdown_c", "slowdown_c"),
        ("shutdown_c", "shutdown_c"),
        ("gpu_max_c", "gpu_max_c"),
        ("mem_max_c", "mem_max_c"),
        ("memory_temp_c", "memory_temp_c"),
    ):
        if v.get(key) is not None:
            out.append(f"{spec_key} {int(v[key])}")
    out += [
        f"power_mw {int(round(v['power_w'] * 1000))}",
        f"power_limit_mw {int(round(v['power_limit_w'] * 1000))}",
        # nvidia-smi's "Default Power Limit": the enforced one unless the scenario lowers the latter
        f"power_default_mw {int(round(v.get('power_default_limit_w', v['power_limit_w']) * 1000))}",
        f"util_gpu {v['utilization_gpu_pct']}",
        f"util_memory {v['utilization_memory_pct']}",
        f"memory_total {v['memory_total_mib'] << 20}",
        f"memory_used {v['memory_used_mib'] << 20}",
        f"ecc_current {int(v['ecc_enabled'])}",
        f"ecc_pending {int(v['ecc_pending_enabled'])}",
    ]
    if "ecc" not in gone:
        e = v["ecc"]
        out += [
            f"ecc_vol_corrected {e.get('volatile_corrected', 0)}",
            f"ecc_vol_uncorrected {e.get('volatile_uncorrected', 0)}",
            f"ecc_agg_corrected {e.get('aggregate_corrected', 0)}",
            f"ecc_agg_uncorrected {e.get('aggregate_uncorrected', 0)}",
        ]
    if "retired_pages" not in gone:
        r = v["retired_pages"]
        out += [
            f"retired_sbe {r.get('sbe', 0)}",
            f"retired_dbe {r.get('dbe', 0)}",
            f"retired_pending {int(bool(r.get('pending')))}",
        ]
    if "remapped_rows" not in gone:
        m = v["remapped_rows"]
        out += [
            f"remap_corrected {m.get('correctable', 0)}",
            f"remap_uncorrected {m.get('uncorrectable', 0)}",
            f"remap_pending {int(bool(m.get('pending')))}",
            f"remap_failure {int(bool(m.get('failure')))}",
        ]
    p = v["pcie"]
    out += [
        f"pcie_gen {p['gen']}",
        f"pcie_max_gen {p['max_gen']}",
        f"pcie_width {p['width']}",
        f"pcie_max_width {p['max_width']}",
    ]
    nv = v["nvlink"]
    links = int(nv.get("links", 0))
    if links and "nvlink" not in gone:
        down = [n for n in nv.get("down", []) if 0 <= n < links]
        out += [
            f"nvlink_links {links}",
            f"nvlink_down {','.join(str(n) for n in down) or '-'}",
            f"nvlink_counters {int(bool(nv.get('counters', True)))}",
        ]
        per_link = {e["link"]: e for e in nv.get("errors", [])}
        for link in range(links):
            e = per_link.get(link, {})
            counters = [int(e.get(k, nv.get(k, 0))) for k in ("replay", "recovery", "crc_flit", "crc_data")]
            if any(counters):
                out.append(f"nvlink {link} {' '.join(str(c) for c in counters)}")
    if "fabric" not in gone:
        f = v["fabric"]
        out += [f"fabric_state {FABRIC_STATES[f.get('state', 'completed')]}", f"fabric_status {f.get('status', 0)}"]
        if f.get("health_mask") is not None:
            out.append(f"fabric_health_mask {f['health_mask']}")
        if f.get("health_summary") is not None:
            out.append(f"fabric_health_summary {f['health_summary']}")
    bits = 0
    for name in v.get("throttle_reasons", []):
        bits |= THROTTLE_BITS[name]
    out += [
        f"throttle {bits:#x}",
        f"persistence {int(bool(v['persistence_mode']))}",
        f"recovery_action {RECOVERY_ACTIONS[v['recovery_action']]}",
        f"mig_current {int(bool(v.get('mig_mode')))}",
        f"mig_pending {int(bool(v.get('mig_mode')))}",
    ]
    out += [f"throttle_{reason}_ns {int(ns)}" for reason, ns in sorted(v.get("throttle_time_ns", {}).items())]
    procs = ",".join(f"{int(pr['pid'])}:{int(pr.get('used_memory_mib', 0)) << 20}" for pr in v["processes"])
    out.append(f"processes {procs or '-'}")
    if v.get("init_ms"):
        out.append(f"init_ms {int(v['init_ms'])}")
    for call in sorted(gpu.unsupported - set(FIELD_CALLS)):
        out.append(f"unsupported {call}")
    return out
