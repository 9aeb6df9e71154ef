"""The ``/metrics`` endpoint: one thread and a selector serve pre-rendered bytes.

It never calls into a round: ``/metrics`` returns what ``NodeMetrics.payload()`` holds (the
last round rendered once, plus a live tail), so a scrape answers while a probe hangs.

It holds under abuse. The port is unauthenticated and any host that reaches it can open
connections, so what a client can hold is bounded (``Limits``):

- **No task per connection.** One thread serves every connection, so a flood of connections
  costs file descriptors and a few KiB each, never a thread: the unit's ``TasksMax`` cannot be
  exhausted through the port, and the XID follower and the rounds keep their threads.
- **At most ``max_connections`` open.** One more closes the connection that has waited longest
  without sending a whole request (a slowloris's), so a scraper that sends its request at once
  is still served while the flood lasts.
- **Timeouts per connection.** The request head must be complete within ``read_timeout_s`` of
  the connection's start (or of the first byte of a request that follows a response; bytes
  dripped in do not extend it); a keep-alive connection is closed after ``idle_timeout_s``
  without a request; a response the client does not take within ``write_timeout_s`` is dropped.
- **A size cap.** A request head over ``max_header_bytes`` is answered 431 and closed; a
  request with a body (``Content-Length``, ``Transfer-Encoding``) 400, a method other than
  GET and HEAD 405, both closed.
- **A CPU budget.** At most ``accepts_per_s`` connections are taken a second (the rest wait in
  the kernel's backlog) and ``requests_per_s`` requests answered (one more gets a 503 and is
  closed), so a flood costs the daemon's other threads, all under the unit's ``CPUQuota``,
  next to nothing.
"""

from __future__ import annotations

import errno
import os
import selectors
import socket
import sys
import threading
import time
from typing import Callable, Optional

from nodehealth.daemon.http_limits import TICK_S, Bucket, Limits, ListenError, parse_listen
from nodehealth.metrics import CONTENT_TYPE

SWITCH_INTERVAL_S = 0.001  # the interpreter's thread switch interval while the endpoint serves
_TEXT = "text/plain; charset=utf-8"
_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
    505: "HTTP Version Not Supported",
}
_READ, _WRITE, _LINGER = "read", "write", "linger"
# What follows a response (_Conn.close_after): the next request, a close after draining what the
# client may still send (the endpoint's own close), or a close at once (the client asked for it).
_KEEP, _DRAIN, _AT_ONCE = "", "drain", "at once"
# Connections the kernel holds for us beyond those taken: a flood waits there (costing no
# descriptor and no task) instead of pushing out the SYN of a scraper (capped by somaxconn).
_BACKLOG = 1024


class _Conn:
    __slots__ = ("sock", "fd", "buf", "out", "state", "since", "deadline", "idle", "close_after", "drained", "events")

    def __init__(self, sock: socket.socket, now: float, limits: Limits) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.buf = bytearray()
        self.out = memoryview(b"")
        self.state = _READ
        self.since = now  # when it began waiting for the request it has not sent yet
        self.deadline = now + limits.read_timeout_s
        self.idle = False  # between two requests of a keep-alive connection
        self.close_after = _KEEP
        self.drained = 0
        self.events = 0  # what the selector watches for it


class MetricsServer:
    """``/metrics``, ``/healthz`` and ``/`` on ``listen``, served by one thread."""

    def __init__(
        self,
        listen: str,
        payload: Callable[[], bytes],
        health: Optional[Callable[[], tuple[int, str]]] = None,
        payload_gzip: Optional[Callable[[], bytes]] = None,
        limits: Limits = Limits(),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        host, port = parse_listen(listen)
        self.payload, self.payload_gzip = payload, payload_gzip
        self.health = health or (lambda: (200, "ok"))
        self.limits, self.clock = limits, clock
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            self.sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError as exc:
            raise ListenError(f"cannot listen on {listen}: {exc.strerror or exc}") from None
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.sock.bind((host, port))
            self.sock.listen(_BACKLOG)
            self.sock.setblocking(False)
        except (OSError, OverflowError) as exc:
            self.sock.close()
            raise ListenError(f"cannot listen on {listen}: {getattr(exc, 'strerror', None) or exc}") from None
        self.address = self.sock.getsockname()[:2]
        self.conns: dict[int, _Conn] = {}
        self.selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._stopping = False
        self._accept_paused_until = 0.0
        now = clock()
        self.accepts = Bucket(limits.accepts_per_s, limits.accept_burst, now)
        self.requests = Bucket(limits.requests_per_s, limits.request_burst, now)
        self.accepted = 0  # connections taken, over the server's life
        self.thread = threading.Thread(target=self._serve, name="metrics-http", daemon=True)

    # ------------------------------------------------------------------ life cycle

    def start(self) -> None:
        # A scrape that comes while a round runs Python in its thread waits for the interpreter's
        # lock, up to the switch interval each time it blocks (5 ms by default: the scrape's p99);
        # 1 ms keeps it under a millisecond at the cost of a few more switches during a round.
        if sys.getswitchinterval() > SWITCH_INTERVAL_S:
            sys.setswitchinterval(SWITCH_INTERVAL_S)
        self.selector.register(self.sock, selectors.EVENT_READ, None)
        self.selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self.thread.start()

    def stop(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass
        if self.thread.is_alive():
            self.thread.join(timeout=5.0)
        for conn in list(self.conns.values()):
            self._close(conn)
        self.selector.close()
        self.sock.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _serve(self) -> None:
        while not self._stopping:
            try:
                self._once()
            except Exception:  # noqa: BLE001 - the endpoint must outlive any one bad connection
                time.sleep(0.01)

    def _once(self) -> None:
        now = self.clock()
        nearest = min((c.deadline for c in self.conns.values()), default=now + TICK_S)
        if self._accept_paused_until:
            nearest = min(nearest, self._accept_paused_until)
        # Idle (no connection, accepting): nothing is due, so the thread sleeps until a client or
        # stop() (the wake pipe) comes; else it looks again at the nearest deadline, at most TICK_S on.
        idle = not self.conns and not self._accept_paused_until
        events = self.selector.select(None if idle else max(0.0, min(TICK_S, nearest - now)))
        now = self.clock()
        for key, _ in events:
            if key.data is None:
                self._accept(now)
            elif key.data == "wake":
                try:
                    os.read(self._wake_r, 64)
                except OSError:
                    pass
            elif self._open(key.data):  # not one closed earlier in this batch
                conn = key.data
                try:
                    if conn.state == _WRITE:
                        self._flush(conn, now)
                    else:
                        self._read(conn, now)
                    self._drive(conn, now)
                except Exception:  # noqa: BLE001 - that connection ends, the others go on
                    self._close(conn)
        now = self.clock()
        for conn in [c for c in self.conns.values() if c.deadline <= now]:
            self._close(conn)
        if self._accept_paused_until and now >= self._accept_paused_until:
            self._accept_paused_until = 0.0
            self.selector.register(self.sock, selectors.EVENT_READ, None)

    # ------------------------------------------------------------------ connections

    def _pause_accepting(self, until: float) -> None:
        """Leave new connections in the kernel's backlog until ``until``."""
        if not self._accept_paused_until:
            self.selector.unregister(self.sock)
        self._accept_paused_until = until

    def _accept(self, now: float) -> None:
        """Take one connection. The listening socket is polled level-triggered, so a backlog wakes
        the selector again at once and the reads of connections already open interleave with the
        accepts; a scrape (one connection waiting) costs no accept() that fails with EAGAIN."""
        if not self.accepts.ready(now):
            self._pause_accepting(self.accepts.next_at(now))
            return
        try:
            sock, _ = self.sock.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                # Out of descriptors: give one back if we hold any (the pending connection wakes us
                # again), else stop accepting a moment (it would wake us at once, again and again).
                if not self._evict():
                    self._pause_accepting(now + 0.1)
            return  # or the client went away before we took it (ECONNABORTED, ...)
        self.accepts.take(now)
        self.accepted += 1
        sock.setblocking(False)
        if len(self.conns) >= self.limits.max_connections:
            self._evict()
        conn = _Conn(sock, now, self.limits)
        self.conns[conn.fd] = conn
        try:  # a scraper's request is often there already: serve it before anything else
            self._read(conn, now)
            self._drive(conn, now)
        except Exception:  # noqa: BLE001
            self._close(conn)

    def _evict(self) -> bool:
        """Close the connection that has waited longest for a whole request (else the oldest)."""
        if not self.conns:
            return False
        waiting = [c for c in self.conns.values() if c.state == _READ]
        self._close(min(waiting or list(self.conns.values()), key=lambda c: c.since))
        return True

    def _open(self, conn: _Conn) -> bool:
        return self.conns.get(conn.fd) is conn

    def _close(self, conn: _Conn) -> None:
        if self._open(conn):
            del self.conns[conn.fd]
            if conn.events:
                try:
                    self.selector.unregister(conn.sock)
                except (KeyError, ValueError):
                    pass
        conn.sock.close()

    def _watch(self, conn: _Conn) -> None:
        """Have the selector watch what the connection waits for: to send, or to read."""
        if not self._open(conn):
            return
        want = selectors.EVENT_WRITE if conn.state == _WRITE else selectors.EVENT_READ
        if conn.events == want:
            return
        if conn.events:
            self.selector.modify(conn.sock, want, conn)
        else:
            self.selector.register(conn.sock, want, conn)
        conn.events = want

    def _read(self, conn: _Conn, now: float) -> None:
        try:
            data = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(conn)
            return
        if not data:
            self._close(conn)
            return
        if conn.state == _LINGER:
            conn.drained += len(data)
            if conn.drained > self.limits.linger_bytes:
                self._close(conn)
            return
        if conn.idle:  # the first byte of the next request: its head has read_timeout_s from now
            conn.idle = False
            conn.deadline = now + self.limits.read_timeout_s
        conn.buf += data

    def _drive(self, conn: _Conn, now: float) -> None:
        """Answer each whole request buffered while its response goes out at once; then watch."""
        while self._open(conn) and conn.state == _READ and self._next(conn, now):
            self._flush(conn, now)
            if self._open(conn) and conn.state == _READ and conn.buf:  # pipelined: already begun
                conn.idle = False
                conn.deadline = now + self.limits.read_timeout_s
        self._watch(conn)

    def _next(self, conn: _Conn, now: float) -> bool:
        """Take one request head from the buffer and set up its response; False if none is whole."""
        end = conn.buf.find(b"\r\n\r\n")
        if end < 0 and len(conn.buf) <= self.limits.max_header_bytes:
            return False
        if end < 0 or end + 4 > self.limits.max_header_bytes:
            self._respond(conn, now, 431, b"request head too large\n", _TEXT, close=True)
            return True
        head = bytes(conn.buf[:end])
        del conn.buf[: end + 4]
        self._request(conn, now, head)
        return True

    def _request(self, conn: _Conn, now: float, head: bytes) -> None:
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
            self._respond(conn, now, 400, b"bad request\n", _TEXT, close=True)
            return
        method, target, version = parts
        headers: dict[bytes, bytes] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep or not name or name != name.strip():
                self._respond(conn, now, 400, b"bad header\n", _TEXT, close=True)
                return
            headers[name.lower()] = value.strip()
        token = headers.get(b"connection", b"").lower()
        keep = (b"close" not in token) if version == b"HTTP/1.1" else (b"keep-alive" in token)
        if headers.get(b"content-length", b"0") != b"0" or b"transfer-encoding" in headers:
            self._respond(conn, now, 400, b"a request body is not accepted\n", _TEXT, close=True)
            return
        if not self.requests.take(now):
            self._respond(
                conn, now, 503, b"busy: too many requests\n", _TEXT, close=True, extra=(("Retry-After", "1"),)
            )
            return
        if method not in (b"GET", b"HEAD"):
            self._respond(conn, now, 405, b"GET or HEAD only\n", _TEXT, close=True, extra=(("Allow", "GET, HEAD"),))
            return
        path = target.split(b"?", 1)[0]
        encoding = ""
        try:
            if path == b"/metrics":
                if self.payload_gzip is not None and b"gzip" in headers.get(b"accept-encoding", b""):
                    body, encoding = self.payload_gzip(), "gzip"
                else:
                    body = self.payload()
                code, ctype = 200, CONTENT_TYPE
            elif path == b"/healthz":
                code, text = self.health()
                body, ctype = (text + "\n").encode(), _TEXT
            elif path == b"/":
                code, body, ctype = 200, b"nodehealth daemon: see /metrics and /healthz\n", _TEXT
            else:
                code, body, ctype = 404, b"not found\n", _TEXT
        except Exception:  # noqa: BLE001 - a rendering bug is a 500, not a dead endpoint
            code, body, ctype, encoding = 500, b"internal error\n", _TEXT, ""
        self._respond(conn, now, code, body, ctype, close=not keep, encoding=encoding, head_only=method == b"HEAD")
        if not keep and not conn.buf:
            # The client asked for the close (or spoke HTTP/1.0) and sent nothing after its request
            # (RFC 9112 9.6: it sends no more): close at once, a FIN. Where the endpoint closes on
            # its own, or input follows, the response goes out and unread input is drained a while
            # (linger) first, so that the client reads the response instead of a reset.
            conn.close_after = _AT_ONCE

    def _respond(
        self,
        conn: _Conn,
        now: float,
        code: int,
        body: bytes,
        ctype: str,
        close: bool,
        encoding: str = "",
        head_only: bool = False,
        extra: tuple[tuple[str, str], ...] = (),
    ) -> None:
        fields = [
            f"HTTP/1.1 {code} {_REASONS.get(code, 'Error')}",
            f"Content-Type: {ctype}",
            f"Content-Length: {len(body)}",
        ]
        if encoding:
            fields.append(f"Content-Encoding: {encoding}")
        fields.extend(f"{k}: {v}" for k, v in extra)
        fields.append("Connection: close" if close else "Connection: keep-alive")
        data = ("\r\n".join(fields) + "\r\n\r\n").encode("ascii") + (b"" if head_only else body)
        conn.out = memoryview(data)
        conn.close_after = _DRAIN if close else _KEEP
        conn.state = _WRITE
        conn.deadline = now + self.limits.write_timeout_s

    def _flush(self, conn: _Conn, now: float) -> None:
        """Send what the client takes now; once all is sent, wait for the next request or close."""
        try:
            while conn.out:
                conn.out = conn.out[conn.sock.send(conn.out) :]
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(conn)
            return
        if conn.close_after == _AT_ONCE:
            self._close(conn)
            return
        if conn.close_after == _DRAIN:
            try:
                conn.sock.shutdown(socket.SHUT_WR)
            except OSError:
                self._close(conn)
                return
            conn.state, conn.deadline = _LINGER, now + self.limits.linger_s
            conn.buf.clear()
        else:
            conn.state, conn.since, conn.idle = _READ, now, True
            conn.deadline = now + self.limits.idle_timeout_s
