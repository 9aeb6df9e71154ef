"""What a common change costs, counted on a copy of the tree (docs/architecture.md, "What a change costs").

Each case copies the package (and, for a face, the packaging files that read the table) into the test's directory,
makes the change there by plain text insertion on stable anchor lines, and counts the files whose content
differs from the tree's (new files included). The change is then shown to be live: a subprocess runs the
copy (``PYTHONPATH``, its ``nodehealth.__file__`` checked first) through the CLI, the metrics renderer or
the kernel-log parser. Where the suite demands a file the recipe does not name, the case shows the rule
that demands it failing on the smaller change first, so the number below is the true one. Tests and
generated files (docs/metrics.md, docs/xid.md, etc/nodehealth.toml, golden files) are not counted.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from test_face_table import build_wheel, needs_system_setuptools, table_scripts, wheel_scripts

# Files a change touches, besides tests and generated docs:
# gpu_check: checks/<name>.py (with its drain-reason code, ``REASON``) and its line in registry.py;
# face: faces/<face>.py, faces/table.py (the console scripts of the wheel, the .deb and the RPM derive from it);
# metric: metrics/gpu_table.py (a per-GPU row; families.py for the others), metrics/renderers.py;
# kernel_log_pattern: xid/patterns.py (the store keeps the kinds of the event patterns).
CHANGE_COST = {"gpu_check": 2, "face": 2, "metric": 2, "kernel_log_pattern": 1}
# The cost table's rows in docs/architecture.md, by their leading words.
DOC_ROWS = {
    "gpu_check": "a new GPU check",
    "face": "a new face",
    "metric": "a new metric",
    "kernel_log_pattern": "a new kernel-log pattern",
}

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "examples" / "scenarios" / "healthy-8x-h100.toml"
SPEC = Path("packaging") / "rpm" / "nodehealth.spec"
TIMEOUT = 300


# --------------------------------------------------------------------------- the copy and its diff


def copy_tree(tmp: Path, *files: Path) -> Path:
    """The package (and ``files``, relative to the tree) under ``tmp/tree``."""
    tree = tmp / "tree"
    shutil.copytree(ROOT / "nodehealth", tree / "nodehealth", ignore=shutil.ignore_patterns("__pycache__"))
    for rel in files:
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / rel, tree / rel)
    return tree


def changed(tree: Path) -> set[str]:
    """Files of the copy whose content is not the tree's, or that the tree lacks."""
    out = set()
    for path in tree.rglob("*"):
        if path.is_file() and "__pycache__" not in path.parts:
            rel = path.relative_to(tree)
            orig = ROOT / rel
            if not orig.is_file() or orig.read_bytes() != path.read_bytes():
                out.add(rel.as_posix())
    return out


def insert(path: Path, anchor: str, text: str, after: bool = True) -> None:
    """Put ``text`` right after (or before) the one occurrence of ``anchor`` in ``path``."""
    body = path.read_text(encoding="utf-8")
    assert body.count(anchor) == 1, f"{path}: anchor {anchor!r} found {body.count(anchor)} times, not once"
    at = body.index(anchor) + (len(anchor) if after else 0)
    path.write_text(body[:at] + text + body[at:], encoding="utf-8")


def replace_once(path: Path, old: str, new: str) -> None:
    body = path.read_text(encoding="utf-8")
    assert body.count(old) == 1, f"{path}: {old!r} found {body.count(old)} times, not once"
    path.write_text(body.replace(old, new), encoding="utf-8")


def run_copy(tree: Path, *args: str, code: str = "", stdin: str = "") -> subprocess.CompletedProcess[str]:
    """``python -m nodehealth ARGS`` (or ``python -c CODE``) on the copy, from a directory of its own."""
    cwd = tree.parent / "run"
    cwd.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "NODEHEALTH_CONFIG"))}
    env.update(PYTHONPATH=str(tree), NO_COLOR="1", SLURMD_NODENAME="n1")
    cmd = [sys.executable, "-c", code] if code else [sys.executable, "-m", "nodehealth", *args]
    return subprocess.run(
        cmd, capture_output=True, text=True, env=env, cwd=cwd, input=stdin, timeout=TIMEOUT, check=False
    )


def assert_runs_the_copy(tree: Path) -> None:
    proc = run_copy(tree, code="import nodehealth; print(nodehealth.__file__)")
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip()).resolve().is_relative_to((tree / "nodehealth").resolve()), proc.stdout


def json_of(proc: subprocess.CompletedProcess[str]) -> Any:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


def config(tmp: Path) -> Path:
    """A config of the test's own: the simulated healthy node, state and procfs under ``tmp``."""
    path = tmp / "nh.toml"
    path.write_text(
        f'node_name = "n1"\n[nvml]\nsimulate = "{SCENARIO}"\n[paths]\nstate_dir = "{tmp}/state"\n'
        f'procfs_root = "{tmp}/proc"\n',
        encoding="utf-8",
    )
    return path


# --------------------------------------------------------------------------- the documented numbers


def test_the_architecture_doc_states_these_costs() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text.split("## What a change costs", 1)[1].split("\n## ", 1)[0]
    stated = {}
    for key, words in DOC_ROWS.items():
        m = re.search(r"^\|\s*" + re.escape(words) + r"\b[^|]*\|\D*(\d+)", section, re.M)
        assert m, f"docs/architecture.md's cost table has no row starting {words!r}"
        stated[key] = int(m.group(1))
    assert stated == CHANGE_COST, "docs/architecture.md's cost table is not what the copies below count"


# --------------------------------------------------------------------------- a new GPU check

GPU_MIG = '''\
"""MIG mode off: a GPU split into MIG instances is not the whole GPU Slurm hands a job."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from nodehealth.checks.base import CheckSettings, Context, field_error, judge_gpus, setting
from nodehealth.model import CheckResult, Finding, Status
from nodehealth.observations import GpuObservation, Observations

REASON = ("mig", "MIG mode on where Slurm hands out whole GPUs")


@dataclass(frozen=True)
class Settings(CheckSettings):
    when_on: str = setting("warn", "status when MIG mode is on", choices=("warn", "fail"))


def evaluate(obs: Observations, settings: Settings, ctx: Context) -> CheckResult:
    def judge(gpu: GpuObservation) -> Optional[list[Finding]]:
        err = field_error(gpu, "mig_mode")
        if err is not None:
            return [err]
        if gpu.mig_enabled is None:
            return None
        if not gpu.mig_enabled:
            return []
        status = Status.FAIL if settings.when_on == "fail" else Status.WARN
        return [Finding(status, f"GPU {gpu.index}: MIG mode on", gpu=gpu.index)]

    return judge_gpus(obs, ctx, judge, "{n} GPU(s) with MIG mode off")
'''

REASON_RULE = """
import json
from nodehealth.model import CheckResult, Status
from nodehealth.registry import CHECKS
from nodehealth.slurm import reasons
codes = reasons.reason_codes()
print(json.dumps([sorted({spec.name for spec in CHECKS} ^ set(codes)), codes["gpu_mig"][0],
                  reasons.format_reason(CheckResult("gpu_mig", Status.WARN, "GPU 2: MIG mode on", gpu=2))]))
"""


def test_a_new_gpu_check(tmp_path: Path) -> None:
    tree = copy_tree(tmp_path)
    pkg = tree / "nodehealth"
    (pkg / "checks" / "gpu_mig.py").write_text(GPU_MIG, encoding="utf-8")
    insert(
        pkg / "registry.py",
        """    CheckSpec("gpu_persistence", "gpu_persistence", _GPU, ALL, True, "cheap"),\n""",
        """    CheckSpec("gpu_mig", "gpu_mig", _GPU, ALL, True, "cheap"),\n""",
    )
    assert changed(tree) == {"nodehealth/checks/gpu_mig.py", "nodehealth/registry.py"}
    assert len(changed(tree)) == CHANGE_COST["gpu_check"], sorted(changed(tree))
    assert_runs_the_copy(tree)
    # Its drain-reason code is its module's REASON, read through the registry: every registered check
    # has a code (tests/test_slurm_policy.py) and a drain for it starts with its own.
    rule = run_copy(tree, code=REASON_RULE)
    assert rule.returncode == 0, rule.stdout + rule.stderr
    assert json.loads(rule.stdout) == [[], "mig", "nh:mig GPU2 gpu_mig: GPU 2: MIG mode on"], rule.stdout
    listed = json_of(run_copy(tree, "list-checks", "--format", "json"))
    assert "gpu_mig" in [row["name"] for row in listed]
    defaults = run_copy(tree, "config", "defaults")
    assert defaults.returncode == 0 and "[checks.gpu_mig]" in defaults.stdout and "when_on" in defaults.stdout
    report = json_of(
        run_copy(tree, "check", "--config", str(config(tmp_path)), "--simulate", str(SCENARIO), "--format", "json")
    )
    (mig,) = [c for c in report["checks"] if c["name"] == "gpu_mig"]
    assert (mig["status"], mig["summary"]) == ("OK", "8 GPU(s) with MIG mode off"), mig


# --------------------------------------------------------------------------- a new face

FACE = '''\
"""``nodehealth-sweep`` (a second ``Epilog=``): the epilog's checks once more, after the site's own epilog."""

from __future__ import annotations

import sys
from typing import Sequence

from nodehealth.faces.args import handle
from nodehealth.faces.common import guarded, job_face


def cli() -> int:
    """The installed ``nodehealth-sweep``: Slurm passes no argument, a person may."""
    return main(sys.argv[1:])


def main(argv: Sequence[str] = ()) -> int:
    code = handle("sweep", argv)  # a person: --help, --version, --dry-run
    if code is not None:
        return code
    return guarded("sweep", lambda: job_face("sweep", "epilog", "end"))


if __name__ == "__main__":
    raise SystemExit(cli())
'''
ROW = """    Face("sweep", "nodehealth.faces.sweep", "epilog", "nodehealth-sweep", "sweep", "Epilog=",
         "runs the epilog's checks again after the site's own epilog and, on a fault, drains the node (exit 1)"),
"""
NEW_SCRIPT = "nodehealth-sweep"
ENTRY = "nodehealth.faces.sweep:cli"


@needs_system_setuptools
def test_a_new_face(tmp_path: Path) -> None:
    tree = copy_tree(tmp_path, Path("pyproject.toml"), Path("setup.py"), SPEC)
    pkg = tree / "nodehealth"
    (pkg / "faces" / "sweep.py").write_text(FACE, encoding="utf-8")
    insert(pkg / "faces" / "table.py", "\n)\nBY_NAME = {face.name: face for face in FACES}", ROW, after=False)
    assert changed(tree) == {"nodehealth/faces/sweep.py", "nodehealth/faces/table.py"}  # 2 in the package
    assert len(changed(tree)) == CHANGE_COST["face"], sorted(changed(tree))
    assert_runs_the_copy(tree)
    # Packaged with nothing more: the copy's wheel installs the script, and the RPM spec's list has it.
    wheel = build_wheel(tree, tmp_path / "wheel")
    assert wheel_scripts(wheel)[NEW_SCRIPT] == ENTRY
    assert table_scripts(tree)[NEW_SCRIPT] == ENTRY and "%{_bindir}/nodehealth-*" in (tree / SPEC).read_text()
    # Installed as pip installs it, the script runs the face (--help acts on nothing).
    target = tmp_path / "installed"
    installed = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-compile",
            "--target",
            str(target),
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    env = dict(os.environ, PYTHONPATH=str(target))
    helped = subprocess.run(
        [sys.executable, str(target / "bin" / NEW_SCRIPT), "--help"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=TIMEOUT,
        check=False,
    )
    assert helped.returncode == 0 and helped.stdout.startswith(f"usage: {NEW_SCRIPT} "), helped.stdout + helped.stderr
    cfg = config(tmp_path)
    doc = json_of(run_copy(tree, "check", "--as", "sweep", "--config", str(cfg), "--format", "json"))
    assert doc["as"]["face"] == "sweep" and doc["phase"] == "epilog" and doc["as"]["exit_code"] == 0, doc["as"]


# --------------------------------------------------------------------------- a new metric

FAMILY = "nodehealth_gpu_memory_temperature_celsius"
RENDER = f"""
from nodehealth import runner
from nodehealth.config import loader as config
from nodehealth.metrics import NodeMetrics
cfg = config.resolve({{"nvml": {{"simulate": {str(SCENARIO)!r}}},
                      "paths": {{"state_dir": "/nonexistent/nodehealth-test"}}}}, "<test>")
out = runner.execute(cfg, phase="daemon", node="gpu001")
m = NodeMetrics("gpu001", process=False)
m.update_round(out.report, out.observations)
print(m.payload().decode())
"""


def test_a_new_metric(tmp_path: Path) -> None:
    tree = copy_tree(tmp_path)
    pkg = tree / "nodehealth"
    insert(
        pkg / "metrics" / "gpu_table.py",
        """    row(_G, "nodehealth_gpu_power_watts", GAUGE, GPU""",
        f'''    row(_G, "{FAMILY}", GAUGE, GPU, "GPU memory (HBM) temperature", "celsius"),\n''',
        after=False,
    )
    insert(
        pkg / "metrics" / "renderers.py",
        """    ("nodehealth_gpu_power_watts", lambda g: g.power_w),\n""",
        f'''    ("{FAMILY}", lambda g: g.memory_temp_c),\n''',
        after=False,
    )
    assert len(changed(tree)) == CHANGE_COST["metric"], sorted(changed(tree))
    assert changed(tree) == {"nodehealth/metrics/gpu_table.py", "nodehealth/metrics/renderers.py"}
    assert_runs_the_copy(tree)
    proc = run_copy(tree, code=RENDER)
    assert proc.returncode == 0, proc.stderr
    assert f"# TYPE {FAMILY} gauge" in proc.stdout
    samples = re.findall(r"^" + FAMILY + r'\{gpu="(\d+)"[^}]*\} (\S+)$', proc.stdout, re.M)
    assert [gpu for gpu, _ in samples] == [str(i) for i in range(8)], proc.stdout[-2000:]
    assert all(float(value) > 0 for _, value in samples)


# --------------------------------------------------------------------------- a new kernel-log pattern

KIND = "rm_init_failed"
LINE = "[   12.345678] NVRM: GPU 0000:3b:00.0: RmInitAdapter failed! (0x26:0xffff:1489)"
ENTRY_TEXT = textwrap.dedent(f'''\
    RM_INIT_FAILED = Pattern(
        name="rm_init_failed",
        role=EVENT,
        about="the driver could not initialise a GPU (`RmInitAdapter failed!`, its error codes after it), "
        "with the GPU when the line names it; no XID number (0)",
        regex=Regex(
            DRIVER_TAG + r"[ \\t]*(?:GPU[ \\t]+(?P<pci>" + PCI + r")(?:\\.[0-7])?:[ \\t]+)?"
            r"(?P<payload>RmInitAdapter failed!.*)",
            re.DOTALL,
        ),
        needles=(DRIVER_TAG, "RmInitAdapter failed"),
        kind="{KIND}",
        xid=0,
        samples=(
            gives("{LINE}", TESTS, xid=0, pci="0000:3b:00", kind="{KIND}", uptime_s=12.345678,
                  message="RmInitAdapter failed! (0x26:0xffff:1489)"),
            gives("NVRM: RmInitAdapter failed! (0x31:0xffff:867)", TESTS, xid=0, pci=None,
                  message="RmInitAdapter failed! (0x31:0xffff:867)"),
            no_match("6,2213,5123456791,-;process 'sh' launched 'NVRM: RmInitAdapter failed! (0x26:0xffff:1489)' "
                     "with NULL argv: empty string added", TESTS),
            no_match("nvidia-persistenced: RmInitAdapter failed! (0x26:0xffff:1489)", TESTS),
        ),
    )


''')
# The look-alike of fallen_off_bus that said this line is no event (the self-check reads it through
# parse_line, so it goes with the new entry, in the same file).
LOOK_ALIKE = f'''        no_match("{LINE}", TESTS),\n'''
ROUND_TRIP = f"""
import json
from nodehealth.xid import history
from nodehealth.xid.catalog import catalog_for
from nodehealth.xid.parse import parse_line
event = parse_line({LINE!r})
state = history.StoreState(boot_id="boot-1")
history.add_events(state, [(event, None, 1000.0)], catalog_for())
back, ignored = history.StoreState.from_json(json.loads(json.dumps(state.to_json())))
print(json.dumps({{"parsed": [event.kind, event.xid, event.pci, event.message], "stored": back.events[0]["kind"],
                  "ignored": ignored}}))
"""


def self_check(tree: Path) -> subprocess.CompletedProcess[str]:
    """tests/test_xid_patterns.py, as it is, on the copy (its generated-doc test left to --update-golden)."""
    tests = tree / "tests"
    tests.mkdir(exist_ok=True)
    shutil.copyfile(ROOT / "tests" / "test_xid_patterns.py", tests / "test_xid_patterns.py")
    if not (tests / "fixtures").exists():
        (tests / "fixtures").symlink_to(ROOT / "tests" / "fixtures")
    (tree / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=str(tree))
    try:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-p",
                "no:cacheprovider",
                "-v",
                "tests/test_xid_patterns.py",
                "-k",
                "not docs_pattern_table",
            ],
            capture_output=True,
            text=True,
            env=env,
            cwd=tree,
            timeout=TIMEOUT,
            check=False,
        )
    finally:
        shutil.rmtree(tests)
        (tree / "pytest.ini").unlink()


def test_a_new_kernel_log_pattern(tmp_path: Path) -> None:
    tree = copy_tree(tmp_path)
    patterns = tree / "nodehealth" / "xid" / "patterns.py"
    replace_once(patterns, LOOK_ALIKE, "")
    insert(
        patterns,
        "# --------------------------------------------------------------------------- context\n",
        ENTRY_TEXT,
        after=False,
    )
    replace_once(
        patterns,
        "    SXID_LINE,\n    NVIDIA_GPU,\n)",
        "    SXID_LINE,\n    RM_INIT_FAILED,\n    NVIDIA_GPU,\n)",
    )
    assert changed(tree) == {"nodehealth/xid/patterns.py"}
    assert_runs_the_copy(tree)
    checked = self_check(tree)
    assert checked.returncode == 0, checked.stdout[-3000:] + checked.stderr[-2000:]
    assert "test_sample_line_parses_as_declared[rm_init_failed-1-gives] PASSED" in checked.stdout
    proc = run_copy(tree, code=ROUND_TRIP)
    got = json_of(proc)
    assert got["parsed"] == [KIND, 0, "0000:3b:00", "RmInitAdapter failed! (0x26:0xffff:1489)"]
    # A kind of its own survives the XID store (history's kinds are the event patterns' kinds): read back,
    # the event keeps it and nothing is reported ignored.
    assert got["stored"] == KIND and got["ignored"] == [], got
    assert len(changed(tree)) == CHANGE_COST["kernel_log_pattern"], sorted(changed(tree))
