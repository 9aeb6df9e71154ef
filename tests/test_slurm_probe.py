"""The ``slurm_node`` probe: one scontrol call through slurm.client, a SlurmNode (NodeInfo) out."""

from __future__ import annotations

import os
from pathlib import Path

from nodehealth.observations import ProbeError, SlurmNode
from nodehealth.probes.slurm import show_node

REAL = Path(__file__).parent / "fixtures" / "real-world" / "scontrol" / "irush_slurm1711_four_nodes_one_drained.txt"


def fake_scontrol(tmp_path: Path, body: str, code: int = 0) -> str:
    out = tmp_path / "out.txt"
    out.write_text(body)
    seen = tmp_path / "conf.txt"
    script = tmp_path / "scontrol"
    script.write_text(f'#!/bin/sh\necho "$SLURM_CONF" > {seen}\ncat {out}\nexit {code}\n')
    script.chmod(0o755)
    return str(script)


def test_real_output_gives_gres_state_and_the_conf_it_was_told(tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_CONF", raising=False)
    got = show_node(fake_scontrol(tmp_path, REAL.read_text()), "cortex-01", 2.0, slurm_conf="/etc/slurm/x.conf")
    assert isinstance(got, SlurmNode)
    assert (got.name, got.gres_gpus, got.state.text, got.state.base) == ("cortex-01", 8, "ALLOCATED", "ALLOCATED")
    assert (tmp_path / "conf.txt").read_text().strip() == "/etc/slurm/x.conf"


def test_node_missing_from_the_output_or_scontrol_missing_is_a_probe_error(tmp_path):
    got = show_node(fake_scontrol(tmp_path, REAL.read_text()), "nosuch-01", 2.0)
    assert isinstance(got, ProbeError) and got.probe == "slurm_node" and "nosuch-01" in got.message
    missing = show_node(os.path.join(str(tmp_path), "no-scontrol"), "cortex-01", 2.0)
    assert isinstance(missing, ProbeError) and missing.kind == "unavailable"
