"""InfiniBand error counters, the ports' history and flaps: the probe (probes/infiniband.py) over a fake
sysfs tree, the history (probes/ib_history.py) in a tmp state dir, the check's judgement
(checks/host_infiniband.py).

The sysfs formats are the kernel's: drivers/infiniband/core/sysfs.c (``state_show`` "4: ACTIVE",
``phys_state_show`` "5: LinkUp", ``rate_show`` "400 Gb/sec (4X NDR)", ``show_pma_counter`` "%llu\\n")
and the counter names of Documentation/ABI/stable/sysfs-class-infiniband.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from nodehealth.checks import host_infiniband
from nodehealth.checks.base import Context
from nodehealth.model import Action, Status
from nodehealth.observations import IbPort, IbSample, Observations, ProbeError
from nodehealth.probes import ib_history, infiniband
from nodehealth.statedir import layout

UP = {"state": "4: ACTIVE", "phys_state": "5: LinkUp", "rate": "400 Gb/sec (4X NDR)", "link_layer": "InfiniBand"}
DOWN = {"state": "1: DOWN", "phys_state": "2: Polling", "rate": "10 Gb/sec (4X)", "link_layer": "InfiniBand"}


def _port(root: Path, device: str = "mlx5_0", number: int = 1, files: Any = UP, **counters: str) -> Path:
    d = root / "class" / "infiniband" / device / "ports" / str(number)
    (d / "counters").mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (d / name).write_text(text + "\n")
    for name, text in counters.items():
        (d / "counters" / name).write_text(text + "\n")
    return d


def _ctx() -> Context:
    return Context(name="host_infiniband", phase="manual", node="gpu001", expected_gpus=8)


def _judge(ports: Any, **settings: Any) -> Any:
    return host_infiniband.evaluate(Observations(infiniband=ports), host_infiniband.Settings(**settings), _ctx())


def _collect(sysfs: Path, state: Path, persist: bool = True, now: float = 1000.0, timeout_s: float = 30.0) -> Any:
    pending = infiniband.start(str(sysfs), str(state), timeout_s, persist=persist)
    pending.clock = lambda: now
    return pending.collect()


# --------------------------------------------------------------------------- the counters' files


def test_counters_are_read_by_name_and_a_missing_one_is_absent(tmp_path: Path) -> None:
    _port(tmp_path, symbol_error="0", link_downed="2", port_rcv_errors="18446744073709551615")
    (tmp_path / "class/infiniband/mlx5_0/ports/1/counters/unlisted_counter").write_text("7\n")
    (port,) = infiniband.read_ports(str(tmp_path))
    assert port.counters == (("symbol_error", 0), ("link_downed", 2), ("port_rcv_errors", 18446744073709551615))
    assert port.error is None


@pytest.mark.parametrize("text", ["-1", "12 errors", "0x10", "18446744073709551616", "", "\u0661\u0662", "1e3"])
def test_a_malformed_counter_is_named_never_a_number(tmp_path: Path, text: str) -> None:
    _port(tmp_path, symbol_error=text, link_downed="0")
    (port,) = infiniband.read_ports(str(tmp_path))
    assert port.counters == (("link_downed", 0),)
    assert port.error is not None and "counters/symbol_error: malformed value" in port.error


def test_a_huge_counter_file_is_read_only_32_bytes(tmp_path: Path) -> None:
    d = _port(tmp_path)
    (d / "counters" / "symbol_error").write_text("9" * (4 << 20))
    (port,) = infiniband.read_ports(str(tmp_path))
    assert port.counters == ()
    assert port.error is not None and "malformed value" in port.error and len(port.error) < 400


def test_a_symlinked_or_special_counter_file_is_refused(tmp_path: Path) -> None:
    d = _port(tmp_path)
    secret = tmp_path / "elsewhere"
    secret.write_text("5\n")
    (d / "counters" / "symbol_error").symlink_to(secret)
    os.mkfifo(d / "counters" / "link_downed")  # would block a plain open(); O_NONBLOCK + fstat refuse it
    (port,) = infiniband.read_ports(str(tmp_path))
    assert port.counters == ()
    assert port.error is not None
    assert "counters/symbol_error" in port.error and "counters/link_downed: not a regular file" in port.error


def test_a_port_error_and_a_counter_error_are_both_named(tmp_path: Path) -> None:
    _port(tmp_path, files={**UP, "rate": "fast"}, symbol_error="x")
    (port,) = infiniband.read_ports(str(tmp_path))
    assert port.error is not None and "rate: malformed" in port.error and "symbol_error: malformed" in port.error


def test_a_hung_sysfs_read_is_bounded_by_the_deadline(tmp_path: Path) -> None:
    # A PMA counter read waits on the HCA's firmware: a FIFO's open blocks as a wedged one would.
    fifo = tmp_path / "hang"
    os.mkfifo(fifo)

    def read(_root: str) -> tuple[IbPort, ...]:
        with open(fifo):
            return ()

    pending = infiniband.start(str(tmp_path), str(tmp_path / "state"), 0.5, read=read)
    got = pending.collect()
    assert isinstance(got, ProbeError) and got.kind == "timeout"
    res = _judge(got)
    assert res.status is Status.UNKNOWN


def test_no_infiniband_class_is_no_ports_no_child_and_no_history_file(tmp_path: Path) -> None:
    state = tmp_path / "state"
    assert infiniband.start(str(tmp_path), str(state), 5.0).child is None
    assert _collect(tmp_path, state) == ()
    assert not (state / layout.IB_HISTORY).exists()


# --------------------------------------------------------------------------- the history


def test_rounds_build_a_change_log_in_the_state_dir(tmp_path: Path) -> None:
    sysfs, state = tmp_path / "sys", tmp_path / "state"
    d = _port(sysfs, link_downed="0", symbol_error="0")
    for t in (100.0, 130.0, 160.0):
        (port,) = _collect(sysfs, state, now=t)
    # Three equal rounds: the first of the run and the latest are kept.
    assert [s.t for s in port.history] == [100.0, 160.0]
    for name, text in DOWN.items():
        (d / name).write_text(text + "\n")
    (d / "counters" / "link_downed").write_text("1\n")
    (port,) = _collect(sysfs, state, now=190.0)
    # The file keeps changes: up since 100 (the rounds at 130 and 160 only moved the time), down at 190.
    assert [(s.t, s.up) for s in port.history] == [(100.0, True), (190.0, False)]
    saved = json.loads((state / layout.IB_HISTORY).read_text())
    assert [s[0] for s in saved["ports"]["mlx5_0/1"]] == [100.0, 190.0]  # the time-only sample is not kept
    assert saved["format"] == 1 and list(saved["ports"]) == ["mlx5_0/1"]
    assert oct((state / layout.IB_HISTORY).stat().st_mode & 0o777) == "0o600"


def test_a_look_writes_nothing_but_sees_the_kept_history(tmp_path: Path) -> None:
    sysfs, state = tmp_path / "sys", tmp_path / "state"
    _port(sysfs, link_downed="0")
    _collect(sysfs, state, now=100.0)
    before = (state / layout.IB_HISTORY).read_bytes()
    (port,) = _collect(sysfs, state, persist=False, now=200.0)
    assert [s.t for s in port.history] == [100.0, 200.0]
    assert (state / layout.IB_HISTORY).read_bytes() == before
    (port,) = _collect(sysfs, tmp_path / "never", persist=False, now=200.0)
    assert [s.t for s in port.history] == [200.0] and not (tmp_path / "never").exists()


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        '{"format": 2, "ports": {}}',
        '{"format": 1, "ports": {"mlx5_0/1": [[1e400, true, []]]}}',
        '{"format": 1, "ports": {"mlx5_0/1": [[50, "yes", []]]}}',
        '{"format": 1, "ports": {"mlx5_0/1": [[50, true, [["link_downed", -1]]]]}}',
        '{"format": 1, "ports": {"mlx5_0/1": [[60, true, []], [50, true, []]]}}',
        '{"format": 1, "ports": {"mlx5_0/1": [[50, true, [["link_downed", true]]]]}}',
    ],
)
def test_a_hostile_or_corrupt_history_file_is_history_lost_never_an_error(tmp_path: Path, text: str) -> None:
    sysfs, state = tmp_path / "sys", tmp_path / "state"
    _port(sysfs, link_downed="0")
    state.mkdir(mode=0o700)
    (state / layout.IB_HISTORY).write_text(text)
    (port,) = _collect(sysfs, state, now=100.0)
    assert [s.t for s in port.history] == [100.0]
    assert _judge((port,)).status is Status.OK


def test_a_history_file_past_the_readers_limit_is_ignored(tmp_path: Path) -> None:
    sysfs, state = tmp_path / "sys", tmp_path / "state"
    _port(sysfs)
    state.mkdir(mode=0o700)
    (state / layout.IB_HISTORY).write_text('{"format": 1, "ports": {"x": []}, "pad": "' + "a" * (2 << 20) + '"}')
    (port,) = _collect(sysfs, state, now=100.0)
    assert [s.t for s in port.history] == [100.0]


def test_an_unsafe_state_dir_costs_the_history_not_the_round(tmp_path: Path) -> None:
    sysfs, state = tmp_path / "sys", tmp_path / "state"
    _port(sysfs)
    state.mkdir(mode=0o777)
    os.chmod(state, 0o777)  # writable by others: refused as a state dir
    (port,) = _collect(sysfs, state, now=100.0)
    assert port.state == "ACTIVE" and [s.t for s in port.history] == [100.0]
    assert not (state / layout.IB_HISTORY).exists()


def test_a_clock_set_back_ends_the_history() -> None:
    earlier = (IbSample(500.0, False), IbSample(600.0, True))
    assert ib_history.merge(earlier, IbSample(400.0, True)) == (IbSample(400.0, True),)


def test_the_history_is_bounded_in_time_and_length() -> None:
    old = tuple(IbSample(float(t), t % 2 == 0) for t in range(0, 100))
    now = IbSample(100.0 + ib_history.HORIZON_S, True)
    kept = ib_history.merge(old, now)
    assert kept[0].t == 99.0 and kept[-1] == now  # the newest sample past the horizon is the baseline
    many = tuple(IbSample(float(t), t % 2 == 0) for t in range(1000))
    assert len(ib_history.merge(many, IbSample(1000.0, True))) == ib_history.MAX_SAMPLES


# --------------------------------------------------------------------------- the check


def _with(history: Any, **kw: Any) -> IbPort:
    last = history[-1]
    state, phys = ("ACTIVE", "LinkUp") if last.up else ("DOWN", "Polling")
    return IbPort("mlx5_0", 1, state, phys, 400.0, "InfiniBand", counters=last.counters, history=tuple(history), **kw)


def _flapping(times: int, start: float = 0.0, step: float = 30.0) -> list[IbSample]:
    out, t = [IbSample(start, True)], start
    for _ in range(times):
        out += [IbSample(t + step, False), IbSample(t + 2 * step, True)]
        t += 2 * step
    return out


def test_three_flaps_in_ten_minutes_warn_and_do_not_drain() -> None:
    res = _judge((_with(_flapping(3)),))
    assert res.status is Status.WARN and res.action is Action.NONE
    assert "down and back 3 time(s) in 600 s" in res.summary


def test_two_flaps_or_flaps_past_the_window_are_not_a_flapping_port() -> None:
    assert _judge((_with(_flapping(2)),)).status is Status.OK
    old = _flapping(3) + [IbSample(2000.0, True)]
    assert _judge((_with(old),)).status is Status.OK


def test_flap_status_fail_drains_to_inspect_and_flap_max_zero_turns_it_off() -> None:
    res = _judge((_with(_flapping(3)),), flap_status="FAIL")
    assert res.status is Status.FAIL and res.action is Action.INSPECT
    assert _judge((_with(_flapping(5)),), flap_max=0).status is Status.OK


def test_link_downed_counts_the_downs_no_round_saw() -> None:
    history = [IbSample(0.0, True, (("link_downed", 10),)), IbSample(300.0, True, (("link_downed", 13),))]
    res = _judge((_with(history),))
    assert res.status is Status.WARN and "3 time(s)" in res.summary
    assert res.details["ports"]["mlx5_0/1"]["flaps"] == 3


def test_error_counters_are_not_judged_by_default() -> None:
    history = [IbSample(0.0, True, (("symbol_error", 0),)), IbSample(60.0, True, (("symbol_error", 90000),))]
    assert _judge((_with(history),)).status is Status.OK


def test_a_rising_error_counter_warns_past_its_threshold() -> None:
    history = [
        IbSample(0.0, True, (("symbol_error", 5), ("port_rcv_errors", 0))),
        IbSample(3000.0, True, (("symbol_error", 50), ("port_rcv_errors", 1))),
        IbSample(3500.0, True, (("symbol_error", 120), ("port_rcv_errors", 1))),
    ]
    res = _judge((_with(history),), error_increase_max=100)
    assert res.status is Status.WARN and "symbol_error +115" in res.summary and "port_rcv" not in res.summary
    assert _judge((_with(history),), error_increase_max=115).status is Status.OK


def test_the_counter_window_starts_at_the_sample_in_effect_then() -> None:
    history = [
        IbSample(0.0, True, (("symbol_error", 0),)),
        IbSample(100.0, True, (("symbol_error", 1000),)),
        IbSample(5000.0, True, (("symbol_error", 1001),)),
    ]
    assert host_infiniband.increase(tuple(history), "symbol_error", 3600.0) == 1
    assert host_infiniband.increase(tuple(history), "symbol_error", 86400.0) == 1001


def test_a_counter_reset_counts_its_new_value_not_a_negative() -> None:
    history = (
        IbSample(0.0, True, (("symbol_error", 500),)),
        IbSample(60.0, True, (("symbol_error", 7),)),
        IbSample(120.0, True, (("symbol_error", 10),)),
    )
    assert host_infiniband.increase(history, "symbol_error", 600.0) == 10


def test_a_threshold_on_a_port_without_counters_is_unknown_never_ok() -> None:
    res = _judge((_with([IbSample(0.0, True)]),), error_increase_max=10)
    assert res.status is Status.UNKNOWN and "none of error_counters" in res.summary


def test_rounds_of_a_flapping_port_through_the_probe_warn(tmp_path: Path) -> None:
    sysfs, state = tmp_path / "sys", tmp_path / "state"
    d = _port(sysfs, link_downed="0")
    t = time.time()
    for i in range(7):
        files = UP if i % 2 == 0 else DOWN
        for name, text in files.items():
            (d / name).write_text(text + "\n")
        ports = _collect(sysfs, state, now=t + 30 * i)
    res = _judge(ports)
    assert res.status is Status.WARN and "down and back 3 time(s)" in res.summary


def test_expected_ports_and_rate_per_host_pattern_come_from_an_override(tmp_path: Path) -> None:
    from nodehealth.config.loader import load

    conf = tmp_path / "nodehealth.toml"
    conf.write_text(
        '[[override]]\nhosts = "gpu[001-008]"\n[override.checks.host_infiniband]\nmin_ports = 8\nmin_rate_gbps = 400\n'
    )
    gpu = load(str(conf), host="gpu003").checks["host_infiniband"]
    cpu = load(str(conf), host="cpu001").checks["host_infiniband"]
    assert (gpu.min_ports, gpu.min_rate_gbps) == (8, 400.0)
    assert (cpu.min_ports, cpu.min_rate_gbps) == (0, 0.0)
    res = _judge((_with([IbSample(0.0, True)]),), min_ports=8, min_rate_gbps=400)
    assert res.status is Status.FAIL and "1 InfiniBand port(s) found, 8 expected" in res.summary


# --------------------------------------------------------------------------- through the runner


def _runner_config(tmp_path: Path) -> Any:
    from nodehealth.config import loader as config

    return config.resolve(
        {"paths": {"sysfs_root": str(tmp_path / "sys"), "state_dir": str(tmp_path / "state")}}, "<test>"
    )


def test_the_daemon_and_faces_keep_the_history_and_a_check_by_hand_writes_none(tmp_path: Path) -> None:
    from nodehealth import runner

    d = _port(tmp_path / "sys", link_downed="0", symbol_error="3")
    cfg = _runner_config(tmp_path)
    out = runner.execute(cfg, phase="manual", only=("host_infiniband",), node="gpu001", read_only=True)
    assert out.report.results[0].status is Status.OK
    assert not (tmp_path / "state" / layout.IB_HISTORY).exists()
    for downs in ("1", "2", "3", "4"):  # the look by hand kept nothing: the daemon's first round is the baseline
        (d / "counters" / "link_downed").write_text(downs + "\n")
        out = runner.execute(cfg, phase="daemon", only=("host_infiniband",), node="gpu001")
    assert (tmp_path / "state" / layout.IB_HISTORY).exists()
    (res,) = out.report.results
    assert res.status is Status.WARN and "down and back 3 time(s)" in res.summary
    assert res.details["ports"]["mlx5_0/1"]["counters"] == {"symbol_error": 3, "link_downed": 4}


def test_many_ports_flapping_all_day_still_leave_a_file_the_next_round_reads(tmp_path: Path) -> None:
    from nodehealth.statedir import files

    ports = tuple(
        IbPort(f"mlx5_{i}", 1, "ACTIVE", "LinkUp", 400.0, "InfiniBand", counters=(("symbol_error", 10**12),))
        for i in range(200)
    )
    flapping = tuple(IbSample(float(t), t % 2 == 0, (("symbol_error", 10**12 + t),)) for t in range(300))
    history = {ib_history.key(p): flapping for p in ports}
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / layout.IB_HISTORY).write_text(json.dumps(ib_history.encode(history)))
    assert (state / layout.IB_HISTORY).stat().st_size > files.MAX_READ  # refused by the reader: history lost
    ib_history.update(str(state), ports, 400.0)
    kept = ib_history.read(str(state))
    assert (state / layout.IB_HISTORY).stat().st_size <= files.MAX_READ // 2 and len(kept) == 200
    big = {k: flapping[:255] + (IbSample(400.0, True, (("symbol_error", 10**12),)),) for k in history}
    trimmed = ib_history.fit(big)
    assert all(v[-1].t == 400.0 and 1 <= len(v) < 256 for v in trimmed.values())
    assert len(json.dumps(ib_history.encode(trimmed))) <= files.MAX_READ // 2


def test_a_quiet_round_does_not_rewrite_the_file_and_a_change_does(tmp_path: Path) -> None:
    sysfs, state = tmp_path / "sys", tmp_path / "state"
    d = _port(sysfs, symbol_error="0")
    _collect(sysfs, state, now=100.0)
    before = (state / layout.IB_HISTORY).stat()
    (port,) = _collect(sysfs, state, now=200.0)
    assert [s.t for s in port.history] == [100.0, 200.0]
    after = (state / layout.IB_HISTORY).stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    (d / "counters" / "symbol_error").write_text("5\n")
    (port,) = _collect(sysfs, state, now=300.0)
    assert [s.t for s in port.history] == [100.0, 300.0]
    assert (state / layout.IB_HISTORY).stat().st_ino != before.st_ino
    (port,) = _collect(sysfs, state, now=400.0)
    assert [s.t for s in port.history] == [100.0, 300.0, 400.0]


def test_a_saturated_error_counter_is_said_never_a_quiet_ok() -> None:
    # symbol_error is 16 bits wide in the IBA PortCounters and stops at 65535: no increase shows past it.
    history = [IbSample(0.0, True, (("symbol_error", 65535),)), IbSample(600.0, True, (("symbol_error", 65535),))]
    res = _judge((_with(history),), error_increase_max=100)
    assert res.status is Status.WARN and "symbol_error saturated at 65535" in res.summary
    assert _judge((_with(history),)).status is Status.OK  # thresholds off: not judged
