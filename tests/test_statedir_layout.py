"""Two directories, one layout: what belongs to one boot in ``[paths] state_dir`` (a tmpfs), what must
outlive a reboot in ``[paths] persistent_dir``, the rule for configs from before the split, and the
upgrade that moves a drain record from the run dir once, on the ground rules of ``statedir.files``.

docs/operations.md ("Where the state lives"), docs/security.md ("The state dir").
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from test_slurm_faces import Fake

from nodehealth.config import lastgood, lean
from nodehealth.config.loader import load_valid
from nodehealth.config.schema import Config
from nodehealth.faces import healthcheck
from nodehealth.statedir import files, layout, slurmstate

NOBODY = 65534
RECORD = {
    "version": 1,
    "clean_runs": 0,
    "boot_id": "boot-1",
    "drain": {
        "reason": "nodehealth: gpu_remapped_rows: GPU 3 row remap pending",
        "check": "gpu_remapped_rows",
        "action": "reboot",
        "boot_id": "boot-1",
        "time": 1000.0,
        "phase": "health",
    },
}


class Dirs:
    """A config with a run dir and a persistent dir of its own (as a default install has them)."""

    def __init__(self, tmp: Path) -> None:
        self.run, self.lib = tmp / "run" / "nodehealth", tmp / "var" / "lib" / "nodehealth"
        self.state_dir, self.persistent_dir = str(self.run), str(self.lib)


def logger() -> tuple[list[str], Any]:
    said: list[str] = []
    return said, lambda msg, **kw: said.append(msg)


def old_record(d: Dirs, record: dict[str, Any] = RECORD) -> Path:
    """The drain record where the layout before the split kept it: the run dir, root's, 0600."""
    files.require_state_dir(d.state_dir)
    old = d.run / layout.SLURM_STATE
    files.write_atomic(str(old), json.dumps(record))
    return old


# --- the layout and the rule -------------------------------------------------------------------

# The defaults of [paths]: /run/nodehealth and /var/lib/nodehealth, under the suite's own sandbox
# while it runs (tests/conftest.py; tests/test_host_guard.py pins the production values).
RUN, LIB = lean.default("paths.state_dir"), lean.default("paths.persistent_dir")


def test_a_default_install_keeps_what_outlives_a_boot_in_var_lib_and_the_rest_in_run() -> None:
    paths = Config().paths
    assert (paths.state_dir, paths.persistent_dir) == (RUN, LIB)
    for name in (layout.SLURM_STATE, layout.CONFIG_GOOD):
        assert layout.path_for(paths, name) == f"{LIB}/{name}"
    for name in (layout.DAEMON_STATE, layout.XID_EVENTS, layout.COUNTERS, layout.LEDGER):
        assert layout.path_for(paths, name) == f"{RUN}/{name}"
    assert layout.earlier_path(paths, layout.SLURM_STATE) == f"{RUN}/slurm-state.json"
    assert layout.earlier_path(paths, layout.DAEMON_STATE) is None
    assert layout.path_for("/one", layout.SLURM_STATE) == "/one/slurm-state.json"  # one directory for all


CASES = {
    # (what the file says, state_dir, persistent_dir) for the node n1
    "nothing": ("", RUN, LIB),
    "state_dir only (moved before the split)": ('[paths]\nstate_dir = "/srv/nh"\n', "/srv/nh", "/srv/nh"),
    "both": ('[paths]\nstate_dir = "/srv/run"\npersistent_dir = "/srv/lib"\n', "/srv/run", "/srv/lib"),
    "persistent_dir only": ('[paths]\npersistent_dir = "/srv/lib"\n', RUN, "/srv/lib"),
    "state_dir in an override for this node": (
        '[[override]]\nhosts = "n[1-2]"\npaths.state_dir = "/srv/nh"\n',
        "/srv/nh",
        "/srv/nh",
    ),
    "state_dir in an override for another node": (
        '[[override]]\nhosts = "n9"\npaths.state_dir = "/srv/nh"\n',
        RUN,
        LIB,
    ),
    "persistent_dir in the file, state_dir in an override": (
        '[paths]\npersistent_dir = "/srv/lib"\n[[override]]\nhosts = "n1"\npaths.state_dir = "/srv/nh"\n',
        "/srv/nh",
        "/srv/lib",
    ),
}


@pytest.mark.parametrize("text,state_dir,persistent_dir", CASES.values(), ids=CASES.keys())
def test_the_full_loader_and_the_fast_paths_reader_place_the_dirs_alike(
    tmp_path: Path, text: str, state_dir: str, persistent_dir: str
) -> None:
    """A config that sets state_dir and not persistent_dir keeps everything in that state_dir (every
    test config of the suite is one, and a site that followed the old advice loses nothing)."""
    path = tmp_path / "nh.toml"
    path.write_text(text)
    env = {"NODEHEALTH_CONFIG": str(path), "SLURMD_NODENAME": "n1"}
    cfg, _ = load_valid(str(path), env, remember=False)
    s, why = lean.read_settings(env)
    assert s is not None, why
    assert (cfg.paths.state_dir, cfg.paths.persistent_dir) == (state_dir, persistent_dir)
    assert (s.state_dir, s.persistent_dir) == (state_dir, persistent_dir)
    assert layout.path_for(s, layout.CONFIG_GOOD) == lastgood.path_in(cfg.paths)


def test_a_validated_config_is_kept_in_the_persistent_dir_and_the_fast_path_finds_it(tmp_path: Path) -> None:
    d = Dirs(tmp_path)
    path = tmp_path / "nh.toml"
    path.write_text(f'[paths]\nstate_dir = "{d.run}"\npersistent_dir = "{d.lib}"\n')
    load_valid(str(path), {})
    assert (d.lib / layout.CONFIG_GOOD).exists() and not (d.run / layout.CONFIG_GOOD).exists()
    assert oct(os.stat(d.lib).st_mode & 0o7777) == "0o700"
    s, _ = lean.read_settings({"NODEHEALTH_CONFIG": str(path)})
    assert s is not None and lastgood.unchanged(s, s.config_path, s.config_id) == ""


def test_a_persistent_dir_others_can_write_gets_no_record(tmp_path: Path) -> None:
    d = Dirs(tmp_path)
    d.lib.mkdir(parents=True)
    os.chown(d.lib, NOBODY, NOBODY)  # another user's: it could swap the record the next face trusts
    with pytest.raises(files.UnsafeDir):
        lastgood.record(d, "/etc/nodehealth/nodehealth.toml", "x = 1\n", None, 1000.0)
    assert slurmstate.update(d, lambda s: s, 0.1) is None
    assert list(d.lib.iterdir()) == []


# --- the faces on the split layout -------------------------------------------------------------


def split(f: Fake, tmp: Path) -> Dirs:
    """The Fake's config with a run dir and a persistent dir."""
    d = Dirs(tmp)
    cfg = Path(os.environ["NODEHEALTH_CONFIG"])
    cfg.write_text(
        cfg.read_text().replace(f'state_dir = "{tmp}/state"', f'state_dir = "{d.run}"\npersistent_dir = "{d.lib}"')
    )
    return d


def test_a_reboot_class_drain_outlives_the_run_dir_and_resumes_after_the_reboot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's path on a default layout: drained for a reboot-class fault, then the reboot (the
    tmpfs run dir gone, a new boot id): the record in the persistent dir makes the reason provably
    ours, and clean runs after the new boot resume the node."""
    f = Fake(tmp_path, monkeypatch, scenario="gpu-missing.toml", clean_runs=1)
    monkeypatch.delenv("SLURM_JOB_ID")
    d = split(f, tmp_path)
    assert healthcheck.main() == 1
    assert f.nodes()["n1"][0] == "IDLE+DRAIN"
    kept = json.loads((d.lib / layout.SLURM_STATE).read_text())
    assert kept["drain"]["action"] == "reboot" and not (d.run / layout.SLURM_STATE).exists()
    shutil.rmtree(d.run)  # the reboot: the tmpfs is empty
    f.boot.write_text("boot-2\n")
    f.use("healthy.toml")
    assert healthcheck.main() == 0
    assert f.nodes()["n1"] == ["IDLE", None]
    assert json.loads((d.lib / layout.SLURM_STATE).read_text())["drain"] is None
    assert files.check_dir(str(d.run)) is None and files.check_dir(str(d.lib)) is None


def test_one_wiped_directory_forgets_the_drain_and_leaves_it_to_a_person(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same with the single tmpfs dir of before (a config that sets state_dir only): after the
    reboot the reason is no longer provably ours and the node is not resumed."""
    f = Fake(tmp_path, monkeypatch, scenario="gpu-missing.toml", clean_runs=1)
    monkeypatch.delenv("SLURM_JOB_ID")
    assert healthcheck.main() == 1
    shutil.rmtree(tmp_path / "state")
    f.boot.write_text("boot-2\n")
    f.use("healthy.toml")
    assert healthcheck.main() == 0 and healthcheck.main() == 0
    assert f.nodes()["n1"][0] == "IDLE+DRAIN"
    assert not [u for u in f.updates() if "state=resume" in u]


# --- the upgrade -------------------------------------------------------------------------------


def test_an_upgraded_node_keeps_its_drain_record_moved_once(tmp_path: Path) -> None:
    d = Dirs(tmp_path)
    old = old_record(d)
    assert slurmstate.load(d).drain is not None  # a reader before the first write sees it where it was
    assert old.exists() and not d.lib.exists()  # and moves nothing
    said, log = logger()
    new = slurmstate.update(d, lambda s: s, 0.5, log)
    assert new is not None and new.drain is not None and new.drain.reason == RECORD["drain"]["reason"]
    assert not old.exists()
    assert json.loads((d.lib / layout.SLURM_STATE).read_text())["drain"]["check"] == "gpu_remapped_rows"
    assert oct(os.stat(d.lib / layout.SLURM_STATE).st_mode & 0o7777) == "0o600"
    assert [m for m in said if "moved" in m] == [
        f"moved {old} to {d.lib / layout.SLURM_STATE} (state that must "
        "outlive a reboot now lives in the persistent dir)"
    ]
    said.clear()
    slurmstate.update(d, lambda s: s, 0.5, log)
    assert said == []  # once


def test_an_upgrade_never_overwrites_a_persistent_record(tmp_path: Path) -> None:
    d = Dirs(tmp_path)
    old_record(d)
    slurmstate.update(Dirs(tmp_path).persistent_dir, lambda s: slurmstate.State(clean_runs=5), 0.5)
    assert slurmstate.load(d).clean_runs == 5 and slurmstate.load(d).drain is None
    slurmstate.update(d, lambda s: s, 0.5)
    assert slurmstate.load(d).clean_runs == 5 and (d.run / layout.SLURM_STATE).exists()


def _symlink(d: Dirs, old: Path, tmp: Path) -> None:
    elsewhere = tmp / "elsewhere.json"
    elsewhere.write_text(json.dumps(RECORD))
    old.unlink()
    old.symlink_to(elsewhere)


def _hard_link(d: Dirs, old: Path, tmp: Path) -> None:
    other = tmp / "other.json"
    os.link(old, other)


def _fifo(d: Dirs, old: Path, tmp: Path) -> None:
    old.unlink()
    os.mkfifo(old, 0o600)


def _nobodys(d: Dirs, old: Path, tmp: Path) -> None:
    os.chown(old, NOBODY, NOBODY)


def _group_writable(d: Dirs, old: Path, tmp: Path) -> None:
    old.chmod(0o620)


def _not_strict_json(d: Dirs, old: Path, tmp: Path) -> None:
    old.write_text('{"version": 1, "clean_runs": NaN, "drain": null}')


HOSTILE = {
    "a symlink": (_symlink, "symbolic link"),
    "a hard link": (_hard_link, "has 2 names"),
    "a FIFO": (_fifo, "not a regular file"),
    "another user's file": (_nobodys, f"owned by uid {NOBODY}"),
    "a group-writable file": (_group_writable, "writable by group or others"),
    "NaN": (_not_strict_json, "not valid JSON"),
}


@pytest.mark.parametrize("plant,why", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_hostile_or_corrupt_old_file_is_refused_without_losing_protection(
    tmp_path: Path, plant: Any, why: str
) -> None:
    """Refused: not read, not moved, said once; the state is written afresh in the persistent dir and
    keeps working (a drain recorded after it is kept, and a reboot does not lose it)."""
    d = Dirs(tmp_path)
    old = old_record(d)
    plant(d, old, tmp_path)
    assert slurmstate.load(d) == slurmstate.State()
    said, log = logger()
    assert slurmstate.update(d, lambda s: s, 0.5, log) == slurmstate.State()
    (line,) = [m for m in said if "before the upgrade" in m]
    assert why in line and str(old) in line
    assert os.path.lexists(old)  # left where it was, nothing written through it
    assert not (tmp_path / "elsewhere.json").exists() or json.loads((tmp_path / "elsewhere.json").read_text()) == RECORD
    drained = slurmstate.DrainRecord("nodehealth: x: y", "x", "reboot", "boot-1", 2000.0, "health")
    assert slurmstate.update(d, lambda s: slurmstate.State(drain=drained), 0.5, log) is not None
    assert [m for m in said if "before the upgrade" in m] == [line]  # said once
    shutil.rmtree(d.run)
    assert slurmstate.load(d).drain == drained


def test_check_by_hand_neither_makes_the_persistent_dir_nor_moves_an_old_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`nodehealth check` writes nothing (docs/operations.md): on the split layout it reads the drain
    record where an upgrade left it and creates no persistent dir."""
    from test_check_writes_nothing import cli, node, snapshot

    _, cfg, env = node(tmp_path, monkeypatch, "remap-pending.toml")
    d = Dirs(tmp_path)
    cfg.write_text(
        cfg.read_text().replace(f'state_dir = "{tmp_path}/state"', f'state_dir = "{d.run}"\npersistent_dir = "{d.lib}"')
    )
    old_record(d)
    before = snapshot(d.run)
    for argv in (["check"], ["check", "--as", "healthcheck"]):
        res = cli(*argv, "--config", str(cfg), env=env)
        assert res.returncode == 1, (argv, res.stdout + res.stderr)
        assert not os.path.lexists(d.lib) and snapshot(d.run) == before, argv


def test_the_daemon_refuses_a_persistent_dir_another_user_owns(tmp_path: Path) -> None:
    from nodehealth.daemon.core import StartError, validate_start

    d = Dirs(tmp_path)
    d.lib.mkdir(parents=True)
    os.chown(d.lib, NOBODY, NOBODY)
    path = tmp_path / "nh.toml"
    scenario = Path(__file__).parent / "fixtures" / "slurm" / "healthy.toml"
    path.write_text(f'[nvml]\nsimulate = "{scenario}"\n[paths]\nstate_dir = "{d.run}"\npersistent_dir = "{d.lib}"\n')
    cfg, _ = load_valid(str(path), {}, remember=False)
    with pytest.raises(StartError, match=f"persistent dir {d.lib}: .*owned by uid {NOBODY}"):
        validate_start(cfg)
    os.chown(d.lib, 0, 0)
    validate_start(cfg)
    assert oct(os.stat(d.run).st_mode & 0o7777) == "0o700"
