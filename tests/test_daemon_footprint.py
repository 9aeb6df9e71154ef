"""What the long-lived daemon holds: pynvml imported once, ahead of its readers, with nothing of NVML run
in it; no OpenSSL.

The probe cases run in a fresh interpreter (this test process may have imported pynvml already): the
NVML probe of the given phase reads the simulated 8x H100 node twice, then the process reports
whether it holds pynvml, whether that pynvml has loaded a library, and whether any NVML library is
mapped into it. The daemon case reads a real daemon's /proc/PID/maps after its rounds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from test_daemon_util import free_port, start, stop, wait_for, write_config

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "examples" / "scenarios" / "healthy-8x-h100.toml"

PROGRAM = r"""
import json, sys
from nodehealth_sim import driver
# The scenario's driver loaded here too, as a node's libnvidia-ml is there to be loaded: an nvmlInit
# in this process would succeed and leave pynvml's library handle set.
driver.preload(570)
from nodehealth.config import loader as C
from nodehealth.observations import NvmlSnapshot
from nodehealth.probes import PROBES, ProbeContext

cfg = C.resolve({"paths": {"state_dir": sys.argv[2]}, "nvml": {"simulate": sys.argv[3]}}, "<test>",
                host="gpu001", environ={})
gpus = []
for _ in range(2):
    snap = PROBES["nvml"].gather(ProbeContext(cfg, "gpu001", phase=sys.argv[1], writes=False), 20.0).collect()
    assert isinstance(snap, NvmlSnapshot) and snap.complete, snap
    gpus.append(len(snap.gpus))
nv = sys.modules.get("pynvml")
with open("/proc/self/maps") as f:
    mapped = sorted({line.split()[-1] for line in f if "nvidia-ml" in line})
print(json.dumps({"gpus": gpus, "imported": nv is not None,
                  "loaded": None if nv is None else nv.nvmlLib is not None, "mapped": len(mapped)}))
"""


def _run(tmp_path: Path, phase: str) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "sim")]))
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM, phase, str(tmp_path / "state"), str(SCENARIO)],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(tmp_path),
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_daemon_holds_pynvml_but_no_nvml_library(tmp_path: Path) -> None:
    got = _run(tmp_path, "daemon")
    assert got["gpus"] == [8, 8]  # the readers, forked with pynvml already imported, read every GPU
    assert got["imported"] is True  # imported ahead: the readers inherit it
    # ... and nothing of NVML ran in the daemon: nvidia-ml-py loads its library only in nvmlInit
    assert got["loaded"] is False
    assert got["mapped"] == 1  # the one this test loaded


def test_a_one_shot_face_leaves_pynvml_to_the_reader(tmp_path: Path) -> None:
    # A prolog (or a check by hand) forks one reader: importing ahead would only cost it.
    for phase in ("prolog", "manual"):
        got = _run(tmp_path, phase)
        assert got["gpus"] == [8, 8]
        assert got == {"gpus": [8, 8], "imported": False, "loaded": None, "mapped": 1}, phase


def _mapped(pid: int) -> set[str]:
    with open(f"/proc/{pid}/maps") as f:
        return {os.path.basename(line.split()[-1]) for line in f if "/" in line}


def test_a_running_daemon_maps_neither_an_nvml_library_nor_openssl(tmp_path: Path) -> None:
    port = free_port()
    proc = start(write_config(tmp_path, "healthy-8x-h100", port, interval_s=1))
    try:
        # Rounds 1-3 have read the GPUs (each in a reader child) and asked Slurm (a scontrol that fails
        # here or a sinfo: the Slurm client is loaded either way).
        wait_for(f"http://127.0.0.1:{port}/metrics", lambda b: b"\nnodehealth_rounds_total 3.0" in b, timeout=120)
        libs = _mapped(proc.pid)
    finally:
        stop(proc)
    assert "libpython3" in " ".join(libs) or any(name.startswith("python3") for name in libs)  # the maps were read
    assert not [n for n in libs if "nvidia-ml" in n], libs  # NVML ran in the readers only
    # hashlib and secrets load OpenSSL (3.4 MiB of RSS) for a config digest and a random token
    have_builtin = any(_builtin(name) for name in ("_sha2", "_sha256"))
    if have_builtin:
        assert not [n for n in libs if n.startswith("libcrypto")], libs


def _builtin(name: str) -> bool:
    try:
        __import__(name)
    except ImportError:
        return False
    return True
