"""The /metrics endpoint in process: what it serves, and what a hostile client cannot hold
(slowloris, idle and never-reading clients, oversized heads, floods of connections)."""

from __future__ import annotations

import gzip
import os
import socket
import threading
import time

import pytest

from nodehealth.daemon.http import Limits, ListenError, MetricsServer, parse_listen

BODY = b"# HELP x x\n# TYPE x gauge\nx 1.0\n"
# Short timeouts so the cuts happen within the test; the client's own patience is far longer.
QUICK = Limits(read_timeout_s=0.3, idle_timeout_s=0.3, write_timeout_s=0.3, linger_s=0.3)
PATIENCE_S = 10.0


@pytest.fixture
def serve():
    servers: list[MetricsServer] = []

    def _start(limits: Limits = QUICK, body: bytes = BODY, health=None, clock=time.monotonic) -> MetricsServer:
        server = MetricsServer(
            "127.0.0.1:0", lambda: body, health, lambda: gzip.compress(body), limits=limits, clock=clock
        )
        server.start()
        servers.append(server)
        return server

    yield _start
    for s in servers:
        s.stop()


def _connect(server: MetricsServer, rcvbuf: int = 0) -> socket.socket:
    sock = socket.socket()
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(PATIENCE_S)
    sock.connect(server.address)
    return sock


def _read_all(sock: socket.socket) -> bytes:
    """Everything until the server closes; a reset counts as a close."""
    out = bytearray()
    while True:
        try:
            data = sock.recv(65536)
        except ConnectionResetError:
            break
        if not data:
            break
        out += data
    return bytes(out)


def _closed_by_server(sock: socket.socket) -> bool:
    """True once the server closes; False if the client's patience runs out first."""
    try:
        _read_all(sock)
    except socket.timeout:
        return False
    return True


def _response(f) -> tuple[int, dict[str, str], bytes]:
    """One response read off a keep-alive connection (``sock.makefile("rb")``), by its Content-Length."""
    status = f.readline()
    assert status, "connection closed"
    headers = {}
    while True:
        line = f.readline().decode().strip()
        if not line:
            break
        name, _, value = line.partition(":")
        headers[name.lower()] = value.strip()
    return int(status.split()[1]), headers, f.read(int(headers["content-length"]))


def _wait(predicate, what: str) -> None:
    end = time.monotonic() + PATIENCE_S
    while not predicate():
        assert time.monotonic() < end, what
        time.sleep(0.01)


# ---------------------------------------------------------------------- what it serves


def test_metrics_healthz_root_404_and_gzip(serve):
    server = serve(health=lambda: (503, "round stuck"))
    with _connect(server) as s, s.makefile("rb") as f:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        code, headers, body = _response(f)
        assert (code, body) == (200, BODY) and headers["content-type"].startswith("text/plain; version=0.0.4")
        s.sendall(b"GET /metrics?x=1 HTTP/1.1\r\nAccept-Encoding: gzip\r\n\r\n")  # the same connection
        code, headers, body = _response(f)
        assert code == 200 and headers["content-encoding"] == "gzip" and gzip.decompress(body) == BODY
        s.sendall(b"GET /healthz HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\n\r\nGET /nope HTTP/1.1\r\n\r\n")  # pipelined
        assert _response(f)[::2] == (503, b"round stuck\n")
        assert _response(f)[0] == 200
        assert _response(f)[0] == 404


def test_head_has_the_length_but_no_body_and_http10_closes(serve):
    server = serve()
    with _connect(server) as s:
        s.sendall(b"HEAD /metrics HTTP/1.0\r\n\r\n")
        raw = _read_all(s)
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and f"Content-Length: {len(BODY)}".encode() in head and body == b""


def test_a_close_the_client_asked_for_is_at_once(serve):
    """``Connection: close`` (or HTTP/1.0) and nothing after the request: the response and the close
    go out together, and the endpoint holds nothing of the connection (no linger, no select)."""
    server = serve()
    for request in (b"GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n", b"GET /metrics HTTP/1.0\r\n\r\n"):
        with _connect(server) as s:
            s.sendall(request)
            assert _read_all(s).endswith(b"\r\n\r\n" + BODY)
            assert not server.conns  # closed before the client saw the end of the response


def test_input_after_a_close_of_the_endpoints_own_is_drained_not_reset(serve):
    """A request the endpoint refuses while its client is still sending (a body it does not take):
    the response is sent, then what follows is read and dropped (up to ``linger_bytes``, within
    ``linger_s``), so the client's sends meet no reset; an immediate close would reset the next one."""
    server = serve(limits=Limits(linger_s=PATIENCE_S, linger_bytes=1 << 20))
    with _connect(server) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nContent-Length: 65536\r\n\r\n")
        assert _read_all(s).startswith(b"HTTP/1.1 400 ")  # the answer and the endpoint's FIN
        for _ in range(32):  # the body the client goes on sending: all of it taken
            s.sendall(b"x" * 2048)
        _wait(lambda: sum(c.drained for c in server.conns.values()) >= 65536, "the rest was not drained")


@pytest.mark.parametrize(
    "request_bytes, code",
    [
        (b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 405),
        (b"GET /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello", 400),
        (b"GET /metrics HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
        (b"GET /metrics\r\n\r\n", 400),
        (b"GET /metrics HTTP/1.1\r\nno colon here\r\n\r\n", 400),
    ],
)
def test_what_it_does_not_take_is_answered_and_closed(serve, request_bytes, code):
    with _connect(serve()) as s:
        s.sendall(request_bytes)
        raw = _read_all(s)  # closed after the answer
    assert raw.startswith(f"HTTP/1.1 {code} ".encode()) and b"Connection: close" in raw


def test_listen_forms_and_errors():
    assert parse_listen("10.0.0.5:10915") == ("10.0.0.5", 10915)
    assert parse_listen("[::1]:9") == ("::1", 9)
    assert parse_listen(":10915") == ("0.0.0.0", 10915)
    for bad in ("10915", "host:", "host:99999"):
        with pytest.raises(ListenError):
            parse_listen(bad)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        with pytest.raises(ListenError, match="cannot listen"):
            MetricsServer(f"127.0.0.1:{busy.getsockname()[1]}", lambda: BODY)


# ---------------------------------------------------------------------- what a client cannot hold


def test_a_slowloris_that_drips_header_bytes_is_cut_at_the_read_timeout(serve):
    server = serve()
    with _connect(server) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        cut = False
        end = time.monotonic() + PATIENCE_S
        while time.monotonic() < end:  # a header byte every 50 ms never completes the head
            try:
                s.sendall(b"X")
            except (BrokenPipeError, ConnectionResetError):
                cut = True
                break
            try:
                s.settimeout(0.05)
                if s.recv(1) == b"":
                    cut = True
                    break
            except socket.timeout:
                pass
            except ConnectionResetError:
                cut = True
                break
        assert cut, "the partial request was never cut"


def test_a_connection_that_sends_nothing_is_cut(serve):
    with _connect(serve()) as s:
        assert _closed_by_server(s)


def test_an_idle_keep_alive_connection_is_cut_after_its_response(serve):
    with _connect(serve()) as s, s.makefile("rb") as f:
        s.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
        assert _response(f)[0] == 200
        assert _closed_by_server(s)


def test_a_client_that_never_reads_its_response_is_dropped(serve):
    big = b"x" * (32 << 20)  # far more than the socket buffers of both ends hold
    server = serve(body=big)
    with _connect(server, rcvbuf=4096) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
        _wait(lambda: server.conns, "the connection was never taken")
        _wait(lambda: not server.conns, "the stalled response was never dropped")
        assert len(_read_all(s)) < len(big)


def test_an_oversized_request_head_is_431_and_closed(serve):
    server = serve()
    with _connect(server) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\n" + b"X-Pad: " + b"a" * 16384 + b"\r\n\r\n")
        raw = _read_all(s)
    assert raw.startswith(b"HTTP/1.1 431 ") and b"Connection: close" in raw
    with _connect(server) as s:  # a head that never ends is cut at the cap too, not buffered
        s.sendall(b"GET /metrics HTTP/1.1\r\n" + b"a" * (QUICK.max_header_bytes + 1))
        assert _read_all(s).startswith(b"HTTP/1.1 431 ")


def test_connections_cost_no_thread_and_are_capped(serve):
    limits = Limits(max_connections=16, read_timeout_s=60, idle_timeout_s=60, accepts_per_s=1e6, accept_burst=10**6)
    server = serve(limits=limits)
    threads = threading.active_count()
    tasks = len(os.listdir("/proc/self/task"))
    held = []
    try:
        for _ in range(300):
            s = _connect(server)
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # and never the end of the head
            held.append(s)
        _wait(
            lambda: sum(_closed_now(s) for s in held) >= 300 - limits.max_connections,
            "connections over the cap were not closed",
        )
        assert len(server.conns) <= limits.max_connections
        # Not one more thread or task than before the flood (fewer is fine: a thread an earlier test
        # stopped may leave the kernel's task list only after its join returned).
        assert threading.active_count() <= threads and len(os.listdir("/proc/self/task")) <= tasks
        # A scraper that sends its request at once is still served while the flood holds the rest.
        with _connect(server) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n")
            assert _read_all(s).startswith(b"HTTP/1.1 200 ")
    finally:
        for s in held:
            s.close()


def _closed_now(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True
    finally:
        sock.settimeout(PATIENCE_S)


class _Clock:
    """A clock that moves only when told: the rates below are counted, not timed."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return self.now

    def seen(self) -> None:
        """Wait until the server has gone once more, whole, through its loop (it reads the clock three
        times a turn, the last for the deadlines), so it has seen the time as it is now."""
        start = self.reads
        _wait(lambda: self.reads >= start + 4, "the server did not look at its clock again")


def test_a_keep_alive_connection_outlives_a_scrape_interval():
    """Prometheus holds its connection between scrapes (every 15 s to 1 min, its default): a minute
    idle, the connection still serves the next scrape; past ``idle_timeout_s`` it is closed."""
    assert Limits().idle_timeout_s > 60
    clock = _Clock()
    server = MetricsServer("127.0.0.1:0", lambda: BODY, None, lambda: gzip.compress(BODY), clock=clock)
    server.start()
    try:
        with _connect(server) as s, s.makefile("rb") as f:
            s.sendall(b"GET /metrics HTTP/1.1\r\nAccept-Encoding: gzip\r\n\r\n")
            assert _response(f)[0] == 200
            clock.now += 60.0  # a minute between scrapes
            clock.seen()  # the server swept its deadlines at that time
            s.sendall(b"GET /metrics HTTP/1.1\r\nAccept-Encoding: gzip\r\n\r\n")
            assert _response(f)[0] == 200  # the same connection
            clock.now += Limits().idle_timeout_s + 1
            assert _closed_by_server(s)
    finally:
        server.stop()


def test_connections_are_taken_no_faster_than_the_accept_rate(serve):
    clock = _Clock()
    limits = Limits(accepts_per_s=4, accept_burst=5, read_timeout_s=60)
    server = serve(limits=limits, clock=clock)
    held = [_connect(server) for _ in range(12)]  # all in the kernel's backlog at once
    try:
        _wait(lambda: server.accepted >= 5, "the burst was not taken")
        time.sleep(0.3)  # the server had every chance to take more
        assert server.accepted == 5  # the rest wait in the backlog while no time passes
        clock.now += 1.0  # one second: four more
        _wait(lambda: server.accepted >= 9, "the next second's connections were not taken")
        time.sleep(0.3)
        assert server.accepted == 9
    finally:
        for s in held:
            s.close()


def test_requests_over_the_rate_get_503_and_a_close(serve):
    clock = _Clock()
    server = serve(limits=Limits(requests_per_s=1, request_burst=3, read_timeout_s=60, idle_timeout_s=60), clock=clock)
    with _connect(server) as s, s.makefile("rb") as f:
        s.sendall(b"GET /metrics HTTP/1.1\r\n\r\n" * 5)  # pipelined, all at once
        assert [_response(f)[0] for _ in range(4)] == [200, 200, 200, 503]
        assert f.read() == b""  # closed after the 503
    clock.now += 1.0
    with _connect(server) as s:  # a second later: one more
        s.sendall(b"GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n")
        assert _read_all(s).startswith(b"HTTP/1.1 200 ")


def test_a_scrape_waits_behind_a_busy_thread_at_most_a_short_switch(serve):
    """The endpoint shortens the interpreter's switch interval (a round's Python in another thread
    makes a scrape wait for the lock up to it, each time the scrape's thread blocks)."""
    import sys

    from nodehealth.daemon.http import SWITCH_INTERVAL_S

    before = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    try:
        serve()
        assert sys.getswitchinterval() <= SWITCH_INTERVAL_S <= 0.001
    finally:
        sys.setswitchinterval(before)


def test_an_idle_endpoint_sleeps_until_a_client_or_the_stop() -> None:
    """No client, accepting: the endpoint's thread waits in one select with no timeout (no tick a
    second); a connection wakes it, and so does stop() (the wake pipe)."""
    server = MetricsServer("127.0.0.1:0", lambda: BODY, None, lambda: gzip.compress(BODY), limits=QUICK)
    waits: list[object] = []
    real = server.selector.select

    def select(timeout: object = None) -> object:
        waits.append(timeout)
        return real(timeout)

    server.selector.select = select  # type: ignore[method-assign]
    server.start()
    try:
        _wait(lambda: len(waits) >= 1, "the endpoint never waited")
        assert waits[0] is None  # idle: no timeout
        with _connect(server) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n")
            assert _read_all(s).startswith(b"HTTP/1.1 200 ")
        _wait(lambda: not server.conns and waits[-1] is None, "the endpoint did not go idle again")
    finally:
        server.stop()
    assert not server.thread.is_alive()  # stop() woke the idle wait
