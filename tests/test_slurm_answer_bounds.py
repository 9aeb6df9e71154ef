"""slurmctld's answers are bounded before they are stored: the Slurm state file caches a few parsed,
bounded fields of this node's record, never the answer itself (docs/security.md, "Programs root runs").

A fake ``scontrol`` prints what a broken or hostile one could: 20 MB of invalid UTF-8, a record with
a 200 KB reason, a node name of 100,000 characters. The state file stays a few KiB, or is not
written; the state writer itself refuses a state its own reader would refuse (over 1 MiB).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from nodehealth.config.loader import load
from nodehealth.observations import ProbeError, SlurmNode
from nodehealth.probes.slurm import MAX_REASON_CHARS, node_view
from nodehealth.statedir import files, layout, slurmstate

HEAD = b"NodeName=n1 Arch=x86_64 Gres=gpu:8 State=IDLE Partitions=p Reason="


def fake(tmp_path: Path, body: bytes) -> Path:
    """A config whose ``[slurm] scontrol`` prints ``body`` (bytes as they are) for any call."""
    out = tmp_path / "answer.bin"
    out.write_bytes(body)
    script = tmp_path / "scontrol"
    script.write_text(f"#!{sys.executable}\nimport sys\nsys.stdout.buffer.write(open({str(out)!r}, 'rb').read())\n")
    script.chmod(0o755)
    cfg = tmp_path / "nh.toml"
    cfg.write_text(
        f'node_name = "n1"\n[paths]\nstate_dir = "{tmp_path}/state"\n[slurm]\nscontrol = "{script}"\ntimeout_s = 60\n'
    )
    return cfg


def view(cfg_path: Path) -> Any:
    cfg = load(str(cfg_path))
    return node_view(cfg, "n1", "healthcheck", 60.0)


def state_file(tmp_path: Path) -> Path:
    return tmp_path / "state" / layout.SLURM_STATE


def test_twenty_megabytes_of_invalid_utf8_are_not_cached(tmp_path: Path) -> None:
    cfg = fake(tmp_path, HEAD + b"\xff\xfe" * 10_000_000)
    got = view(cfg)
    assert isinstance(got, ProbeError) and "more than" in got.message
    path = state_file(tmp_path)
    assert not path.exists() or path.stat().st_size < 64 << 10


@pytest.mark.parametrize("size", [200_000, 250_000])
def test_a_long_invalid_reason_is_cached_bounded(tmp_path: Path, size: int) -> None:
    """Under the one-node answer's cap: parsed, and only the bounded fields go to the state file."""
    cfg = fake(tmp_path, HEAD + b"\xff" * size + b"\n")
    got = view(cfg)
    assert isinstance(got, SlurmNode) and got.gres_gpus == 8
    path = state_file(tmp_path)
    assert path.stat().st_size < 16 << 10
    cached = json.loads(path.read_text())["slurm_node"]
    assert set(cached) == {"name", "gres_gpus", "state", "reason", "time"}
    assert cached["name"] == "n1" and cached["gres_gpus"] == 8 and len(cached["reason"]) <= MAX_REASON_CHARS
    assert slurmstate.load(str(tmp_path / "state")).slurm_node == cached  # its own reader takes it back


def test_a_one_node_answer_over_its_cap_is_no_answer(tmp_path: Path) -> None:
    """Between the one-node cap (256 KiB) and the cluster cap (16 MiB): refused, nothing cached."""
    cfg = fake(tmp_path, HEAD + b"x" * (2 << 20) + b"\n")
    got = view(cfg)
    assert isinstance(got, ProbeError) and "more than" in got.message
    assert not state_file(tmp_path).exists()


def test_a_node_name_no_host_has_is_not_cached(tmp_path: Path) -> None:
    cfg = fake(tmp_path, b"NodeName=" + b"n" * 100_000 + b" State=IDLE\n")
    cfg.write_text(cfg.read_text().replace('node_name = "n1"', f'node_name = "{"n" * 100_000}"'))
    got = node_view(load(str(cfg)), "n" * 100_000, "healthcheck", 60.0)
    assert not isinstance(got, ProbeError) or "did not describe" in got.message
    assert not state_file(tmp_path).exists()


def test_the_state_writer_refuses_what_its_reader_would(tmp_path: Path) -> None:
    sd = str(tmp_path / "state")
    assert slurmstate.update(sd, lambda s: s.__class__(clean_runs=3), 1.0) is not None
    before = state_file(tmp_path).read_bytes()
    logged: list[str] = []
    huge = {"name": "n1", "reason": "x" * (files.MAX_READ + 1)}
    got = slurmstate.update(
        sd, lambda s: s.__class__(clean_runs=4, slurm_node=huge), 1.0, log=lambda msg, **kw: logged.append(msg)
    )
    assert got is None and "not written" in logged[0]
    assert state_file(tmp_path).read_bytes() == before  # the last good state stands
    assert slurmstate.load(sd).clean_runs == 3
    assert os.path.getsize(state_file(tmp_path)) < 4096
