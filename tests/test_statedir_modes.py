"""The state dir's modes from the first write: a fresh one is 0700 and every file in it 0600, whatever the
umask, whether the first writer is a face (its last-good config record comes first) or the daemon.

docs/security.md ("The state dir"): it holds the config text, user names, job ids and the verdict a
prolog trusts, so nobody but root may read it. Each test starts with no state dir at all and walks
every entry the run left.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from test_daemon_util import free_port, start, stop, wait_for, write_config
from test_slurm_faces import Fake

from nodehealth.config import lastgood
from nodehealth.config.loader import load_valid
from nodehealth.faces import epilog, healthcheck, prolog
from nodehealth.statedir import files, layout

ROOT = Path(__file__).resolve().parent.parent


class umask:
    def __init__(self, value: int) -> None:
        self.value = value

    def __enter__(self) -> None:
        self.old = os.umask(self.value)

    def __exit__(self, *exc: object) -> None:
        os.umask(self.old)


def walk_modes(d: Path) -> dict[str, tuple[str, int]]:
    """Every entry below ``d`` (and ``d`` itself as "."): its kind and permission bits, links not followed."""
    out = {".": ("dir" if d.is_dir() else "?", stat.S_IMODE(os.lstat(d).st_mode))}
    for p in sorted(d.rglob("*")):
        st = os.lstat(p)
        kind = "dir" if stat.S_ISDIR(st.st_mode) else "file" if stat.S_ISREG(st.st_mode) else "other"
        out[str(p.relative_to(d))] = (kind, stat.S_IMODE(st.st_mode))
    return out


def wrong_modes(d: Path) -> dict[str, tuple[str, int]]:
    """The entries that are not a 0700 directory or a 0600 regular file."""
    return {name: got for name, got in walk_modes(d).items() if got not in (("dir", 0o700), ("file", 0o600))}


MASKS = pytest.mark.parametrize("mask", [0o022, 0o000], ids=["umask022", "umask000"])


@MASKS
def test_the_last_good_record_is_written_into_a_0700_dir_as_0600(tmp_path: Path, mask: int) -> None:
    """The first write of a fresh node: load_valid records the config before any face writes state."""
    sd = tmp_path / "run" / "nodehealth"
    cfg = tmp_path / "nh.toml"
    cfg.write_text(f'[paths]\nstate_dir = "{sd}"\n')
    with umask(mask):
        load_valid(str(cfg))
    assert (sd / layout.CONFIG_GOOD).exists()
    assert wrong_modes(sd) == {}
    assert lastgood.read(str(sd)) is not None


def test_the_last_good_record_goes_nowhere_near_an_untrusted_dir(tmp_path: Path) -> None:
    """Recording a validated config checks the state dir first, as every state writer does."""
    sd = tmp_path / "state"
    sd.mkdir(mode=0o777)
    sd.chmod(0o777)  # writable by anyone: another user could swap what the next face trusts
    with pytest.raises(files.UnsafeDir):
        lastgood.record(str(sd), "/etc/nodehealth/nodehealth.toml", "x = 1\n", None, 1000.0)
    assert list(sd.iterdir()) == []


@MASKS
def test_a_fresh_state_dir_from_the_first_face_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mask: int) -> None:
    """Prolog, epilog and health check of a healthy node, then a faulty prolog that drains: the config
    record, the ledger, counters, the job baseline, the Slurm state and every lock."""
    f = Fake(tmp_path, monkeypatch)
    sd = tmp_path / "state"
    assert not sd.exists()
    with umask(mask):
        assert prolog.main() == 0
        assert epilog.main() == 0
        assert healthcheck.main() == 0
        f.use("remap-pending.toml")
        assert prolog.main() == 1
    names = set(walk_modes(sd))
    assert {
        layout.CONFIG_GOOD,
        layout.LEDGER,
        f"{layout.LEDGER}.lock",
        layout.SLURM_STATE,
        layout.COUNTERS,
        layout.JOBS_DIR,
    } <= names, names
    assert wrong_modes(sd) == {}


@MASKS
def test_a_fresh_state_dir_from_the_first_face_as_slurm_runs_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mask: int
) -> None:
    """The same through the installed entry point, a process of its own started with the umask."""
    Fake(tmp_path, monkeypatch)
    sd = tmp_path / "state"
    exe = Path(sys.executable).parent / "nodehealth-prolog"
    argv = (
        [str(exe)]
        if exe.exists()
        else [sys.executable, "-c", "import sys; from nodehealth.faces.prolog import main; sys.exit(main())"]
    )
    res = subprocess.run(
        argv, capture_output=True, text=True, cwd="/", timeout=120, preexec_fn=lambda: os.umask(mask) and None
    )
    assert res.returncode == 0, res.stderr
    assert (sd / layout.CONFIG_GOOD).exists() and (sd / layout.LEDGER).exists()
    assert wrong_modes(sd) == {}


@MASKS
def test_a_fresh_state_dir_from_the_daemon(tmp_path: Path, mask: int) -> None:
    """The daemon's first rounds: config record, verdict (daemon-state.json), counters, the XID store."""
    port = free_port()
    cfg = write_config(tmp_path, "healthy-8x-h100", port)
    sd = tmp_path / "state"
    assert not sd.exists()
    with umask(mask):
        proc = start(cfg)
    try:
        wait_for(f"http://127.0.0.1:{port}/metrics", lambda b: b"nodehealth_rounds_total 2.0" in b, timeout=120)
    finally:
        code, err = stop(proc, timeout=60)
    assert code == 0, err
    names = set(walk_modes(sd))
    assert {layout.CONFIG_GOOD, layout.DAEMON_STATE, layout.COUNTERS, layout.XID_EVENTS} <= names, names
    assert wrong_modes(sd) == {}
