"""The systemd unit: its parsed settings, and `systemd-analyze verify` on a copy whose ExecStart points at this
checkout's entry point."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from private_systemd import PrivateSystemd, bind_refused, our_cgroups
from private_systemd import why_not as private_why_not

ROOT = Path(__file__).resolve().parent.parent
UNIT = ROOT / "packaging" / "systemd" / "nodehealth.service"
ANALYZE = shutil.which("systemd-analyze")

Unit = dict[str, dict[str, list[str]]]


def parse_unit(text: str) -> Unit:
    """``{section: {key: [values]}}`` as systemd reads a unit file (systemd.syntax(7)).

    Lines starting with ``#`` or ``;`` are comments; a trailing backslash continues a line; a key
    may be assigned several times (list settings accumulate) and an empty assignment resets it.
    """
    unit: Unit = {}
    section = None
    lines = iter(text.splitlines())
    for raw in lines:
        line = raw.strip()
        while line.endswith("\\"):
            line = line[:-1].rstrip() + " " + next(lines, "").strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            unit.setdefault(section, {})
            continue
        assert section is not None, f"assignment outside a section: {raw!r}"
        key, sep, value = line.partition("=")
        assert sep, f"not a key=value line: {raw!r}"
        values = unit[section].setdefault(key.strip(), [])
        value = value.strip()
        if value:
            values.append(value)
        else:
            values.clear()
    return unit


def last(unit: Unit, key: str, section: str = "Service") -> str:
    """The value a single-valued setting takes: its last assignment ('' when unset)."""
    values = unit.get(section, {}).get(key, [])
    return values[-1] if values else ""


def words(unit: Unit, key: str, section: str = "Service") -> list[str]:
    return [w for v in unit.get(section, {}).get(key, []) for w in v.split()]


_TIME = re.compile(r"^(\d+(\.\d+)?\s*(us|ms|s|sec|m|min|h|hr)?\s*)+$")


def positive_time(value: str) -> bool:
    """A systemd time span above zero ("0" switches a timeout or the watchdog off)."""
    return bool(_TIME.match(value)) and any(c in "123456789" for c in value)


# What the daemon needs from its unit: (setting, predicate on the parsed unit).
REQUIRED = (
    ("Type", lambda u: last(u, "Type") == "notify"),
    ("WatchdogSec", lambda u: positive_time(last(u, "WatchdogSec"))),
    ("Restart", lambda u: last(u, "Restart") == "on-failure"),
    ("RestartPreventExitStatus", lambda u: "2" in words(u, "RestartPreventExitStatus")),
    ("ExecReload", lambda u: last(u, "ExecReload") == "/bin/kill -HUP $MAINPID"),
    ("ProtectSystem", lambda u: last(u, "ProtectSystem") == "strict"),
    ("ReadWritePaths", lambda u: "/run/nodehealth" in words(u, "ReadWritePaths")),
    # The state dir holds the config text, user names and the verdict a prolog trusts: root's alone
    # (docs/security.md); the daemon refuses one writable by others, and nothing else may read it.
    (
        "RuntimeDirectoryMode",
        lambda u: last(u, "RuntimeDirectory") == "nodehealth" and last(u, "RuntimeDirectoryMode") == "0700",
    ),
    # What must outlive a reboot ([paths] persistent_dir, /var/lib/nodehealth): the same discipline.
    (
        "StateDirectoryMode",
        lambda u: last(u, "StateDirectory") == "nodehealth" and last(u, "StateDirectoryMode") == "0700",
    ),
    ("ProtectHome", lambda u: last(u, "ProtectHome") == "yes"),
    ("PrivateTmp", lambda u: last(u, "PrivateTmp") == "yes"),
    ("NoNewPrivileges", lambda u: last(u, "NoNewPrivileges") == "yes"),
    (
        "DeviceAllow",
        lambda u: (
            {"/dev/kmsg", "char-nvidia-frontend"} <= {v.split()[0] for v in u.get("Service", {}).get("DeviceAllow", [])}
        ),
    ),
    ("MemoryMax", lambda u: last(u, "MemoryMax") not in ("", "infinity")),
    ("CPUQuota", lambda u: last(u, "CPUQuota").endswith("%")),
)


def unmet(unit: Unit) -> list[str]:
    """The settings of REQUIRED the unit does not satisfy."""
    return [key for key, ok in REQUIRED if not ok(unit)]


def test_unit_has_what_the_daemon_needs():
    unit = parse_unit(UNIT.read_text())
    assert unmet(unit) == []
    assert last(unit, "ExecStart").startswith("/usr/bin/nodehealth daemon")
    assert last(unit, "WantedBy", "Install") == "multi-user.target"


def _commented_out(key: str) -> str:
    return "".join(
        f"# {line}" if line.startswith(f"{key}=") else line for line in UNIT.read_text().splitlines(keepends=True)
    )


@pytest.mark.parametrize("key", [key for key, _ in REQUIRED])
def test_a_commented_out_setting_is_missing(key):
    text = _commented_out(key)
    assert f"# {key}=" in text  # the line is still in the file, as a comment
    assert unmet(parse_unit(text)) == [key]


def test_parser_reads_systemd_syntax():
    unit = parse_unit(
        "[Service]\n; a comment\nDeviceAllow=/dev/a rw\nDeviceAllow=\nDeviceAllow=/dev/b \\\n  r\n"
        "WatchdogSec=0\n[Install]\nWantedBy=x.target\n"
    )
    assert unit["Service"]["DeviceAllow"] == ["/dev/b r"]  # the empty assignment reset the list
    assert "WatchdogSec" in unmet(unit) and last(unit, "WantedBy", "Install") == "x.target"
    with pytest.raises(AssertionError):
        parse_unit("Type=notify\n")


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


def test_the_kernel_log_stays_readable():
    """The XID follower reads /dev/kmsg: ProtectKernelLogs=yes would hide it and drop CAP_SYSLOG (so the
    node_exporter-style hardening must not be copied here), and the bounding set must keep CAP_SYSLOG."""
    unit = parse_unit(UNIT.read_text())
    assert last(unit, "ProtectKernelLogs") in ("", "no", "false")
    assert "CAP_SYSLOG" in words(unit, "CapabilityBoundingSet")
    assert "/dev/kmsg r" in unit["Service"]["DeviceAllow"]
    assert last(unit, "DevicePolicy") == "closed"
    assert "@system-service" in words(unit, "SystemCallFilter")


# The exposure docs/install.md records; a change to the unit that raises it must update the docs.
EXPOSURE = 3.2


@pytest.mark.real
@pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze not installed (Debian package systemd)")
def test_systemd_analyze_security_exposure(tmp_path):
    unit = tmp_path / "nodehealth.service"
    unit.write_text(UNIT.read_text())
    res = subprocess.run(
        [ANALYZE, "security", "--offline=true", "--no-pager", str(unit)], capture_output=True, text=True
    )
    found = re.search(r"Overall exposure level for nodehealth.service: (\d+\.\d)", res.stdout)
    assert found, res.stdout + res.stderr
    assert float(found.group(1)) <= EXPOSURE, res.stdout
    assert f"exposure {EXPOSURE}" in (ROOT / "docs" / "install.md").read_text()


def _systemd_runs() -> str:
    """Why the real unit cannot be started here ('' when it can)."""
    if not Path("/run/systemd/system").is_dir():
        comm = Path("/proc/1/comm").read_text().strip() if Path("/proc/1/comm").exists() else "?"
        return f"systemd is not the init system here (PID 1 is {comm!r}), so no unit can be started"
    if os.geteuid() != 0:
        return "starting a system unit needs root"
    if not os.environ.get("CI"):
        return "starting a unit changes the host: CI only"
    return ""


@pytest.mark.skipif(bool(_systemd_runs()), reason=_systemd_runs() or "-")
def test_the_real_unit_starts_and_reports_ready(tmp_path):
    """The shipped unit, hardening and all, under the machine's systemd: a copy named nodehealth-test whose
    daemon runs this checkout over a simulated node, with its state dir outside /run/nodehealth (and outside
    /tmp, which PrivateTmp= hides). Type=notify: `systemctl start` returns once the daemon sent READY=1."""
    work = Path(tempfile.mkdtemp(prefix="nodehealth-unit-", dir="/run"))
    name = "nodehealth-test.service"
    target = Path("/run/systemd/system") / name
    try:
        (work / "state").mkdir()
        config = work / "nodehealth.toml"
        config.write_text(
            f'[paths]\nstate_dir = "{work / "state"}"\n[nvml]\nsimulate = '
            f'"{ROOT / "examples" / "scenarios" / "healthy-8x-h100.toml"}"\n'
        )
        exe = Path(sys.executable).parent / "nodehealth"
        text = UNIT.read_text().replace(
            "ExecStart=/usr/bin/nodehealth daemon --config /etc/nodehealth/nodehealth.toml",
            f"ExecStart={exe} daemon --config {config}",
        )
        text = text.replace("ReadWritePaths=/run/nodehealth", f"ReadWritePaths=/run/nodehealth {work}")
        text = text.replace("StateDirectory=nodehealth", "StateDirectory=nodehealth-test")  # not the host's
        target.write_text(text.replace("ProtectHome=yes", "ProtectHome=read-only"))
        subprocess.run(["systemctl", "daemon-reload"], check=True)
        res = subprocess.run(["systemctl", "start", name], capture_output=True, text=True, timeout=90)
        status = subprocess.run(["systemctl", "status", "--no-pager", "-l", name], capture_output=True, text=True)
        assert res.returncode == 0, res.stderr + status.stdout
        active = subprocess.run(["systemctl", "is-active", name], capture_output=True, text=True).stdout.strip()
        assert active == "active", status.stdout
    finally:
        subprocess.run(["systemctl", "stop", name], capture_output=True)
        target.unlink(missing_ok=True)
        subprocess.run(["systemctl", "daemon-reload"], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree("/var/lib/nodehealth-test", ignore_errors=True)


@pytest.mark.real
@pytest.mark.skipif(bool(private_why_not()), reason=private_why_not() or "-")
def test_the_real_unit_under_a_private_systemd():
    """The shipped unit, hardening and all, under a real systemd booted as PID 1 of private namespaces
    (tests/private_systemd.py), where this machine's own init is not systemd. Type=notify: `systemctl
    start` returns once the daemon sent READY=1; then its first round in the unit's status text, /metrics
    on the namespace's loopback, a reload (SIGHUP) and a clean stop. The machine keeps its /tmp and gets
    no cgroup of the private systemd's."""
    here = Path(sys.executable)  # the checkout's venv, seen through the bind (PrivateTmp= hides /tmp)
    python = f"/run/nh-src/{here.relative_to(ROOT)}" if here.is_relative_to(ROOT) else str(here)
    fd, marker = tempfile.mkstemp(prefix="nodehealth-host-tmp-")
    os.close(fd)
    seen = tempfile.mkdtemp(prefix="nodehealth-bind-", dir="/var/tmp")
    Path(seen, "seen").write_text("from the host's /var/tmp")
    cgroups = {c for base in our_cgroups() for c in base.iterdir() if c.is_dir()}
    try:
        with PrivateSystemd(binds={"/run/nh-src": str(ROOT), "/run/nh-var-tmp": seen}) as sd:
            # A source in a directory the namespace covers with a tmpfs (a checkout in /var/tmp or /tmp) is bound first.
            assert sd.path("/run/nh-var-tmp/seen").read_text() == "from the host's /var/tmp"
            _start_stop_reload(sd, python)
        assert Path(marker).exists()  # a boot that ran sysinit.target would have emptied /tmp
        assert {c for base in our_cgroups() for c in base.iterdir() if c.is_dir()} == cgroups
    finally:
        Path(marker).unlink(missing_ok=True)
        shutil.rmtree(seen, ignore_errors=True)


def _start_stop_reload(sd: PrivateSystemd, python: str) -> None:
    work = sd.path("/run/nh-work")
    (work / "state").mkdir(parents=True)
    (work / "nodehealth.toml").write_text(
        '[paths]\nstate_dir = "/run/nh-work/state"\n'
        '[nvml]\nsimulate = "/run/nh-src/examples/scenarios/healthy-8x-h100.toml"\n'
    )
    text = UNIT.read_text()
    for old, new in (
        (
            "ExecStart=/usr/bin/nodehealth daemon --config /etc/nodehealth/nodehealth.toml",
            f"ExecStart={python} -m nodehealth daemon --config /run/nh-work/nodehealth.toml",
        ),
        (
            "Environment=PYTHONDONTWRITEBYTECODE=1",
            "Environment=PYTHONDONTWRITEBYTECODE=1 PYTHONPATH=/run/nh-src:/run/nh-src/sim",
        ),
        ("ReadWritePaths=/run/nodehealth", "ReadWritePaths=/run/nodehealth /run/nh-work"),
        ("ProtectHome=yes", "ProtectHome=read-only"),  # an interpreter installed under /root (pyenv)
    ):
        assert old in text, old
        text = text.replace(old, new)
    name = "nodehealth-test.service"
    sd.path(f"/run/systemd/system/{name}").write_text(text)
    assert sd.run(["systemctl", "daemon-reload"]).returncode == 0
    res = sd.run(["systemctl", "start", name])
    status = sd.run(["systemctl", "status", "--no-pager", "-l", name]).stdout
    assert res.returncode == 0, res.stderr + status
    end = time.monotonic() + 120
    while "round 1:" not in status and time.monotonic() < end:  # the daemon's sd_notify STATUS=
        time.sleep(0.2)
        status = sd.run(["systemctl", "show", "-p", "StatusText", name]).stdout
    assert "round 1: OK" in status, status
    # Nothing else ran: sysinit.target's services (tmpfiles, sysctl, modules-load, ...) are masked.
    ran = sd.run(["systemctl", "list-units", "--all", "--type=service", "--no-legend", "--plain"]).stdout
    assert [u.split()[0] for u in ran.splitlines() if u.split()[2:3] != ["inactive"]] == [name], ran
    scrape = sd.run([python, "-c", _SCRAPE])
    assert scrape.returncode == 0 and "nodehealth_rounds_total" in scrape.stdout, scrape.stderr
    assert sd.run(["systemctl", "reload", name]).returncode == 0
    assert sd.run(["systemctl", "is-active", name]).stdout.strip() == "active"
    assert sd.run(["systemctl", "stop", name]).returncode == 0
    shown = sd.run(["systemctl", "show", "-p", "ActiveState,Result", name]).stdout.split()
    assert sorted(shown) == ["ActiveState=inactive", "Result=success"], shown


_SCRAPE = (
    "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:10915/metrics', timeout=10).read().decode())"
)


@pytest.mark.parametrize(
    "inside, host, refused",
    [
        ("/opt/nh-src", "/srv/checkout", "not under /run"),  # mkdir -p would make /opt/nh-src on this machine
        ("/run/nh-src", "/run/user/0/checkout", "under /run, which the private /run covers"),
        ("/run/nh-src", "checkout", "not a plain absolute path"),
        ("/run/../etc/nh", "/srv/checkout", "not a plain absolute path"),
        ("/run/nh src", "/srv/checkout", "not a plain absolute path"),  # the boot script is shell
    ],
)
def test_a_private_systemd_refuses_a_bind_it_cannot_keep_off_the_machine(inside: str, host: str, refused: str) -> None:
    with pytest.raises(ValueError, match=refused):
        PrivateSystemd(binds={inside: host})


def test_a_private_systemd_takes_a_bind_from_a_covered_directory() -> None:
    assert bind_refused("/run/nh-src", "/var/tmp/checkout") == "" and bind_refused("/run/nh-src", "/tmp/c") == ""
