"""The scrape and the daemon's footprint, this tree against the previous release, side by side.

    .venv/bin/python bench/scrape_bench.py [--baseline /tmp/v020] [--no-anchors] [--rounds 15]
        [--window 4] [--rate 50] [--steady 180] [--out bench-scrape.txt]

``--baseline`` is a checkout of the previous release (``git worktree add /tmp/v020 v0.2.0``; its
simulator's fake libnvidia-ml is this tree's build: ``ln -s $PWD/sim/nodehealth_sim/fakenvml/build
/tmp/v020/sim/nodehealth_sim/fakenvml/build``). Both daemons run at once, each from its own tree
with the interpreter of this venv, on examples' healthy-8x-h100 scenario (8 simulated GPUs), 30 s
rounds, no Slurm hook.
1. Series and bytes of one scrape (plain) and its gzip size.
2. Steady state for --steady seconds: a scrape every 15 s each on a connection held between
   scrapes (as Prometheus does; its latency and how many connections it took), RSS every 5 s, CPU
   (the daemon and its reaped probe children) over the stretch.
3. /metrics at --rate requests/s, ``Accept-Encoding: gzip`` (as Prometheus asks), in --rounds
   windows of --window seconds interleaved A, B, B, A, ..., for each server one window with a new
   connection per request and one with every request on one connection (keep-alive: Prometheus
   keeps its connection between scrapes): p50 and p99 per window, and the server's CPU time per
   scrape (which a busy machine's scheduling does not inflate the way it does the latency); the
   report gives the medians of the windows and each p99 over the C server's (below).
4. Anchors, in the same interleaved windows (unless --no-anchors): each a process of its own
   serving this tree's page as the daemon last rendered it: ``nodehealth.daemon.http`` alone (the
   endpoint without the daemon's other threads), a minimal ``http.server`` with the page as constant
   bytes (gzip once), and prometheus_client's own exposition server (``start_http_server``, the
   page's families rendered on each scrape). On a busy machine the absolute p99 is the scheduler's.
   The last anchor is the floor: a
   single-threaded C server (``bench/anchor_server.c``, built with the machine's ``cc``) writing the
   same page as a prebuilt response: what remains of its p99 is the loopback's, the scheduler's and
   this client's, which no server can go below.
The report is printed and written to --out.
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

from _common import KeepAlive, raw_get

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from test_daemon_util import free_port, wait_for, write_config  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def proc_stats(pid: int) -> tuple[float, int]:
    """(CPU seconds user+system with reaped children, RSS bytes)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = sum(int(x) for x in fields[11:15]) / TICK
    with open(f"/proc/{pid}/statm") as f:
        rss = int(f.read().split()[1]) * PAGE
    return cpu, rss


def scrape(port: int, gzip_ok: bool) -> tuple[float, bytes]:
    """One GET on a new connection with a raw-socket client (the figure is the server's)."""
    code, took, body = raw_get("127.0.0.1", port, gzip_ok)
    assert code == 200, code
    return took, body


def window(port: int, rate: float, seconds: float, keep: bool = False) -> list[float]:
    """Scrapes at ``rate`` for ``seconds``, each on a new connection or (``keep``) all on one."""
    lat: list[float] = []
    client = KeepAlive("127.0.0.1", port, True) if keep else None
    period, next_at = 1.0 / rate, time.monotonic()
    end = next_at + seconds
    try:
        while time.monotonic() < end:
            if client is None:
                lat.append(scrape(port, True)[0])
            else:
                code, took, _ = client.get()
                assert code == 200, code
                lat.append(took)
            next_at += period
            time.sleep(max(0.0, next_at - time.monotonic()))
    finally:
        if client is not None:
            client.close()
    return sorted(lat)


def q(lat: list[float], p: float) -> float:
    return lat[min(len(lat) - 1, int(p * len(lat)))] * 1000


def series(text: bytes) -> int:
    return sum(1 for line in text.decode().splitlines() if line and not line.startswith("#"))


def serve(kind: str, port: int, page: Path) -> None:
    """An anchor (see 4. above): serve ``page`` on 127.0.0.1:``port`` until killed."""
    body = page.read_bytes()
    zipped = gzip.compress(body, compresslevel=6, mtime=0)
    ctype = "text/plain; version=0.0.4; charset=utf-8"
    if kind == "endpoint":
        from nodehealth.daemon.http import MetricsServer

        server = MetricsServer(f"127.0.0.1:{port}", lambda: body, None, lambda: zipped)
        server.start()
        server.thread.join()
    elif kind == "http.server":
        from http.server import BaseHTTPRequestHandler, HTTPServer

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # its head and body are two writes: no delayed-ACK stall

            def do_GET(self) -> None:
                z = "gzip" in self.headers.get("Accept-Encoding", "")
                out = zipped if z else body
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(out)))
                if z:
                    self.send_header("Content-Encoding", "gzip")
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: object) -> None:
                pass

        HTTPServer(("127.0.0.1", port), Handler).serve_forever()
    else:
        from prometheus_client import CollectorRegistry, start_http_server
        from prometheus_client.parser import text_string_to_metric_families

        families = list(text_string_to_metric_families(body.decode()))

        class Page:
            def collect(self) -> list[object]:
                return families

        registry = CollectorRegistry(auto_describe=False)
        registry.register(Page())  # type: ignore[arg-type]
        start_http_server(port, "127.0.0.1", registry=registry)
        while True:
            time.sleep(3600)


ANCHORS = ("endpoint", "http.server", "prometheus_client", "C server")


def c_server(page: Path) -> Optional[list[str]]:
    """The floor anchor (bench/anchor_server.c) built beside ``page``, with the page's two prebuilt
    responses: its command line less the port, or None with no C compiler here."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    exe = page.parent / "anchor_server"
    subprocess.run([cc, "-O2", "-o", str(exe), str(ROOT / "bench" / "anchor_server.c")], check=True)
    body = page.read_bytes()
    ctype = b"Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
    for name, payload, extra in (
        ("plain.http", body, b""),
        ("gzip.http", gzip.compress(body, compresslevel=6, mtime=0), b"Content-Encoding: gzip\r\n"),
    ):
        head = b"HTTP/1.1 200 OK\r\n" + ctype + extra + b"Content-Length: %d\r\n\r\n" % len(payload)
        (page.parent / name).write_bytes(head + payload)
    return [str(exe), "PORT", str(page.parent / "plain.http"), str(page.parent / "gzip.http")]


def start_anchor(kind: str, page: Path) -> Optional[tuple[subprocess.Popen[bytes], int]]:
    port = free_port()
    if kind == "C server":
        argv = c_server(page)
        if argv is None:
            return None
        cmd = [str(port) if a == "PORT" else a for a in argv]
    else:
        cmd = [sys.executable, __file__, "--serve", kind, "--port", str(port), "--page", str(page)]
    proc = subprocess.Popen(cmd, cwd=str(ROOT), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, port


def start(tree: Path, tmp: Path, kmsg: str = "") -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    cfg = write_config(tmp, "healthy-8x-h100", port, interval_s=30, kmsg_path=kmsg or None)
    env = dict(os.environ, PYTHONPATH=f"{tree}:{tree / 'sim'}")
    env.pop("NOTIFY_SOCKET", None)
    cmd = [sys.executable, "-m", "nodehealth", "daemon", "--config", str(cfg)]
    proc = subprocess.Popen(cmd, cwd=str(tree), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, port


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline", help="a checkout of the previous release (v0.2.0)")
    ap.add_argument("--baseline-label", default="v0.2.0", help="its name in the report (e.g. a commit)")
    ap.add_argument("--no-anchors", action="store_true", help="no anchor servers in the latency windows")
    ap.add_argument("--serve", choices=ANCHORS, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--page", help=argparse.SUPPRESS)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--window", type=float, default=4.0)
    ap.add_argument("--rate", type=float, default=50.0)
    ap.add_argument("--steady", type=float, default=180.0)
    ap.add_argument("--out", default="bench-scrape.txt")
    ap.add_argument(
        "--kmsg",
        default="",
        help="the kernel log the daemons follow (/dev/kmsg, read only, as in production); default an empty file",
    )
    args = ap.parse_args()
    if args.serve:
        serve(args.serve, args.port, Path(args.page))
        return 0
    trees = {"this tree": ROOT}
    if args.baseline:
        trees[args.baseline_label] = Path(args.baseline).resolve()
    tmp = Path(tempfile.mkdtemp(prefix="nodehealth-scrape-"))
    procs: dict[str, tuple[subprocess.Popen[bytes], int]] = {}
    anchors: dict[str, tuple[subprocess.Popen[bytes], int]] = {}
    lines: list[str] = []

    def say(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    try:
        for name, tree in trees.items():
            d = tmp / name.replace(" ", "-")
            d.mkdir()
            procs[name] = start(tree, d, args.kmsg)
        for _, port in procs.values():
            wait_for(f"http://127.0.0.1:{port}/metrics", lambda b: b"\nnodehealth_rounds_total 1.0" in b, timeout=120)
        say(
            f"8 simulated GPUs (healthy-8x-h100), 30 s rounds, following {args.kmsg or 'an empty file'}; "
            f"{sys.version.split()[0]}; {os.cpu_count()} CPUs"
        )
        names = list(procs)
        two = len(names) == 2

        def row(label: str, values: dict[str, float], fmt: str) -> None:
            cells = " | ".join(format(values[n], fmt) for n in names)
            b = values[names[-1]] if two else 0
            say(f"| {label} | {cells} |" + (f" {values[names[0]] / b:.2f}x |" if two and b else (" |" if two else "")))

        say("| figure | " + " | ".join(names) + (" | ratio |" if two else " |"))
        say("|---" * (len(names) + 1 + two) + "|")
        size = {}
        for name, (_, port) in procs.items():
            _, plain = scrape(port, False)
            _, zipped = scrape(port, True)
            size[name] = (series(plain), len(plain), len(zipped))
        row("series per scrape", {n: size[n][0] for n in names}, "d")
        row("bytes per scrape (plain)", {n: size[n][1] for n in names}, "d")
        row("bytes per scrape (gzip)", {n: size[n][2] for n in names}, "d")
        page = tmp / "page.txt"
        page.write_bytes(scrape(procs["this tree"][1], False)[1])
        # Steady state: all at once, a scrape every 15 s each, on a connection held between scrapes
        # as Prometheus holds it (a server that closed it in between costs that scrape a connect).
        cpu0 = {n: proc_stats(p.pid)[0] for n, (p, _) in procs.items()}
        rss: dict[str, list[int]] = {n: [] for n in procs}
        held = {n: KeepAlive("127.0.0.1", port, True) for n, (_, port) in procs.items()}
        paced: dict[str, list[float]] = {n: [] for n in procs}
        t0 = time.monotonic()
        next_scrape = t0
        while time.monotonic() - t0 < args.steady:
            if time.monotonic() >= next_scrape:
                for n, client in held.items():
                    paced[n].append(client.get()[1])
                next_scrape += 15
            for n, (p, _) in procs.items():
                rss[n].append(proc_stats(p.pid)[1])
            time.sleep(5)
        elapsed = time.monotonic() - t0
        for client in held.values():
            client.close()
        row(
            f"scrape every 15 s on a held connection, median (ms) of {len(paced[names[0]])}",
            {n: statistics.median(paced[n]) * 1000 for n in names},
            ".2f",
        )
        row("the same, slowest (ms)", {n: max(paced[n]) * 1000 for n in names}, ".2f")
        row("the same, connections opened", {n: held[n].connects for n in names}, "d")
        row(
            f"daemon RSS, median over {elapsed:.0f} s (MiB)",
            {n: statistics.median(rss[n]) / 2**20 for n in names},
            ".1f",
        )
        cpu = {n: 100 * (proc_stats(p.pid)[0] - cpu0[n]) / elapsed for n, (p, _) in procs.items()}
        row(f"daemon CPU, % of a core over {elapsed:.0f} s", cpu, ".3f")
        servers = dict(procs)
        for kind in () if args.no_anchors else ANCHORS:
            started = start_anchor(kind, page)
            if started is None:
                say(f"(no C compiler: no {kind} anchor)")
                continue
            servers[kind] = anchors[kind] = started
        for _, port in anchors.values():
            wait_for(f"http://127.0.0.1:{port}/metrics", timeout=30)
        # Latency windows, interleaved A B C ... C B A ..., each server a window on new connections
        # and one on a connection held (keep-alive, as Prometheus scrapes).
        modes = ("new connection", "keep-alive")
        p50: dict[tuple[str, str], list[float]] = {}
        p99: dict[tuple[str, str], list[float]] = {}
        pooled: dict[tuple[str, str], list[float]] = {}
        cpu_per: dict[tuple[str, str], list[float]] = {}  # server CPU ms per scrape, per window
        order = list(servers)
        for r in range(args.rounds):
            for n in order if r % 2 == 0 else order[::-1]:
                for mode in modes if r % 2 == 0 else modes[::-1]:
                    before = proc_stats(servers[n][0].pid)[0]
                    lat = window(servers[n][1], args.rate, args.window, keep=mode == "keep-alive")
                    key = (n, mode)
                    cpu_per.setdefault(key, []).append((proc_stats(servers[n][0].pid)[0] - before) * 1000 / len(lat))
                    p50.setdefault(key, []).append(q(lat, 0.5))
                    p99.setdefault(key, []).append(q(lat, 0.99))
                    pooled.setdefault(key, []).extend(lat)
        anchor = "C server" if "C server" in servers else None
        for mode in modes:
            what = f"{args.rounds} windows of {args.window:g} s at {args.rate:g}/s, gzip, {mode}"
            say("")
            say(
                f"| /metrics, {what} | p50 (ms) | p99 (ms) | p99 pooled (ms) | CPU per scrape (ms) |"
                + (" p99 - C server (ms) |" if anchor else "")
            )
            say("|---|---|---|---|---|" + ("---|" if anchor else ""))
            m99 = {n: statistics.median(p99[(n, mode)]) for n in servers}
            for n in servers:
                key = (n, mode)
                over = f" {m99[n] - m99[anchor]:+.2f} |" if anchor else ""
                say(
                    f"| {n} | {statistics.median(p50[key]):.2f} | {m99[n]:.2f} | {q(sorted(pooled[key]), 0.99):.2f} | "
                    f"{statistics.median(cpu_per[key]):.3f} |{over}"
                )
            shown = [n for n in servers if n in procs or n == anchor]
            say("p99 per window: " + "; ".join(f"{n} " + " ".join(f"{x:.2f}" for x in p99[(n, mode)]) for n in shown))
    finally:
        for p, _ in list(procs.values()) + list(anchors.values()):
            p.terminate()
        for p, _ in list(procs.values()) + list(anchors.values()):
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
    Path(args.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
