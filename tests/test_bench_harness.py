"""One Slurm harness for the tests and the benches: only ``tests/slurm_daemons.py`` (and the two clusters built
on it, ``tests/slurm_cluster.py`` and ``tests/multinode.py``) start munged, slurmctld and slurmd; every bench
that needs a private Slurm builds on them."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HARNESS = {"tests/slurm_daemons.py", "tests/slurm_cluster.py", "tests/multinode.py"}
MUNGED = "/usr/sbin/munged"  # every private Slurm starts its own munged first
SLURM_DAEMONS = ("/usr/sbin/slurmctld", "/usr/sbin/slurmd")
RUNS = {"Popen", "run", "call", "check_call", "check_output"}


def _starts_a_slurm_daemon(node: ast.Call) -> bool:
    """``subprocess.Popen([...slurmctld/slurmd..., "-D"])`` and the like: a daemon started in the foreground."""
    name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
    if name not in RUNS or not node.args or not isinstance(node.args[0], (ast.List, ast.Tuple)):
        return False
    words = [e.value for e in node.args[0].elts if isinstance(e, ast.Constant)]
    return bool(words) and words[0] in SLURM_DAEMONS and "-D" in words


def daemon_starters(paths: list[Path]) -> list[str]:
    """``file:line`` of each place outside the harness that starts munged, slurmctld or slurmd itself
    (a restart through the harness's own ``_spawn`` is the harness's)."""
    found = []
    for path in paths:
        rel = path.relative_to(ROOT).as_posix()
        if rel in HARNESS or path.resolve() == Path(__file__).resolve():  # this rule names them itself
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith(MUNGED):
                found.append(f"{rel}:{node.lineno} munged")
            elif isinstance(node, ast.Call) and _starts_a_slurm_daemon(node):
                found.append(f"{rel}:{node.lineno} a Slurm daemon")
    return sorted(found)


def test_no_bench_or_test_starts_slurm_but_the_harness() -> None:
    paths = sorted((ROOT / "bench").glob("*.py")) + sorted((ROOT / "tests").glob("*.py"))
    found = daemon_starters(paths)
    assert not found, "a private Slurm started outside the harness (tests/slurm_daemons.py):\n" + "\n".join(found)


def test_the_rule_can_fail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bench = tmp_path / "bench"
    bench.mkdir()
    (bench / "own_cluster.py").write_text(
        "import subprocess\n"
        "subprocess.Popen(['/usr/sbin/munged', '-F'])\n"
        "subprocess.Popen(['/usr/sbin/slurmctld', '-D'], env={})\n"
    )
    (bench / "fine.py").write_text(
        "import subprocess\n"
        "LOG = 'slurmctld.log'\n"
        "subprocess.run(['/usr/sbin/slurmctld', '-V'])\n"
        "c._spawn('slurmd', ['/usr/sbin/slurmd', '-D'])\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert daemon_starters(sorted(bench.glob("*.py"))) == [
        "bench/own_cluster.py:2 munged",
        "bench/own_cluster.py:3 a Slurm daemon",
    ]


def test_the_rpc_bench_cluster_is_the_harness_multinode() -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import slurm_rpc_cluster
        from multinode import MultiNode
    finally:
        sys.path.remove(str(ROOT / "bench"))
    assert issubclass(slurm_rpc_cluster.Cluster, MultiNode)
