"""``nodehealth list-checks`` as a person reads it: within 100 columns, no reST markup, every check with
its whole description and its probes."""

from __future__ import annotations

import pytest

from nodehealth.cli import main
from nodehealth.commands import list_checks
from nodehealth.registry import CHECKS


def _listed(capsys: pytest.CaptureFixture[str]) -> list[str]:
    assert main(["list-checks"]) == 0
    return capsys.readouterr().out.splitlines()


def test_every_line_fits_100_columns_and_carries_no_rest_markup(capsys: pytest.CaptureFixture[str]) -> None:
    lines = _listed(capsys)
    assert max(len(line) for line in lines) <= list_checks.WIDTH == 100
    assert not [line for line in lines if "``" in line]


def test_every_check_has_its_row_its_probes_and_its_whole_description(capsys: pytest.CaptureFixture[str]) -> None:
    lines = _listed(capsys)
    rows = {line.split()[0]: n for n, line in enumerate(lines) if line and not line.startswith(" ")}
    assert list(rows)[1:] == [spec.name for spec in CHECKS]
    starts = sorted(rows.values()) + [len(lines)]
    blocks = {lines[a].split()[0]: " ".join(" ".join(lines[a:b]).split()) for a, b in zip(starts, starts[1:])}
    for spec in CHECKS:
        block = blocks[spec.name]
        assert " ".join(spec.summary.split()) in block, spec.name
        assert all(probe in block for probe in (*spec.needs, *spec.uses)), spec.name
    assert "job_forensics (epilog): what happened" in blocks["job_forensics"]


def test_a_long_row_wraps_its_probes_and_description_within_the_width() -> None:
    row = {
        "name": "a_check",
        "default": False,
        "cost": "slow",
        "timeout_s": 2.5,
        "phases": ["epilog"],
        "needs": ["probe_number_one", "probe_number_two", "probe_number_three"],
        "uses": ["optional_probe"],
        "description": "word " * 60,
    }
    out = list_checks.text([row], width=90).splitlines()
    assert max(len(line) for line in out) <= 90 and len(out) >= 6
    assert out[1].startswith("a_check") and "off" in out[1] and "2.5 s" in out[1] and "epilog" in out[1]
    assert " ".join(" ".join(out).split()).count("word") == 60 and "(+optional_probe)" in " ".join(out)
