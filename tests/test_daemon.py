"""The daemon as a process: live scrape, promtool, SIGHUP with a bad config, hung probe, start errors,
sd_notify, state hand-off, XID to drain."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from conftest import Timing
from test_daemon_util import free_port, get, sample, start, stop, wait_for, write_config

from nodehealth.statedir import verdict as state

PROMTOOL = shutil.which("promtool")


def _metrics(port: int) -> str:
    return get(f"http://127.0.0.1:{port}/metrics")[1].decode()


def test_live_daemon_serves_metrics_writes_state_and_stops_on_sigterm(tmp_path):
    port = free_port()
    cfg = write_config(tmp_path, "healthy-8x-h100", port)
    proc = start(cfg)
    try:
        text = wait_for(f"http://127.0.0.1:{port}/metrics", lambda b: b"nodehealth_rounds_total 2.0" in b).decode()
        assert sample(text, "nodehealth_gpu_temperature_celsius", gpu="7") is not None
        assert sample(text, "nodehealth_check_status", check="gpu_xid") is not None
        got, why = state.read(str(tmp_path / "state"), max_age_s=30, require_xid=True)
        assert got is not None, why
        assert got.report["phase"] == "daemon" and got.xid_follower == "alive"
        # The latest GPU counter reading, which a fast-path prolog copies as its job's baseline.
        counters = json.loads((tmp_path / "state" / "gpu-counters.json").read_text())
        assert counters["source"] == "daemon" and len(counters["gpus"]) == 8
        assert get(f"http://127.0.0.1:{port}/healthz")[0] == 200
    finally:
        code, err = stop(proc)
    assert code == 0, err
    assert "stopping" in err


@pytest.mark.real
@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (Debian package prometheus)")
def test_promtool_check_metrics_on_a_live_scrape(tmp_path):
    port = free_port()
    proc = start(write_config(tmp_path, "row-remap-pending", port))
    try:
        body = wait_for(f"http://127.0.0.1:{port}/metrics", lambda b: b"nodehealth_rounds_total 1.0" in b)
    finally:
        stop(proc)
    res = subprocess.run([PROMTOOL, "check", "metrics"], input=body, capture_output=True)
    assert res.returncode == 0 and not res.stdout.strip() and not res.stderr.strip(), res.stdout + res.stderr
    assert b"process_resident_memory_bytes" in body


def test_sighup_with_a_bad_config_keeps_the_old_one(tmp_path):
    port = free_port()
    cfg = write_config(tmp_path, "healthy-8x-h100", port, interval_s=1)
    proc = start(cfg)
    try:
        wait_for(f"http://127.0.0.1:{port}/metrics", lambda b: b"nodehealth_rounds_total 1.0" in b)
        good = cfg.read_text()
        cfg.write_text(good + "\n[daemon]\ninterval_s = -3\n")  # duplicate table + bad value
        proc.send_signal(signal.SIGHUP)
        text = wait_for(
            f"http://127.0.0.1:{port}/metrics", lambda b: b'nodehealth_config_reloads_total{result="error"} 1.0' in b
        ).decode()
        assert sample(text, "nodehealth_config_last_reload_success") == 0
        r1 = sample(_metrics(port), "nodehealth_rounds_total")
        wait_for(
            f"http://127.0.0.1:{port}/metrics",  # still running on the old config
            lambda b: sample(b.decode(), "nodehealth_rounds_total") > r1,
        )
        # A good config is taken: the scenario changes to a failing node.
        cfg.write_text(good.replace("healthy-8x-h100", "row-remap-pending"))
        proc.send_signal(signal.SIGHUP)
        wait_for(
            f"http://127.0.0.1:{port}/metrics", lambda b: b'nodehealth_check_status{check="gpu_remapped_rows"} 4.0' in b
        )
        assert proc.poll() is None
    finally:
        code, err = stop(proc)
    assert "config reload rejected, keeping the running configuration" in err
    assert "configuration reloaded" in err and code == 0


@pytest.mark.timing
def test_scrape_during_a_hung_probe_answers_fast_with_the_timeout_metric(tmp_path, timing: Timing):
    port = free_port()
    proc = start(write_config(tmp_path, "hung-nvml-call", port, interval_s=1, nvml_timeout_s=2.0))
    try:
        wait_for(f"http://127.0.0.1:{port}/metrics")  # endpoint up while the first round hangs
        worst = 0.0
        for _ in range(20):
            code, body, took = get(f"http://127.0.0.1:{port}/metrics")
            assert code == 200
            worst = max(worst, took)
            time.sleep(0.05)
        # a scrape that waited for the hung round would take the probe's 2 s
        fast = min(timing.slack(0.5), 1.0)
        assert worst < fast, (worst, fast)
        text = wait_for(
            f"http://127.0.0.1:{port}/metrics",
            lambda b: b'nodehealth_probe_timed_out{probe="nvml"} 1.0' in b,
            timeout=15,
        ).decode()
        assert sample(text, "nodehealth_check_status", check="nvml") == 4
        # The next round hangs again; scrapes during it still answer, from the last round.
        t0 = time.monotonic()
        seen_running = False
        while time.monotonic() - t0 < 4:
            code, body, took = get(f"http://127.0.0.1:{port}/metrics")
            assert code == 200 and took < fast, (took, fast)
            t = body.decode()
            if (sample(t, "nodehealth_round_running_seconds") or 0) > 0.5:
                seen_running = True
                assert sample(t, "nodehealth_probe_timed_out", probe="nvml") == 1
            time.sleep(0.1)
        assert seen_running
    finally:
        stop(proc)


def test_listen_address_in_use_is_a_clear_start_error(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        proc = start(write_config(tmp_path, "healthy-8x-h100", port))
        code, err = stop(proc, timeout=20) if proc.wait(timeout=20) is not None else (None, "")
    assert code == 1
    assert f"cannot listen on 127.0.0.1:{port}" in err and "in use" in err


def test_unwritable_state_dir_is_a_start_error(tmp_path):
    # Root may write into a mode-0555 directory, but nobody can create one under /proc.
    ro = Path("/proc") if os.geteuid() == 0 else tmp_path / "ro"
    if ro != Path("/proc"):
        ro.mkdir(mode=0o555)
    cfg = write_config(tmp_path, "healthy-8x-h100", free_port())
    cfg.write_text(cfg.read_text().replace(str(tmp_path / "state"), str(ro / "state")))
    proc = start(cfg)
    proc.wait(timeout=20)
    code, err = stop(proc)
    assert code == 1 and "state dir" in err


def test_state_dir_that_is_a_file_and_missing_textfile_dir_are_start_errors(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    cfg = write_config(tmp_path, "healthy-8x-h100", free_port())
    cfg.write_text(cfg.read_text().replace(str(tmp_path / "state"), str(blocker / "state")))
    proc = start(cfg)
    proc.wait(timeout=20)
    code, err = stop(proc)
    assert code == 1 and "state dir" in err and "Not a directory" in err, err
    cfg = write_config(tmp_path, "healthy-8x-h100", free_port(), extra=f'textfile_dir = "{tmp_path / "nope"}"')
    proc = start(cfg)
    proc.wait(timeout=20)
    code, err = stop(proc)
    assert code == 1 and "textfile_dir" in err and "does not exist" in err


def test_bad_config_at_start_exits_2(tmp_path):
    cfg = tmp_path / "bad.toml"
    cfg.write_text("[daemon]\ninterval_s = 0\n")
    proc = start(cfg)
    proc.wait(timeout=20)
    code, err = stop(proc)
    assert code == 2 and "interval_s" in err


def test_textfile_written_each_round(tmp_path):
    tdir = tmp_path / "textfile"
    tdir.mkdir()
    port = free_port()
    proc = start(write_config(tmp_path, "healthy-8x-h100", port, extra=f'textfile_dir = "{tdir}"'))
    try:
        wait_for(f"http://127.0.0.1:{port}/metrics", lambda b: b"nodehealth_rounds_total 1.0" in b)
        prom, end = tdir / "nodehealth-daemon.prom", time.monotonic() + 20
        while not prom.exists() and time.monotonic() < end:  # written at the end of the round
            time.sleep(0.05)
        text = prom.read_text()
        assert "nodehealth_gpu_temperature_celsius" in text
    finally:
        stop(proc)


def test_sd_notify_datagrams_ready_status_watchdog(tmp_path):
    sock_path = str(tmp_path / "notify.sock")
    rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    rx.bind(sock_path)
    rx.settimeout(15)
    port = free_port()
    proc = start(
        write_config(tmp_path, "healthy-8x-h100", port), env={"NOTIFY_SOCKET": sock_path, "WATCHDOG_USEC": "400000"}
    )
    got: list[str] = []
    try:
        end = time.monotonic() + 15
        while time.monotonic() < end and not (
            {"READY=1", "WATCHDOG=1"} <= set(got) and any(g.startswith("STATUS=round") for g in got)
        ):
            got.append(rx.recv(4096).decode())
    finally:
        code, _ = stop(proc)
        try:
            rx.settimeout(2)
            while True:
                got.append(rx.recv(4096).decode())
        except OSError:
            pass
        rx.close()
    assert "READY=1" in got and "WATCHDOG=1" in got and "STOPPING=1" in got, got
    assert any(g.startswith("STATUS=round") for g in got), got


@pytest.mark.timing
def test_drain_class_xid_acts_within_a_second(tmp_path, timing: Timing):
    """A fatal XID line appended to the followed kernel log: stored, counted, verdict FAIL in the
    state file and the Slurm hook asked to drain, well inside 1 s (the in-process daemon)."""
    from nodehealth.config import loader as config
    from nodehealth.daemon.core import Daemon
    from nodehealth.daemon.logs import Log
    from nodehealth.metrics import SlurmView

    port = free_port()
    cfgp = write_config(tmp_path, "healthy-8x-h100", port, interval_s=30)
    cfg = config.load(str(cfgp))
    cfg = dataclasses.replace(cfg, daemon=dataclasses.replace(cfg.daemon, slurm_actions=True))
    drained: list[tuple[float, str]] = []

    class Hook:
        def after_round(self, cfg, report, node, boot_id):
            return SlurmView(drained=False, drained_by_nodehealth=False, breaker_open=False)

        def on_fault(self, cfg, report, node, boot_id):
            bad = [r for r in report.results if r.status.name == "FAIL"]
            drained.append((time.monotonic(), bad[0].name if bad else ""))
            return SlurmView(drained=True, drained_by_nodehealth=True, breaker_open=False, last_action="drained")

    import io

    d = Daemon(cfg, str(cfgp), log=Log(stream=io.StringIO()), slurm=Hook(), notify=lambda s: True)
    d.start()
    try:
        d.round()
        assert d.report is not None and d.report.status.name == "OK"
        end = time.monotonic() + 30
        while d.xid.state() != "alive" and time.monotonic() < end:  # the follower has read the backlog
            time.sleep(0.01)
        assert d.xid.state() == "alive"
        line = "NVRM: Xid (PCI:0000:9a:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"
        t0 = time.monotonic()
        with open(tmp_path / "kmsg", "a") as f:
            f.write(line)
        end = t0 + 5
        while not drained and time.monotonic() < end:
            time.sleep(0.01)
        assert drained, f"no drain: {d.log.lines}"
        latency = drained[0][0] - t0
        assert drained[0][1] == "gpu_xid"
        # 1 s on a quiet machine, and never near the next round (interval_s = 30) that would find it too
        assert latency < min(timing.slack(1.0), 10.0), latency
        got, why = state.read(cfg.paths.state_dir, max_age_s=30)
        assert got is not None and got.status == "FAIL", why
        text = d.metrics.payload().decode()
        assert sample(text, "nodehealth_xid_errors_total", gpu="4", xid="79") == 1
        assert sample(text, "nodehealth_slurm_node_drained_by_nodehealth") == 1
    finally:
        d.shutdown()
