"""Start one ``nodehealth preflight`` rank as a local process, with the Slurm variables srun would set."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Mapping

ROOT = Path(__file__).resolve().parent.parent


def start_rank(
    rank: int,
    size: int,
    node: str,
    job: tuple[str, str, str],
    shared: Path,
    config: Path,
    args: tuple[str, ...] = (),
    env_extra: Mapping[str, str] = {},  # noqa: B006 - read only
) -> subprocess.Popen[str]:
    """Rank ``rank`` of ``size`` on ``node``; ``job``: (job id, step id, the job's node list)."""
    job_id, step_id, nodelist = job
    env = dict(
        os.environ,
        SLURM_PROCID=str(rank),
        SLURM_NTASKS=str(size),
        SLURM_NODEID=str(rank),
        SLURMD_NODENAME=node,
        SLURM_JOB_ID=job_id,
        SLURM_STEP_ID=step_id,
        SLURM_JOB_NODELIST=nodelist,
        SLURM_NNODES=str(size),
        SLURM_CONF="/nonexistent/slurm.conf",
        **env_extra,
    )
    argv = [sys.executable, "-m", "nodehealth", "preflight", "--shared-dir", str(shared), "--config", str(config)]
    return subprocess.Popen(
        [*argv, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT
    )
