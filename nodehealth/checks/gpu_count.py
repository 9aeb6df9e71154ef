"""The node has the GPUs it should: NVML's count against config, Slurm's Gres or the PCI bus."""

from __future__ import annotations

from typing import Any

from nodehealth.checks.base import CheckSettings, Context, expected_gpu_count, nvml_snapshot, result
from nodehealth.model import Action, CheckResult, Status
from nodehealth.observations import NvmlSnapshot, Observations, PciGpus
from nodehealth.observations.record import record

# The drain reason's code (``nh:<code>``, a published contract: never changes meaning) and what it says.
REASON = ("gpucount", "not the GPUs the node should have (config, Slurm's Gres or the PCI bus)")


@record
class Settings(CheckSettings):
    pass


def evaluate(obs: Observations, settings: Settings, ctx: Context) -> CheckResult:
    snap = nvml_snapshot(obs, ctx)
    if isinstance(snap, CheckResult):
        return snap
    expected, source = expected_gpu_count(obs, ctx)
    seen = snap.device_count if snap.device_count is not None else len(snap.gpus)
    details: dict[str, Any] = {"expected": expected, "expected_from": source, "nvml_count": seen}
    if source == "slurm gres" and any(g.mig_enabled for g in snap.gpus) and isinstance(obs.pci_gpus, PciGpus):
        # With MIG, Gres=gpu:N counts MIG devices, not GPUs: count physical GPUs on the bus.
        expected, source = len(obs.pci_gpus.bus_ids), f"pci ({obs.pci_gpus.source}; MIG enabled, Slurm counts slices)"
        details.update(expected=expected, expected_from=source)
    if expected is None:
        return result(
            ctx,
            Status.WARN,
            f"{seen} GPU(s) visible; expected count unknown "
            "(set [gpu] expected_count, or run under Slurm with Gres=gpu:N)",
            **details,
        )
    if seen < expected:
        missing = _missing_bus_ids(obs, snap)
        where = f" (not visible: {', '.join(missing)})" if missing else ""
        return result(
            ctx,
            Status.FAIL,
            f"{seen} of {expected} GPUs visible to NVML{where}; expected from {source}",
            Action.REBOOT,
            missing_pci=missing,
            **details,
        )
    if seen > expected:
        return result(ctx, Status.WARN, f"{seen} GPUs visible, {expected} expected from {source}", **details)
    return result(ctx, Status.OK, f"{seen} GPU(s), as expected from {source}", **details)


def _missing_bus_ids(obs: Observations, snap: NvmlSnapshot) -> list[str]:
    if not isinstance(obs.pci_gpus, PciGpus):
        return []
    seen = {(g.pci_bus_id or "").lower() for g in snap.gpus}
    return [b for b in obs.pci_gpus.bus_ids if b.lower() not in seen]
