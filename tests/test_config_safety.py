"""A bad or hostile config never turns the checks off, never drains a healthy node, never runs anyone's code.

The last configuration that validated on this node is kept in the state dir and used when the
file stops validating; running as root only root's own files and programs are trusted; every
number is finite; what would only fail at run time fails at load time.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from test_slurm_faces import Fake

from nodehealth.config import lastgood, lean, trust
from nodehealth.config import loader as C
from nodehealth.faces import healthcheck, prolog
from nodehealth.statedir import layout

NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="ownership is checked only when running as root")


def write(tmp_path: Path, text: str, name: str = "nh.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def state_config(tmp_path: Path, extra: str = "") -> str:
    return write(tmp_path, f'[paths]\nstate_dir = "{tmp_path / "state"}"\n' + extra)


# --------------------------------------------------------------------------- the last good configuration


def test_a_validated_config_is_recorded_with_its_text_hash_time_and_identity(tmp_path):
    path = state_config(tmp_path, "[gpu]\nexpected_count = 4\n")
    loaded = C.load_safe(path, now=1000.0)
    assert loaded.valid and loaded.using == "file" and loaded.cfg.gpu.expected_count == 4
    rec = json.loads((tmp_path / "state" / layout.CONFIG_GOOD).read_text())
    st = os.stat(path)
    assert rec["path"] == path and rec["text"] == Path(path).read_text() and rec["validated_at"] == 1000.0
    assert rec["identity"] == [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
    import hashlib

    assert rec["sha256"] == hashlib.sha256(rec["text"].encode()).hexdigest()
    assert lastgood.unchanged(str(tmp_path / "state"), path, lean.identity(st)) == ""
    assert not lastgood.record(str(tmp_path / "state"), path, rec["text"], rec["identity"], 2000.0)  # unchanged


BROKEN = {
    "syntax": "[gpu\n",
    "unknown-key": "colour = 1\n",
    "nan": "[daemon]\nstate_max_age_s = nan\n",
    "relative-scontrol": '[slurm]\nscontrol = "scontrol"\n',
}


@pytest.mark.parametrize("how", list(BROKEN))
def test_a_file_that_stops_validating_runs_with_the_last_one_that_did(tmp_path, how):
    path = state_config(tmp_path, "[gpu]\nexpected_count = 4\n")
    assert C.load_safe(path).valid
    good = Path(path).read_text()
    Path(path).write_text(good + BROKEN[how])
    loaded = C.load_safe(path)
    assert loaded.error is not None and loaded.using == "last_validated", loaded
    assert loaded.cfg.gpu.expected_count == 4 and loaded.cfg.paths.state_dir == str(tmp_path / "state")
    assert path in loaded.cfg.source and "as it validated at" in loaded.cfg.source
    with pytest.raises(C.ConfigError):
        C.load(path)


def test_the_last_good_record_is_found_in_the_default_state_dir_when_the_file_names_none(tmp_path, monkeypatch):
    default = tmp_path / "default-state"
    monkeypatch.setitem(
        lean.BY_KEY, "paths.state_dir", ("paths.state_dir", "state_dir", "path", str(default), None, None, None)
    )
    path = write(tmp_path, "[gpu]\nexpected_count = 2\n")
    assert C.load_safe(path, remember=False).valid
    lastgood.record(str(default), path, Path(path).read_text(), lean.identity(os.stat(path)), time.time())
    Path(path).write_text("[gpu\n")
    loaded = C.load_safe(path, remember=False)
    assert loaded.using == "last_validated" and loaded.cfg.gpu.expected_count == 2


def test_without_a_last_good_config_the_defaults_run(tmp_path):
    path = state_config(tmp_path, "colour = 1\n")
    loaded = C.load_safe(path)
    assert loaded.using == "defaults" and loaded.error is not None and loaded.error.kind == "value"
    assert "no configuration has validated" in loaded.note
    # the defaults, in the state dir the file names (where its drain records and ledger are)
    assert loaded.cfg == C.resolve({"paths": {"state_dir": str(tmp_path / "state")}}, "<defaults>")
    Path(path).write_text("colour = 1\n")
    assert C.load_safe(path).cfg == C.resolve({}, "<defaults>")
    with pytest.raises(C.ConfigError):
        C.load_safe(path, defaults=False)


def test_a_record_of_another_file_or_with_a_wrong_hash_is_not_used(tmp_path):
    other = state_config(tmp_path, "[gpu]\nexpected_count = 4\n")
    assert C.load_safe(other).valid
    path = write(tmp_path, f'[paths]\nstate_dir = "{tmp_path / "state"}"\ncolour = 1\n', "other.toml")
    assert C.load_safe(path).using == "defaults"  # the record is the other file's
    Path(other).write_text(Path(other).read_text() + "[gpu\n")
    rec_path = tmp_path / "state" / layout.CONFIG_GOOD
    rec = json.loads(rec_path.read_text())
    rec["text"] = rec["text"].replace("= 4", "= 5")
    rec_path.write_text(json.dumps(rec))
    loaded = C.load_safe(other)
    assert loaded.using == "defaults" and "does not match its sha256" in loaded.note


def test_a_last_good_config_that_no_longer_validates_is_not_used(tmp_path):
    scen = tmp_path / "scen.toml"
    scen.write_text("[[gpu]]\n")
    path = state_config(tmp_path, f'[nvml]\nsimulate = "{scen}"\n')
    check = _probe_setup()
    assert C.load_safe(path, check=check).valid
    scen.write_text("[[gpu]]\npower_w = nan\n")  # the scenario it names broke since
    from nodehealth.probes import source

    source.forget()
    Path(path).write_text(Path(path).read_text() + "colour = 1\n")
    loaded = C.load_safe(path, check=check)
    assert loaded.using == "defaults" and "no longer does" in loaded.note and "power_w" in loaded.note


def _probe_setup() -> Any:
    from nodehealth.config.use import probe_setup

    return probe_setup


@as_root
def test_a_last_good_record_others_can_write_is_not_used(tmp_path):
    path = state_config(tmp_path, "[gpu]\nexpected_count = 4\n")
    assert C.load_safe(path).valid
    os.chown(tmp_path / "state" / layout.CONFIG_GOOD, NOBODY, NOBODY)
    Path(path).write_text(Path(path).read_text() + "[gpu\n")
    loaded = C.load_safe(path)
    assert loaded.using == "defaults" and "owned by uid 65534" in loaded.note


# --------------------------------------------------------------------------- the faces with a bad config


def _break(cfg: Path) -> None:
    cfg.write_text(cfg.read_text() + "[daemon]\ninterval_s = nan\n")


def test_a_bad_config_keeps_the_prolog_checking_and_draining_a_faulty_node(tmp_path, monkeypatch, capfd):
    f = Fake(tmp_path, monkeypatch, scenario="remap-pending.toml")
    cfg = Path(os.environ["NODEHEALTH_CONFIG"])
    C.load_safe(str(cfg))  # validated once on this node (the daemon's start, or any face)
    _break(cfg)
    assert prolog.main() == 1
    err = capfd.readouterr().err
    assert "error: configuration error" in err and "daemon.interval_s: nan is not a finite number" in err, err
    assert "as it validated at" in err and "not checking" not in err
    (upd,) = f.updates()
    assert upd[3].startswith("reason=nh:rowremap GPU1 gpu_remapped_rows")


def test_a_bad_config_never_drains_a_healthy_node(tmp_path, monkeypatch, capfd):
    f = Fake(tmp_path, monkeypatch, scenario="healthy.toml")
    cfg = Path(os.environ["NODEHEALTH_CONFIG"])
    assert healthcheck.main() == 0  # validates and records the config
    _break(cfg)
    assert healthcheck.main() == 0 and prolog.main() == 0
    assert f.updates() == []
    assert capfd.readouterr().err.count("error: configuration error") == 2


def test_the_faces_log_a_bad_config_to_syslog(tmp_path, monkeypatch):
    Fake(tmp_path, monkeypatch, scenario="healthy.toml")
    cfg = Path(os.environ["NODEHEALTH_CONFIG"])
    C.load_safe(str(cfg))
    _break(cfg)
    got: list[str] = []
    import syslog

    monkeypatch.setattr(syslog, "syslog", lambda *a: got.append(a[-1]))
    assert prolog.main() == 0
    assert any("configuration error" in m and "interval_s" in m for m in got), got


# --------------------------------------------------------------------------- the fast path notices


def test_the_fast_path_takes_the_cold_path_when_the_file_is_not_the_validated_one(tmp_path):
    state = tmp_path / "state"
    path = state_config(tmp_path)
    env = {"NODEHEALTH_CONFIG": path}
    s, why = lean.read_settings(env)
    assert s is not None, why
    assert "has not been validated on this node" in lastgood.unchanged(s.state_dir, s.config_path, s.config_id)
    C.load_safe(path)
    s, _ = lean.read_settings(env)
    assert s is not None and lastgood.unchanged(str(state), s.config_path, s.config_id) == ""
    time.sleep(0.01)
    Path(path).write_text(Path(path).read_text() + "colour = 1\n")  # lean cannot see this error
    s, _ = lean.read_settings(env)
    assert s is not None and "changed since it last validated" in lastgood.unchanged(
        str(state), s.config_path, s.config_id
    )
    os.chmod(path, 0o600)  # only the change time moves
    s2, _ = lean.read_settings(env)
    assert s2 is not None and s2.config_id != s.config_id


def test_fast_path_prolog_goes_cold_on_an_edited_config(tmp_path):
    from nodehealth.faces import fast

    state = tmp_path / "state"
    path = state_config(tmp_path)
    env = {"NODEHEALTH_CONFIG": path, "SLURMD_NODENAME": "n1"}
    C.load_safe(path)
    Path(path).write_text(Path(path).read_text() + "colour = 1\n")
    answer = fast.prolog(env)
    assert isinstance(answer, str) and "changed since it last validated" in answer
    assert not (state / "daemon-state.json").exists()  # decided before the verdict was even looked at


def test_an_edited_config_costs_one_cold_prolog_and_a_broken_one_keeps_every_prolog_cold(tmp_path):
    from test_prolog_fast_path import Node

    node = Node(tmp_path)  # its config validated, as at the daemon's start
    report = node.daemon_report()
    node.write_state(report)
    out, err = node.prolog()
    assert out["rc"] == 0 and "fast path" in err and "not taken" not in err, err
    node.write_config("[gpu]\nexpected_count = 8\n", validated=False)
    out, err = node.prolog()
    assert out["rc"] == 0 and "changed since it last validated" in err and "error" not in err, err
    out, err = node.prolog()  # the cold path validated and recorded it
    assert out["rc"] == 0 and "not taken" not in err, err
    node.write_config("[gpu]\nexpected_count = 8\ncolour = 1\n", validated=False)
    for _ in range(2):
        out, err = node.prolog()
        assert out["rc"] == 0 and "changed since it last validated" in err, err
        assert "error: configuration error" in err and "colour: unknown key" in err, err


# --------------------------------------------------------------------------- root trusts only root's files


@as_root
@pytest.mark.parametrize("how", ["file-owner", "file-mode", "dir-owner", "dir-mode", "parent-mode"])
def test_a_config_others_can_change_is_refused(tmp_path, how):
    d = tmp_path / "etc" / "nodehealth"
    d.mkdir(parents=True)
    path = write(d, "[gpu]\nexpected_count = 4\n")
    if how == "file-owner":
        os.chown(path, NOBODY, 0)
    elif how == "file-mode":
        os.chmod(path, 0o666)
    elif how == "dir-owner":
        os.chown(d, NOBODY, 0)
    elif how == "dir-mode":
        os.chmod(d, 0o775)
    else:
        os.chmod(d.parent, 0o757)
    with pytest.raises(C.ConfigError) as info:
        C.load(path)
    assert info.value.kind == "untrusted" and "not trusted" in str(info.value)
    s, why = lean.read_settings({"NODEHEALTH_CONFIG": path})
    if how.startswith("file"):  # the fast path checks the file it reads (its directories: the identity)
        assert s is None and "not trusted" in why


@as_root
def test_a_sticky_world_writable_directory_is_accepted(tmp_path):
    d = tmp_path / "sticky"
    d.mkdir()
    os.chmod(d, 0o1777)
    assert C.load(write(d, "[gpu]\nexpected_count = 4\n")).gpu.expected_count == 4
    os.chmod(d, 0o777)
    with pytest.raises(C.ConfigError, match="writable by group and others"):
        C.load(str(d / "nh.toml"))


@as_root
def test_a_symlinked_config_is_checked_where_it_points(tmp_path):
    real = tmp_path / "user"
    real.mkdir()
    os.chown(real, NOBODY, NOBODY)
    target = write(real, "[gpu]\nexpected_count = 4\n")
    link = tmp_path / "nh.toml"
    link.symlink_to(target)
    with pytest.raises(C.ConfigError, match=f"{real} is owned by uid {NOBODY}"):
        C.load(str(link))


@as_root
@pytest.mark.parametrize("how", ["owner", "mode", "dir-mode", "missing-in-user-dir"])
def test_a_program_others_can_change_is_refused(tmp_path, how):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    prog = bindir / "scontrol"
    prog.write_text("#!/bin/sh\n")
    prog.chmod(0o755)
    if how == "owner":
        os.chown(prog, NOBODY, NOBODY)
    elif how == "mode":
        prog.chmod(0o757)
    elif how == "dir-mode":
        bindir.chmod(0o777)
    else:
        prog.unlink()
        os.chown(bindir, NOBODY, NOBODY)
    path = write(tmp_path, f'[slurm]\nscontrol = "{prog}"\n')
    with pytest.raises(C.ConfigError) as info:
        C.load(path)
    assert info.value.kind == "untrusted" and f"slurm.scontrol: {prog} not trusted" in str(info.value)


@as_root
def test_config_check_reports_an_untrusted_program(tmp_path):
    prog = tmp_path / "scontrol"
    prog.write_text("#!/bin/sh\n")
    prog.chmod(0o777)
    path = write(tmp_path, f'[slurm]\nscontrol = "{prog}"\n')
    res = subprocess.run(
        [sys.executable, "-m", "nodehealth", "config", "check", path], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 2 and "slurm.scontrol" in res.stderr and "writable by" in res.stderr, res.stderr


def test_not_running_as_root_nothing_is_checked(tmp_path):
    d = tmp_path / "open"
    d.mkdir()
    os.chmod(d, 0o777)
    assert trust.problem(str(d / "x"), euid=1000) == ""
    assert trust.problem(str(d / "x"), euid=0).startswith(f"{d} is writable")
    assert trust.problem("relative/path", euid=0) == "relative/path is not an absolute path"


# --------------------------------------------------------------------------- numbers are finite


NAN_KEYS = [
    ("daemon", "state_max_age_s"),
    ("drain", "max_share"),
    ("phases.prolog", "budget_s"),
    ("daemon", "interval_s"),
    ("slurm", "timeout_s"),
    ("checks.gpu_temperature", "timeout_s"),
]


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "+nan"])
@pytest.mark.parametrize(("table", "key"), NAN_KEYS, ids=[f"{t}.{k}" for t, k in NAN_KEYS])
def test_a_non_finite_number_is_an_error_naming_the_key(tmp_path, table, key, value):
    path = write(tmp_path, f"[{table}]\n{key} = {value}\n")
    with pytest.raises(C.ConfigError, match=rf"{table}\.{key}: .* is not a finite number"):
        C.load(path)


def test_a_non_finite_number_in_an_override_or_array_is_an_error(tmp_path):
    path = write(tmp_path, '[[override]]\nhosts = "gpu1"\n[override.drain]\nmax_share = nan\n')
    with pytest.raises(C.ConfigError, match=r"override\[0\]\.drain\.max_share: nan is not a finite number"):
        C.load(path)
    path = write(tmp_path, "x = [1.0, inf]\n")
    with pytest.raises(C.ConfigError, match=r"x\[1\]: inf is not a finite number"):
        C.load(path)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_the_schema_refuses_non_finite_numbers_built_from_tables_too(value):
    with pytest.raises(C.ConfigError, match="drain.max_share: .* is not a finite number"):
        C.resolve({"drain": {"max_share": value}}, "<test>")


@pytest.mark.parametrize(
    "text",
    [
        "[daemon]\nstate_max_age_s = nan\n",
        "[phases.prolog]\nbudget_s = inf\n",
        "[slurm]\ntimeout_s = -nan\n",
        '[[override]]\nhosts = "n1"\ndaemon.state_max_age_s = nan\n',
    ],
)
def test_the_lean_reader_refuses_non_finite_numbers(tmp_path, text):
    s, why = lean.read_settings({"NODEHEALTH_CONFIG": write(tmp_path, text), "SLURMD_NODENAME": "n1"})
    assert s is None and "has an unexpected value" in why


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[[gpu]]\npower_w = nan\n", "gpu[0].power_w"),
        ("[defaults]\npower_limit_w = inf\n", "defaults.power_limit_w"),
        ("[node]\ncall_delay_ms = inf\n", "node.call_delay_ms"),
    ],
)
def test_a_scenario_number_must_be_finite(tmp_path, text, key):
    from nodehealth_sim import nvml as simnvml

    with pytest.raises(simnvml.ScenarioError, match=re.escape(key) + ": must be a finite number"):
        simnvml.parse(write(tmp_path, text, "scen.toml"))


def test_sighup_with_a_non_finite_number_keeps_the_running_config(tmp_path):
    from nodehealth.daemon.core import Daemon

    path = state_config(tmp_path, '[daemon]\ninterval_s = 30\nlisten = ""\n')
    loaded = C.load_safe(path)
    d = Daemon(loaded.cfg, config_path=path, notify=lambda s: True, use_default_hooks=False, loaded=loaded)
    Path(path).write_text(Path(path).read_text().replace("interval_s = 30", "interval_s = nan"))
    assert d.reload() is False
    assert d.cfg.daemon.interval_s == 30.0
    text = d.metrics.payload().decode()
    assert f'nodehealth_config_valid{{error="value",file="{path}"}} 0.0' in text, text
    assert 'nodehealth_config_in_use_info{using="last_validated"} 1.0' in text
    Path(path).write_text(Path(path).read_text().replace("interval_s = nan", "interval_s = 20"))
    assert d.reload() is True and d.cfg.daemon.interval_s == 20.0
    assert f'nodehealth_config_valid{{error="none",file="{path}"}} 1.0' in d.metrics.payload().decode()


def test_the_daemon_notices_a_changed_file_at_the_next_scrape(tmp_path):
    from nodehealth.daemon.core import Daemon

    path = state_config(tmp_path, '[daemon]\nlisten = ""\n')
    loaded = C.load_safe(path)
    d = Daemon(loaded.cfg, config_path=path, notify=lambda s: True, use_default_hooks=False, loaded=loaded)
    assert 'error="none"' in d.metrics.payload().decode()
    Path(path).write_text(Path(path).read_text() + "[checks.gpu_ecc]\ntimeout_s = inf\n")
    text = d.metrics.payload().decode()
    assert f'nodehealth_config_valid{{error="value",file="{path}"}} 0.0' in text, text
    assert d.cfg == loaded.cfg  # judged, not applied
    assert any("changed and does not validate" in line for line in d.log.lines)


# --------------------------------------------------------------------------- validation at load time


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[slurm]\nscontrol = "scontrol"\n', "slurm.scontrol: 'scontrol' is relative; expected an absolute path"),
        ('[slurm]\nscontrol = ""\n', "slurm.scontrol: empty; expected an absolute path"),
        ('[paths]\nstate_dir = ""\n', "paths.state_dir: empty"),
        ('[paths]\nstate_dir = "state"\n', "paths.state_dir: 'state' is relative"),
        ('[paths]\nprocfs_root = "proc"\n', "paths.procfs_root: 'proc' is relative"),
        ('[slurm]\nconf = "slurm.conf"\n', "slurm.conf: 'slurm.conf' is relative"),
        ('[daemon]\ntextfile_dir = "prom"\n', "daemon.textfile_dir: 'prom' is relative"),
        ('[[override]]\nhosts = "x1"\nslurm.scontrol = "bin/scontrol"\n', "override[0].slurm.scontrol: 'bin/scontrol'"),
    ],
)
def test_paths_must_be_absolute(tmp_path, text, message):
    with pytest.raises(C.ConfigError) as info:
        C.load(write(tmp_path, text))
    assert message in str(info.value)


@pytest.mark.parametrize(
    "listen",
    [
        "10915",
        "0.0.0.0",
        "0.0.0.0:",
        "0.0.0.0:http",
        "0.0.0.0:70000",
        "::1:10915",
        "[::1:10915",
        "[nothex]:10915",
        "host name:1",
        " 0.0.0.0:10915",
        "[]:1",
        "[127.0.0.1]:10915",
        "-x:1",
    ],
)
def test_a_malformed_listen_address_is_an_error(tmp_path, listen):
    with pytest.raises(C.ConfigError, match="daemon.listen: .*expected HOST:PORT"):
        C.load(write(tmp_path, f"[daemon]\nlisten = {json.dumps(listen)}\n"))


@pytest.mark.parametrize(
    "listen",
    [
        "",
        "0.0.0.0:10915",
        "[::]:10915",
        "127.0.0.1:0",
        ":10915",
        "[fe80::1%eth0]:80",
        "gpu001.mgmt:10915",
        "localhost:65535",
    ],
)
def test_well_formed_listen_addresses_pass(tmp_path, listen):
    assert C.load(write(tmp_path, f"[daemon]\nlisten = {json.dumps(listen)}\n")).daemon.listen == listen


def test_the_lean_readers_path_keys_are_checked_by_the_loader_too():
    lean_paths = {tuple(k[0].split(".")) for k in lean.KEYS if k[2] == "path"}
    assert lean_paths and lean_paths <= {(t, k) for t, k, _ in C.ABSOLUTE}


@pytest.mark.parametrize("text", ['[paths]\nstate_dir = "state"\n', '[paths]\nprocfs_root = ""\n'])
def test_the_lean_reader_refuses_relative_paths(tmp_path, text):
    s, why = lean.read_settings({"NODEHEALTH_CONFIG": write(tmp_path, text)})
    assert s is None and "has an unexpected value" in why


def _in_child(code: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)


def test_a_fifo_as_config_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "nh.toml"
    os.mkfifo(fifo)
    code = (
        "from nodehealth.config import loader, lean\n"
        f"try:\n    loader.load({str(fifo)!r})\nexcept loader.ConfigError as e:\n    print('loader:', e.kind, e)\n"
        f"print('lean:', lean.read_settings({{'NODEHEALTH_CONFIG': {str(fifo)!r}}})[1])\n"
    )
    res = _in_child(code)  # a reader that opened the FIFO would block here until the timeout
    assert "loader: unreadable" in res.stdout and "not a regular file" in res.stdout, res.stdout + res.stderr
    assert "lean: config " in res.stdout and res.stdout.count("not a regular file") == 2


def test_a_fifo_is_not_even_opened(tmp_path, monkeypatch):
    fifo = tmp_path / "nh.toml"
    os.mkfifo(fifo)
    opened: list[str] = []
    real_open = os.open

    def spy(p: Any, *a: Any, **k: Any) -> int:
        opened.append(str(p))
        return real_open(p, *a, **k)

    monkeypatch.setattr(os, "open", spy)
    with pytest.raises(C.ConfigError, match="not a regular file"):
        C.load(str(fifo))
    assert lean.read_settings({"NODEHEALTH_CONFIG": str(fifo)})[0] is None
    assert str(fifo) not in opened


def test_a_fifo_swapped_in_after_the_stat_is_opened_without_blocking_and_refused(tmp_path):
    fifo = tmp_path / "nh.toml"
    os.mkfifo(fifo)
    code = (
        "import os\nfrom nodehealth.config import lean\n"
        "real = os.stat\n"
        f"os.stat = lambda p, *a, **k: real({__file__!r})  # it was a regular file when looked at\n"
        f"try:\n    lean.read_regular({str(fifo)!r})\nexcept lean.NotRegular as e:\n    print('refused:', e)\n"
    )
    res = _in_child(code, timeout=10)  # opened without O_NONBLOCK, this would wait for a writer forever
    assert "refused:" in res.stdout and "not a regular file" in res.stdout, res.stdout + res.stderr


@as_root
def test_the_opened_file_itself_is_checked_not_only_its_path(tmp_path, monkeypatch):
    path = write(tmp_path, "[gpu]\nexpected_count = 4\n")
    os.chown(path, NOBODY, NOBODY)
    monkeypatch.setattr(trust, "problem", lambda *a, **k: "")  # the path looked fine (a race, a bind mount)
    with pytest.raises(C.ConfigError, match=f"not trusted: owned by uid {NOBODY}, not root"):
        C.load(path)


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/null"])
def test_a_device_as_config_is_refused(device):
    with pytest.raises(C.ConfigError, match="not a regular file") as info:
        C.load(device)
    assert info.value.kind == "unreadable"
    s, why = lean.read_settings({"NODEHEALTH_CONFIG": device})
    assert s is None and "not a regular file" in why


def test_a_config_larger_than_the_limit_is_refused(tmp_path):
    path = write(tmp_path, "# " + "x" * lean.MAX_BYTES + "\n")
    with pytest.raises(C.ConfigError, match="larger than"):
        C.load(path)


def test_nesting_up_to_the_limit_passes_the_tree_check():
    deep: Any = []
    for _ in range(C.MAX_DEPTH - 1):
        deep = [deep]
    C.check_tree({"x": deep}, "<test>")
    with pytest.raises(C.ConfigError, match="nested too deeply"):
        C.check_tree({"x": [deep]}, "<test>")


@pytest.mark.parametrize("depth", [17, 5000])
def test_deep_nesting_is_a_config_error(tmp_path, depth):
    path = write(tmp_path, "x = " + "[" * depth + "]" * depth + "\n")
    with pytest.raises(C.ConfigError, match="nested too deeply") as info:
        C.load(path)
    assert info.value.kind == "syntax"
    s, why = lean.read_settings({"NODEHEALTH_CONFIG": path})
    assert s is None or depth < 100  # lean reads only its keys; deep elsewhere is the loader's to report


def test_deep_nesting_in_config_check_is_exit_2_not_3(tmp_path):
    path = write(tmp_path, "x = " + "[" * 5000 + "]" * 5000 + "\n")
    res = subprocess.run(
        [sys.executable, "-m", "nodehealth", "config", "check", path], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 2 and "nested too deeply" in res.stderr and "Traceback" not in res.stderr, res.stderr


# --------------------------------------------------------------------------- the daemon


@pytest.mark.parametrize(
    ("old", "new", "words"),
    [
        ('state_dir = "{state}"', 'state_dir = "state"', "paths.state_dir: 'state' is relative"),
        ('state_dir = "{state}"', 'state_dir = ""', "paths.state_dir: empty"),
        ('listen = "127.0.0.1:{port}"', 'listen = "127.0.0.1"', "daemon.listen: '127.0.0.1': expected HOST:PORT"),
        ("[daemon]", '[slurm]\nscontrol = "scontrol"\n[daemon]', "slurm.scontrol: 'scontrol' is relative"),
        ("[daemon]", "[daemon]\nstate_max_age_s = nan", "daemon.state_max_age_s: nan is not a finite number"),
    ],
    ids=["relative-state-dir", "empty-state-dir", "listen-without-port", "relative-scontrol", "nan"],
)
def test_the_daemon_exits_2_for_a_config_error_with_nothing_to_fall_back_on(tmp_path, old, new, words):
    from test_daemon_util import free_port, start, stop, write_config

    port = free_port()
    cfg = write_config(tmp_path, "healthy-8x-h100", port)
    fill = {"state": str(tmp_path / "state"), "port": str(port)}
    text = cfg.read_text()
    assert old.format(**fill) in text
    cfg.write_text(text.replace(old.format(**fill), new, 1))
    proc = start(cfg)
    try:
        proc.wait(timeout=30)
    finally:
        code, err = stop(proc)
    assert code == 2 and words in err and "no configuration has validated on this node" in err, (code, err)


def test_the_daemon_runs_on_the_last_good_config_and_alarms(tmp_path):
    from test_daemon_util import free_port, sample, start, stop, wait_for, write_config

    port = free_port()
    cfg = write_config(tmp_path, "healthy-8x-h100", port)
    url = f"http://127.0.0.1:{port}/metrics"
    proc = start(cfg)
    try:
        text = wait_for(url, lambda b: b"nodehealth_rounds_total 1.0" in b).decode()
        assert sample(text, "nodehealth_config_valid", file=str(cfg), error="none") == 1
        cfg.write_text(cfg.read_text() + "[drain]\nmax_share = nan\n")  # no SIGHUP: seen at the next scrape
        wait_for(url, lambda b: f'nodehealth_config_valid{{error="value",file="{cfg}"}} 0.0'.encode() in b)
    finally:
        code, err = stop(proc)
    assert code == 0 and "changed and does not validate" in err and "drain.max_share" in err, err
    proc = start(cfg)  # a restart with the broken file: the last good config runs, and says so
    try:
        text = wait_for(url, lambda b: b"nodehealth_rounds_total 1.0" in b).decode()
        assert sample(text, "nodehealth_config_valid", file=str(cfg), error="value") == 0
        assert sample(text, "nodehealth_config_in_use_info", using="last_validated") == 1
        assert sample(text, "nodehealth_check_status", check="gpu_ecc") == 0  # still checking
    finally:
        code, err = stop(proc)
    assert code == 0 and "configuration error" in err and "as it validated at" in err, err


def test_the_metric_error_labels_are_the_loaders_kinds():
    from nodehealth.metrics.families import BY_NAME, CONFIG_ERRORS

    assert CONFIG_ERRORS == ("none", *C.KINDS)
    assert BY_NAME["nodehealth_config_valid"].values["error"] == CONFIG_ERRORS
