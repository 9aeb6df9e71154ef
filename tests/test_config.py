"""Config: defaults, validation errors that name file and key, host overrides, node name."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest

from nodehealth.cli import main
from nodehealth.config import lean, sample, schema
from nodehealth.config import loader as C

ROOT = Path(__file__).resolve().parent.parent


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "nodehealth.toml"
    path.write_text(text)
    return str(path)


def test_defaults_when_default_file_is_absent(monkeypatch):
    monkeypatch.setattr(lean, "DEFAULT_PATH", "/nonexistent/nodehealth.toml")
    cfg = C.load(environ={})
    assert cfg.source == "<defaults>"
    assert cfg.phases.prolog.budget_s == 20.0
    assert cfg.gpu.expected_count == "auto"
    assert set(cfg.checks) >= {"nvml", "gpu_count", "gpu_ecc"}


def test_explicit_missing_file_is_an_error():
    with pytest.raises(C.ConfigError, match="/nonexistent.toml: no such file"):
        C.load("/nonexistent.toml")


def test_env_var_selects_the_file(tmp_path):
    path = write(tmp_path, "[gpu]\nexpected_count = 4\n")
    cfg = C.load(environ={"NODEHEALTH_CONFIG": path})
    assert cfg.gpu.expected_count == 4
    assert cfg.source == path


BAD = [
    ("invalid-toml", "[gpu\n", "invalid TOML"),
    ("unknown-top-key", "colour = 1\n", "colour: unknown key"),
    ("unknown-section-key", "[gpu]\nexpectedcount = 8\n", "gpu.expectedcount: unknown key"),
    ("wrong-type", '[phases.prolog]\nbudget_s = "fast"\n', "phases.prolog.budget_s: expected a number"),
    ("bool-is-not-a-number", "[phases.prolog]\nbudget_s = true\n", "phases.prolog.budget_s: expected a number"),
    ("out-of-range", "[phases.prolog]\nbudget_s = 0\n", "phases.prolog.budget_s: 0.0 is below the minimum 1"),
    ("bad-choice", '[policy]\nunknown = "maybe"\n', "policy.unknown: 'maybe' is not one of pass, fail"),
    ("unknown-check", "[checks.gpu_tempreature]\nenabled = false\n", "checks.gpu_tempreature: unknown check"),
    ("unknown-check-key", "[checks.gpu_ecc]\nmax_dbe = 1\n", "checks.gpu_ecc.max_dbe: unknown key"),
    ("expected-count-word", '[gpu]\nexpected_count = "eight"\n', 'gpu.expected_count: expected an integer or "auto"'),
    ("expected-count-negative", "[gpu]\nexpected_count = -1\n", "gpu.expected_count: -1 is below the minimum 0"),
    ("array-item-type", "[checks.gpu_driver]\nallowed = [550]\n", "checks.gpu_driver.allowed[0]: expected a string"),
    ("table-expected", "gpu = 3\n", "gpu: expected a table"),
    ("boot-id-path-is-gone", '[resume]\nboot_id_path = "/tmp/boot_id"\n', "resume.boot_id_path: unknown key"),
    (
        "xid-severity-unknown",
        '[checks.gpu_xid]\nseverity_overrides = ["63=fatal"]\n',
        "checks.gpu_xid: XID 63: severity override: unknown severity 'fatal'",
    ),
    (
        "xid-override-malformed",
        '[checks.gpu_xid]\nseverity_overrides = ["sixty=drain"]\n',
        "checks.gpu_xid: severity override 'sixty=drain'",
    ),
    ("bad-hostlist", '[[override]]\nhosts = "gpu[001-"\n', "override[0].hosts: bad hostlist"),
    ("override-without-hosts", "[[override]]\n[override.gpu]\nexpected_count = 4\n", "override[0].hosts"),
    (
        "override-typo-for-other-host",
        '[[override]]\nhosts = "other[1-2]"\n[override.gpu]\nexpected_cnt = 4\n',
        "override[0].gpu.expected_cnt: unknown key",
    ),
]


@pytest.mark.parametrize(("text", "message"), [(t, m) for _, t, m in BAD], ids=[i for i, _, _ in BAD])
def test_bad_config_names_file_and_key(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(C.ConfigError) as info:
        C.load(path, host="gpu001")
    assert re.match(re.escape(path) + r":[1-9][0-9]*: ", str(info.value)), str(info.value)  # file:line
    assert message in str(info.value)


OVERRIDES = """
[gpu]
expected_count = 8

[[override]]
hosts = "gpu[001-064]"
[override.gpu]
expected_count = 4
[override.checks.gpu_nvlink]
expected_links = 12

[[override]]
hosts = "gpu[010-012]"
[override.checks.gpu_driver]
allowed = ["550."]
"""


@pytest.mark.parametrize(
    ("host", "count", "links", "allowed"),
    [
        ("gpu001", 4, 12, ()),
        ("gpu011", 4, 12, ("550.",)),
        ("gpu065", 8, 0, ()),
        ("login1", 8, 0, ()),
    ],
    ids=["first-rule", "both-rules-later-wins", "outside-range", "other-name"],
)
def test_host_overrides(tmp_path, host, count, links, allowed):
    cfg = C.load(write(tmp_path, OVERRIDES), host=host)
    assert cfg.gpu.expected_count == count
    assert cfg.checks["gpu_nvlink"].expected_links == links  # type: ignore[attr-defined]
    assert cfg.checks["gpu_driver"].allowed == allowed  # type: ignore[attr-defined]


def test_nested_table_keeps_parent_default_for_other_keys(tmp_path):
    cfg = C.load(write(tmp_path, "[phases.manual]\nbudget_s = 40\n"))
    assert cfg.phases.manual.budget_s == 40
    assert cfg.phases.prolog.budget_s == 20.0


def test_node_name_precedence():
    assert lean.node_name("cfgname", {"SLURMD_NODENAME": "gpu007"}) == "gpu007"
    assert lean.node_name("cfgname", {}) == "cfgname"
    assert lean.node_name("", {}) and "." not in lean.node_name("", {})


def test_override_selected_by_slurmd_nodename(tmp_path):
    cfg = C.load(write(tmp_path, OVERRIDES), environ={"SLURMD_NODENAME": "gpu002"})
    assert cfg.gpu.expected_count == 4


def test_simulate_path_is_relative_to_config_file(tmp_path):
    cfg = C.load(write(tmp_path, '[nvml]\nsimulate = "node.toml"\n'))
    assert cfg.nvml.simulate == str(tmp_path / "node.toml")


def test_sample_config_is_current_and_valid():
    path = ROOT / "etc" / "nodehealth.toml"
    assert path.read_text() == sample.document(), "regenerate: nodehealth config defaults > etc/nodehealth.toml"
    cfg = C.load(str(path))
    assert cfg == C.resolve({}, str(path))


def test_sample_config_documents_every_key():
    text = sample.document()
    for spec_name, settings in schema.Config().checks.items():
        assert f"[checks.{spec_name}]" in text
        for field in settings.__dataclass_fields__:
            assert f"# {field} = " in text, (spec_name, field)


def test_config_check_cli_prints_effective_config(tmp_path, capsys):
    path = write(tmp_path, OVERRIDES)
    assert main(["config", "check", path, "--host", "gpu003"]) == 0
    out = capsys.readouterr().out
    assert "valid; effective configuration for host gpu003" in out
    assert "expected_count = 4" in out


def test_config_check_cli_bad_file_is_one_line_exit_2(tmp_path):
    path = write(tmp_path, '[gpu]\nexpected_count = "x"\n')
    proc = subprocess.run(
        [sys.executable, "-m", "nodehealth", "config", "check", path], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0
    assert path in proc.stderr and "gpu.expected_count" in proc.stderr
    assert "Traceback" not in proc.stderr


# --------------------------------------------------------------------------- the fast path's lean reader


def _schema_field(key: str) -> tuple[object, dataclasses.Field]:
    """The dataclass field a dotted key names in the schema, and its default in ``Config()``."""
    *tables, name = key.split(".")
    obj: object = schema.Config()
    for table in tables:
        obj = getattr(obj, table)
    fields = {f.name: f for f in dataclasses.fields(obj)}  # type: ignore[arg-type]
    return getattr(obj, name), fields[name]


@pytest.mark.parametrize("key", [k[0] for k in lean.KEYS])
def test_lean_keys_are_the_schemas_keys_with_one_default(key):
    _, attr, kind, default, lo, hi, choices = lean.BY_KEY[key]
    value, field = _schema_field(key)
    assert value == default and type(value) is type(default), (key, value, default)
    assert (field.metadata["min"], field.metadata["max"], field.metadata["choices"]) == (lo, hi, choices)
    assert {"str": str, "path": str, "bool": bool, "int": int, "number": float}[kind] is type(default)
    assert getattr(lean.Settings(), attr) == default


LEAN_CASES = {
    "empty": "",
    "every-key": """
node_name = "gpu001"
[phases.prolog]
budget_s = 12
[slurm]
timeout_s = 1.5
[paths]
state_dir = "/var/lib/nh"
procfs_root = "/host/proc"
[daemon]
state_max_age_s = 45
xid_follow = false
[ledger]
enabled = false
max_bytes = 8192
[policy]
unknown = "fail"
""",
    "overrides": """
[phases.prolog]
budget_s = 15
[[override]]
hosts = "gpu[001-004]"
phases.prolog.budget_s = 11
slurm.timeout_s = 2
[[override]]
hosts = "gpu002"
[override.paths]
procfs_root = "/p2"
[override.daemon]
state_max_age_s = 10.5
[[override]]
hosts = "gpu[100-200]"
policy.unknown = "fail"
""",
}


@pytest.mark.parametrize("host", ["gpu001", "gpu002", "gpu150"])
@pytest.mark.parametrize("case", list(LEAN_CASES))
def test_lean_reader_agrees_with_the_full_loader(tmp_path, case, host):
    path = write(tmp_path, LEAN_CASES[case])
    env = {"NODEHEALTH_CONFIG": path, "SLURMD_NODENAME": host}
    cfg = C.load(environ=env)
    s, why = lean.read_settings(env)
    assert s is not None, why
    for key, attr, *_ in lean.KEYS:
        obj: object = cfg
        for part in key.split("."):
            obj = getattr(obj, part)
        assert getattr(s, attr) == obj, (key, getattr(s, attr), obj)


@pytest.mark.parametrize(
    "text",
    [
        "[phases.prolog]\nbudget_s = 0.5\n",
        "[slurm]\ntimeout_s = 61\n",
        "[ledger]\nmax_bytes = 100\n",
        "[ledger]\nmax_bytes = 8192.0\n",
        '[policy]\nunknown = "maybe"\n',
        "[paths]\nprocfs_root = 1\n",
        '[[override]]\nhosts = "gpu001"\nslurm.timeout_s = 0\n',
    ],
)
def test_lean_reader_refuses_what_the_loader_refuses(tmp_path, text):
    path = write(tmp_path, text)
    env = {"NODEHEALTH_CONFIG": path, "SLURMD_NODENAME": "gpu001"}
    with pytest.raises(C.ConfigError):
        C.load(environ=env)
    s, why = lean.read_settings(env)
    assert s is None and "has an unexpected value" in why


def test_lean_reader_and_loader_read_the_same_file(tmp_path, monkeypatch):
    default = write(tmp_path, "[phases.prolog]\nbudget_s = 16\n")
    monkeypatch.setattr(lean, "DEFAULT_PATH", default)
    s, _ = lean.read_settings({})
    assert s is not None and s.prolog_budget_s == 16.0 == C.load(environ={}).phases.prolog.budget_s
    assert C.node_name is lean.node_name and C.config_path is lean.config_path


def test_lean_module_imports_only_the_standard_librarys_basics():
    code = (
        "import sys; before = set(sys.modules); import nodehealth.config.lean; "
        "print(' '.join(sorted(set(sys.modules) - before)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert set(out) <= {"__future__", "nodehealth", "nodehealth.config", "nodehealth.config.lean"}, out


def test_a_phase_budget_under_a_check_timeout_caps_it_instead_of_refusing(tmp_path):
    """Lowering the prolog's budget alone is enough: the checks' timeout_s (10 s) is capped by it."""
    from nodehealth import runner

    scenario = Path(__file__).resolve().parent.parent / "examples" / "scenarios" / "hung-nvml-call.toml"
    path = tmp_path / "nodehealth.toml"
    path.write_text(
        f'[phases.prolog]\nbudget_s = 2\n[nvml]\nsimulate = "{scenario}"\n'
        f'[paths]\nstate_dir = "{tmp_path / "state"}"\n',
        encoding="utf-8",
    )
    cfg = C.load(str(path))
    assert cfg.phases.prolog.budget_s == 2 and cfg.checks["gpu_ecc"].timeout_s == 10
    report = runner.run(cfg, phase="prolog", only=("nvml",), node="sim01")
    res = report.results[0]
    # Hung (FAIL) on a quiet machine; on a busy one the GPUs read before the hung call can make it
    # "answering slowly" (UNKNOWN) within the same capped budget: either way never OK, and the 2 s cap held.
    assert (res.status.name, "hung" in res.summary or "slowly" in res.summary) in (("FAIL", True), ("UNKNOWN", True))
    assert report.duration_s < 2.5
