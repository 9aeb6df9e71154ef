"""Journal logging with structured fields: the one Log of the faces and the daemon (nodehealth/platform/log.py).

The real-library tests run Debian's python3-systemd (sd_journal_sendv in libsystemd) in a private mount
namespace (``unshare -m``, root) where a test socket stands at /run/systemd/journal/socket, journald's
own address, so nothing reaches the host's journal (tests/journal_ns.py)."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nodehealth.daemon.logs import Log as DaemonLog
from nodehealth.platform import log as facelog
from nodehealth.platform import sdnotify

ROOT = Path(__file__).resolve().parent.parent
SYSTEM_PYTHON = "/usr/bin/python3"


def _why_not_real() -> str:
    if os.geteuid() != 0:
        return "needs root for a private mount namespace (unshare -m)"
    if shutil.which("unshare") is None:
        return "unshare missing (util-linux)"
    probe = subprocess.run([SYSTEM_PYTHON, "-c", "import systemd.journal"], capture_output=True)
    if probe.returncode != 0:
        return "Debian's systemd bindings are missing (python3-systemd; make system-deps)"
    if subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        return "this machine does not allow mount namespaces"
    return ""


WHY = _why_not_real()


def in_namespace(code: str) -> dict:
    """Run ``code`` under Debian's Python (its python3-systemd), the checkout first on the path."""
    res = subprocess.run(
        [
            "unshare",
            "-m",
            SYSTEM_PYTHON,
            str(ROOT / "tests" / "journal_ns.py"),
            "--",
            SYSTEM_PYTHON,
            "-c",
            f"import sys; sys.path.insert(0, {str(ROOT)!r})\n{code}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    out = json.loads(res.stdout)
    assert out["rc"] == 0, out
    return out


def test_face_fields_from_a_result_line():
    fields = facelog.journal_fields("FAIL gpu_ecc: GPU 3: 2 volatile uncorrectable errors", "42", "prolog")
    assert fields["NODEHEALTH_CHECK"] == "gpu_ecc" and fields["NODEHEALTH_GPU"] == "3"
    assert fields["NODEHEALTH_JOB"] == "42" and fields["NODEHEALTH_STATUS"] == "FAIL"
    assert fields["PRIORITY"] == "3" and fields["SYSLOG_IDENTIFIER"] == "nodehealth-prolog"
    plain = facelog.journal_fields("fast path not taken: stale", None, "epilog", notable=True)
    assert "NODEHEALTH_CHECK" not in plain and "NODEHEALTH_JOB" not in plain and plain["PRIORITY"] == "4"
    assert facelog.journal_fields("WARN gpu_pcie: 8 GPU(s) x8", None, "healthcheck")["PRIORITY"] == "4"
    explicit = facelog.journal_fields("drained", "7", "epilog", check="gpu_xid", gpu=1, status="FAIL")
    assert explicit["NODEHEALTH_CHECK"] == "gpu_xid" and explicit["NODEHEALTH_GPU"] == "1"


def test_face_without_the_journal_writes_stderr(monkeypatch, capsys):
    monkeypatch.setattr(sdnotify, "JOURNAL_SOCKET", "/nonexistent/socket")
    facelog.Log("prolog", "9")("FAIL gpu_ecc: GPU 0: bad")
    assert capsys.readouterr().err == "nodehealth-prolog[job 9]: FAIL gpu_ecc: GPU 0: bad\n"


def test_daemon_fields_and_priority_by_status():
    sent: list[tuple[str, dict]] = []
    log = DaemonLog(journal=lambda message, **kw: sent.append((message, kw)))
    log("FAIL gpu_ecc: bad", check="gpu_ecc", gpu=2, job="5", status="FAIL")
    log("round done")
    (m1, f1), (_, f2) = sent
    assert f1["NODEHEALTH_CHECK"] == "gpu_ecc" and f1["NODEHEALTH_GPU"] == "2" and f1["NODEHEALTH_JOB"] == "5"
    assert f1["PRIORITY"] == "3" and f2["PRIORITY"] == "6"  # journal fields are strings, a face's and the daemon's
    stream = io.StringIO()
    DaemonLog(stream=stream)("WARN gpu_pcie: x8", check="gpu_pcie", status="WARN")
    assert stream.getvalue() == "nodehealth-daemon: warning: WARN gpu_pcie: x8 [check=gpu_pcie status=WARN]\n"


@pytest.mark.real
@pytest.mark.skipif(bool(WHY), reason=WHY or "-")
def test_face_logs_through_the_real_library():
    out = in_namespace(
        "from nodehealth.faces.log import Log\n"
        "log = Log('prolog', '4711')\n"
        "log('FAIL gpu_remapped_rows: GPU 1: a row remap is pending', notable=True)\n"
        "log('daemon verdict HEALTHY (0.4 s old, round 3): fast path')\n"
    )
    first, second = out["entries"]
    assert first["MESSAGE"] == "FAIL gpu_remapped_rows: GPU 1: a row remap is pending"
    assert first["NODEHEALTH_CHECK"] == "gpu_remapped_rows" and first["NODEHEALTH_GPU"] == "1"
    assert first["NODEHEALTH_JOB"] == "4711" and first["PRIORITY"] == "3"
    assert first["SYSLOG_IDENTIFIER"] == "nodehealth-prolog" and first["NODEHEALTH_FACE"] == "prolog"
    assert "CODE_FILE" in first  # sent by python3-systemd's journal.send, not by hand
    assert second["PRIORITY"] == "6" and "NODEHEALTH_CHECK" not in second
    assert "nodehealth-prolog[job 4711]: FAIL gpu_remapped_rows" in out["stderr"]  # slurmd's copy


@pytest.mark.real
@pytest.mark.skipif(bool(WHY), reason=WHY or "-")
def test_daemon_logs_through_the_real_library():
    out = in_namespace(
        "from nodehealth.daemon.logs import Log\n"
        "log = Log.default()\n"
        "assert log.journal is not None, 'journal_sender() found no journal'\n"
        "log('XID 79 on GPU 4: GPU has fallen off the bus', 'err', xid=79, gpu=4, job='12')\n"
        "log('WARN gpu_pcie: GPU 2 at x8', check='gpu_pcie', gpu=2, status='WARN')\n"
    )
    xid, pcie = out["entries"]
    assert xid["NODEHEALTH_XID"] == "79" and xid["NODEHEALTH_GPU"] == "4" and xid["NODEHEALTH_JOB"] == "12"
    assert xid["PRIORITY"] == "3" and xid["SYSLOG_IDENTIFIER"] == "nodehealth-daemon"
    assert pcie["NODEHEALTH_CHECK"] == "gpu_pcie" and pcie["PRIORITY"] == "4"
    assert out["stderr"] == ""  # the journal took them: no stderr copy


def _python_for_debians_bindings() -> str:
    """A Python with the checkout's dependencies that can load Debian's python3-systemd (a C extension built
    for Debian's Python version): this one when its version matches, else the project's .venv (make test builds
    it first; under `make pytest39` this process is a 3.9)."""
    want = subprocess.run(
        [SYSTEM_PYTHON, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True
    ).stdout.strip()
    if want == str(sys.version_info[:2]):
        return sys.executable
    return str(ROOT / ".venv" / "bin" / "python")


JOURNAL_REMOTE = next(
    (
        p
        for p in ("/lib/systemd/systemd-journal-remote", "/usr/lib/systemd/systemd-journal-remote")
        if os.path.exists(p)
    ),
    None,
)


@pytest.mark.real
@pytest.mark.skipif(
    bool(WHY) or JOURNAL_REMOTE is None,
    reason=WHY or "systemd-journal-remote missing (Debian package systemd-journal-remote)",
)
def test_xid_scan_journal_reads_the_real_journal(tmp_path):
    """``xid scan --journal`` through python3-systemd's Reader over a journal file written by
    systemd-journal-remote, holding one kernel record of this boot, mounted (in the namespace) where the
    system journal lives."""
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")
    machine = Path("/etc/machine-id").read_text().strip() if Path("/etc/machine-id").exists() else "0" * 32
    msg = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."
    export = (
        f"__REALTIME_TIMESTAMP=1764590000000000\n__MONOTONIC_TIMESTAMP=94570000\n_BOOT_ID={boot}\n"
        f"_MACHINE_ID={machine}\n_TRANSPORT=kernel\nPRIORITY=3\nSYSLOG_IDENTIFIER=kernel\nMESSAGE={msg}\n\n"
    )
    (tmp_path / "in.export").write_text(export)
    journal = tmp_path / "j" / machine
    journal.mkdir(parents=True)
    made = subprocess.run(
        [JOURNAL_REMOTE, f"--output={journal}/system.journal", str(tmp_path / "in.export")],
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0, made.stderr
    code = (
        f"import os, subprocess, sys\n"
        f"subprocess.run(['mount', '--bind', {str(tmp_path / 'j')!r}, '/run/log/journal'], check=True)\n"
        f"if os.path.isdir('/var/log/journal'):\n"
        f"    subprocess.run(['mount', '-t', 'tmpfs', 'nodehealth-test', '/var/log/journal'], check=True)\n"
        f"sys.path.append('/usr/lib/python3/dist-packages')\n"
        f"from nodehealth.cli import main\n"
        f"sys.argv = ['nodehealth', 'xid', 'scan', '--journal', '--format', 'json', '--no-nvml']\n"
        f"main()\n"
    )
    script = tmp_path / "scan.py"
    script.write_text(code)
    # The checkout's venv Python (hostlist, pynvml), Debian's python3-systemd appended after them.
    # In the namespace: a tmpfs over /run (the host's /run is not touched), the file at /run/log/journal.
    res = subprocess.run(
        [
            "unshare",
            "-m",
            "sh",
            "-c",
            "mount --make-rprivate / && mount -t tmpfs nodehealth-test "
            f"/run && mkdir -p /run/log/journal && exec {_python_for_debians_bindings()} {script}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert res.returncode in (0, 1), res.stdout + res.stderr
    events = json.loads(res.stdout)
    assert "79" in res.stdout and "fallen off the bus" in res.stdout, res.stdout + res.stderr
    assert events, res.stdout
