"""Benchmark: /metrics under a slowloris, and the XID follower's latency meanwhile.

    .venv/bin/python bench/metrics_abuse.py [--runs 20] [--attackers 300] [--rev REV | --tree DIR] [--out FILE]

Starts ``nodehealth daemon`` on a free loopback port with 8 simulated GPUs and the XID follower
on a kmsg-format file, rounds every 600 s (so no round runs while it measures), within the
unit's limits: as root, in cgroup v1 ``pids`` and ``cpu`` groups with ``TasksMax=64`` and
``CPUQuota=20%``; where root cannot make those, as user nobody under RLIMIT_NPROC 64 (threads
count; root is exempt from that limit). Then, first quiet and then while ``--attackers``
connections each hold the start of a request and never its end (each one cut is reopened at
once, as a slowloris does):

- XID follower: one real-format ``Xid 79`` record appended to the file, then the state file
  polled every 1 ms until it is rewritten with ``gpu_xid`` FAIL (the drain-class path: event
  stored, judged, published); ``--runs`` records, 0.3 s apart;
- a scraper: ``GET /metrics`` every 0.2 s on a new connection (5 s timeout): latency, failures;
- the daemon: its most tasks (``/proc/PID/task``), its CPU, whether it lived, the XID events
  it logged it could not handle;
- the attack: connections the server cut, and how long each was held before the cut.

With ``--rev REV`` (or ``--tree DIR``) the same runs first against the tree at REV (``git
archive`` into a temp dir) or in DIR, so the two are side by side. Prints the medians;
``--out FILE`` writes every figure as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from test_daemon_util import (  # noqa: E402
    NOBODY,
    as_nobody_with_tasks,
    free_port,
    unprivileged_python,
    wait_for,
    write_config,
)

TASKS = 64  # packaging/systemd/nodehealth.service: TasksMax=64, CPUQuota=20%
CPU_QUOTA = 20
TICK = os.sysconf("SC_CLK_TCK")
LINE = "NVRM: Xid (PCI:0000:9a:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
STATE = "daemon-state.json"


class Slowloris:
    """Holds ``n`` connections, each with a partial request; reopens each one the server cuts."""

    def __init__(self, port: int, n: int) -> None:
        self.port, self.n = port, n
        self.sel = selectors.DefaultSelector()
        self.stop_event = threading.Event()
        self.held_s: list[float] = []  # how long each cut connection was held
        self.refused = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _open(self) -> None:
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect(("127.0.0.1", self.port))
        except BlockingIOError:
            pass
        except OSError:
            s.close()
            self.refused += 1
            return
        self.sel.register(s, selectors.EVENT_WRITE, [time.monotonic(), False])

    def _run(self) -> None:
        for _ in range(self.n):
            self._open()
        while not self.stop_event.is_set():
            for key, _ in self.sel.select(0.05):
                s: Any = key.fileobj
                opened, sent = key.data
                if not sent:  # connected (or failed): send the start of a request, never its end
                    try:
                        s.send(b"GET /metrics HTTP/1.1\r\nHost: gpu001\r\nUser-Agent: slow\r\n")
                        self.sel.modify(s, selectors.EVENT_READ, [opened, True])
                        continue
                    except OSError:
                        self.refused += 1
                        self.sel.unregister(s)
                        s.close()
                        self._open()
                        continue
                try:
                    data = s.recv(4096)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:
                    self.held_s.append(time.monotonic() - opened)
                    self.sel.unregister(s)
                    s.close()
                    self._open()
            missing = self.n - len(self.sel.get_map())
            for _ in range(max(0, missing)):
                self._open()
                time.sleep(0.01)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(5)
        for key in list(self.sel.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]


def scraper(port: int, stop_event: threading.Event, out: dict[str, list[float]]) -> None:
    while not stop_event.is_set():
        t0 = time.perf_counter()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
                c.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAccept-Encoding: gzip\r\n\r\n")
                raw = bytearray()
                while True:
                    data = c.recv(65536)
                    if not data:
                        break
                    raw += data
            if not raw.startswith(b"HTTP/1.1 200 "):
                raise OSError(raw[:40])
            out["ok"].append(time.perf_counter() - t0)
        except OSError:
            out["failed"].append(time.perf_counter() - t0)
        stop_event.wait(0.2)


def xid_latencies(kmsg: Path, state: Path, runs: int, seq: int, proc: subprocess.Popen[bytes]) -> list[Optional[float]]:
    out: list[Optional[float]] = []
    for _ in range(runs):
        seq += 1
        before = _stamp(state)
        t0 = time.perf_counter()
        with open(kmsg, "a") as fh:
            fh.write(f"4,{seq},{int(time.monotonic() * 1e6)},-;{LINE}\n")
        got: Optional[float] = None
        while time.perf_counter() - t0 < 5 and proc.poll() is None:
            if _stamp(state) != before and _gpu_xid(state) == "FAIL":
                got = time.perf_counter() - t0
                break
            time.sleep(0.001)
        out.append(got)
        time.sleep(0.3)
    return out


def _stamp(path: Path) -> tuple[int, int]:
    try:
        st = path.stat()
    except OSError:
        return (0, 0)
    return st.st_ino, st.st_mtime_ns


def _gpu_xid(path: Path) -> str:
    try:
        report = json.loads(path.read_text())["report"]
    except (OSError, ValueError, KeyError):
        return ""
    return next((c["status"] for c in report.get("checks", ()) if c.get("name") == "gpu_xid"), "")


def tasks(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return 0


def cpu_s(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(x) for x in fields[11:15]) / TICK


class Cgroups:
    """The unit's ``TasksMax=64`` and ``CPUQuota=20%`` as cgroup v1 ``pids`` and ``cpu`` groups,
    where this machine lets root make them; ``enter`` is a ``preexec_fn``."""

    def __init__(self) -> None:
        self.dirs: list[Path] = []
        name = f"nodehealth-bench-{os.getpid()}"
        try:
            pids, cpu = Path("/sys/fs/cgroup/pids") / name, Path("/sys/fs/cgroup/cpu") / name
            pids.mkdir()
            self.dirs.append(pids)
            (pids / "pids.max").write_text(f"{TASKS}\n")
            cpu.mkdir()
            self.dirs.append(cpu)
            (cpu / "cpu.cfs_period_us").write_text("100000\n")
            (cpu / "cpu.cfs_quota_us").write_text(f"{CPU_QUOTA * 1000}\n")
        except OSError:
            self.remove()

    def enter(self) -> None:
        for d in self.dirs:
            (d / "cgroup.procs").write_text(f"{os.getpid()}\n")

    def remove(self) -> None:
        for d in reversed(self.dirs):
            try:
                d.rmdir()
            except OSError:
                pass
        self.dirs = []


def measure(tree: Path, runs: int, attackers: int) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="nh-abuse."))
    os.chmod(tmp, 0o755)
    port = free_port()
    cfg = write_config(tmp, "healthy-8x-h100", port, interval_s=600)
    cfg.write_text(cfg.read_text().replace(str(ROOT / "examples"), str(tree / "examples")))
    env = {k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"}
    python, preexec, limits = sys.executable, None, "none (not root)"
    env["PYTHONPATH"] = str(tree)
    groups = Cgroups() if os.geteuid() == 0 else None
    if groups is not None and groups.dirs:
        preexec, limits = groups.enter, f"cgroup pids.max {TASKS}, cpu quota {CPU_QUOTA}% (the unit's)"
    elif os.geteuid() == 0:
        found = unprivileged_python(tree)
        if found is not None:
            python, env = found
            preexec, limits = as_nobody_with_tasks(TASKS), f"user nobody, RLIMIT_NPROC {TASKS}"
            for p in (tmp, tmp / "kmsg"):
                os.chown(p, NOBODY, NOBODY)
    err = open(tmp / "daemon.err", "wb")
    proc = subprocess.Popen(
        [python, "-m", "nodehealth", "daemon", "--config", str(cfg)],
        cwd=str(tree),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=err,
        preexec_fn=preexec,
    )
    result: dict[str, Any] = {"tree": str(tree), "limits": limits, "attackers": attackers}
    try:
        wait_for(f"http://127.0.0.1:{port}/metrics", lambda b: b"nodehealth_rounds_total 1.0" in b, timeout=30)
        time.sleep(1.0)
        state = tmp / "state" / STATE
        result["tasks_quiet"] = tasks(proc.pid)
        result["xid_quiet_s"] = xid_latencies(tmp / "kmsg", state, runs, 1000, proc)
        attack = Slowloris(port, attackers)
        scrapes: dict[str, list[float]] = {"ok": [], "failed": []}
        stop_scraper = threading.Event()
        attack.start()
        time.sleep(2.0)  # the flood is up
        sampler_stop = threading.Event()
        most = [tasks(proc.pid)]

        def sample_tasks() -> None:
            while not sampler_stop.wait(0.05):
                most[0] = max(most[0], tasks(proc.pid))

        sampler = threading.Thread(target=sample_tasks, daemon=True)
        sampler.start()
        scrape_thread = threading.Thread(target=scraper, args=(port, stop_scraper, scrapes), daemon=True)
        scrape_thread.start()
        cpu0, t0 = cpu_s(proc.pid), time.monotonic()
        result["xid_attacked_s"] = xid_latencies(tmp / "kmsg", state, runs, 2000, proc)
        time.sleep(6.0)  # past the read timeout, so cuts by timeout are counted too
        result["cpu_attacked"] = (cpu_s(proc.pid) - cpu0) / (time.monotonic() - t0)
        stop_scraper.set()
        scrape_thread.join(10)
        sampler_stop.set()
        sampler.join(5)
        attack.stop()
        result.update(
            tasks_attacked_max=most[0],
            scrapes_ok_s=scrapes["ok"],
            scrapes_failed=len(scrapes["failed"]),
            cut=len(attack.held_s),
            held_s=attack.held_s,
            refused=attack.refused,
            alive=proc.poll() is None,
        )
    finally:
        if proc.poll() is None:
            proc.terminate()
        try:
            code: Optional[int] = proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait(5)
        err.close()
        result["exit_code"] = code
        log = (tmp / "daemon.err").read_text(errors="replace")
        result["stderr_tail"] = log[-2000:]
        failed = [line for line in log.splitlines() if "XID event handling failed" in line]
        result["xid_handling_failed"] = len(failed)
        result["xid_handling_failed_first"] = failed[0] if failed else ""
        shutil.rmtree(tmp, ignore_errors=True)
        if groups is not None:
            groups.remove()
    return result


def _med_ms(values: list[Optional[float]]) -> str:
    got = [v for v in values if v is not None]
    if not got:
        return "none"
    return f"{statistics.median(got) * 1000:.0f} ms"


def summary(r: dict[str, Any]) -> list[str]:
    missed = sum(v is None for v in r.get("xid_attacked_s", [None]))
    return [
        f"tree {r['tree']}, limits: {r['limits']}, {r['attackers']} slowloris connections",
        f"  XID line -> state file, quiet: median {_med_ms(r.get('xid_quiet_s', []))}; attacked: median "
        f"{_med_ms(r.get('xid_attacked_s', []))} ({missed} of {len(r.get('xid_attacked_s', []))} never published)",
        f"  XID events the daemon could not handle: {r.get('xid_handling_failed')} "
        f"{r.get('xid_handling_failed_first', '')[:120]}",
        f"  daemon tasks: {r.get('tasks_quiet')} quiet, at most {r.get('tasks_attacked_max')} attacked; alive "
        f"after the attack: {r.get('alive')}; exit code {r.get('exit_code')}; CPU while attacked "
        f"{100 * r.get('cpu_attacked', 0):.0f} % of a core",
        f"  scraper during the attack: {len(r.get('scrapes_ok_s', []))} answered (median "
        f"{_med_ms(r.get('scrapes_ok_s', []))}), {r.get('scrapes_failed')} failed",
        f"  slowloris connections cut by the server: {r.get('cut')} (held median "
        f"{_med_ms(r.get('held_s', []))}, max {max(r.get('held_s') or [0]):.1f} s); connects refused "
        f"{r.get('refused')}",
    ]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--attackers", type=int, default=300)
    ap.add_argument("--rev", help="also measure the tree at this git revision, first")
    ap.add_argument("--tree", help="also measure the source tree in this directory, first")
    ap.add_argument("--out", help="write every figure here as JSON")
    args = ap.parse_args()
    results = []
    if args.tree:
        results.append(dict(measure(Path(args.tree).resolve(), args.runs, args.attackers), rev=args.tree))
    if args.rev:
        old = Path(tempfile.mkdtemp(prefix="nh-rev."))
        os.chmod(old, 0o755)
        try:
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.rev], check=True, capture_output=True)
            subprocess.run(["tar", "-x", "-C", str(old)], input=archive.stdout, check=True)
            results.append(dict(measure(old, args.runs, args.attackers), rev=args.rev))
        finally:
            shutil.rmtree(old, ignore_errors=True)
    results.append(dict(measure(ROOT, args.runs, args.attackers), rev="working tree"))
    for r in results:
        print("\n".join(summary(r)))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
