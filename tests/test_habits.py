"""The habits: strict mypy where the issue asks for it, the pre-commit hooks, the busy-machine run
and its marker (a test whose margins scale with the machine's load says so)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"

STRICT_PACKAGES = ("nodehealth.checks.*", "nodehealth.slurm.*", "nodehealth.statedir.*", "nodehealth.config.*")
# mypy --strict's per-module flags (warn_unused_ignores is on for every module already).
STRICT_FLAGS = (
    "disallow_any_generics",
    "disallow_subclassing_any",
    "disallow_untyped_calls",
    "disallow_untyped_defs",
    "disallow_incomplete_defs",
    "disallow_untyped_decorators",
    "warn_return_any",
    "no_implicit_reexport",
    "strict_equality",
)


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_mypy_is_strict_on_checks_slurm_statedir_and_config() -> None:
    mypy = _pyproject()["tool"]["mypy"]
    assert mypy["check_untyped_defs"] and mypy["warn_unused_ignores"]
    strict = [o for o in mypy.get("overrides", []) if set(STRICT_PACKAGES) <= set(o["module"])]
    assert len(strict) == 1, mypy.get("overrides")
    assert {f: strict[0].get(f) for f in STRICT_FLAGS} == dict.fromkeys(STRICT_FLAGS, True)


def test_pre_commit_runs_ruff_check_ruff_format_and_mypy_from_the_venv() -> None:
    text = (ROOT / ".pre-commit-config.yaml").read_text()
    for entry in ("entry: .venv/bin/ruff check", "entry: .venv/bin/ruff format --check", "entry: .venv/bin/mypy\n"):
        assert entry in text, entry
    assert "repo: local" in text and "language: system" in text


def timing_tests_unmarked(test_dir: Path) -> list[str]:
    """``file::test`` of each test that takes the ``timing`` fixture without the ``timing`` marker
    (on the function or the module's ``pytestmark``)."""

    def marks(node: ast.AST) -> bool:
        return "pytest.mark.timing" in ast.unparse(node)

    out = []
    for path in sorted(test_dir.glob("test_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        module_marked = any(
            isinstance(n, ast.Assign) and any(ast.unparse(t) == "pytestmark" for t in n.targets) and marks(n.value)
            for n in tree.body
        )
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef) or not node.name.startswith("test"):
                continue
            if (
                "timing" in [a.arg for a in node.args.args]
                and not module_marked
                and not any(marks(d) for d in node.decorator_list)
            ):
                out.append(f"{path.name}::{node.name}")
    return out


def test_tests_that_scale_their_margins_carry_the_timing_marker() -> None:
    markers = _pyproject()["tool"]["pytest"]["ini_options"]["markers"]
    assert any(m.startswith("timing:") for m in markers), markers
    found = timing_tests_unmarked(TESTS)
    assert not found, "mark them @pytest.mark.timing (make test-busy runs those):\n" + "\n".join(found)


def test_rule_timing_marker_can_fail(tmp_path: Path) -> None:
    (tmp_path / "test_a.py").write_text(
        "import pytest\n"
        "def test_unmarked(timing):\n    pass\n"
        "@pytest.mark.timing\ndef test_marked(timing):\n    pass\n"
        "def test_no_fixture():\n    pass\n"
    )
    (tmp_path / "test_b.py").write_text(
        "import pytest\npytestmark = pytest.mark.timing\ndef test_module_marked(timing):\n    pass\n"
    )
    assert timing_tests_unmarked(tmp_path) == ["test_a.py::test_unmarked"]


@pytest.mark.timing
def test_the_timing_fixture_measures_this_machine(timing) -> None:  # type: ignore[no-untyped-def]
    assert 0 < timing.startup_s < 60 and 0 < timing.fork_s < 60
    assert timing.slack(0.5) == 0.5 * timing.scale


def test_the_scale_is_the_slower_of_start_up_and_fork_and_clamped() -> None:
    """The margins grow with whichever of the two measurements is slower than a quiet machine's, never
    shrink below a quiet machine's, and stop at MAX_SCALE."""
    from conftest import MAX_SCALE, QUIET_FORK_S, QUIET_STARTUP_S, Timing

    assert Timing(QUIET_STARTUP_S * 3, QUIET_FORK_S).scale == pytest.approx(3.0)
    assert Timing(QUIET_STARTUP_S, QUIET_FORK_S * 5).scale == pytest.approx(5.0)
    assert Timing(QUIET_STARTUP_S / 10, QUIET_FORK_S / 10).scale == 1.0
    assert Timing(QUIET_STARTUP_S * 1000, QUIET_FORK_S).scale == MAX_SCALE
    assert Timing(QUIET_STARTUP_S * 4, QUIET_FORK_S).slack(0.5) == pytest.approx(2.0)


def test_busy_runs_the_command_with_a_hog_per_core_and_ends_them(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    # The command writes down the hogs it runs beside, each alive then, and exits 3.
    code = (
        "import os, sys; hogs = os.environ['BUSY_HOG_PIDS'].split(); "
        "assert all(os.path.exists(f'/proc/{p}') for p in hogs); "
        "open(sys.argv[1], 'w').write(' '.join(hogs)); sys.exit(3)"
    )
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "busy.sh"), sys.executable, "-c", code, str(pids)],
        env={**os.environ, "HOGS": "2"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 3, proc.stderr
    hogs = [int(p) for p in pids.read_text().split()]
    assert len(hogs) == 2, (hogs, proc.stderr)
    end = time.monotonic() + 60
    while any(Path(f"/proc/{p}").exists() for p in hogs) and time.monotonic() < end:
        time.sleep(0.05)
    assert not [p for p in hogs if Path(f"/proc/{p}").exists()], "a hog outlived busy.sh"
    assert "2 CPU hogs" in proc.stderr
