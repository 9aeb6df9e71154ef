"""The systemd unit: `systemd-analyze verify` on a copy whose ExecStart points at this checkout's entry point."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
UNIT = ROOT / "packaging" / "systemd" / "nodehealth.service"
ANALYZE = shutil.which("systemd-analyze")


def test_unit_has_what_the_daemon_needs():
    text = UNIT.read_text()
    for line in ("Type=notify", "WatchdogSec=", "Restart=on-failure", "ProtectSystem=strict", "ProtectHome=yes",
                 "PrivateTmp=yes", "NoNewPrivileges=yes", "ReadWritePaths=/run/nodehealth", "DeviceAllow=/dev/kmsg",
                 "DeviceAllow=char-nvidia-frontend", "MemoryMax=", "CPUQuota=", "RestartPreventExitStatus=2",
                 "ExecReload=/bin/kill -HUP $MAINPID"):
        assert line in text, line


@pytest.mark.real
@pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze not installed (Debian package systemd)")
def test_systemd_analyze_verify(tmp_path):
    exe = Path(sys.executable).parent / "nodehealth"
    if not exe.exists():
        exe = Path(shutil.which("nodehealth") or "/usr/bin/nodehealth")
    unit = tmp_path / "nodehealth.service"
    unit.write_text(UNIT.read_text().replace("ExecStart=/usr/bin/nodehealth", f"ExecStart={exe}"))
    res = subprocess.run([ANALYZE, "verify", str(unit)], capture_output=True, text=True)
    out = (res.stdout + res.stderr).strip()
    assert res.returncode == 0, out
    assert "nodehealth.service" not in out, out  # no warning about our unit
