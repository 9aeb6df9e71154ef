"""NVLink: every link active, error counters under thresholds."""

from __future__ import annotations

import re
from typing import Any, Optional

from nodehealth.checks.base import CheckSettings, Context, field_error, judge_gpus, result, setting
from nodehealth.model import Action, CheckResult, Finding, Status
from nodehealth.observations import GpuObservation, NvmlSnapshot, Observations
from nodehealth.observations.record import record

# The drain reason's code (``nh:<code>``, a published contract: never changes meaning) and what it says.
REASON = ("nvlink", "NVLink links inactive or error counters over thresholds")


@record
class Settings(CheckSettings):
    expected_links: int = setting(
        0,
        "links each NVLink GPU should have active (H100 SXM: 18); 0 = every link NVML reports must be active",
        unit="links",
        min=0,
        max=64,
    )
    max_replay: int = setting(
        1000, "WARN above this many data-link replays on one link since the driver loaded", unit="errors", min=0
    )
    max_recovery: int = setting(
        100, "WARN above this many link recoveries on one link since the driver loaded", unit="errors", min=0
    )
    max_crc: int = setting(1000, "WARN above this many CRC (flit + data) errors on one link", unit="errors", min=0)


# NVIDIA names its PCIe boards by form factor: "A100-PCIE-40GB", "A100 80GB PCIe", "H100 PCIe", and the
# bridged PCIe pairs "H100 NVL", "H200 NVL" (the product table of NVIDIA/open-gpu-kernel-modules' README).
# NVML itself has no form-factor query in any nvml.h up to CUDA 13.3 (nvmlPlatformInfo's peerType is
# Blackwell rack systems only), so the product name is what tells a card with optional bridges.
_BRIDGE_OPTIONAL = re.compile(r"\bpcie\b|\bnvl\b", re.IGNORECASE)
# NVML_GPU_FABRIC_STATE_NOT_STARTED/IN_PROGRESS/COMPLETED: the GPU belongs to an NVSwitch fabric.
_FABRIC_MEMBER = (1, 2, 3)


def _all_down(snap: Any) -> bool:
    """Every GPU with NVLink hardware reports every link down."""
    if not isinstance(snap, NvmlSnapshot):
        return False
    linked = [g for g in snap.gpus if g.nvlinks]
    return bool(linked) and all(not link.active for g in linked for link in g.nvlinks or ())


def _unbridged(snap: Any) -> bool:
    """Every link of every GPU down on PCIe cards with no bridge fitted, and nothing says otherwise.

    A100 PCIe and H100 NVL have NVLink hardware, bridges are optional, and NVML reports the
    links of an unbridged card as inactive, not as "not supported" (NVIDIA DCGM issues #49 and
    #198; NVSentinel PR #1481). Only where every such GPU is a PCIe board by its name and none
    is a member of an NVSwitch fabric: an SXM/NVSwitch board (HGX, NVL72) has no optional
    bridge, and all its links down is a fault (gpud judges all-down on an NVLink system
    unhealthy, leptonai/gpud issue #1085). One link up anywhere means bridges are fitted.
    """
    if not _all_down(snap):
        return False
    linked = [g for g in snap.gpus if g.nvlinks]
    return all(
        g.name is not None and _BRIDGE_OPTIONAL.search(g.name) and g.fabric_state not in _FABRIC_MEMBER for g in linked
    )


def evaluate(obs: Observations, settings: Settings, ctx: Context) -> CheckResult:
    unbridged = not settings.expected_links and _unbridged(obs.nvml)
    # Every link of every GPU down on a board without optional bridges: the links did not train
    # (NVSwitch, baseboard, Fabric Manager); on an NVSwitch board GPUs and switches are reset
    # together, so the repair is a reboot, not one GPU's reset.
    untrained = not unbridged and not settings.expected_links and _all_down(obs.nvml)

    def judge(gpu: GpuObservation) -> Optional[list[Finding]]:
        err = field_error(gpu, "nvlink")
        if err is not None:
            return [err]
        if not gpu.nvlinks or unbridged:
            return None  # no NVLink, or NVLink hardware with nothing connected
        out: list[Finding] = []
        down = [link.link for link in gpu.nvlinks if not link.active]
        active = len(gpu.nvlinks) - len(down)
        if settings.expected_links and active < settings.expected_links:
            out.append(
                Finding(
                    Status.FAIL,
                    f"GPU {gpu.index}: {active} of {settings.expected_links} NVLinks active (down: {_links(down)})",
                    Action.RESET_GPU,
                    gpu.index,
                )
            )
        elif untrained:
            out.append(
                Finding(
                    Status.FAIL,
                    f"GPU {gpu.index}: every NVLink of every GPU inactive "
                    f"({len(down)} of {len(gpu.nvlinks)} here; not a PCIe card with optional bridges)",
                    Action.REBOOT,
                    gpu.index,
                )
            )
        elif not settings.expected_links and down:
            out.append(
                Finding(Status.FAIL, f"GPU {gpu.index}: NVLink {_links(down)} inactive", Action.RESET_GPU, gpu.index)
            )
        for link in gpu.nvlinks:
            crc = (link.crc_flit or 0) + (link.crc_data or 0)
            over = []
            if (link.replay or 0) > settings.max_replay:
                over.append(f"{link.replay} replays")
            if (link.recovery or 0) > settings.max_recovery:
                over.append(f"{link.recovery} recoveries")
            if crc > settings.max_crc:
                over.append(f"{crc} CRC errors")
            if over:
                out.append(
                    Finding(
                        Status.WARN,
                        f"GPU {gpu.index}: NVLink {link.link}: {', '.join(over)}",
                        Action.INSPECT,
                        gpu.index,
                    )
                )
        return out

    res = judge_gpus(obs, ctx, judge, "{n} GPU(s): all NVLinks active, error counters low")
    if unbridged and res.status == Status.SKIPPED:
        res = result(
            ctx,
            Status.SKIPPED,
            "NVLink hardware present but no link active on any GPU: no NVLink "
            "bridges fitted (set expected_links if this node should have them)",
            **res.details,
        )
    return res


def _links(links: list[int]) -> str:
    return ",".join(str(n) for n in links)
