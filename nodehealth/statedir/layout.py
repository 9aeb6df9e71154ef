"""Every file nodehealth keeps, in which of its two directories, and this boot's id: one owner.

Standard library only (``os``), so the prolog's fast path may import it. Any other module that
needs a state file's path or the boot id asks here; a test checks that no other module spells a
state file name or the boot-id path itself, nor hands a persistent file the run directory.

**Two directories.** ``[paths] state_dir`` (default ``/run/nodehealth``, a tmpfs: the unit's
``RuntimeDirectory=``) holds what belongs to one boot; ``[paths] persistent_dir`` (default
``/var/lib/nodehealth``, the unit's ``StateDirectory=``) holds what must outlive a reboot: a
drain record written before the reboot a fault asks for is what proves, after it, that the
node's reason is ours to resume. ``PERSISTENT`` names the files of the second; every other name
is of the first. A config that sets ``state_dir`` but not ``persistent_dir`` keeps everything in
that one ``state_dir``, as before the split (``nodehealth.config.lean.read_settings`` and the
loader apply the rule; here ``persistent_dir`` is taken as configured).

=========================  =====================================================  ====  ==================
file                       what                                                   dir   writers
=========================  =====================================================  ====  ==================
``daemon-state.json``      the daemon's latest verdict (``statedir.verdict``)      run   daemon
``daemon-state.marshal``   the same verdict in ``marshal`` form (the fast path's)  run   daemon
``gpu-counters.json``      the latest per-GPU ECC / row-remap counters            run   faces, daemon
``gpu-counters.marshal``   the same reading in ``marshal`` form (the fast path's)  run   faces, daemon
``prolog-<config>.marshal`` the fast path's settings for one config file           run*  faces, daemon
                           (``config.snapshot``; *: the default run dir)
``jobs.jsonl``             the job ledger (``statedir.ledger``)                   run   prolog, epilog
``jobs/<id>.json``         one job's counters at its start (its baseline)         run   prolog
``xid-events.json``        XID events of this boot and the kmsg position          run   XID follower, probe
``ib-history.json``        InfiniBand ports' state and error counters per round   run   faces, daemon
``slurm-state.json``       the Slurm faces' memory: drain record, clean runs,     kept  faces, daemon
                           drain history, the cached Slurm view
``config-good.json``       the last config that validated here (text, sha256)     kept  faces, daemon
``slurm-observe.json``     observe mode: the would-be drain, would-be counts      kept  faces, daemon
``reboots.json``           the reboots asked per check (``[slurm] reboot``)       kept  faces, daemon
=========================  =====================================================  ====  ==================

A ``.marshal`` file is written in the same call as its JSON file, after it, from the same value
(``strictjson.dumps_marshal``); only the prolog's fast path reads it, so it imports no ``json``. The
fast path's settings are found from the config file's path alone (it reads no TOML), so they are
kept in the default run dir (``[paths] state_dir``'s default, ``config.lean``), whatever the config
sets: ``snapshot_path``.

Each JSON file ``F`` is written atomically (``statedir.files``) and serialised by ``F.lock``
beside it. A new file that must outlive a boot is one name here and one entry of
``PERSISTENT``; its reader and writer take its path from ``path_for(paths, NAME)``.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:  # no typing import at run time: the fast path pays for every module
    from typing import Any, Optional

DAEMON_STATE = "daemon-state.json"
DAEMON_STATE_MARSHAL = "daemon-state.marshal"  # the verdict for the prolog's fast path (no json there)
COUNTERS_MARSHAL = "gpu-counters.marshal"  # the latest counters for the fast path's job baseline
SNAPSHOT_PREFIX, SNAPSHOT_FORM = "prolog-", "marshal"  # the fast path's settings per config file
SNAPSHOT_NAME_MAX = 240  # a longer name (a config path that long) gets no snapshot: the cold path runs
SLURM_STATE = "slurm-state.json"
COUNTERS = "gpu-counters.json"
LEDGER = "jobs.jsonl"
JOBS_DIR = "jobs"
XID_EVENTS = "xid-events.json"
XID_LOCK = "xid-events.lock"
IB_HISTORY = "ib-history.json"  # the InfiniBand ports' change log (probes.ib_history)
CONFIG_GOOD = "config-good.json"
SLURM_OBSERVE = "slurm-observe.json"  # observe mode: the would-be drain of this node, would-be counts
REBOOTS = "reboots.json"  # [slurm] reboot = "asap": the reboots asked per check (slurm.reboot)

# The files that must outlive a reboot: in [paths] persistent_dir. Every other file is of one boot.
PERSISTENT = frozenset((SLURM_STATE, CONFIG_GOOD, SLURM_OBSERVE, REBOOTS))

# The kernel's id of the running boot, under the configured procfs root ([paths] procfs_root).
BOOT_ID_REL = ("sys", "kernel", "random", "boot_id")
PROCFS_ROOT = "/proc"


def path(state_dir: str, name: str) -> str:
    """``<state_dir>/<name>`` for one of the names above."""
    return os.path.join(state_dir, name)


def dir_for(paths: Any, name: str) -> str:
    """The directory that holds ``name``: ``paths.persistent_dir`` for a name of ``PERSISTENT``,
    else ``paths.state_dir``. ``paths`` is the config's ``[paths]`` (``config.schema.Paths``) or
    the fast path's ``config.lean.Settings``; a plain string is one directory for every file (the
    layout before the split, and what a test that wants one directory passes)."""
    if isinstance(paths, str):
        return paths
    return str(paths.persistent_dir if name in PERSISTENT else paths.state_dir)


def path_for(paths: Any, name: str) -> str:
    """``<dir_for(paths, name)>/<name>``: the one way to the path of a state file."""
    return os.path.join(dir_for(paths, name), name)


def earlier_path(paths: Any, name: str) -> Optional[str]:
    """Where a persistent file lived before the split (in the run directory), when that is another
    place than now; None for a file of one boot or when one directory holds everything."""
    if isinstance(paths, str) or name not in PERSISTENT:
        return None
    old = os.path.join(str(paths.state_dir), name)
    return None if os.path.abspath(old) == os.path.abspath(path_for(paths, name)) else old


def snapshot_path(run_dir: str, config_path: str) -> Optional[str]:
    """``<run_dir>/prolog-<config path, percent-escaped>.marshal``: the prolog's fast-path settings
    made from the config file ``config_path`` (``nodehealth.config.snapshot``); None when the name
    would be too long."""
    name = config_path.strip("/").replace("%", "%25").replace("/", "%2F")
    name = f"{SNAPSHOT_PREFIX}{name}.{SNAPSHOT_FORM}"
    return os.path.join(run_dir, name) if len(name) <= SNAPSHOT_NAME_MAX else None


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
