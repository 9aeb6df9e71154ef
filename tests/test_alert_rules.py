"""The alert rules' words: every label an alert's text names exists in every branch of its expression,
and every branch of an expression with ``or`` is one the promtool unit tests make fire."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from nodehealth.metrics.families import FAMILIES

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "deploy" / "prometheus" / "nodehealth-rules.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "tests" / "nodehealth-rules.test.yml"
PROMTOOL = shutil.which("promtool")
# What Prometheus adds to every scraped series (deploy/prometheus/scrape.yml), and `up`'s own labels.
TARGET_LABELS = {"instance", "job"}
METRIC = re.compile(r"\b(up|nodehealth_\w+)\b")
LABEL_REF = re.compile(r"\$labels\.(\w+)")
GROUP = re.compile(r"\bgroup_(?:left|right)\s*\(([^)]*)\)")


@dataclass(frozen=True)
class Alert:
    name: str
    expr: str  # as written (a block's lines joined)
    span: tuple[int, int]  # where the expression's text is in the file
    block: str  # the indentation of a block expression's lines; "" for one on the expr: line
    text: str  # the annotations and labels, as written


def alerts(text: str) -> list[Alert]:
    """The alerting rules of the file, read as the file writes them (one rule per ``- alert:``)."""
    out = []
    starts = [m.start() for m in re.finditer(r"^\s*- alert: ", text, re.M)] + [len(text)]
    for begin, end in zip(starts, starts[1:]):
        rule = text[begin:end]
        name = re.search(r"- alert: (\w+)", rule)
        assert name is not None
        inline = re.search(r"^\s*expr: (?!\|)(.+)$", rule, re.M)
        if inline:
            span, block, expr = (begin + inline.start(1), begin + inline.end(1)), "", inline.group(1)
        else:
            head = re.search(r"^(\s*)expr: \|\n((?:\1\s+.+\n)+)", rule, re.M)
            assert head is not None, name.group(1)
            lines = head.group(2).splitlines()
            block = re.match(r"\s*", lines[0]).group(0)  # type: ignore[union-attr]
            span, expr = (begin + head.start(2), begin + head.end(2)), " ".join(ln.strip() for ln in lines)
        rest = rule[span[1] - begin :] if inline is None else rule[inline.end() :]
        out.append(Alert(name.group(1), expr, span, block, rest))
    return out


def branches(expr: str) -> list[str]:
    """The expression cut at every ``or`` outside parentheses and braces: each one can fire the alert."""
    parts, depth, start = [], 0, 0
    for m in re.finditer(r"[(){}\[\]]|\bor\b", expr):
        tok = m.group(0)
        if tok in "({[":
            depth += 1
        elif tok in ")}]":
            depth -= 1
        elif depth == 0:
            parts.append(expr[start : m.start()].strip())
            start = m.end()
    return parts + [expr[start:].strip()]


LABELS = {f.name: set(f.labels) for f in FAMILIES}


def branch_labels(branch: str) -> set[str]:
    """The labels of the series a branch gives: its first metric's (the left side of any operation
    keeps its labels) and those a group_left/group_right brings, with the target's."""
    names = [n for n in METRIC.findall(branch)]
    assert names, branch
    unknown = [n for n in names if n != "up" and n not in LABELS]
    assert not unknown, f"not a family of nodehealth/metrics/families.py: {unknown}"
    first = set() if names[0] == "up" else LABELS[names[0]]
    grouped = {label.strip() for g in GROUP.findall(branch) for label in g.split(",") if label.strip()}
    return first | grouped | TARGET_LABELS


def test_the_reader_sees_every_alert_and_the_or_branches() -> None:
    found = alerts(RULES.read_text(encoding="utf-8"))
    assert [a.name for a in found] == re.findall(r"^\s*- alert: (\w+)\s*$", RULES.read_text(), re.M)
    assert branches("a or (b or c)") == ["a", "(b or c)"]
    assert branches('x{l=~"or|and"} == 1 or y') == ['x{l=~"or|and"} == 1', "y"]
    assert branch_labels("increase(nodehealth_xid_errors_total[10m]) > 0") == {"gpu", "xid", "action"} | TARGET_LABELS


def test_every_label_an_alert_names_exists_in_every_branch_of_its_expression() -> None:
    """``NodehealthDrainClassXid`` named ``$labels.xid`` while one branch (the check's status) has none."""
    missing = []
    for alert in alerts(RULES.read_text(encoding="utf-8")):
        used = set(LABEL_REF.findall(alert.text))
        for branch in branches(alert.expr):
            gone = used - branch_labels(branch)
            if gone:
                missing.append((alert.name, branch, sorted(gone)))
    assert not missing, missing


def test_a_label_missing_from_one_branch_is_caught() -> None:
    rule = """
      - alert: Both
        expr: |
          increase(nodehealth_xid_errors_total[10m]) > 0
            or nodehealth_check_status{check="gpu_xid"} == 4
        annotations:
          summary: "{{ $labels.instance }}: XID {{ $labels.xid }}"
"""
    (alert,) = alerts(rule)
    assert [sorted(set(LABEL_REF.findall(alert.text)) - branch_labels(b)) for b in branches(alert.expr)] == [
        [],
        ["xid"],
    ]


def _rule_tests_with(tmp: Path, rules: str) -> subprocess.CompletedProcess[str]:
    """``promtool test rules`` on a copy of the rule tests against ``rules`` (the tests' ../ layout kept)."""
    assert PROMTOOL is not None
    (tmp / "tests").mkdir(exist_ok=True)
    (tmp / RULES.name).write_text(rules, encoding="utf-8")
    tests = tmp / "tests" / RULE_TESTS.name
    tests.write_text(RULE_TESTS.read_text(encoding="utf-8"), encoding="utf-8")
    return subprocess.run([PROMTOOL, "test", "rules", str(tests)], capture_output=True, text=True, timeout=120)


@pytest.mark.real
@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (Debian package prometheus)")
def test_every_branch_of_an_or_is_one_a_rule_test_makes_fire(tmp_path: Path) -> None:
    """Each branch dropped in turn: the rule tests must then fail on that alert (the single-branch
    alerts: tests/test_prometheus.py renames each one)."""
    text = RULES.read_text(encoding="utf-8")
    assert _rule_tests_with(tmp_path, text).returncode == 0
    untested = []
    several = [(a, branches(a.expr)) for a in alerts(text) if len(branches(a.expr)) > 1]
    assert several  # NodehealthGpuRowRemap: pending or failed
    for alert, parts in several:
        for i, part in enumerate(parts):
            rest = " or ".join(p for j, p in enumerate(parts) if j != i)
            new = f"{alert.block}{rest}\n" if alert.block else rest
            res = _rule_tests_with(tmp_path, text[: alert.span[0]] + new + text[alert.span[1] :])
            if res.returncode == 0 or f"alertname: {alert.name}," not in res.stdout + res.stderr:
                untested.append((alert.name, part))
    assert not untested, f"no rule test needs these branches to fire: {untested}"
