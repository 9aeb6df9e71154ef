"""Reading one node: ``sinfo -n NODE`` (slurmctld packs that node alone) with a parse that a reason
cannot fool, ``scontrol show node -o NODE`` where sinfo has no record; the reconciliation's jitter.

The programs are real executables in tmp_path (``sinfo`` beside ``scontrol``, as Slurm installs
them) that answer what a hostile or odd slurmctld would; tests/test_slurm_reasons.py runs the
real ones against a private slurmctld.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from nodehealth.observations import ProbeError
from nodehealth.platform.deadline import Deadline
from nodehealth.slurm import nodes as sn
from nodehealth.slurm.client import MAX_NODE_ANSWER, Scontrol

SCONTROL_LINE = (
    "NodeName=n1 Arch=x86_64 Gres=gpu:8 State=IDLE+DRAIN Partitions=debug "
    "Reason=nh:rowremap GPU1 gpu_remapped_rows: GPU 1: row remap pending [root@2026-12-02T01:02:22]"
)


def programs(tmp_path: Path, sinfo_body: str | None) -> tuple[Scontrol, Path]:
    """``scontrol`` (answers SCONTROL_LINE) and, unless None, ``sinfo`` running ``sinfo_body`` with
    ``$END`` set to the record end it was asked for; both log their argv (one JSON list a line)."""
    log = tmp_path / "calls.log"
    log_cmd = "python3 -c 'import json,sys; print(json.dumps(sys.argv[1:]))' \"$@\" >> " + str(log)
    (tmp_path / "scontrol").write_text(f"#!/bin/sh\n{log_cmd}\necho '{SCONTROL_LINE}'\n")
    (tmp_path / "scontrol").chmod(0o755)
    if sinfo_body is not None:
        # -O's argument is the 6th: the fields then the end token after "Reason:".
        (tmp_path / "sinfo").write_text(f'#!/bin/bash\n{log_cmd}\nEND="${{6#*Reason:}}"\n{sinfo_body}\n')
        (tmp_path / "sinfo").chmod(0o755)
    return Scontrol(str(tmp_path / "scontrol"), 30.0, Deadline(60.0)), log


def calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_one_node_is_read_with_sinfo_and_means_what_scontrol_says(tmp_path: Path) -> None:
    client, log = programs(
        tmp_path,
        "printf 'n1|idle+drain|gpu:8|root|2026-12-02T01:02:22|"
        'nh:rowremap GPU1 gpu_remapped_rows: GPU 1: row remap pending%s\\n\' "$END"',
    )
    got = client.show("n1")
    assert not isinstance(got, ProbeError), got
    (via_sinfo,) = got
    (via_scontrol,) = sn.parse_nodes(SCONTROL_LINE)
    assert (via_sinfo.name, via_sinfo.state, via_sinfo.reason, via_sinfo.gres_gpus) == (
        via_scontrol.name,
        via_scontrol.state,
        via_scontrol.reason,
        via_scontrol.gres_gpus,
    )
    assert via_sinfo.to_json() == via_scontrol.to_json()  # the cached form is the same
    (argv,) = calls(log)
    assert argv[:5] == ["-h", "-N", "-n", "n1", "-O"] and client.calls == 1


def test_a_reason_with_bars_and_a_forged_record_after_a_newline_is_one_reason(tmp_path: Path) -> None:
    # An admin's (or a hostile tool's) reason: '|' inside, then a newline and a healthy-looking record.
    client, _ = programs(
        tmp_path,
        "printf 'n1|idle+drain|gpu:8|alice|2026-12-02T01:02:22|"
        'hold|do not|resume\\nn1|idle|gpu:8|root|now|x%s\\n\' "$END"',
    )
    got = client.show("n1")
    assert not isinstance(got, ProbeError), got
    (n,) = got
    assert n.drained and n.state.text == "IDLE+DRAIN" and n.gres_gpus == 8
    assert n.reason is not None and n.reason.text == "hold|do not|resume\nn1|idle|gpu:8|root|now|x"
    assert n.reason.user == "alice" and not n.drained_by_us


def test_a_record_that_does_not_end_with_the_token_is_no_answer(tmp_path: Path) -> None:
    # A guessed end (not this call's random token) cannot close a record.
    client, log = programs(tmp_path, "printf 'n1|idle|gpu:8|root|now|none@nh0000000000000000@\\n'")
    got = client.show("n1")
    assert isinstance(got, ProbeError) and got.kind == "invalid", got
    assert len(calls(log)) == 1  # not read again some other way: an answer that is no answer is an error


def test_records_of_the_node_in_two_partitions_are_one_node(tmp_path: Path) -> None:
    rec = "n1|mixed+drain|gpu:h100:8(S:0-1)|root|t|nh:ecc GPU6 gpu_ecc: x"
    client, _ = programs(tmp_path, f'printf \'{rec}%s\\n{rec}%s\\n\' "$END" "$END"')
    got = client.show("n1")
    assert not isinstance(got, ProbeError) and len(got) == 1 and got[0].gres_gpus == 8 and got[0].drained_by_us


def test_records_that_disagree_are_no_answer(tmp_path: Path) -> None:
    client, _ = programs(
        tmp_path, 'printf \'n1|idle+drain|gpu:8|root|t|nh:ecc x%s\\nn1|idle|gpu:8|root|t|none%s\\n\' "$END" "$END"'
    )
    got = client.show("n1")
    assert isinstance(got, ProbeError) and "disagree" in got.message


def test_a_node_sinfo_does_not_list_is_read_with_scontrol(tmp_path: Path) -> None:
    # sinfo lists the nodes of partitions: a node in none is read the old way.
    client, log = programs(tmp_path, "printf 'n2|idle|gpu:8|root|t|none%s\\n' \"$END\"")
    got = client.show("n1")
    assert not isinstance(got, ProbeError) and got[0].reason is not None
    assert [c[0] for c in calls(log)] == ["-h", "show"] and client.calls == 2


def test_without_sinfo_beside_scontrol_scontrol_reads_the_node(tmp_path: Path) -> None:
    client, log = programs(tmp_path, None)
    got = client.show("n1")
    assert not isinstance(got, ProbeError) and got[0].drained_by_us
    assert calls(log) == [["show", "node", "-o", "n1"]]


def test_the_whole_cluster_is_still_scontrols(tmp_path: Path) -> None:
    client, log = programs(tmp_path, "exit 3")
    got = client.show(None)
    assert not isinstance(got, ProbeError)
    assert calls(log) == [["show", "node", "-o"]]


def test_a_sinfo_answer_over_the_one_node_cap_is_no_answer(tmp_path: Path) -> None:
    client, _ = programs(tmp_path, f"head -c {MAX_NODE_ANSWER + 4096} /dev/zero | tr '\\0' x; printf '%s\\n' \"$END\"")
    got = client.show("n1")
    assert isinstance(got, ProbeError) and got.kind == "invalid" and "more than" in got.message


def test_a_failing_sinfo_is_an_error_not_a_second_call(tmp_path: Path) -> None:
    client, log = programs(tmp_path, "echo 'slurm_load_node: Unable to contact slurm controller' >&2; exit 1")
    got = client.show("n1")
    assert isinstance(got, ProbeError) and "Unable to contact" in got.message
    assert len(calls(log)) == 1


@pytest.mark.parametrize(
    "text,why",
    [
        ("n1|idle|gpu:8%s\n", "field"),
        ("", None),
        ("garbage without an end\n", "end"),
    ],
)
def test_parse_sinfo_node_table(text: str, why: str | None) -> None:
    end = "@nhabc@"
    got = sn.parse_sinfo_node(text.replace("%s", end), "n1", end)
    if why is None:
        assert got is None
    else:
        assert isinstance(got, str) and why in got


# ----------------------------------------------------------------------------- reconciliation jitter


def test_reconciliation_due_times_of_1000_nodes_spread_over_the_window() -> None:
    period = 3600.0
    due = [sn.reconcile_after_s(f"gpu{i:04d}", period) for i in range(1000)]
    assert all(0.9 * period <= d < 1.1 * period for d in due)
    # Spread over the ±10 % window, not bunched: every 36 s bin of the 720 s window is used, none holds
    # more than 5 % of the nodes (a uniform spread gives 5 % per bin on average).
    bins = [0] * 20
    for d in due:
        bins[int((d - 0.9 * period) / (0.2 * period) * 20)] += 1
    assert min(bins) > 0 and max(bins) <= 100, bins
    assert statistics.pstdev(due) > 0.04 * period  # uniform over ±10 %: about 5.8 %
    assert len(set(due)) > 990


def test_a_nodes_jitter_is_stable_and_its_own() -> None:
    assert sn.reconcile_after_s("gpu0017", 3600.0) == sn.reconcile_after_s("gpu0017", 3600.0)
    assert sn.reconcile_after_s("gpu0017", 3600.0) != sn.reconcile_after_s("gpu0018", 3600.0)
    # The same fraction of any period: a node keeps its place when reconcile_s changes.
    a, b = sn.reconcile_after_s("gpu0017", 3600.0) / 3600.0, sn.reconcile_after_s("gpu0017", 60.0) / 60.0
    assert abs(a - b) < 1e-12


def _node_due(early: bool) -> str:
    """A node name whose reconciliation falls due before (``early``) or after 0.97 × reconcile_s."""
    return next(
        n
        for n in (f"gpu{i:04d}" for i in range(10_000))
        if (sn.reconcile_after_s(n, 3600.0) < 0.97 * 3600.0) is early
        and abs(sn.reconcile_after_s(n, 3600.0) - 0.97 * 3600.0) > 60
    )


@pytest.mark.parametrize("early", [True, False], ids=["due-early", "due-late"])
def test_the_slurm_node_probe_reconciles_at_the_nodes_own_due_time(tmp_path: Path, early: bool) -> None:
    """A cached view 0.97 × reconcile_s old: read again for a node due early, kept for one due late."""
    import time
    from dataclasses import replace

    from nodehealth.config.loader import load
    from nodehealth.probes.slurm import node_view
    from nodehealth.statedir import slurmstate

    name = _node_due(early)
    log = tmp_path / "calls.log"
    script = tmp_path / "scontrol"
    script.write_text(f"#!/bin/sh\necho \"$*\" >> {log}\necho 'NodeName={name} Gres=gpu:8 State=IDLE'\n")
    script.chmod(0o755)
    cfg_path = tmp_path / "nh.toml"
    cfg_path.write_text(
        f'node_name = "{name}"\n[paths]\nstate_dir = "{tmp_path}/state"\n'
        f'[slurm]\nscontrol = "{script}"\ntimeout_s = 60\nreconcile_s = 3600\n'
    )
    cfg = load(str(cfg_path))
    cached = {"name": name, "gres_gpus": 7, "state": "IDLE", "reason": None, "time": time.time() - 0.97 * 3600}
    assert slurmstate.update(cfg.paths, lambda s: replace(s, slurm_node=cached), lock_timeout_s=5.0) is not None
    got = node_view(cfg, name, "healthcheck", 60.0)
    assert not isinstance(got, ProbeError)
    assert (got.gres_gpus, log.exists()) == ((8, True) if early else (7, False))


def test_a_sinfo_others_can_write_is_never_run_scontrol_reads(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    client, log = programs(tmp_path, f"touch {marker}")
    (tmp_path / "sinfo").chmod(0o757)  # anyone may rewrite it: root does not run it
    client = Scontrol(str(tmp_path / "scontrol"), 30.0, Deadline(60.0))
    assert client.sinfo == ""
    got = client.show("n1")
    assert not isinstance(got, ProbeError) and got[0].drained_by_us
    assert not marker.exists() and calls(log) == [["show", "node", "-o", "n1"]]


def test_sinfo_gets_slurm_conf_and_none_of_the_callers_sinfo_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # SINFO_FORMAT / SINFO_PARTITION / SLURM_TIME_FORMAT would change what sinfo prints or lists.
    for k, v in {
        "SINFO_FORMAT": "%N",
        "SINFO_PARTITION": "other",
        "SLURM_TIME_FORMAT": "%s",
        "SLURM_CONF": "/etc/slurm/x.conf",
        "LD_PRELOAD": "/tmp/evil.so",
    }.items():
        monkeypatch.setenv(k, v)
    seen = tmp_path / "env"
    client, _ = programs(tmp_path, f"env > {seen}; printf 'n1|idle|gpu:8|root|t|none%s\\n' \"$END\"")
    got = client.show("n1")
    assert not isinstance(got, ProbeError), got
    env = dict(line.split("=", 1) for line in seen.read_text().splitlines() if "=" in line)
    assert env.get("SLURM_CONF") == "/etc/slurm/x.conf"
    assert not {"SINFO_FORMAT", "SINFO_PARTITION", "SLURM_TIME_FORMAT", "LD_PRELOAD"} & set(env)


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _failing_node(tmp_path: Path, answer: bool = False) -> tuple[object, Path, Path]:
    """A config whose scontrol logs each call and fails (or, with ``answer``, describes node n1)."""
    from nodehealth.config.loader import load

    log = tmp_path / "calls.log"
    script = tmp_path / "scontrol"
    fail = "echo 'slurm_load_node: Socket timed out' >&2; exit 1"
    body = "echo 'NodeName=n1 Gres=gpu:8 State=IDLE'" if answer else fail
    script.write_text(f'#!/bin/sh\necho "$*" >> {log}\n{body}\n')
    script.chmod(0o755)
    cfg_path = tmp_path / "nh.toml"
    cfg_path.write_text(
        f'node_name = "n1"\n[paths]\nstate_dir = "{tmp_path}/state"\n'
        f'[slurm]\nscontrol = "{script}"\ntimeout_s = 60\nreconcile_s = 3600\n'
    )
    return load(str(cfg_path)), log, script


def test_a_failed_read_is_not_repeated_every_round_and_backs_off(tmp_path: Path) -> None:
    """slurmctld not answering: one call, then none until the back-off has passed, which doubles."""
    from nodehealth.probes import slurm as ps
    from nodehealth.slurm import client as sc

    cfg, log, _ = _failing_node(tmp_path)
    clock = _Clock()
    first = ps.node_view(cfg, "n1", "daemon", 60.0, clock=clock)
    assert isinstance(first, ProbeError) and "Socket timed out" in first.message
    wait1 = sc.retry_after_s("n1", 1, 3600.0)
    assert 0.9 * sc.RETRY_FIRST_S <= wait1 <= 1.1 * sc.RETRY_FIRST_S
    for step in (30.0, wait1 - 31.0):  # the rounds in between ask nothing, and say why
        clock.t += step
        got = ps.node_view(cfg, "n1", "daemon", 60.0, clock=clock)
        assert isinstance(got, ProbeError) and got.kind == first.kind
        assert "Socket timed out" in got.message and "1 failed read(s) in a row; the next in" in got.message
    assert len(log.read_text().splitlines()) == 1
    clock.t += 2.0  # past the back-off: asked again, fails again
    ps.node_view(cfg, "n1", "daemon", 60.0, clock=clock)
    assert len(log.read_text().splitlines()) == 2
    wait2 = sc.retry_after_s("n1", 2, 3600.0)
    assert wait2 == pytest.approx(2 * wait1)
    clock.t += wait2 - 1.0  # the doubled wait: still nothing
    ps.node_view(cfg, "n1", "daemon", 60.0, clock=clock)
    assert len(log.read_text().splitlines()) == 2
    assert sc.retry_after_s("n1", 40, 3600.0) <= 1.1 * sc.RETRY_MAX_S
    assert sc.retry_after_s("n1", 40, 600.0) <= 1.1 * 600.0


def test_during_the_back_off_the_cached_view_stands_and_an_answer_ends_it(tmp_path: Path) -> None:
    import time
    from dataclasses import replace

    from nodehealth.probes import slurm as ps
    from nodehealth.slurm import client as sc
    from nodehealth.statedir import slurmstate

    cfg, log, script = _failing_node(tmp_path)
    stale = {"name": "n1", "gres_gpus": 7, "state": "IDLE", "reason": None, "time": time.time() - 2 * 3600}
    assert slurmstate.update(cfg.paths, lambda s: replace(s, slurm_node=stale), lock_timeout_s=5.0) is not None
    clock = _Clock()
    for _ in range(3):
        got = ps.node_view(cfg, "n1", "daemon", 60.0, clock=clock)
        assert not isinstance(got, ProbeError) and got.gres_gpus == 7
        clock.t += 15.0  # three rounds inside the first back-off (at least 54 s)
    assert len(log.read_text().splitlines()) == 1
    _failing_node(tmp_path, answer=True)  # slurmctld answers again
    clock.t += sc.retry_after_s("n1", 1, 3600.0)
    got = ps.node_view(cfg, "n1", "daemon", 60.0, clock=clock)
    assert not isinstance(got, ProbeError) and got.gres_gpus == 8
    assert len(log.read_text().splitlines()) == 2
    assert not sc.BACKOFF.held(cfg, "n1")  # the back-off is over


def test_a_one_shot_health_check_reads_once_whatever_another_config_met(tmp_path: Path) -> None:
    """The back-off is the process's, for the node, scontrol and state dir it met: not another's."""
    from nodehealth.probes import slurm as ps

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    cfg_a, log_a, _ = _failing_node(tmp_path / "a")
    cfg_b, log_b, _ = _failing_node(tmp_path / "b")
    clock = _Clock()
    ps.node_view(cfg_a, "n1", "daemon", 60.0, clock=clock)
    ps.node_view(cfg_b, "n1", "healthcheck", 60.0, clock=clock)
    assert (len(log_a.read_text().splitlines()), len(log_b.read_text().splitlines())) == (1, 1)
