"""Per-GPU ECC and row-remap counters: the latest reading and each job's baseline (standard library only).

``<state_dir>/gpu-counters.json`` holds the latest reading any face or the daemon took from
NVML; ``<state_dir>/jobs/<job id>.json`` the counters of a job's GPUs at its start (written by
the prolog from its own reading, or copied from the latest one on the fast path). The epilog's
job forensics (``nodehealth.checks.job_forensics``) compares the two. The per-GPU record is
``nodehealth.observations.gpu_counters`` of an NVML snapshot; this module stores it.
"""

from __future__ import annotations

import os
import time

from nodehealth.statedir import files, layout

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Mapping, Optional, Sequence

COUNTERS_VERSION = 1
MAX_JOB_FILES = 512  # baselines of jobs whose epilog never ran are pruned past this many


def counters_record(counters: Mapping[str, Any], now: float, boot_id: Optional[str], source: str,
                    gpus: Optional[Sequence[int]] = None, job_id: Optional[str] = None) -> dict[str, Any]:
    """The JSON written to the state dir: all GPUs, or only ``gpus`` (a job's baseline)."""
    keep = None if gpus is None else {str(g) for g in gpus}
    return {"v": COUNTERS_VERSION, "job_id": job_id, "time": round(now, 3), "boot_id": boot_id, "source": source,
            "gpus": {k: dict(v) for k, v in counters.items() if keep is None or k in keep}}


def write_latest(state_dir: str, counters: Mapping[str, Any], boot_id: Optional[str], source: str) -> None:
    """The latest reading of every GPU (OSError when it cannot be written)."""
    files.write_json(layout.path(state_dir, layout.COUNTERS), counters_record(counters, time.time(), boot_id, source),
                     compact=True)


def read_latest(state_dir: str) -> Optional[dict[str, Any]]:
    return files.read_object(layout.path(state_dir, layout.COUNTERS))


def write_baseline(state_dir: str, job_id: str, record: Mapping[str, Any]) -> None:
    p = layout.job_file(state_dir, job_id)
    if p is None:
        return
    files.write_json(p, dict(record), compact=True)
    files.prune_oldest(os.path.dirname(p), ".json", keep=MAX_JOB_FILES // 2, over=MAX_JOB_FILES)


def baseline_from_latest(state_dir: str, job_id: str, gpus: Optional[Sequence[int]],
                         boot_id: Optional[str]) -> Optional[str]:
    """Copy the job GPUs' latest counters into the job's baseline; a reason when there are none."""
    latest = read_latest(state_dir)
    if latest is None or not isinstance(latest.get("gpus"), dict):
        return f"no GPU counter reading in {state_dir} yet"
    if latest.get("boot_id") != boot_id:
        return "the latest GPU counter reading is from another boot"
    keep = None if gpus is None else {str(g) for g in gpus}
    record = {"v": COUNTERS_VERSION, "job_id": job_id, "time": round(time.time(), 3), "boot_id": boot_id,
              "source": f"{latest.get('source', '?')} reading (fast path)", "reading_time": latest.get("time"),
              "gpus": {k: v for k, v in latest["gpus"].items() if keep is None or k in keep}}
    write_baseline(state_dir, job_id, record)
    return None


def take_baseline(state_dir: str, job_id: str) -> Optional[dict[str, Any]]:
    """The job's baseline, removed from the state dir (the epilog consumes it); None when absent."""
    p = layout.job_file(state_dir, job_id)
    if p is None:
        return None
    rec = files.read_object(p)
    try:
        os.unlink(p)
    except OSError:
        pass
    return rec
