"""The prolog fast path's own files: the settings snapshot, the verdict's and the counters' marshal forms.

Every way a snapshot cannot be believed sends the prolog to the cold path with the reason (never an exit
0 on doubt); each guard is a case below that fails when the guard is gone. The fast path is called in
this process (``fast.prolog``: the reason comes back as a string); tests/test_prolog_fast_path.py runs
it as slurmd does, and the module list below runs it in a fresh interpreter.
"""

from __future__ import annotations

import json
import marshal
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from nodehealth.config import lean, snapshot
from nodehealth.config.loader import load_valid
from nodehealth.faces import fast
from nodehealth.statedir import counters, layout, strictjson
from nodehealth.statedir import verdict as daemon_state

ROOT = Path(__file__).resolve().parent.parent
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="ownership is checked only when running as root")
REPORT = {
    "node": "n1",
    "phase": "daemon",
    "status": "OK",
    "checks": [{"name": "nvml", "status": "OK", "summary": "8 GPUs", "action": "none", "gpu": None, "details": {}}],
}


class Node:
    """A validated config (so a snapshot), a boot id and a fresh verdict written as the daemon writes it."""

    def __init__(self, d: Path, extra: str = "") -> None:
        self.d, self.state = d, d / "state"
        boot = d / "proc" / "sys" / "kernel" / "random" / "boot_id"
        boot.parent.mkdir(parents=True)
        boot.write_text("boot-1\n")
        self.config = d / "nh.toml"
        self.config.write_text(f'[paths]\nstate_dir = "{self.state}"\nprocfs_root = "{d / "proc"}"\n' + extra)
        load_valid(str(self.config))
        daemon_state.write(str(self.state), daemon_state.encode(REPORT, "boot-1", time.time(), "alive"))
        self.env = {"NODEHEALTH_CONFIG": str(self.config), "SLURMD_NODENAME": "n1"}
        where = snapshot.path_for(str(self.config))
        assert where is not None
        self.snapshot = Path(where)

    def answer(self, **env: str) -> Any:
        return fast.prolog(dict(self.env, **env), act=False)

    def rewrite(self, change: Callable[[dict[str, Any]], Any]) -> None:
        """The snapshot as ``change`` leaves it (changed in place)."""
        raw = marshal.loads(self.snapshot.read_bytes())
        change(raw)
        self.snapshot.write_bytes(marshal.dumps(raw))


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


def test_a_validated_config_leaves_a_snapshot_the_fast_path_decides_from(node: Node) -> None:
    got = node.answer()
    assert isinstance(got, daemon_state.DaemonState) and got.status == "OK", got
    raw = marshal.loads(node.snapshot.read_bytes())
    st = os.stat(node.config)
    assert raw["config_path"] == str(node.config) and raw["config_id"] == lean.identity(st)
    assert raw["settings"]["state_dir"] == str(node.state) and raw["override_node"] == ""
    assert node.snapshot.parent == Path(lean.default("paths.state_dir"))  # the default run dir (the sandbox's)
    assert node.snapshot.stat().st_mode & 0o7777 == 0o600


def _mode(mode: int) -> Callable[[Node], None]:
    return lambda n: n.snapshot.chmod(mode)


def _bytes(data: bytes) -> Callable[[Node], None]:
    return lambda n: n.snapshot.write_bytes(data)


def _cut(n: Node) -> None:
    data = n.snapshot.read_bytes()
    n.snapshot.write_bytes(data[: len(data) // 2])


def _link(n: Node) -> None:
    real = n.d / "elsewhere.marshal"
    real.write_bytes(n.snapshot.read_bytes())
    n.snapshot.unlink()
    n.snapshot.symlink_to(real)


def _edit(n: Node) -> None:
    n.config.write_text(n.config.read_text() + "# an edit the full loader has not seen\n")


def _touch(n: Node) -> None:  # the same text, written again after the snapshot: newer than it
    st = n.config.stat()
    os.utime(n.config, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))


def _setting(key: str, value: Any) -> Callable[[Node], None]:
    return lambda n: n.rewrite(lambda raw: raw["settings"].__setitem__(key, value))


GUARDS: dict[str, tuple[Callable[[Node], None], str]] = {
    "missing": (lambda n: n.snapshot.unlink(), "has not been validated on this node yet"),
    "truncated": (_cut, "corrupt or partial"),
    "garbage": (_bytes(b"\xff\x00 not marshal"), "corrupt or partial"),
    "empty": (_bytes(b""), "corrupt or partial"),
    "code object": (_bytes(marshal.dumps(compile("1", "x", "eval"))), "corrupt or partial"),
    "a tuple": (_bytes(marshal.dumps(("v", 1))), "corrupt or partial"),
    "nan": (lambda n: n.rewrite(lambda raw: raw["settings"].__setitem__("max_age_s", float("nan"))), "corrupt"),
    "other kind": (lambda n: n.rewrite(lambda raw: raw.__setitem__("kind", "x")), "not a nodehealth snapshot"),
    "other version": (lambda n: n.rewrite(lambda raw: raw.__setitem__("v", 2)), "have version 2"),
    "a field missing": (lambda n: n.rewrite(lambda raw: raw.pop("override_node")), "incomplete"),
    "a field more": (lambda n: n.rewrite(lambda raw: raw.__setitem__("x", 1)), "incomplete"),
    "bad identity": (lambda n: n.rewrite(lambda raw: raw.__setitem__("config_id", [1, 2])), "incomplete"),
    "another file": (lambda n: n.rewrite(lambda raw: raw.__setitem__("config_path", "/x.toml")), "made from /x.toml"),
    "file edited": (_edit, "changed since it last validated"),
    "file newer": (_touch, "changed since it last validated"),
    "age limit out of range": (_setting("max_age_s", 0.5), "daemon.state_max_age_s is missing or has an unexpected"),
    "relative state dir": (_setting("state_dir", "state"), "paths.state_dir is missing or has an unexpected"),
    "setting missing": (lambda n: n.rewrite(lambda raw: raw["settings"].pop("unknown")), "policy.unknown is missing"),
    "group-writable": (_mode(0o660), "writable by group or others"),
    "a symlink": (_link, "symbolic link"),
    "not a file": (lambda n: (n.snapshot.unlink(), n.snapshot.mkdir()) and None, "not a regular file"),
}


@pytest.mark.parametrize("how", GUARDS)
def test_a_snapshot_that_cannot_be_believed_sends_the_prolog_cold(node: Node, how: str) -> None:
    spoil, words = GUARDS[how]
    spoil(node)
    got = node.answer()
    assert isinstance(got, str) and words in got, got


@as_root
def test_a_snapshot_of_another_owner_is_refused_as_root(node: Node) -> None:
    os.chown(node.snapshot, 65534, 65534)
    got = node.answer()
    assert isinstance(got, str) and "owned by uid 65534" in got, got


@as_root
def test_a_config_others_may_change_is_refused_before_its_snapshot_is_read(node: Node) -> None:
    node.config.chmod(0o666)
    got = node.answer()
    assert isinstance(got, str) and "not trusted: writable by group or others" in got, got


def test_a_run_dir_others_may_write_is_not_trusted(node: Node) -> None:
    run = Path(snapshot.run_dir())
    mode = run.stat().st_mode & 0o7777
    run.chmod(0o777)
    try:
        got = node.answer()
    finally:
        run.chmod(mode)
    assert isinstance(got, str) and "fast-path settings not trusted" in got and "writable" in got, got


def test_override_rules_are_matched_against_the_node_slurmd_names(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("SLURMD_NODENAME", "n1")  # the cold path's prolog validated it on n1
    node = Node(tmp_path, '[[override]]\nhosts = "n[1-2]"\ndaemon.state_max_age_s = 30\n')
    assert marshal.loads(node.snapshot.read_bytes())["override_node"] == "n1"
    got = node.answer()
    assert isinstance(got, daemon_state.DaemonState), got
    got = node.answer(SLURMD_NODENAME="n2")
    assert isinstance(got, str) and "[[override]] rules for node n1, not n2" in got, got


def test_a_missing_config_named_by_the_environment_goes_cold(node: Node) -> None:
    got = node.answer(NODEHEALTH_CONFIG=str(node.d / "nope.toml"))
    assert isinstance(got, str) and "no such file" in got, got


def test_settings_the_full_loader_places_elsewhere_are_not_kept(tmp_path: Path) -> None:
    class Paths:
        state_dir, persistent_dir = "/elsewhere", "/elsewhere"

    cfg = tmp_path / "nh.toml"
    cfg.write_text(f'[paths]\nstate_dir = "{tmp_path}"\n')
    why = snapshot.keep(str(cfg), cfg.read_text(), lean.identity(cfg.stat()), Paths())
    assert "not the loader's" in why and not Path(str(snapshot.path_for(str(cfg)))).exists()


# --- the marshal forms -----------------------------------------------------------------------------


def test_both_forms_of_the_verdict_are_judged_alike(node: Node) -> None:
    for form in ("json", "marshal"):
        got, why = daemon_state.read(str(node.state), 90, boot_id="boot-1", form=form)
        assert got is not None and got.report == REPORT and got.status == "OK", (form, why)
        got, why = daemon_state.read(str(node.state), 90, boot_id="boot-2", form=form)
        assert got is None and "another boot" in why, form


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x00",
        marshal.dumps(b"bytes"),
        marshal.dumps({1: 2}),
        marshal.dumps({"a": (1,)}),
        marshal.dumps({"a": {1, 2}}),
        marshal.dumps(float("inf")),
        marshal.dumps(10**25),
        marshal.dumps(compile("x", "x", "eval")),
    ],
)
def test_parse_marshal_believes_only_what_json_could_hold(data: bytes) -> None:
    with pytest.raises(ValueError):
        strictjson.parse_marshal(data)


def test_parse_marshal_refuses_deep_nesting_and_hostile_bytes_with_a_value_error_only() -> None:
    deep: Any = []
    for _ in range(strictjson.MAX_DEPTH + 1):
        deep = [deep]
    with pytest.raises(ValueError):
        strictjson.parse_marshal(marshal.dumps(deep))
    good = marshal.dumps(REPORT)
    assert strictjson.parse_marshal(good) == REPORT
    for end in range(len(good)):  # every partial write
        with pytest.raises(ValueError):
            strictjson.parse_marshal(good[:end])
    rng = random.Random(23)
    for _ in range(300):  # one byte flipped (seeded; a flipped length may make marshal allocate before it fails)
        data = bytearray(good)
        at = rng.randrange(len(data))
        data[at] = rng.randrange(256)
        try:
            strictjson.parse_marshal(bytes(data))
        except ValueError:
            pass


def test_dumps_small_writes_what_json_writes() -> None:
    rng = random.Random(7)
    alphabet = [chr(i) for i in range(0, 260)] + ["\U0001f600", "\u2028", '"', "\\", "\x7f"]
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 10)))
        obj = {"v": 1, text: [text, 1.5, -0.0, 1e-7, 10**18, True, None, (1, 2)], "f": rng.random(), "n": {"a": {}}}
        assert strictjson.dumps_small(obj) == json.dumps(obj, separators=(",", ":"))
    assert strictjson.dumps_small({"x": float("nan"), 1: 2}) == strictjson.dumps({"x": None, 1: 2}, compact=True)


def test_the_baseline_reads_the_counters_marshal_form_while_it_is_the_newer(tmp_path: Path) -> None:
    sd = str(tmp_path)
    counters.write_latest(sd, {"0": {"volatile_uncorrected": 3}}, "b", "daemon")
    got, why = counters.read_latest_fast(sd)
    assert got is not None and got["gpus"] == {"0": {"volatile_uncorrected": 3}}, why
    json_path = Path(layout.path(sd, layout.COUNTERS))
    raw = json.loads(json_path.read_text())
    raw["gpus"]["0"]["volatile_uncorrected"] = 4  # an earlier release's face writes the JSON alone, later
    json_path.write_text(json.dumps(raw))
    st = Path(layout.path(sd, layout.COUNTERS_MARSHAL)).stat()
    os.utime(json_path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    got, _ = counters.read_latest_fast(sd)
    assert got is not None and got["gpus"]["0"]["volatile_uncorrected"] == 4
    os.utime(json_path, ns=(st.st_atime_ns, st.st_mtime_ns - 10**9))
    Path(layout.path(sd, layout.COUNTERS_MARSHAL)).write_bytes(marshal.dumps({"time": 1.0, "gpus": {"x": {}}}))
    got, why = counters.read_latest_fast(sd)
    assert got is None and "not a GPU index" in str(why)


# --- what the fast path imports ----------------------------------------------------------------------

# Every module a fast-path prolog may import beyond what the interpreter has at start-up (``-S``: no
# site, so the venv's own start-up modules do not hide an import). A new one fails here, not in a bench.
ALLOWED = {
    "__future__",
    "_collections_abc",
    "_stat",
    "fcntl",  # the ledger's lock
    "genericpath",
    "os",
    "os.path",
    "posixpath",
    "stat",
    "nodehealth",
    "nodehealth.config",
    "nodehealth.config.lean",
    "nodehealth.config.snapshot",
    "nodehealth.faces",
    "nodehealth.faces.fast",
    "nodehealth.faces.log",
    "nodehealth.faces.prolog",
    "nodehealth.platform",
    "nodehealth.platform.log",
    "nodehealth.platform.sdnotify",  # the journal's lookup at the first line (a stat of its socket)
    "nodehealth.slurm",
    "nodehealth.slurm.jobenv",
    "nodehealth.statedir",
    "nodehealth.statedir.counters",
    "nodehealth.statedir.directory",
    "nodehealth.statedir.files",
    "nodehealth.statedir.layout",
    "nodehealth.statedir.ledger",
    "nodehealth.statedir.strictjson",
    "nodehealth.statedir.verdict",
}
NEVER = ("tomllib", "tomli", "re", "typing", "enum", "json", "datetime", "dataclasses", "hashlib", "socket")
RUN = """
import sys
before = set(sys.modules)
from nodehealth.faces import prolog
rc = prolog.main()
print(repr((rc, sorted(set(sys.modules) - before), sorted(sys.modules))))
"""


def test_the_fast_path_imports_only_the_modules_listed_here(node: Node) -> None:
    counters.write_latest(str(node.state), {"0": {"volatile_uncorrected": 0}}, "boot-1", "daemon")
    env = dict(
        node.env,
        SLURM_JOB_ID="42",
        SLURM_JOB_GPUS="0",
        PYTHONPATH=str(ROOT),
        NODEHEALTH_DEFAULT_ROOT=os.environ[lean.DEFAULT_ROOT_ENV],
    )
    res = subprocess.run([sys.executable, "-S", "-c", RUN], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "fast path" in res.stderr and "not taken" not in res.stderr, res.stderr
    assert "no ECC baseline" not in res.stderr, res.stderr
    rc, new, everything = eval(res.stdout.strip().splitlines()[-1])  # noqa: S307 - our own child's repr
    assert rc == 0
    assert set(new) - ALLOWED == set(), sorted(set(new) - ALLOWED)
    assert not [m for m in NEVER if m in everything], [m for m in NEVER if m in everything]
    assert (node.state / "jobs" / "42.json").exists()  # the baseline was copied, without json
    assert json.loads((node.state / "jobs.jsonl").read_text())["job_id"] == "42"  # the ledger's start record
