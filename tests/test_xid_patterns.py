"""The kernel-log pattern table: every sample line of every pattern gives what its entry declares.

The cases are generated from ``nodehealth.xid.patterns.PATTERNS``: a new pattern is tested by
adding its entry (with its real sample lines) there. docs/xid.md's pattern table is generated
from the same table: ``pytest tests/test_xid_patterns.py --update-golden`` rewrites it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from nodehealth.xid import patterns
from nodehealth.xid.parse import parse_line, scan
from nodehealth.xid.patterns import EVENT, PATTERNS, Pattern, Sample

DOC = Path(__file__).resolve().parent.parent / "docs" / "xid.md"
BEGIN, END = "<!-- patterns: generated from nodehealth/xid/patterns.py -->", "<!-- patterns: end -->"


def _cases() -> list[Any]:
    return [
        pytest.param(p, s, id=f"{p.name}-{i}-{'gives' if s.gives is not None else 'none'}")
        for p in PATTERNS
        for i, s in enumerate(p.samples, 1)
    ]


@pytest.mark.parametrize(("pattern", "sample"), _cases())
def test_sample_line_parses_as_declared(pattern: Pattern, sample: Sample) -> None:
    if pattern.role == EVENT:
        event = parse_line(sample.line)
        if sample.gives is None:
            assert event is None, f"look-alike line gave an event: {event}"
            return
        assert event is not None, "no event"
        assert event.kind == pattern.kind, f"read by another pattern ({event.kind})"
        assert event.raw == sample.line
        got = {key: getattr(event, key) for key in sample.gives}
        assert got == dict(sample.gives)
        assert [(e.xid, e.pci) for e in scan([sample.line])] == [(event.xid, event.pci)], "scan agrees"
        return
    m = pattern.regex.search(sample.line)
    if sample.gives is None:
        assert m is None, f"matched {m.group(0)!r}"
        return
    assert m is not None, "no match"
    assert {key: m.group(key) for key in sample.gives} == dict(sample.gives)


@pytest.mark.parametrize("pattern", PATTERNS, ids=lambda p: p.name)
def test_every_pattern_has_real_or_cited_samples_both_ways(pattern: Pattern) -> None:
    assert any(s.gives is not None for s in pattern.samples), "no line it reads"
    assert any(s.gives is None for s in pattern.samples), "no look-alike line it must not read"
    assert all(s.source for s in pattern.samples)
    assert pattern.about and pattern.regex.pattern
    if pattern.role in (EVENT, patterns.CONTEXT):
        assert pattern.needles, "an event or context pattern names the text its lines always hold"
        for s in pattern.samples:
            if s.gives is not None:
                assert all(n in s.line for n in pattern.needles), f"needle missing from {s.line!r}"
    if pattern.role == EVENT:
        assert pattern.kind
        assert "xid" in pattern.regex.groupindex or pattern.xid is not None


def test_names_are_unique_and_the_pre_filter_covers_every_event_pattern() -> None:
    names = [p.name for p in PATTERNS]
    assert len(names) == len(set(names))
    for p in PATTERNS:
        if p.role in (EVENT, patterns.CONTEXT):
            assert any(a in p.needles[0] for a in patterns.ANCHORS), p.name


def test_published_samples_are_the_fixture_lines() -> None:
    """A sample citing a published source is (part of) a verbatim line of tests/fixtures/real-world/."""
    fixtures = Path(__file__).resolve().parent / "fixtures" / "real-world"
    known = [
        json.loads(t)["line"]
        for t in (fixtures / "xid_lines.jsonl").read_text(encoding="utf-8").splitlines()
        if t.strip()
    ]
    for log in sorted((fixtures / "xid_logs").glob("*.log")):
        known += log.read_text(encoding="utf-8", errors="replace").splitlines()
    for p in PATTERNS:
        for s in p.samples:
            if "@" in s.source:
                assert any(s.line in line for line in known), (p.name, s.line)


_BLOCK_RE = re.compile(re.escape(BEGIN) + r"\n(.*?)" + re.escape(END), re.DOTALL)


def _doc_block(text: str) -> re.Match[str]:
    m = _BLOCK_RE.search(text)
    assert m, f"docs/xid.md lacks the generated pattern table ({BEGIN} ... {END})"
    return m


def test_docs_pattern_table_is_generated_from_the_table(request: pytest.FixtureRequest) -> None:
    want = patterns.markdown()
    if request.config.getoption("--update-golden"):
        text = DOC.read_text(encoding="utf-8")
        m = _doc_block(text)
        DOC.write_text(text[: m.start(1)] + want + text[m.end(1) :], encoding="utf-8")
    assert _doc_block(DOC.read_text(encoding="utf-8")).group(1) == want, (
        "docs/xid.md is out of date: pytest tests/test_xid_patterns.py --update-golden"
    )


def test_every_pattern_entry_is_in_the_table() -> None:
    """An entry is the whole change: one defined in xid/ but missing from ``PATTERNS`` (or the prefixes'
    ``RECORDS``/``CLOCKS``) would never be tried, so it fails here."""
    from nodehealth.xid import pattern_kit, prefixes

    defined = {v.name for m in (patterns, prefixes, pattern_kit) for v in vars(m).values() if isinstance(v, Pattern)}
    assert defined == {p.name for p in PATTERNS}, defined ^ {p.name for p in PATTERNS}
