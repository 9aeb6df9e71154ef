"""The ``/metrics`` endpoint: a small threaded HTTP server that serves pre-rendered bytes.

It never calls into a round: ``/metrics`` returns what ``NodeMetrics.payload()`` holds (the
last round rendered once, plus a live tail), so a scrape answers while a probe hangs.
"""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Optional

from nodehealth.metrics import CONTENT_TYPE


class ListenError(Exception):
    """The listen address is malformed or cannot be bound."""


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT``, ``[v6]:PORT`` or ``:PORT`` (all interfaces) -> (host, port)."""
    value = text.strip()
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ListenError(f"listen {text!r}: expected HOST:PORT (e.g. 0.0.0.0:10915, [::]:10915, 127.0.0.1:10915)")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host or "0.0.0.0", int(port)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64


def _handler(payload: Callable[[], bytes], health: Callable[[], tuple[int, str]],
             payload_gzip: Optional[Callable[[], bytes]] = None) -> type:
    class Handler(BaseHTTPRequestHandler):
        server_version = "nodehealth"
        sys_version = ""
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                if payload_gzip is not None and "gzip" in self.headers.get("Accept-Encoding", ""):
                    self._send(200, payload_gzip(), CONTENT_TYPE, encoding="gzip")
                else:
                    self._send(200, payload(), CONTENT_TYPE)
            elif path == "/healthz":
                code, text = health()
                self._send(code, (text + "\n").encode(), "text/plain; charset=utf-8")
            elif path == "/":
                self._send(200, b"nodehealth daemon: see /metrics and /healthz\n", "text/plain; charset=utf-8")
            else:
                self._send(404, b"not found\n", "text/plain; charset=utf-8")

        def do_HEAD(self) -> None:  # noqa: N802
            self.do_GET()

        def _send(self, code: int, body: bytes, ctype: str, encoding: str = "") -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            if encoding:
                self.send_header("Content-Encoding", encoding)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # quiet: scrapes are not events
            pass

    return Handler


class MetricsServer:
    def __init__(self, listen: str, payload: Callable[[], bytes],
                 health: Optional[Callable[[], tuple[int, str]]] = None,
                 payload_gzip: Optional[Callable[[], bytes]] = None) -> None:
        host, port = parse_listen(listen)
        server_cls: Any = _Server
        if ":" in host:
            server_cls = type("_Server6", (_Server,), {"address_family": socket.AF_INET6})
        try:
            self.server = server_cls((host, port), _handler(payload, health or (lambda: (200, "ok")), payload_gzip))
        except OSError as exc:
            raise ListenError(f"cannot listen on {listen}: {exc.strerror or exc}") from None
        self.address = self.server.server_address[:2]
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.5},
                                       name="metrics-http", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
