"""What the cold path may import: ``import nodehealth.cli`` and a healthy ``check --phase prolog``.

Each runs in a fresh interpreter and reports ``sys.modules`` at its end; every module of ours must match
an entry of its allow-list (a module name or a package prefix) and no listed heavy module may be there.
Names, not times: a new heavy import on the path fails here, not in a benchmark on a busy machine
(bench/import_budget.py measures what each module costs; docs/performance.md has the table).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nodehealth.registry import CHECKS, select

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "examples" / "scenarios" / "healthy-8x-h100.toml"

RUN = """
import contextlib, io, json, sys
argv = json.loads(sys.argv[1])
if argv:
    import nodehealth.cli as cli
    with contextlib.redirect_stdout(io.StringIO()):
        rc = cli.main(argv)
else:
    import nodehealth.cli
    rc = 0
print(json.dumps({"rc": rc, "modules": sorted(sys.modules)}))
"""

# Third-party and heavy standard-library modules neither path may load. pynvml stays in the NVML
# probe's child; prometheus_client is the daemon's.
NEVER = ("pynvml", "prometheus_client", "nodehealth_sim.validation", "nodehealth.metrics", "nodehealth.daemon")

# `import nodehealth.cli`: the parser's frame and the exit codes; each command is imported when it runs.
CLI_ALLOWED = ("nodehealth", "nodehealth.cli", "nodehealth.commands", "nodehealth.commands.options")
CLI_NEVER = NEVER + (
    "typing",  # cli's annotations only (TYPE_CHECKING)
    "difflib",  # a did-you-mean is imported for the word to correct
    "shutil",  # argparse's formatter imports it for the terminal's width; cli reads the width itself
    "hostlist",
    "tomllib",
    "nodehealth.checks",
    "nodehealth.probes",
    "nodehealth.config.schema",
    "nodehealth.observations",
    "nodehealth.registry",
)

# A healthy prolog-phase check: its command, the config, the registry and the prolog's checks, the runner
# and the probes, what a report needs. The prolog's checks come from the registry (never a list here).
PROLOG_CHECKS = tuple(f"nodehealth.checks.{spec.module_name}" for spec in select("prolog", {}))
PROLOG_ALLOWED = (
    "nodehealth",
    "nodehealth.cli",
    "nodehealth.commands",
    "nodehealth.commands.options",
    "nodehealth.commands.common",
    "nodehealth.commands.check",
    "nodehealth.commands.progress",
    "nodehealth.faces",
    "nodehealth.faces.table",
    "nodehealth.config.",
    "nodehealth.config",
    "nodehealth.registry",
    "nodehealth.checks",
    "nodehealth.checks.base",
    *PROLOG_CHECKS,
    "nodehealth.observations",
    "nodehealth.observations.",  # records, cheap to define (observations.record); the NCCL ones excepted below
    "nodehealth.model",
    "nodehealth.render",
    "nodehealth.hints",
    "nodehealth.runner",
    "nodehealth.probes.",
    "nodehealth.probes",
    "nodehealth.platform.",
    "nodehealth.platform",
    "nodehealth.statedir.",
    "nodehealth.statedir",
    "nodehealth.slurm",
    "nodehealth.slurm.nodes",
    "nodehealth.slurm.jobenv",
    "nodehealth.xid.",
    "nodehealth.xid",
    "nodehealth_sim",  # the simulated GPUs of this run
    "nodehealth_sim.",
)
PROLOG_NEVER = NEVER + (
    "psutil",  # the memory probe reads /proc/meminfo itself
    # OpenSSL and the network stack: private names are os.urandom's, the host name os.uname()'s, the Slurm
    # reconciliation's hash _blake2's; tempfile and ctypes.util are pynvml's, in the NVML child only
    "hashlib",
    "_hashlib",
    "hmac",
    "secrets",
    "socket",
    "tempfile",
    "ctypes.util",
    "difflib",  # --only's did-you-mean, for a name to correct
    "shlex",  # the simulator's build, not its driver
    "hostlist",  # a config's [[override]] rules (this one has none)
    "nodehealth.config.locate",  # the lines of a config's errors
    "nodehealth.checks.nccl_selftest",  # a check the prolog does not run is not imported
    "nodehealth.checks.job_forensics",
    "nodehealth.observations.nccl",
    "nodehealth.nccl",
    "nodehealth.slurm.act",
    "nodehealth.slurm.client",  # the prolog reads the cached Slurm view: no client
    "nodehealth.slurm.observe",
    "nodehealth.slurm.policy",
    "nodehealth.preflight",
    "nodehealth.validation",
)


def modules_after(argv: list[str], tmp_path: Path) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-c", RUN, json.dumps(argv)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["rc"] == 0, proc.stderr
    names: list[str] = out["modules"]
    return names


def not_allowed(names: list[str], allowed: tuple[str, ...]) -> list[str]:
    """Our modules (nodehealth, nodehealth_sim) matched by no entry: ``a.b`` names one, ``a.b.`` a package's."""
    ours = [n for n in names if n.split(".")[0] in ("nodehealth", "nodehealth_sim")]
    return [n for n in ours if not any(n == a or (a.endswith(".") and n.startswith(a)) for a in allowed)]


def loaded(names: list[str], never: tuple[str, ...]) -> list[str]:
    return [n for n in names if any(n == bad or n.startswith(bad + ".") for bad in never)]


@pytest.mark.skipif(
    sys.version_info < (3, 10), reason="Python 3.9's standard library loads typing and tokenize's regexes itself"
)
def test_import_cli_loads_no_command(tmp_path: Path) -> None:
    names = modules_after([], tmp_path)
    assert not not_allowed(names, CLI_ALLOWED), not_allowed(names, CLI_ALLOWED)
    assert not loaded(names, CLI_NEVER), loaded(names, CLI_NEVER)


@pytest.mark.skipif(sys.version_info < (3, 10), reason="3.9's stdlib loads typing, tokenize")
def test_a_healthy_prolog_check_loads_only_its_own(tmp_path: Path) -> None:
    cfg = tmp_path / "empty.toml"
    cfg.write_text("", encoding="utf-8")
    names = modules_after(["check", "--config", str(cfg), "--phase", "prolog", "--simulate", str(SCENARIO)], tmp_path)
    assert not not_allowed(names, PROLOG_ALLOWED), not_allowed(names, PROLOG_ALLOWED)
    assert not loaded(names, PROLOG_NEVER), loaded(names, PROLOG_NEVER)
    assert set(PROLOG_CHECKS) <= set(names)  # the run did import what it judged


def test_the_rules_can_fail() -> None:
    names = ["nodehealth", "nodehealth.cli", "nodehealth.metrics.families", "nodehealth.probes.nvml", "pynvml"]
    assert not_allowed(names, CLI_ALLOWED) == ["nodehealth.metrics.families", "nodehealth.probes.nvml"]
    assert loaded(names, CLI_NEVER) == ["nodehealth.metrics.families", "nodehealth.probes.nvml", "pynvml"]
    assert not_allowed(["nodehealth.probesx"], ("nodehealth.probes.",)) == ["nodehealth.probesx"]


def test_a_check_module_is_imported_on_first_use(tmp_path: Path) -> None:
    """The registry names modules by string; the config makes a check's defaults only when asked."""
    code = (
        "import json, sys\n"
        "from nodehealth.config.schema import Config\n"
        "cfg = Config()\n"
        "before = sorted(m for m in sys.modules if m.startswith('nodehealth.checks.'))\n"
        "enabled = cfg.enabled()\n"
        "after_enabled = sorted(m for m in sys.modules if m.startswith('nodehealth.checks.'))\n"
        "cfg.checks['gpu_ecc'].timeout_s\n"
        "print(json.dumps([before, after_enabled, 'nodehealth.checks.gpu_ecc' in sys.modules, enabled]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    before, after_enabled, ecc, enabled = json.loads(proc.stdout)
    assert before == after_enabled == ["nodehealth.checks.base"]
    assert ecc
    assert enabled == {spec.name: spec.default_enabled for spec in CHECKS}


@pytest.mark.parametrize("spec", CHECKS, ids=lambda s: s.name)
def test_a_checks_defaults_leave_enabled_unset(spec) -> None:  # type: ignore[no-untyped-def]
    """``Config.enabled()`` reads a check it has not made as "unset": true only while each default is."""
    assert spec.settings_class().enabled is None


def test_the_lazy_table_is_every_check(tmp_path: Path) -> None:
    from nodehealth.config.schema import CheckTable, Config

    cfg = Config()
    assert isinstance(cfg.checks, CheckTable)
    assert list(cfg.checks) == [spec.name for spec in CHECKS] == list(dict(cfg.checks.items()))
    assert len(cfg.checks) == len(CHECKS) and "gpu_ecc" in cfg.checks and "nope" not in cfg.checks
    assert cfg.checks.get("nope") is None
    with pytest.raises(KeyError):
        cfg.checks["nope"]
    plain = {spec.name: spec.settings_class() for spec in CHECKS}
    assert cfg.checks == plain and {**cfg.checks} == plain and Config() == cfg


def test_the_nvml_child_starts_before_the_xid_check_is_imported() -> None:
    """The runner reads a probe's deadline (its checks' settings, their modules) when it starts that probe:
    NVML, forked first, needs only the GPU checks', and gpu_xid's XID stack loads while the child reads."""
    code = (
        "import json, sys\n"
        "from nodehealth import runner\n"
        "from nodehealth.config.schema import Config\n"
        "from nodehealth.observations import ProbeError\n"
        "from nodehealth.probes import PROBES, Probe\n"
        "seen = {}\n"
        "def fake(name):\n"
        "    def gather(ctx, timeout_s):\n"
        "        seen[name] = ('nodehealth.checks.gpu_xid' in sys.modules, timeout_s)\n"
        "        return ProbeError(name, 'unavailable', 'fake')\n"
        "    return gather\n"
        "table = {n: Probe(n, fake(n), forks=p.forks) for n, p in PROBES.items()}\n"
        "report = runner.run(Config(), 'prolog', probes=table)\n"
        "print(json.dumps([seen, sorted(r.name for r in report.results)]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    seen, judged = json.loads(proc.stdout)
    assert seen["nvml"][0] is False and seen["xid"][0] is True, seen
    assert seen["nvml"][1] == seen["xid"][1] == 10.0  # the checks' default timeout_s, as before
    assert judged == sorted(spec.name for spec in select("prolog", {}))


def test_deadlines_are_the_largest_timeout_of_the_checks_that_need_the_probe() -> None:
    import dataclasses

    from nodehealth.config.schema import CheckTable, Config
    from nodehealth.runner import Deadlines

    base = Config()
    checks = CheckTable({"gpu_ecc": dataclasses.replace(base.checks["gpu_ecc"], timeout_s=20.0)})
    checks["gpu_xid"] = dataclasses.replace(base.checks["gpu_xid"], timeout_s=30.0)
    cfg = dataclasses.replace(base, checks=checks)
    specs = select("prolog", {})
    deadlines = Deadlines(specs, cfg)
    assert deadlines["nvml"] == 20.0  # gpu_xid only uses NVML: its 30 s is not NVML's deadline
    assert deadlines["xid"] == 30.0
    only_xid = Deadlines(select("prolog", {}, only=("gpu_xid",)), cfg)
    assert list(only_xid) == ["xid", "nvml"] and only_xid["nvml"] == 30.0  # used only: its users' deadline
    with pytest.raises(KeyError):
        deadlines["nccl"]
    order: dict[str, None] = {}
    for spec in specs:
        order.update(dict.fromkeys(spec.needs))
    for spec in specs:  # then the probes only used, in their users' order
        order.update(dict.fromkeys(p for p in spec.uses if p not in order))
    assert list(deadlines) == list(order)
