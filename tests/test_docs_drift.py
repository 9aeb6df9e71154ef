"""Docs that cannot drift: what they say of the program is compared with the program itself."""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from nodehealth import SCHEMA_VERSION
from nodehealth.config.schema import DaemonSettings
from nodehealth.daemon.http import parse_listen
from nodehealth.statedir import layout

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def _doc(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


def test_metrics_listen_on_this_node_only_by_default_and_the_docs_say_so() -> None:
    """A package started as installed opens nothing on the site's networks; a Prometheus on another
    host needs an explicit address, which docs/daemon.md says how to give."""
    default = DaemonSettings().listen
    host, _ = parse_listen(default)
    assert ipaddress.ip_address(host).is_loopback, default
    for doc in ("daemon.md", "security.md", "operations.md"):
        assert f"`{default}`" in _doc(doc) or f'listen = "{default}"' in _doc(doc), doc
    assert "A Prometheus on another host needs an explicit listen address" in _doc("daemon.md")
    assert default in (ROOT / "deploy" / "prometheus" / "scrape.yml").read_text(encoding="utf-8")


# ---------------------------------------------------------------- docs/output.md's examples
SCENARIOS = ROOT / "examples" / "scenarios"
BEGIN = re.compile(r"<!-- generated: (?P<args>[^>]*?) -->\n```(?P<lang>\w*)\n(?P<body>.*?)```\n<!-- end -->", re.S)


def _run(tmp: Path, args: str) -> str:
    """``nodehealth ARGS`` on a machine-independent config, with what varies between runs fixed."""
    (tmp / "sys").mkdir(exist_ok=True)  # no InfiniBand, no PCI: the output must not depend on this machine
    cfg = tmp / "nh.toml"
    cfg.write_text(f'[paths]\nsysfs_root = "{tmp / "sys"}"\nstate_dir = "{tmp / "state"}"\n', encoding="utf-8")
    argv = shlex.split(args)
    assert argv[0] == "nodehealth"
    proc = subprocess.run(
        [sys.executable, "-m", "nodehealth", argv[1], "--config", str(cfg), *argv[2:]],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "SLURMD_NODENAME": "gpu042", "NO_COLOR": "1"},
    )
    assert proc.returncode in (0, 1), proc.stderr
    out = proc.stdout.replace(str(cfg), "/etc/nodehealth/nodehealth.toml").replace(f"{ROOT}/", "")
    if "--format json" in args:
        doc = json.loads(out)
        doc.update(duration_s=0.021, started_at=1796000000.0)
        doc["checks"] = [dict(c, duration_s=0.012) for c in doc["checks"] if c["status"] not in ("OK", "SKIPPED")]
        return json.dumps(doc, indent=2) + "\n"
    out = re.sub(r"answered in \d+\.\d+ s", "answered in 0.01 s", out)
    return re.sub(r"checks? in \d+\.\d+ s$", lambda m: m.group(0).split(" in ")[0] + " in 0.02 s", out, flags=re.M)


def _expected(tmp: Path, text: str) -> str:
    def block(m: re.Match[str]) -> str:
        args = m.group("args")
        return f"<!-- generated: {args} -->\n```{m.group('lang')}\n{_run(tmp, args)}```\n<!-- end -->"

    return BEGIN.sub(block, text)


def test_output_md_examples_are_the_programs_output(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """docs/output.md's examples are what `nodehealth check` prints for the shipped scenarios (durations
    fixed); ``--update-golden`` rewrites them."""
    path = DOCS / "output.md"
    text = path.read_text(encoding="utf-8")
    blocks = BEGIN.findall(text)
    assert len(blocks) >= 3, "the text, -q and JSON examples are generated blocks"
    assert any("healthy-8x-h100.toml" in args for args, _, _ in blocks)
    want = _expected(tmp_path, text)
    if request.config.getoption("--update-golden"):
        path.write_text(want, encoding="utf-8")
    assert text == want, "docs/output.md's examples drifted: pytest tests/test_docs_drift.py --update-golden"


def test_output_md_names_every_key_of_the_json_report(tmp_path: Path) -> None:
    doc = json.loads(
        _run(tmp_path, f"nodehealth check --simulate {SCENARIOS / 'row-remap-pending.toml'} --format json")
    )
    table = set(re.findall(r"^\| `([\w.\[\]]+)` \|", _doc("output.md"), re.M))
    keys = set(doc) | {f"checks[].{k}" for c in doc["checks"] for k in c}
    assert keys <= table, sorted(keys - table)
    assert doc["schema_version"] == SCHEMA_VERSION and "`schema_version`" in _doc("output.md")
    assert "## Stability" in _doc("output.md")


def test_output_md_names_every_key_of_a_preview(tmp_path: Path) -> None:
    """The `as` key of `check --as FACE --format json`, as the program prints it."""
    scenario = SCENARIOS / "row-remap-pending.toml"
    table = set(re.findall(r"^\| `(as\.\w+)` \|", _doc("output.md"), re.M))
    for face in ("prolog", "healthcheck"):
        doc = json.loads(_run(tmp_path, f"nodehealth check --as {face} --simulate {scenario} --format json"))
        assert doc["schema_version"] == SCHEMA_VERSION
        assert {f"as.{k}" for k in doc["as"]} == table, face


# ---------------------------------------------------------------- docs/operations.md's file lists
FILE_NAME = re.compile(r"[\w-]+\.(?:jsonl|json|marshal)\b")
# Names the table writes with a placeholder: the job baselines and the fast path's settings per config.
PLACEHOLDERS = {f"{layout.JOBS_DIR}/<job id>.json", f"{layout.SNAPSHOT_PREFIX}<config>.{layout.SNAPSHOT_FORM}"}


def _layout_files() -> set[str]:
    return {v for k, v in vars(layout).items() if k.isupper() and isinstance(v, str) and FILE_NAME.fullmatch(v)}


def _operations_section(title: str) -> str:
    return _doc("operations.md").split(f"\n{title}\n", 1)[1].split("\n## ", 1)[0]


def test_operations_md_files_table_is_statedir_layouts() -> None:
    """Every state file of statedir/layout.py is a row of docs/operations.md's Files table, in the
    directory layout.PERSISTENT puts it in; every row is a file of the layout."""
    rows = re.findall(r"^\| `<(state_dir|persistent_dir)>/([^`]+)` \|", _operations_section("## Files"), re.M)
    assert rows
    seen = {name: folder for folder, name in rows}
    names = _layout_files()
    assert {layout.DAEMON_STATE, layout.COUNTERS, layout.SLURM_STATE, layout.LEDGER} <= names
    for name in names:
        want = "persistent_dir" if name in layout.PERSISTENT else "state_dir"
        assert seen.get(name) == want, (name, seen.get(name), want)
    assert set(seen) <= names | PLACEHOLDERS, set(seen) - names - PLACEHOLDERS
    assert PLACEHOLDERS <= set(seen)


def test_operations_md_names_only_files_the_layout_has() -> None:
    """The check-writes-nothing table and every `name.json` the page mentions are layout files."""
    table = _operations_section("### What `nodehealth check` reads and writes")
    named = set(FILE_NAME.findall(_doc("operations.md"))) | set(FILE_NAME.findall(table))
    known = _layout_files() | {"<id>.json", "<job id>.json", "<config>.marshal"}
    stray = {n for n in named if n not in known and not n.startswith("nodehealth")}
    assert not stray, stray


def test_operations_md_says_the_daemon_publishes_gpu_counters() -> None:
    """The daemon rewrites gpu-counters.json every round (daemon/core.py, write_counters)."""
    text = _doc("operations.md")
    assert "does not publish GPU counters" not in text
    assert "the daemon rewrites it every round" in " ".join(_operations_section("## Epilog job forensics").split())
    row = next(r for r in _operations_section("## Files").splitlines() if f"/{layout.COUNTERS}`" in r)
    assert "the daemon (every round)" in row
