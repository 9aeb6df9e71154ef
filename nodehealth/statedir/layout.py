"""Every file nodehealth keeps in its state directory, and this boot's id: one owner for both.

Standard library only (``os``), so the prolog's fast path may import it. Any other module that
needs a state-dir path or the boot id asks here; a test checks that no other module spells a
state-dir file name or the boot-id path itself.

=========================  =====================================================  ==================
file                       what                                                   writers
=========================  =====================================================  ==================
``daemon-state.json``      the daemon's latest verdict (``statedir.verdict``)      daemon
``slurm-state.json``       the Slurm faces' memory: drain record, clean runs      faces, daemon
``gpu-counters.json``      the latest per-GPU ECC / row-remap counters            faces, daemon
``jobs.jsonl``             the job ledger (``statedir.ledger``)                   prolog, epilog
``jobs/<id>.json``         one job's counters at its start (its baseline)         prolog
``xid-events.json``        XID events of this boot and the kmsg position          XID follower, probe
``config-good.json``       the last config that validated here (text, sha256)     faces, daemon
=========================  =====================================================  ==================

Each JSON file ``F`` is written atomically (``statedir.files``) and serialised by ``F.lock``.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:  # no typing import at run time: the fast path pays for every module
    from typing import Any, Optional

DAEMON_STATE = "daemon-state.json"
SLURM_STATE = "slurm-state.json"
COUNTERS = "gpu-counters.json"
LEDGER = "jobs.jsonl"
JOBS_DIR = "jobs"
XID_EVENTS = "xid-events.json"
XID_LOCK = "xid-events.lock"
CONFIG_GOOD = "config-good.json"

# The kernel's id of the running boot, under the configured procfs root ([paths] procfs_root).
BOOT_ID_REL = ("sys", "kernel", "random", "boot_id")
PROCFS_ROOT = "/proc"


def path(state_dir: str, name: str) -> str:
    """``<state_dir>/<name>`` for one of the names above."""
    return os.path.join(state_dir, name)


# Slurm's job ids are 32-bit (slurm.h: uint32_t job_id); NO_VAL (0xfffffffe) and INFINITE
# (0xffffffff) are not ids, and 0 is none. An array task or a het component has its own plain id
# in SLURM_JOB_ID, so no other form is taken.
MAX_JOB_ID = 0xFFFFFFFD
_DIGITS = frozenset("0123456789")


def valid_job_id(value: Any) -> Optional[str]:
    """``value`` as a Slurm job id in canonical form (decimal ASCII digits, no sign, no leading zero,
    1..``MAX_JOB_ID``), or None. The one rule for every job id that reaches the ledger, a file name,
    a reason or a metric label; an int (a ledger written by hand) is taken too, a bool is not."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not 0 < len(value) <= 10 or value[0] == "0" or not _DIGITS.issuperset(value):
        return None
    return value if int(value) <= MAX_JOB_ID else None


def job_file(state_dir: str, job_id: str) -> Optional[str]:
    """``<state_dir>/jobs/<job id>.json``; None for a job id that is not one (``valid_job_id``)."""
    job = valid_job_id(job_id)
    if job is None:
        return None
    return os.path.join(state_dir, JOBS_DIR, f"{job}.json")


def boot_id_path(procfs_root: str = PROCFS_ROOT) -> str:
    return os.path.join(procfs_root, *BOOT_ID_REL)


def read_boot_id(procfs_root: str = PROCFS_ROOT) -> Optional[str]:
    """This boot's id, or None when it cannot be read (then nothing boot-scoped is trusted)."""
    try:
        with open(boot_id_path(procfs_root), "rb") as f:
            text = f.read(128).decode("ascii", "replace").strip()
    except OSError:
        return None
    return text or None
