"""Per-GPU ECC and row-remap counters: the latest reading and each job's baseline (standard library only).

``<state_dir>/gpu-counters.json`` holds the latest reading any face or the daemon took from
NVML; ``<state_dir>/jobs/<job id>.json`` the counters of a job's GPUs at its start (written by
the prolog from its own reading, or copied from the latest one on the fast path). The epilog's
job forensics (``nodehealth.checks.job_forensics``) compares the two. The per-GPU record is
``nodehealth.observations.gpu_counters`` of an NVML snapshot; this module stores it.

``write_latest`` keeps the reading in ``marshal`` form too (``gpu-counters.marshal``, written after
the JSON from the same value), and the fast path's ``baseline_from_latest`` reads that one while it
is at least as new as the JSON, so a prolog on the fast path imports no ``json``; a JSON file newer
than its marshal form (written by an earlier release) is read as JSON.
"""

from __future__ import annotations

import os
import time

from nodehealth.statedir import files, layout
from nodehealth.statedir.strictjson import dumps_marshal, dumps_small, parse_marshal

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Mapping, Optional, Sequence

COUNTERS_VERSION = 1
MAX_JOB_FILES = 512  # baselines of jobs whose epilog never ran are pruned past this many


def counters_record(
    counters: Mapping[str, Any],
    now: float,
    boot_id: Optional[str],
    source: str,
    gpus: Optional[Sequence[int]] = None,
    job_id: Optional[str] = None,
) -> dict[str, Any]:
    """The JSON written to the state dir: all GPUs, or only ``gpus`` (a job's baseline)."""
    keep = None if gpus is None else {str(g) for g in gpus}
    return {
        "v": COUNTERS_VERSION,
        "job_id": job_id,
        "time": round(now, 3),
        "boot_id": boot_id,
        "source": source,
        "gpus": {k: dict(v) for k, v in counters.items() if keep is None or k in keep},
    }


def problem(raw: Any) -> Optional[str]:
    """Why a parsed counters file is not a record of ours (None when it is): an object with a finite
    ``time`` and ``gpus`` mapping a GPU index to its counters (integers from 0 to 2**64, or null)."""
    if not isinstance(raw, dict):
        return "not a JSON object"
    when = raw.get("time")
    if isinstance(when, bool) or not isinstance(when, (int, float)) or when - when != 0:
        return "no finite time"
    gpus = raw.get("gpus")
    if not isinstance(gpus, dict):
        return "no per-GPU counters"
    for index, rec in gpus.items():
        if not index.isdigit() or len(index) > 4 or not isinstance(rec, dict):
            return f"GPU {index[:8]!r} is not a GPU index with its counters"
        for key, value in rec.items():
            if key == "uuid":
                if value is not None and not isinstance(value, str):
                    return f"GPU {index}: uuid is not text"
            elif value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 64
            ):
                return f"GPU {index}: {key[:40]} is not a counter"
    if raw.get("boot_id") is not None and not isinstance(raw.get("boot_id"), str):
        return "boot_id is not text"
    return None


def _read(path: str) -> tuple[Optional[dict[str, Any]], Optional[str]]:
    raw, why = files.read_json_checked(path)
    if raw is None:
        return None, why
    bad = problem(raw)
    return (None, f"{path}: {bad}") if bad else (raw, None)


def write_latest(state_dir: str, counters: Mapping[str, Any], boot_id: Optional[str], source: str) -> None:
    """The latest reading of every GPU (OSError when it cannot be written, ``files.UnsafeDir`` included).

    Not fsynced (the daemon writes it every round): only a reading of this boot is ever used
    (``baseline_from_latest``), and a crash that loses unsynced data is a reboot."""
    files.require_state_dir(state_dir)
    text = files.dumps(counters_record(counters, time.time(), boot_id, source), compact=True) + "\n"
    mode = files.STATE_FILE_MODE
    files.write_atomic(layout.path(state_dir, layout.COUNTERS), text, mode, durable=False)
    files.write_atomic(layout.path(state_dir, layout.COUNTERS_MARSHAL), dumps_marshal(text), mode, durable=False)


def read_latest(state_dir: str) -> Optional[dict[str, Any]]:
    return read_latest_checked(state_dir)[0]


def read_latest_checked(state_dir: str) -> tuple[Optional[dict[str, Any]], Optional[str]]:
    """The latest reading, or why it cannot be used (None, None: there is none). An unusable file
    is treated as absent and replaced by the next ``write_latest``."""
    return _read(layout.path(state_dir, layout.COUNTERS))


def _mtime_ns(path: str) -> int:
    try:
        return os.lstat(path).st_mtime_ns
    except OSError:
        return -1


def read_latest_fast(state_dir: str) -> tuple[Optional[dict[str, Any]], Optional[str]]:
    """``read_latest_checked`` from the marshal form while it is at least as new as the JSON
    (no ``json`` import), else from the JSON; the marshal form is held to the same ``problem``."""
    path = layout.path(state_dir, layout.COUNTERS_MARSHAL)
    made = _mtime_ns(path)
    if made < 0 or made < _mtime_ns(layout.path(state_dir, layout.COUNTERS)):
        return read_latest_checked(state_dir)
    data, why = files.read_checked(path, files.MAX_READ + 1)
    if data is None or len(data) > files.MAX_READ:
        return None, why or f"{path} is larger than {files.MAX_READ} bytes"
    try:
        raw = parse_marshal(data)
    except ValueError as exc:
        return None, f"{path}: {exc}"
    bad = problem(raw)
    return (None, f"{path}: {bad}") if bad else (raw, None)


def write_baseline(state_dir: str, job_id: str, record: Mapping[str, Any]) -> None:
    p = layout.job_file(state_dir, job_id)
    if p is None:
        return
    files.require_state_dir(state_dir)
    files.require_subdir(os.path.dirname(p))
    files.write_atomic(p, dumps_small(dict(record)) + "\n", files.STATE_FILE_MODE)
    files.prune_oldest(os.path.dirname(p), ".json", keep=MAX_JOB_FILES // 2, over=MAX_JOB_FILES)


def baseline_from_latest(
    state_dir: str, job_id: str, gpus: Optional[Sequence[int]], boot_id: Optional[str]
) -> Optional[str]:
    """Copy the job GPUs' latest counters into the job's baseline; a reason when there are none."""
    latest, why = read_latest_fast(state_dir)
    if latest is None:
        return f"the GPU counter reading is unusable: {why}" if why else f"no GPU counter reading in {state_dir} yet"
    if latest.get("boot_id") != boot_id:
        return "the latest GPU counter reading is from another boot"
    keep = None if gpus is None else {str(g) for g in gpus}
    source = latest.get("source")
    record = {
        "v": COUNTERS_VERSION,
        "job_id": job_id,
        "time": round(time.time(), 3),
        "boot_id": boot_id,
        "source": f"{source if isinstance(source, str) else '?'} reading (fast path)",
        "reading_time": latest.get("time"),
        "gpus": {k: v for k, v in latest["gpus"].items() if keep is None or k in keep},
    }
    write_baseline(state_dir, job_id, record)
    return None


def read_baseline(state_dir: str, job_id: str) -> tuple[Optional[dict[str, Any]], Optional[str]]:
    """The job's baseline, or why it cannot be used (None, None: there is none)."""
    p = layout.job_file(state_dir, job_id)
    return (None, None) if p is None else _read(p)


def take_baseline(state_dir: str, job_id: str) -> Optional[dict[str, Any]]:
    """The job's baseline, removed from the state dir (the epilog consumes it); None when absent
    or unusable."""
    p = layout.job_file(state_dir, job_id)
    if p is None:
        return None
    rec, _ = _read(p)
    try:
        os.unlink(p)
    except OSError:
        pass
    return rec
