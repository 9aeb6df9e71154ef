"""preflight --across under a real ``srun --mpi=pmi2``: all_reduce_perf reaches the step's PMI server.

Slurm's pmi2 plugin gives each task an open socket, ``PMI_FD``. The all_reduce_perf here is a double
that makes PMI's first exchange on that descriptor (MPICH's PMI2 client opens with the PMI-1 line
``cmd=init pmi_version=2 pmi_subversion=0``; slurmstepd answers ``cmd=response_to_init ... rc=0``),
keeps the answer, then runs as the all_reduce_perf double (tests/fakes/all_reduce_perf); the local
self-test before it (no PMI_FD) is the double alone. Without the descriptor passed on, the first
write fails and the node's part fails; without ``PMI_FD`` passed on, no answer is kept.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from multinode import MultiNode
from slurm_cluster import slurm_missing
from test_preflight_multinode import A100, FAKE_NCCL, _preflight, _scenario

pytestmark = pytest.mark.real

PMI2_DOUBLE = """#!{python} -I
import os, sys
if "PMI_FD" not in os.environ:  # the local self-test, not a rank of the step
    os.execv({fake!r}, [{fake!r}, *sys.argv[1:]])
fd = int(os.environ["PMI_FD"])
os.write(fd, b"cmd=init pmi_version=2 pmi_subversion=0\\n")
answer = b""
while not answer.endswith(b"\\n") and len(answer) < 4096:
    chunk = os.read(fd, 4096)
    if not chunk:
        break
    answer += chunk
with open(os.path.join({root!r}, "pmi2-" + os.environ["SLURM_PROCID"]), "wb") as f:
    f.write(answer)
if b"cmd=response_to_init" not in answer or b"rc=0" not in answer:
    sys.exit("PMI2 init refused: %r" % answer)
os.execv({fake!r}, [{fake!r}, *sys.argv[1:]])
"""


@pytest.fixture(scope="module")
def cluster() -> Any:
    why = slurm_missing() or (None if shutil.which("unshare") else "unshare missing")
    if why:
        pytest.skip(why)
    c = MultiNode(["n1", "n2", "n3"]).start()
    yield c
    c.stop()


def _double(c: MultiNode) -> Path:
    prog = c.root / "pmi2_all_reduce_perf"
    prog.write_text(PMI2_DOUBLE.format(python=sys.executable, root=str(c.root), fake=str(FAKE_NCCL)))
    prog.chmod(0o755)
    for n in ("n1", "n2", "n3"):
        _scenario(c, n, "healthy.toml")
        with (c.root / f"nh-{n}.toml").open("a") as f:
            f.write(
                f'[checks.nccl_selftest]\nall_reduce_perf = "{prog}"\nrunner = "nccl-tests"\ngpus = 8\n'
                f'gpu_model = "NVIDIA A100-SXM4-80GB"\nenv = ["FAKE_NCCL_FIXTURE={A100}"]\n'
            )
    return prog


def test_each_part_makes_pmi2s_first_exchange_with_slurmstepd(cluster: MultiNode) -> None:
    _double(cluster)
    res = _preflight(cluster, "--mpi=pmi2", "-w", "n[1-3]", args=("--nccl", "--across", "--nccl-timeout", "8"))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "all-reduce across 3 node(s): " in res.stdout and "verdict: PASS (3 node(s)" in res.stdout
    for rank in range(3):
        answer = (cluster.root / f"pmi2-{rank}").read_bytes()
        assert answer.startswith(b"cmd=response_to_init") and b"rc=0" in answer, answer
    print(f"slurmstepd's answer to PMI2's init: {answer!r}")
