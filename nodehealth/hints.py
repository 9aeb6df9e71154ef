"""What a person does about a finding: its fault class, the command that fixes it, and what brings
the node back.

Every finding has a fault class (``FAULTS``): software (a driver, library or service to install,
load or start), configuration (a setting or permission to change), hardware (a part to inspect,
reseat, cool or replace) and fabric (NVLink, NVSwitch, InfiniBand: the links between parts). The
class picks the advice: only a hardware fault is told to inspect the hardware, whatever the
check's action says. A check's own class (``CHECK_FAULTS``) is refined by what its details say
(``ERROR_FAULTS``: NVML's own error strings; ``DETAIL_HINTS``). Pure data; the text and JSON
reports carry the hint of every WARN, UNKNOWN and FAIL result, its class first.
"""

from __future__ import annotations

from typing import Optional

from nodehealth.model import Action, CheckResult, Status

SOFTWARE, CONFIGURATION, HARDWARE, FABRIC = "software", "configuration", "hardware", "fabric"
FAULTS = (SOFTWARE, CONFIGURATION, HARDWARE, FABRIC)

# How a node nodehealth drained comes back (docs/operations.md, "Resume").
BACK_CLEAN = "the health check resumes the node after [resume] clean_runs clean runs"
BACK_REBOOT = "resumes after a reboot and [resume] clean_runs clean health checks"
BACK_HAND = "resume by hand once fixed: scontrol update nodename=<node> state=resume"

INSPECT_HARDWARE = "inspect the hardware (cabling, seating, power, cooling; RMA if it persists)"
ACTION_HINTS = {
    Action.RESET_GPU: ("reset the GPU when no process uses it: nvidia-smi -r -i {gpu} (or reboot)", BACK_CLEAN),
    Action.REBOOT: ("reboot the node", BACK_REBOOT),
    Action.INSPECT: (INSPECT_HARDWARE, BACK_HAND),
    Action.RESTART_APP: ("stop the process(es) named and restart the job", BACK_CLEAN),
    Action.NONE: ("", BACK_CLEAN),
}
# What a person does for an inspect-class finding that is not a hardware fault.
INSPECT_BY_FAULT = {
    SOFTWARE: "repair the software named (driver, library or service); nothing points at the hardware",
    CONFIGURATION: "fix the setting named; nothing points at the hardware",
    HARDWARE: INSPECT_HARDWARE,
    FABRIC: "inspect the fabric (NVLink/NVSwitch trays and cables, Fabric Manager, the InfiniBand ports)",
}
CHECK_FAULTS = {
    "nvml": HARDWARE,  # a lost, hung or unreachable GPU; ERROR_FAULTS names the software and setting cases
    "gpu_count": HARDWARE,
    "gpu_driver": SOFTWARE,
    "gpu_temperature": HARDWARE,
    "gpu_throttle": HARDWARE,  # cooling or power delivery (a lowered power limit is said in its summary)
    "gpu_ecc": HARDWARE,
    "gpu_retired_pages": HARDWARE,
    "gpu_remapped_rows": HARDWARE,
    "gpu_pcie": HARDWARE,
    "gpu_nvlink": FABRIC,
    "gpu_fabric": FABRIC,
    "gpu_recovery_action": HARDWARE,
    "gpu_persistence": CONFIGURATION,
    "gpu_processes": SOFTWARE,
    "gpu_xid": HARDWARE,
    "gpu_sxid": FABRIC,  # an NVSwitch of the node's NVLink fabric
    "host_memory": HARDWARE,
    "host_mounts": CONFIGURATION,
    "host_shared_dir": CONFIGURATION,
    "host_infiniband": FABRIC,
    "host_pcie_aer": HARDWARE,
    "host_edac": HARDWARE,
    "host_dstate": HARDWARE,  # a GPU or driver that stopped answering holds the process in the kernel
    "host_services": SOFTWARE,
    "job_forensics": SOFTWARE,
    "nccl_selftest": FABRIC,
}
CHECK_HINTS = {
    "gpu_fabric": "systemctl status nvidia-fabricmanager; journalctl -u nvidia-fabricmanager",
    "gpu_persistence": "systemctl enable --now nvidia-persistenced (or nvidia-smi -pm 1)",
    "nvml": "nvidia-smi; lsmod | grep nvidia; dmesg | grep -i nvrm",
    "gpu_xid": "nodehealth xid list; nodehealth xid explain <XID>",
    "gpu_sxid": "journalctl -k -b | grep SXid; nvidia-smi nvlink -s; journalctl -b -u nvidia-fabricmanager",
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
    "host_pcie_aer": "grep . /sys/bus/pci/devices/<bus id>/aer_dev_*; lspci -vvv -s <bus id>; journalctl -k | grep AER",
    "host_edac": "grep . /sys/devices/system/edac/mc/mc*/*_count; ras-mc-ctl --errors; journalctl -k | grep -i edac",
    "host_dstate": "cat /proc/<pid>/stack /proc/<pid>/wchan; ls -l /proc/<pid>/fd | grep nvidia",
    "host_services": "systemctl status <unit>; journalctl -b -u <unit>; ls /sys/module | grep nvidia",
    "host_memory": "free -g; cat /proc/meminfo",
}

_LIBRARY = (
    "install the NVIDIA driver's NVML library, libnvidia-ml.so.1 (Debian: nvidia-driver or libnvidia-ml1; "
    "RHEL: nvidia-driver-NVML or cuda-drivers; the .run installer: the driver itself)"
)
_LIBRARY_CHECK = "ls /usr/lib*/libnvidia-ml.so.1 /usr/lib/*/libnvidia-ml.so.1; nvidia-smi"
# (check, words in its details' "error"): (fault class, what to do, how to check). The words are
# NVML's own (nvmlErrorString) or the probe's; the first match wins.
ERROR_FAULTS = (
    ("nvml", "Shared Library Not Found", SOFTWARE, _LIBRARY, _LIBRARY_CHECK),
    ("nvml", "nvidia-ml-py is not installed", SOFTWARE, "install nvidia-ml-py (pip install nvidia-ml-py)", ""),
    (
        "nvml",
        "Driver Not Loaded",
        SOFTWARE,
        "load the NVIDIA kernel module: modprobe nvidia (built for this kernel? dkms status; uname -r)",
        "lsmod | grep nvidia; cat /proc/driver/nvidia/version; nvidia-smi",
    ),
    (
        "nvml",
        "Insufficient Permissions",
        CONFIGURATION,
        "run nodehealth as root, or give its user the NVIDIA device nodes (and the cgroup's device rules)",
        "ls -l /dev/nvidia*; id; nvidia-smi",
    ),
    (
        "nvml",
        "the oldest this probe is tested with",  # the wheel below the floor (old_library)
        SOFTWARE,
        "upgrade nvidia-ml-py to the floor the message names (pip install 'nvidia-ml-py>=FLOOR')",
        "nodehealth --version",
    ),
)

# Where a check's details say the finding is not what its action's generic text assumes:
# (check, details key) -> (fault class, what to do instead of that text).
DETAIL_HINTS = {
    # ECC switched off, pending mode off too: not hardware, a setting; nvidia-smi -e takes
    # effect at the next reset or reboot (nvml.h, nvmlDeviceGetEccMode).
    ("gpu_ecc", "ecc_disabled"): (
        CONFIGURATION,
        "turn ECC back on: nvidia-smi -i {gpu} -e 1, then reset the GPU (nvidia-smi -r -i {gpu}) or reboot",
    ),
    # A driver outside [checks.gpu_driver] allowed: the node runs the wrong software, not broken parts.
    ("gpu_driver", "allowed"): (
        SOFTWARE,
        "install a driver the list allows, or add this one to [checks.gpu_driver] allowed",
    ),
}


def _refined(result: CheckResult) -> Optional[tuple[str, str, str]]:
    """(fault, do, look) where the result's details name a cause of their own, else None."""
    error = result.details.get("error")
    if isinstance(error, str):
        for check, words, fault, do, look in ERROR_FAULTS:
            if result.name == check and words in error:
                return fault, do, look
    for (check, key), (fault, instead) in DETAIL_HINTS.items():
        if result.name == check and result.details.get(key):
            return fault, instead, CHECK_HINTS.get(check, "")
    return None


def fault(result: CheckResult) -> Optional[str]:
    """The fault class of a WARN or FAIL result (one of ``FAULTS``); None for OK and SKIPPED, and for
    an UNKNOWN whose details name no cause (nodehealth could not tell, so it names no class)."""
    if result.status < Status.WARN:
        return None
    refined = _refined(result)
    if refined is not None:
        return refined[0]
    if result.status == Status.UNKNOWN:
        return None
    if result.action == Action.RESTART_APP:  # a process or an application XID: the job's software
        return SOFTWARE
    return CHECK_FAULTS.get(result.name, HARDWARE if result.action == Action.INSPECT else SOFTWARE)


def hint(result: CheckResult) -> Optional[str]:
    """ "<fault>: <do>; look: ...; <back>" for a WARN, UNKNOWN or FAIL result (an UNKNOWN without a
    class starts with its look); None for OK and SKIPPED."""
    if result.status < Status.WARN:
        return None
    cls = fault(result)
    gpu = "<gpu>" if result.gpu is None else str(result.gpu)
    do, back = ACTION_HINTS.get(result.action, ("", BACK_CLEAN))
    look = CHECK_HINTS.get(result.name, "")
    refined = _refined(result)
    if refined is not None:
        _, do, look = refined
    elif result.action == Action.INSPECT:
        do = INSPECT_BY_FAULT[cls or HARDWARE]
    parts = []
    if do:
        parts.append(do.format(gpu=gpu))
    if look:
        parts.append(f"look: {look.format(gpu=gpu)}")
    if result.status == Status.FAIL:
        parts.append(back)
    elif result.status == Status.UNKNOWN:
        parts.append("nodehealth could not tell; see the message")
    text = "; ".join(parts)
    return f"{cls}: {text}" if cls else text or None
