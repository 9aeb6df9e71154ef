"""Suite-wide rules.

Under CI (``CI`` set), a skipped test marked ``real`` (a real Slurm, Prometheus, systemd
tool) is turned into a failure: CI must install and start what those tests need.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

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
    os.chmod(root, 0o755)
    return root, True


SANDBOX_ROOT, _OWN_SANDBOX = _sandbox_root()
os.environ[DEFAULT_ROOT_ENV] = SANDBOX_ROOT
_GUARD_LOG = os.open(os.path.join(SANDBOX_ROOT, f"host-writes.{os.getpid()}.log"),
                     os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
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
    assert not changes, (f"{request.node.nodeid} changed the host's state dirs "
                         f"{', '.join(GUARDED)} (give it a state dir of its own):\n{changes}")
