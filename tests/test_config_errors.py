"""Config validation reports every error at once, each at its file:line, with the nearest known key or
check; a file that does not validate still never switches the checks off."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nodehealth.config import loader as C
from nodehealth.config import locate
from nodehealth.config.use import use

ROOT = Path(__file__).resolve().parent.parent

THREE = """\
# three mistakes, one run
[gpu]
expected_cnt = 8

[checks.gpu_tempreature]
enabled = false

[phases.prolog]
budget_s = 0
"""


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "nodehealth.toml"
    path.write_text(text)
    return str(path)


def test_three_mistakes_one_run_three_errors_each_at_its_line(tmp_path: Path) -> None:
    path = write(tmp_path, THREE)
    proc = subprocess.run(
        [sys.executable, "-m", "nodehealth", "config", "check", path],
        capture_output=True,
        text=True,
        check=False,
        env={k: v for k, v in os.environ.items() if k != "NODEHEALTH_CONFIG"},
    )
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert lines[0] == f"nodehealth: {path}: 3 errors:", proc.stderr
    assert (
        lines[1]
        == f"  {path}:3: gpu.expected_cnt: unknown key (did you mean expected_count?) (known here: expected_count)"
    )
    assert lines[2].startswith(
        f"  {path}:5: checks.gpu_tempreature: unknown check (did you mean gpu_temperature?) (known: "
    )
    assert lines[3] == f"  {path}:9: phases.prolog.budget_s: 0.0 is below the minimum 1"
    assert len(lines) == 4


def test_the_unknown_top_level_key_lists_every_key_the_file_may_have(tmp_path: Path) -> None:
    with pytest.raises(C.ConfigError) as info:
        C.load(write(tmp_path, "node_name = 'a'\nchecsk = 1\n[gpu]\nexpected_count = 8\n"))
    message = str(info.value)
    assert ":2: checsk: unknown key (did you mean checks?) (known here: node_name, phases," in message
    assert message.endswith(", checks, override)")


def test_an_override_names_its_own_index_and_line(tmp_path: Path) -> None:
    text = (
        '[[override]]\nhosts = "a[1-2]"\n[override.gpu]\nexpected_count = 4\n\n'
        '[[override]]\nhosts = "b[1-2]"\n[override.gpu]\nexpectedcount = 4\n[override.checks.gpu_ecc]\nmax_dbe = 1\n'
    )
    path = write(tmp_path, text)
    with pytest.raises(C.ConfigError) as info:
        C.load(path, host="a1")
    got = [str(e) for e in info.value.problems]
    assert got[0].startswith(f"{path}:9: override[1].gpu.expectedcount: unknown key (did you mean expected_count?)")
    assert got[1].startswith(f"{path}:11: override[1].checks.gpu_ecc.max_dbe: unknown key")
    assert len(got) == 2


def test_a_base_error_is_said_once_not_again_under_each_override(tmp_path: Path) -> None:
    path = write(tmp_path, '[gpu]\nexpected_cnt = 8\n\n[[override]]\nhosts = "a1"\n[override.policy]\nunknown = "x"\n')
    with pytest.raises(C.ConfigError) as info:
        C.load(path, host="a1")
    got = [str(e) for e in info.value.problems]
    assert [g.split(": ")[0] for g in got] == [f"{path}:2", f"{path}:7"], got
    assert "override[0].policy.unknown: 'x' is not one of" in got[1]


def test_every_non_finite_number_at_once(tmp_path: Path) -> None:
    path = write(tmp_path, "[daemon]\ninterval_s = nan\n\n[drain]\nmax_share = inf\n")
    with pytest.raises(C.ConfigError) as info:
        C.load(path)
    assert [str(e).split(": ", 1)[0] for e in info.value.problems] == [f"{path}:2", f"{path}:5"]


def test_invalid_toml_takes_the_parsers_line(tmp_path: Path) -> None:
    path = write(tmp_path, "[gpu]\nexpected_count = 8\n[paths\n")
    with pytest.raises(C.ConfigError) as info:
        C.load(path)
    assert str(info.value).startswith(f"{path}:3: invalid TOML: ") and info.value.kind == "syntax"


def test_a_file_with_several_errors_still_checks_with_the_defaults(tmp_path: Path) -> None:
    """The fail-safe holds: nothing validated here before, so the faces' recipe runs on the defaults."""
    text = THREE + f'\n[paths]\nstate_dir = "{tmp_path / "s"}"\npersistent_dir = "{tmp_path / "p"}"\n'
    loaded = use(write(tmp_path, text), fallback="defaults", remember=False, setup=False)
    assert loaded.using == "defaults" and loaded.error is not None and len(loaded.error.problems) == 3
    assert loaded.cfg.enabled()["gpu_temperature"]  # not switched off by the typo
    one = loaded.error.oneline()  # what a face logs: one line, every error
    assert "\n" not in one and one.count(".toml:") == 4 and ": 3 errors: " in one, one


@pytest.mark.parametrize(
    ("text", "key", "line"),
    [
        ("[gpu]\nexpected_count = 8\n", "gpu.expected_count", 2),
        ("gpu.expected_count = 8\n", "gpu.expected_count", 1),
        ('[checks."gpu_ecc"]\n"max_sbe" = 1\n', "checks.gpu_ecc.max_sbe", 2),
        ("[[override]]\nhosts = 'a'\n[[override]]\nhosts = 'b'\n", "override[1].hosts", 4),
        ('[[override]]\nhosts = "a"\n[override.gpu]\nexpected_count = 4\n', "override[0].gpu.expected_count", 4),
        ('[checks.gpu_driver]\nallowed = [\n  "a",\n  "b",\n]\n', "checks.gpu_driver.allowed[1]", 2),
        ('[a]\ns = """\n[gpu]\nx = 1\n"""\n[gpu]\nx = 2\n', "gpu.x", 7),
        ("[gpu]\n# expected_count = 1\nexpected_count = 2\n", "gpu.expected_count", 3),
        ("[gpu]\n", "gpu.nothing_here", 1),
        ("[gpu]\nx = 1\n\n[chekcs.gpu_ecc]\nenabled = false\n", "chekcs", 4),
        ("", "gpu", None),
    ],
    ids=[
        "table",
        "dotted",
        "quoted",
        "array-of-tables",
        "under-override",
        "array-item",
        "multiline",
        "comment",
        "enclosing",
        "implicit-parent",
        "none",
    ],
)
def test_the_locator(text: str, key: str, line: int | None) -> None:
    assert locate.line_of(locate.index(text), key) == line
