"""Suite-wide rules.

Under CI (``CI`` set), a skipped test marked ``real`` (a real Slurm, Prometheus, systemd
tool) is turned into a failure: CI must install and start what those tests need.

The host's state dirs are out of reach: the defaults of ``[paths]`` lie in a sandbox of the run
(``NODEHEALTH_DEFAULT_ROOT``) for this process and every program the tests start, and a guard fails a
test whose own process (or a child it forked) changes ``/run/nodehealth`` or ``/var/lib/nodehealth``.

Time budgets: the ``timing`` fixture scales a quiet machine's margins by the child start-up measured
once per session; tests that depend on the scheduler are marked ``timing`` (``make test-busy``).
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import hostguard
import pytest

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "examples" / "scenarios"


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    if report.skipped and _in_ci() and item.get_closest_marker("real") is not None:
        report.outcome = "failed"
        reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr
        report.longrepr = f"real-component test skipped under CI (install and start what it needs): {reason}"


@pytest.fixture
def scenario():
    """Path of a shipped scenario by file stem."""

    def _get(name: str) -> str:
        path = SCENARIOS / f"{name}.toml"
        assert path.exists(), path
        return str(path)

    return _get


# Time budgets in tests. A budget a test checks (a hang answered within its deadline plus a
# margin, a reply within so long) holds on a quiet machine with the margin written in the test; on a
# loaded one every process start, fork and wake-up is slower. `timing.slack(margin_s)` scales the
# margin by how much slower than on a quiet machine a child process starts now (measured once per
# session: the median of a few fork+exec of `python -I -c pass` and of a bare fork). What is tested
# stays: a hang is still found at its deadline, a budget still bounds the run. Tests that depend on
# the scheduler carry the marker `timing` (make test-busy runs them with every core busy).
QUIET_STARTUP_S = 0.03  # `python -I -c pass` on a quiet 2-core machine (Debian 12, Python 3.11)
QUIET_FORK_S = 0.002
MAX_SCALE = 20.0  # past this the machine is too slow for any budget to mean something


@dataclass(frozen=True)
class Timing:
    """The child start-up measured in this session and the margins scaled from it."""

    startup_s: float  # median wall time of fork+exec of `python -I -c pass`
    fork_s: float  # median wall time of a fork whose child exits at once, until it is reaped

    @property
    def scale(self) -> float:
        """How much slower than a quiet machine: 1.0 at best, at most MAX_SCALE."""
        return min(MAX_SCALE, max(1.0, self.startup_s / QUIET_STARTUP_S, self.fork_s / QUIET_FORK_S))

    def slack(self, quiet_s: float) -> float:
        """A margin of ``quiet_s`` on a quiet machine, as much more as this machine is slower now."""
        return quiet_s * self.scale


def _median_s(run: Callable[[], None], n: int = 5) -> float:
    times = []
    for _ in range(n):
        t0 = time.monotonic()
        run()
        times.append(time.monotonic() - t0)
    return statistics.median(times)


def _fork_and_reap() -> None:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)


@functools.cache
def measured_timing() -> Timing:
    """This session's ``Timing`` (measured on first use)."""
    startup = _median_s(lambda: subprocess.run([sys.executable, "-I", "-c", "pass"], check=True, timeout=600))
    return Timing(startup_s=startup, fork_s=_median_s(_fork_and_reap))


@pytest.fixture(scope="session")
def timing() -> Timing:
    return measured_timing()


def pytest_report_header(config: pytest.Config) -> list[str]:
    return [f"host state dirs out of reach: defaults of [paths] under {SANDBOX_ROOT}"]


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if measured_timing.cache_info().currsize:
        t = measured_timing()
        terminalreporter.write_line(
            f"timing: child start-up {t.startup_s * 1000:.0f} ms, "
            f"fork {t.fork_s * 1000:.1f} ms (margins x{t.scale:.1f})"
        )


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", help="rewrite golden files from current output")


# The suite never changes the host outside its own sandbox. The production state dirs (the
# defaults of [paths]: this boot's under /run, what outlives a boot under /var/lib) are out of
# reach by construction: before anything of nodehealth is imported, the defaults are moved under a
# directory of this run (NODEHEALTH_DEFAULT_ROOT, read by nodehealth.config.lean), for this process
# and, through the environment, every program the tests start. The guard then looks at what this
# process and its forked children do there (tests/hostguard.py): a daemon or an administrator's
# `nodehealth check` on the host writes its own files without failing a test.
HOST_STATE_DIRS = ("/run/nodehealth", "/var/lib/nodehealth")
GUARDED_ENV = "NODEHEALTH_TEST_GUARDED_DIRS"  # a test of the guard points it at dirs of its own
DEFAULT_ROOT_ENV = "NODEHEALTH_DEFAULT_ROOT"  # nodehealth.config.lean.DEFAULT_ROOT_ENV


def _sandbox_root() -> tuple[str, bool]:
    inherited = os.environ.get(DEFAULT_ROOT_ENV, "")
    if inherited.startswith("/") and os.path.isdir(inherited):  # a session started by a test: its parent's
        return inherited, False
    root = tempfile.mkdtemp(prefix="nodehealth-tests-")
    for sub in ("run", "var/lib"):  # the parents /run and /var/lib of the production defaults
        os.makedirs(os.path.join(root, sub), mode=0o755)
    # /run/nodehealth, as the unit's RuntimeDirectory makes it: the prolog's fast-path settings are kept there
    # (nodehealth.config.snapshot) also for a config whose state_dir is elsewhere, as every test config's is.
    os.mkdir(os.path.join(root, "run", "nodehealth"), 0o700)
    os.chmod(root, 0o755)
    return root, True


SANDBOX_ROOT, _OWN_SANDBOX = _sandbox_root()
if _OWN_SANDBOX:  # also when pytest ends without unconfiguring (an internal error, an interrupt)
    atexit.register(shutil.rmtree, SANDBOX_ROOT, ignore_errors=True)
os.environ[DEFAULT_ROOT_ENV] = SANDBOX_ROOT
_GUARD_LOG = os.open(
    os.path.join(SANDBOX_ROOT, f"host-writes.{os.getpid()}.log"),
    os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC,
    0o600,
)
GUARDED = tuple(os.environ.get(GUARDED_ENV, ":".join(HOST_STATE_DIRS)).split(":"))
hostguard.install(GUARDED, _GUARD_LOG)


def pytest_unconfigure(config: pytest.Config) -> None:
    os.close(_GUARD_LOG)
    if _OWN_SANDBOX:
        shutil.rmtree(SANDBOX_ROOT, ignore_errors=True)


@pytest.fixture(autouse=True)
def _host_state_dir_untouched(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    start = os.fstat(_GUARD_LOG).st_size
    yield
    changes, _ = hostguard.taken(_GUARD_LOG, start)
    assert not changes, (
        f"{request.node.nodeid} changed the host's state dirs "
        f"{', '.join(GUARDED)} (give it a state dir of its own):\n{changes}"
    )
