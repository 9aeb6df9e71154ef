"""The suite never reaches the host's state dirs, and its guard fails only the tests' own writes there.

tests/conftest.py moves the defaults of ``[paths]`` under a directory of the run
(``NODEHEALTH_DEFAULT_ROOT``, read by ``nodehealth.config.lean``) for the test process and every
program it starts, and watches what the test process and its forked children change under the
host's dirs (tests/hostguard.py). The guard's own test runs a small session of its own against
two directories that stand in for the host's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import conftest

from nodehealth.config import lean, sample
from nodehealth.config.schema import Config

HERE = Path(__file__).resolve().parent
PROBE = (
    "from nodehealth.config import lean; from nodehealth.config.schema import Config; "
    "p = Config().paths; s = lean.Settings(); "
    "print(p.state_dir, p.persistent_dir, s.state_dir, s.persistent_dir)"
)


def defaults_under(env: dict[str, str]) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-I", "-c", PROBE], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def test_the_production_defaults_are_the_host_dirs_and_the_suite_moves_them_into_its_sandbox() -> None:
    bare = {k: v for k, v in os.environ.items() if k != lean.DEFAULT_ROOT_ENV}
    production = ["/run/nodehealth", "/var/lib/nodehealth"] * 2
    assert defaults_under(bare) == production
    assert defaults_under({**bare, lean.DEFAULT_ROOT_ENV: "relative/dir"}) == production  # not absolute: ignored
    assert defaults_under({**bare, lean.DEFAULT_ROOT_ENV: "/x/"}) == ["/x/run/nodehealth", "/x/var/lib/nodehealth"] * 2
    # this process and the programs it starts (python -I keeps the variable) are in the run's sandbox
    root = conftest.SANDBOX_ROOT
    assert root != "/" and os.environ[lean.DEFAULT_ROOT_ENV] == root
    moved = [f"{root}/run/nodehealth", f"{root}/var/lib/nodehealth"]
    assert [Config().paths.state_dir, Config().paths.persistent_dir] == moved
    assert defaults_under(dict(os.environ)) == moved * 2
    # the sample config (and `nodehealth config defaults`) still documents the production paths
    text = sample.document()
    assert '# state_dir = "/run/nodehealth"' in text and '# persistent_dir = "/var/lib/nodehealth"' in text
    assert root not in text


def test_a_path_a_config_sets_is_never_moved(tmp_path: Path) -> None:
    from nodehealth.config.loader import load_valid

    path = tmp_path / "nh.toml"
    path.write_text('[paths]\nstate_dir = "/srv/nh"\npersistent_dir = "/srv/lib"\n')
    cfg, _ = load_valid(str(path), {}, remember=False)
    assert (cfg.paths.state_dir, cfg.paths.persistent_dir) == ("/srv/nh", "/srv/lib")


INNER = """
import os, subprocess, sys

RUN, LIB = os.environ["NODEHEALTH_TEST_GUARDED_DIRS"].split(":")


def test_another_process_writes_there():
    # a daemon or an administrator on the host: not the suite's business
    code = ("import os, sys; open(os.path.join(sys.argv[1], 'verdict.json'), 'w').write('{}'); "
            "os.mkdir(sys.argv[2] + '/d')")
    subprocess.run([sys.executable, "-c", code, RUN, LIB], check=True)
    assert os.path.exists(os.path.join(RUN, "verdict.json"))


def test_reading_there():
    with open(os.path.join(RUN, "verdict.json")) as f:
        f.read()
    os.listdir(LIB)


def test_own_open_for_writing():
    with open(os.path.join(RUN, "mine.json"), "w") as f:
        f.write("{}")


def test_own_rename_into_it(tmp_path):
    (tmp_path / "t").write_text("x")
    os.replace(tmp_path / "t", os.path.join(LIB, "record.json"))


def test_own_write_through_the_directory_descriptor():
    fd = os.open(RUN, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.close(os.open("by-name", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd))
    finally:
        os.close(fd)


def test_own_rmdir_there():
    os.rmdir(os.path.join(LIB, "d"))


def test_forked_child_writes():
    pid = os.fork()
    if pid == 0:
        try:
            os.close(os.open(os.path.join(RUN, "child"), os.O_WRONLY | os.O_CREAT, 0o600))
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
"""

EXPECTED = {
    "test_another_process_writes_there": "PASSED",
    "test_reading_there": "PASSED",
    "test_own_open_for_writing": "ERROR",  # the guard fails the test in its teardown
    "test_own_rename_into_it": "ERROR",
    "test_own_write_through_the_directory_descriptor": "ERROR",
    "test_own_rmdir_there": "ERROR",
    "test_forked_child_writes": "ERROR",
}


def test_the_guard_fails_the_tests_own_writes_and_not_another_process(tmp_path: Path) -> None:
    session = tmp_path / "session"
    session.mkdir()
    for name in ("conftest.py", "hostguard.py"):
        shutil.copy(HERE / name, session / name)
    (session / "pytest.ini").write_text("[pytest]\n")
    (session / "test_inner.py").write_text(INNER)
    run, lib = tmp_path / "host-run", tmp_path / "host-lib"
    run.mkdir()
    lib.mkdir()
    env = {**os.environ, conftest.GUARDED_ENV: f"{run}:{lib}"}
    env.pop("PYTEST_ADDOPTS", None)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly", "-rA", "-q", "test_inner.py"],
        cwd=session,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    out = proc.stdout + proc.stderr
    got = {}
    for line in out.splitlines():
        word, _, rest = line.partition(" ")
        if word in ("PASSED", "FAILED", "ERROR") and "::" in rest:
            got[rest.split("::")[1].split(" ")[0]] = word
    assert got == EXPECTED, out
    assert "test_inner.py::test_own_open_for_writing changed the host's state dirs" in out
    assert f"open for writing {run}/mine.json" in out and f"os.rename {lib}/record.json" in out
    assert f"open as a directory descriptor {run}" in out and f"os.rmdir {lib}/d" in out
    assert f"open for writing {run}/child" in out  # reported by the forked child itself
