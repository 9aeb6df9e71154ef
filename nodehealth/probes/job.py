"""The ``job`` probe: the Slurm job a prolog or epilog runs for, from its environment and the state dir.

No Slurm call: the job id and GPUs come from the environment slurmd gives the script
(``SLURM_JOB_ID``, ``SLURM_JOB_GPUS``), the job's start from the job ledger, its ECC baseline
from the file the prolog wrote (``statedir.counters``). Outside a job (``nodehealth check``,
the health check, the daemon) the probe answers "not in a job" and ``job_forensics`` is SKIPPED.
"""

from __future__ import annotations

import time
from typing import Mapping, Union

from nodehealth.observations import JobObservation, ProbeError
from nodehealth.slurm import jobenv
from nodehealth.statedir import files, layout, ledger


def gather(environ: Mapping[str, str], state_dir: str, procfs_root: str) -> Union[JobObservation, ProbeError]:
    job = jobenv.job_id(environ)
    if job is None:
        return ProbeError("job", "unavailable", "not run for a Slurm job (no SLURM_JOB_ID)")
    boot = layout.read_boot_id(procfs_root)
    start = ledger.start_time(ledger.read(state_dir), job, boot)
    path = layout.job_file(state_dir, job)
    baseline = files.read_object(path) if path else None
    if start is None and baseline is not None and isinstance(baseline.get("time"), (int, float)):
        start = float(baseline["time"])
    return JobObservation(
        job_id=job, gpus=jobenv.job_gpus(environ), start=start, baseline=baseline, boot_id=boot, now=time.time()
    )
