"""What a person does about a finding: the command to run, and what brings the node back.

One table per action class, refined per check where a check knows better (the fabric needs
Fabric Manager, persistence needs nvidia-persistenced). Pure data; the text and JSON reports
carry the hint of every WARN, UNKNOWN and FAIL result.
"""

from __future__ import annotations

from typing import Optional

from nodehealth.model import Action, CheckResult, Status

# How a node nodehealth drained comes back (docs/operations.md, "Resume").
BACK_CLEAN = "the health check resumes the node after [resume] clean_runs clean runs"
BACK_REBOOT = "resumes after a reboot and [resume] clean_runs clean health checks"
BACK_HAND = "resume by hand once fixed: scontrol update nodename=<node> state=resume"

ACTION_HINTS = {
    Action.RESET_GPU: ("reset the GPU when no process uses it: nvidia-smi -r -i {gpu} (or reboot)", BACK_CLEAN),
    Action.REBOOT: ("reboot the node", BACK_REBOOT),
    Action.INSPECT: ("inspect the hardware (cabling, seating, power, cooling; RMA if it persists)", BACK_HAND),
    Action.RESTART_APP: ("stop the process(es) named and restart the job", BACK_CLEAN),
    Action.NONE: ("", BACK_CLEAN),
}
CHECK_HINTS = {
    "gpu_fabric": "systemctl status nvidia-fabricmanager; journalctl -u nvidia-fabricmanager",
    "gpu_persistence": "systemctl enable --now nvidia-persistenced (or nvidia-smi -pm 1)",
    "nvml": "nvidia-smi; lsmod | grep nvidia; dmesg | grep -i nvrm",
    "gpu_xid": "nodehealth xid list; nodehealth xid explain <XID>",
    "gpu_count": "nvidia-smi -L; lspci -d 10de:; dmesg | grep -i nvrm",
    "gpu_driver": "nvidia-smi --query-gpu=driver_version --format=csv",
    "gpu_processes": "nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv",
    "gpu_nvlink": "nvidia-smi nvlink -s -i {gpu}; nvidia-smi nvlink -e -i {gpu}",
    "gpu_pcie": "nvidia-smi -q -d PCIE -i {gpu}; lspci -vv -s <bus id>",
    "gpu_temperature": "nvidia-smi -q -d TEMPERATURE,PERFORMANCE -i {gpu}",
    "gpu_remapped_rows": "nvidia-smi -q -d ROW_REMAPPER -i {gpu}",
    "gpu_retired_pages": "nvidia-smi -q -d PAGE_RETIREMENT -i {gpu}",
    "gpu_ecc": "nvidia-smi -q -d ECC -i {gpu}",
    "gpu_recovery_action": "nvidia-smi -q -i {gpu} (the driver's recovery action)",
    "host_mounts": "findmnt; mount -a",
    "host_shared_dir": "ls -ld <dir>; findmnt -T <dir>",
    "host_infiniband": "ibstat; ibv_devinfo",
    "host_memory": "free -g; cat /proc/meminfo",
}

# Where a check's details say the finding is not what its action's generic text assumes:
# (check, details key) -> what to do instead of that text.
DETAIL_HINTS = {
    # ECC switched off, pending mode off too: not hardware, a setting; nvidia-smi -e takes
    # effect at the next reset or reboot (nvml.h, nvmlDeviceGetEccMode).
    ("gpu_ecc", "ecc_disabled"): "turn ECC back on: nvidia-smi -i {gpu} -e 1, then reset the GPU "
    "(nvidia-smi -r -i {gpu}) or reboot",
}


def hint(result: CheckResult) -> Optional[str]:
    """ "do: ...; back: ..." for a WARN, UNKNOWN or FAIL result; None for OK and SKIPPED."""
    if result.status < Status.WARN:
        return None
    gpu = "<gpu>" if result.gpu is None else str(result.gpu)
    do, back = ACTION_HINTS.get(result.action, ("", BACK_CLEAN))
    for (check, key), instead in DETAIL_HINTS.items():
        if result.name == check and result.details.get(key):
            do = instead
    look = CHECK_HINTS.get(result.name, "")
    parts = []
    if do:
        parts.append(do.format(gpu=gpu))
    if look:
        parts.append(f"look: {look.format(gpu=gpu)}")
    if result.status == Status.FAIL:
        parts.append(back)
    elif result.status == Status.UNKNOWN:
        parts.append("nodehealth could not tell; see the message")
    return "; ".join(parts) or None
