"""``nodehealth check`` run by hand leaves the state dir as it found it (docs/operations.md, "What check
reads and writes").

Run as an administrator runs it: the installed ``nodehealth`` program, a process of its own, with
``--config`` naming a config whose state dir is the test's. The state dir is snapshotted (every
name, kind, size, mtime, mode, inode and content) before and after, on a healthy node and on one
with a fault and an XID in the kernel log that the store has not seen yet, with a stale cached
Slurm view (so the check asks slurmctld, and would cache its answer), and with no state dir at all
(it must not be created). The faces themselves, run the same way, do write: the guard is what keeps
the check quiet.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_slurm_faces import Fake

from nodehealth.statedir import layout

BIN = Path(sys.executable).parent
XID_79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus."


def snapshot(d: Path) -> object:
    """Everything about ``d`` and below it that a write could change; None when ``d`` does not exist."""
    if not os.path.lexists(d):
        return None
    out = []
    for p in [d, *sorted(d.rglob("*"))]:
        st = os.lstat(p)
        body = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() and not p.is_symlink() else None
        out.append((str(p.relative_to(d)), st.st_mode, st.st_size, st.st_mtime_ns, st.st_ino, st.st_nlink, body))
    return out


def cli(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    exe = BIN / "nodehealth"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "nodehealth"]
    return subprocess.run([*cmd, *argv], capture_output=True, text=True, env=env, cwd="/", timeout=300)


def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scenario: str) -> tuple[Fake, Path, dict[str, str]]:
    """A simulated node with a fake scontrol and a recorded kernel log (kernel-facility records)."""
    f = Fake(tmp_path, monkeypatch, scenario=scenario)
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("6,1,1000000,-;Linux version 6.1.0\n")
    cfg = tmp_path / "nh.toml"
    cfg.write_text(cfg.read_text() + f'[checks.gpu_xid]\nkmsg_path = "{kmsg}"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "NODEHEALTH"))}
    return f, cfg, env


def stale_slurm_view(sd: Path) -> None:
    """Age the cached Slurm view past [slurm] reconcile_s: the next health check or check asks slurmctld."""
    path = sd / layout.SLURM_STATE
    state = json.loads(path.read_text())
    state["slurm_node"]["time"] = 1000.0
    path.write_text(json.dumps(state))


@pytest.mark.parametrize(
    "argv",
    [
        ["check"],
        ["check", "--format", "json"],
        ["check", "-v", "--phase", "healthcheck"],
        ["check", "--as", "healthcheck"],
        ["check", "--as", "prolog", "--job", "7"],
    ],
    ids=["text", "json", "healthcheck-phase", "as-healthcheck", "as-prolog"],
)
@pytest.mark.parametrize("scenario", ["healthy.toml", "remap-pending.toml"])
def test_check_leaves_an_existing_state_dir_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scenario: str, argv: list[str]
) -> None:
    f, cfg, env = node(tmp_path, monkeypatch, scenario)
    sd = tmp_path / "state"
    face_env = {
        **env,
        "NODEHEALTH_CONFIG": str(cfg),
        "SLURMD_NODENAME": "n1",
        "SLURM_JOB_ID": "7",
        "SLURM_JOB_GPUS": "0,1",
    }
    # The node's own faces fill the state dir as Slurm runs them: ledger, counters, Slurm view, XID store.
    for face in ("nodehealth-healthcheck", "nodehealth-prolog"):
        exe = BIN / face
        res = subprocess.run([str(exe)], capture_output=True, text=True, env=face_env, cwd="/", timeout=300)
        assert res.returncode in (0, 1), res.stderr
    assert {layout.SLURM_STATE, layout.LEDGER, layout.XID_EVENTS, layout.CONFIG_GOOD} <= {p.name for p in sd.iterdir()}
    stale_slurm_view(sd)
    with open(tmp_path / "kmsg", "a") as log:  # an XID the store has not read yet
        log.write(f"4,2,2000000,-;{XID_79}\n")
    calls = len(f.calls())
    before = snapshot(sd)
    res = cli(*argv, "--config", str(cfg), env=env)
    assert res.returncode == 1, res.stdout + res.stderr  # the XID (and the remap) is a fault either way
    assert "79" in res.stdout
    assert snapshot(sd) == before
    if argv[:2] != ["check", "--as"]:
        assert len(f.calls()) == calls + 1  # it did ask slurmctld (the view was stale), and kept the answer to itself


@pytest.mark.parametrize("scenario", ["healthy.toml", "remap-pending.toml"])
def test_check_does_not_create_a_missing_state_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scenario: str
) -> None:
    f, cfg, env = node(tmp_path, monkeypatch, scenario)
    with open(tmp_path / "kmsg", "a") as log:
        log.write(f"4,2,2000000,-;{XID_79}\n")
    for argv in (
        ["check"],
        ["check", "--format", "json"],
        ["check", "--as", "healthcheck"],
        ["check", "--as", "prolog"],
        ["check", "--as", "epilog", "--job", "7"],
    ):
        res = cli(*argv, "--config", str(cfg), env=env)
        assert res.returncode == 1, (argv, res.stdout + res.stderr)
        assert not os.path.lexists(tmp_path / "state"), (argv, sorted(os.listdir(tmp_path / "state")))
    assert [c[0] for c in f.calls()] in (["show"] * 2, ["show"] * 1)  # check itself asks; --as never does


def test_the_same_node_s_health_check_does_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the tests above guard against is real: the health check (Slurm's run) creates the state dir
    and stores the XID and the position it read up to."""
    _, cfg, env = node(tmp_path, monkeypatch, "healthy.toml")
    with open(tmp_path / "kmsg", "a") as log:
        log.write(f"4,2,2000000,-;{XID_79}\n")
    res = subprocess.run(
        [str(BIN / "nodehealth-healthcheck")],
        capture_output=True,
        text=True,
        env={**env, "NODEHEALTH_CONFIG": str(cfg), "SLURMD_NODENAME": "n1"},
        cwd="/",
        timeout=300,
    )
    assert res.returncode == 1, res.stderr
    store = json.loads((tmp_path / "state" / layout.XID_EVENTS).read_text())
    assert [e["xid"] for e in store["events"]] == [79]
