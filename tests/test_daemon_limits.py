"""The daemon within its unit's limits: a slowloris under a 64-task limit costs it no task and
leaves the XID follower acting; a round that cannot get a thread is skipped, not fatal; job ids
leave the endpoint when asked."""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

import pytest
from test_daemon_util import (
    NOBODY,
    ROOT,
    SCENARIOS,
    as_nobody_with_tasks,
    free_port,
    get,
    sample,
    stop,
    unprivileged_python,
    wait_for,
    write_config,
)

from nodehealth.config import loader
from nodehealth.daemon import core
from nodehealth.daemon.core import Daemon
from nodehealth.daemon.logs import Log
from nodehealth.statedir import layout

TASKS = 64  # packaging/systemd/nodehealth.service: TasksMax=64
ATTACKERS = 300
XID_PROBE_THREADS = 2  # a drain-class XID is judged by gpu_xid: its two probes (xid, nvml) run in threads, briefly
PATIENCE_S = 20.0
XID_79 = "NVRM: Xid (PCI:0000:9a:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."


def _tasks(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def _gpu_xid(state_dir: Path) -> str:
    try:
        report = json.loads((state_dir / layout.DAEMON_STATE).read_text())["report"]
    except (OSError, ValueError, KeyError):
        return ""
    return next((c["status"] for c in report.get("checks", ()) if c.get("name") == "gpu_xid"), "")


def _slowloris(port: int) -> Optional[socket.socket]:
    """A connection that sends the start of a request and never its end (None: not accepted)."""
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=0.5)
    except OSError:
        return None
    try:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: gpu001\r\nUser-Agent: slow\r\n")  # never the blank line
    except OSError:
        pass
    s.setblocking(False)
    return s


def _cut(s: Optional[socket.socket]) -> bool:
    if s is None or s.fileno() < 0:
        return True
    try:
        return s.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


@pytest.mark.skipif(
    os.geteuid() != 0, reason="RLIMIT_NPROC binds an unprivileged user only: needs root to start the daemon as one"
)
def test_a_slowloris_under_the_units_task_limit_costs_no_task_and_the_xid_follower_still_acts():
    tmp = Path(tempfile.mkdtemp(prefix="nh-tasks."))  # pytest's tmp dirs are not searchable by others
    try:
        os.chmod(tmp, 0o755)
        port = free_port()
        cfg = write_config(tmp, "healthy-8x-h100", port, interval_s=600)
        for path in (tmp, tmp / "kmsg"):
            os.chown(path, NOBODY, NOBODY)
        found = unprivileged_python()
        if found is None:
            pytest.skip(
                f"no Python that user nobody can run ({os.path.realpath(sys.executable)} is not "
                "searchable by all, nor is there a system one of the same version)"
            )
        python, env = found
        proc = subprocess.Popen(
            [python, "-m", "nodehealth", "daemon", "--config", str(cfg)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            cwd=str(ROOT),
            env=env,
            preexec_fn=as_nobody_with_tasks(TASKS),
        )
        held: list[Optional[socket.socket]] = []
        try:
            wait_for(f"http://127.0.0.1:{port}/metrics", lambda b: b"nodehealth_rounds_total 1.0" in b)
            time.sleep(0.5)  # the follower has read the (empty) backlog
            limits = Path(f"/proc/{proc.pid}/limits").read_text()
            assert any(
                line.startswith("Max processes") and line.split()[2:4] == [str(TASKS)] * 2
                for line in limits.splitlines()
            ), limits
            assert Path(f"/proc/{proc.pid}/status").read_text().count(f"\t{NOBODY}") >= 8  # Uid:, Gid: lines
            base = _tasks(proc.pid)
            held = [_slowloris(port) for _ in range(ATTACKERS)]
            first = list(held)
            with open(tmp / "kmsg", "a") as f:
                f.write(f"4,1001,{int(time.monotonic() * 1e6)},-;{XID_79}\n")
            most, acted = base, False
            end = time.monotonic() + PATIENCE_S
            while time.monotonic() < end and not (acted and all(_cut(s) for s in first)):
                assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
                most = max(most, _tasks(proc.pid))
                acted = acted or _gpu_xid(tmp / "state") == "FAIL"
                for i, s in enumerate(held):  # the attacker opens a new one for each cut
                    if _cut(s):
                        if s is not None:
                            s.close()
                        held[i] = _slowloris(port)
                time.sleep(0.05)
            assert acted, "the fatal XID was not judged and published while /metrics was attacked"
            assert all(_cut(s) for s in first), "slowloris connections were never cut"
            # No task for any connection; judging the XID briefly takes its probes' threads.
            assert most <= base + XID_PROBE_THREADS, (
                f"the daemon went from {base} to {most} tasks under {ATTACKERS} connections"
            )
            code, body, _ = get(f"http://127.0.0.1:{port}/metrics", timeout=5)  # a scraper is still served
            assert code == 200 and sample(body.decode(), "nodehealth_xid_errors_total", gpu="4", xid="79") == 1
        finally:
            for s in held:
                if s is not None:
                    s.close()
            code, err = stop(proc)
        assert proc.poll() is not None and code == 0, err
        assert "can't start new thread" not in err, err
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _daemon(tmp_path: Path, **daemon: object) -> Daemon:
    cfg = loader.load(str(write_config(tmp_path, "healthy-8x-h100", free_port())))
    cfg = dataclasses.replace(cfg, daemon=dataclasses.replace(cfg.daemon, **daemon))
    return Daemon(cfg, None, log=Log(stream=io.StringIO()), notify=lambda s: True, use_default_hooks=False)


def test_a_round_that_cannot_get_a_thread_is_skipped_not_fatal(tmp_path, monkeypatch):
    d = _daemon(tmp_path)
    real = threading.Thread.start

    def start(self: threading.Thread) -> None:
        if self.name == "round":
            raise RuntimeError("can't start new thread")
        real(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    d.start_round()
    assert not d.round_running() and d.round_started_mono is None
    assert "round not started: can't start new thread" in d.log.stream.getvalue()
    assert sample(d.metrics.payload().decode(), "nodehealth_round_errors_total") == 1


def test_a_round_leaves_its_page_rendered_for_the_scrapes(tmp_path, monkeypatch):
    """The round's thread renders and compresses the page (NodeMetrics.render_ahead): the scrape
    after a round writes bytes, it does not build families or gzip the page."""
    d = _daemon(tmp_path)
    assert d.round() is not None
    built: list[int] = []
    families = d.metrics.families
    monkeypatch.setattr(d.metrics, "families", lambda: (built.append(1), families())[1])
    zipped = d.metrics.payload_gzip()
    assert not built and b"nodehealth_rounds_total 1.0" in gzip.decompress(zipped)
    assert gzip.decompress(zipped) == d.metrics.payload()
    d.metrics.count_xid("0", 79, "reboot")  # an update between rounds: rendered at the next scrape
    assert b"nodehealth_xid_errors_total{" in d.metrics.payload() and built == [1]


@pytest.mark.parametrize("publish", [True, False])
def test_job_ids_leave_the_endpoint_when_switched_off(tmp_path, monkeypatch, publish):
    monkeypatch.setattr(core, "ledger_jobs", lambda state_dir, gpus, now: {0: "4242", 3: "4343"})
    d = _daemon(tmp_path, metrics_job_ids=publish)
    assert d.round() is not None
    text = d.metrics.payload().decode()
    assert ('job_id="4242"' in text) is publish and ('job_id="4343"' in text) is publish
    assert sample(text, "nodehealth_gpu_temperature_celsius", gpu="0") is not None  # the rest is there


def test_metrics_detail_is_the_daemons_setting_and_follows_a_reload(tmp_path):
    """[daemon] metrics_detail: the default page has no per-link NVLink series of a healthy node;
    the setting publishes every link, at start and after a reload (SIGHUP) that sets it."""
    path = write_config(tmp_path, "healthy-8x-h100", free_port())
    d = Daemon(
        loader.load(str(path)), str(path), log=Log(stream=io.StringIO()), notify=lambda s: True, use_default_hooks=False
    )
    assert d.round() is not None
    text = d.metrics.payload().decode()
    assert sample(text, "nodehealth_gpu_nvlink_up") is None and sample(text, "nodehealth_gpu_nvlink_errors_total") == 0
    path.write_text(path.read_text().replace("[daemon]\n", "[daemon]\nmetrics_detail = true\n"))
    assert d.reload() is True
    assert sample(d.metrics.payload().decode(), "nodehealth_gpu_nvlink_up", gpu="0", link="17") == 1
    started = _daemon(tmp_path, metrics_detail=True)
    assert started.round() is not None
    assert sample(started.metrics.payload().decode(), "nodehealth_gpu_nvlink_up", gpu="7", link="0") == 1


def test_a_reload_keeps_the_daemons_simulate(tmp_path):
    """`nodehealth daemon --simulate FILE`: a SIGHUP re-reads the file, which names no scenario; the
    daemon keeps running on the command line's scenario (a reload once dropped it: the real NVML, or none)."""
    path = write_config(tmp_path, "healthy-8x-h100", free_port())
    path.write_text("\n".join(ln for ln in path.read_text().splitlines() if not ln.startswith("simulate =")) + "\n")
    scenario = str(SCENARIOS / "row-remap-pending.toml")
    from nodehealth.config.use import simulated

    d = Daemon(
        simulated(loader.load(str(path)), scenario),
        str(path),
        log=Log(stream=io.StringIO()),
        notify=lambda s: True,
        use_default_hooks=False,
        simulate=scenario,
    )
    assert loader.load(str(path)).nvml.simulate in (None, "")
    path.write_text(path.read_text().replace("[daemon]\n", "[daemon]\nmetrics_detail = true\n"))
    assert d.reload() is True and d.cfg.daemon.metrics_detail is True
    assert d.cfg.nvml.simulate == scenario
    report = d.round()
    assert report is not None and "gpu_remapped_rows" in {r.name for r in report.results if r.status.name == "FAIL"}


def test_an_sxid_from_the_follower_is_not_counted_as_a_gpus_xid(tmp_path):
    """The follower hands an NVSwitch's SXid in as it does an XID: it must not become
    nodehealth_xid_errors_total{xid="20034"} (that would fire NodehealthDrainClassXid under a GPU's
    name); the log line names the NVSwitch and the re-judge is gpu_sxid's."""
    from nodehealth.xid.catalog import enrich, load_catalog
    from nodehealth.xid.parse import parse_line

    path = write_config(tmp_path, "healthy-8x-h100", free_port())
    stream = io.StringIO()
    d = Daemon(
        loader.load(str(path)), str(path), log=Log(stream=stream), notify=lambda s: True, use_default_hooks=False
    )
    assert d.round() is not None
    line = "[6781753.400584] nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up"
    event = parse_line(line)
    assert event is not None and event.kind == "sxid"
    d.on_xid(enrich(event, load_catalog()))
    text = d.metrics.payload().decode()
    assert sample(text, "nodehealth_xid_errors_total", xid="20034") is None, text
    assert "SXid 20034 on NVSwitch" in stream.getvalue()
