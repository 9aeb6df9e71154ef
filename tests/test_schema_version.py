"""Every JSON document the program prints for others carries ``schema_version`` (docs/output.md, "Stability").

Each command runs as a user would run it (``python -m nodehealth``) on a config of the test's own
sandbox; a document, or every line of a JSON-lines output, must hold ``schema_version`` equal to
``nodehealth.SCHEMA_VERSION``. A command added to the program that prints JSON without it fails
here once it is listed below; the list is the one of docs/output.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nodehealth import SCHEMA_VERSION

ROOT = Path(__file__).resolve().parent.parent
REAL = ROOT / "tests" / "fixtures" / "real-world"
SCENARIO = ROOT / "examples" / "scenarios" / "row-remap-pending.toml"

COMMANDS = {
    "check": ["check", "--simulate", str(SCENARIO), "--format", "json"],
    "check --as": ["check", "--as", "prolog", "--simulate", str(SCENARIO), "--format", "json"],
    "status": ["status", "--format", "json"],
    "config check": ["config", "check", "--format", "json"],
    "xid explain": ["xid", "explain", "79", "--format", "json"],
    "nccl parse": ["nccl", "parse", str(REAL / "nccl_tests" / "gcm_single_node_8xA100.txt"), "--format", "json"],
    "nccl transport": [
        "nccl",
        "transport",
        str(REAL / "nccl_debug" / "ib_nccl_1657_net_ib_without_gdr.txt"),
        "--format",
        "json",
    ],
}


def _run(tmp: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    (tmp / "sys").mkdir(exist_ok=True)
    cfg = tmp / "nh.toml"
    cfg.write_text(f'[paths]\nsysfs_root = "{tmp / "sys"}"\nstate_dir = "{tmp / "state"}"\n', encoding="utf-8")
    if argv[0] in ("check", "status"):
        argv = [argv[0], "--config", str(cfg), *argv[1:]]
    elif argv[:2] == ["config", "check"]:
        argv = [*argv[:2], str(cfg), *argv[2:]]
    return subprocess.run(
        [sys.executable, "-m", "nodehealth", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "SLURMD_NODENAME": "gpu042", "NO_COLOR": "1"},
    )


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_json_document_names_its_schema_version(tmp_path: Path, name: str) -> None:
    proc = _run(tmp_path, COMMANDS[name])
    assert proc.returncode in (0, 1, 4), (proc.returncode, proc.stderr)
    doc = json.loads(proc.stdout)
    assert isinstance(doc, dict) and doc.get("schema_version") == SCHEMA_VERSION, (name, proc.stdout[:300])


def test_every_line_of_xid_scan_json_names_its_schema_version(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_bytes(
        b"[  100.000000] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.\n"
        b"Dec  1 10:00:00 node kernel: NVRM: Xid (PCI:0000:86:00): 48, pid=2345, DBE (0x1)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "nodehealth", "xid", "scan", "--from", str(log), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    assert lines, (proc.returncode, proc.stderr)
    for line in lines:
        assert json.loads(line).get("schema_version") == SCHEMA_VERSION, line
