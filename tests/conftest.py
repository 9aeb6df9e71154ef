"""Suite-wide rules.

Under CI (``CI`` set), a skipped test marked ``real`` (a real Slurm, Prometheus, systemd
tool) is turned into a failure: CI must install and start what those tests need.
"""

from __future__ import annotations

import os
from pathlib import Path

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


# The suite never changes the host outside its own sandbox: the production state dirs (the
# defaults of [paths]: this boot's under /run, what outlives a boot under /var/lib) must look the
# same after every test as before it.
HOST_STATE_DIRS = (Path("/run/nodehealth"), Path("/var/lib/nodehealth"))


def _host_state() -> object:
    return [sorted((p.name, p.stat().st_mtime_ns, p.stat().st_size) for p in d.iterdir()) if d.exists() else None
            for d in HOST_STATE_DIRS]


@pytest.fixture(autouse=True)
def _host_state_dir_untouched(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    before = _host_state()
    yield
    after = _host_state()
    assert after == before, (f"{request.node.nodeid} changed the host's {' or '.join(map(str, HOST_STATE_DIRS))} "
                             f"(give it a state dir of its own): {before} -> {after}")
