"""What the benches share: where a bench's report goes."""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path
from typing import Optional


def emit(text: str, out: Optional[str]) -> int:
    """``text`` on standard output and, with ``out``, in that file too; the bench's exit code (0)."""
    if out:
        Path(out).write_text(text)
    sys.stdout.write(text)
    return 0


def raw_get(host: str, port: int, gzip_ok: bool) -> tuple[int, float, bytes]:
    """One GET /metrics on a new connection with a minimal client (a raw socket), so that the time is
    the server's and the loopback's, not a heavy HTTP client's: (status code, seconds, body)."""
    request = (
        f"GET /metrics HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n"
        + ("Accept-Encoding: gzip\r\n" if gzip_ok else "")
        + "\r\n"
    ).encode()
    t0 = time.perf_counter()
    with socket.create_connection((host, port), timeout=2) as conn:
        conn.sendall(request)
        chunks = []
        while True:
            data = conn.recv(262144)
            if not data:
                break
            chunks.append(data)
    took = time.perf_counter() - t0
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), took, body


class KeepAlive:
    """GET /metrics on one connection held across requests, as Prometheus scrapes (its HTTP client
    keeps the connection between scrapes); a server that closes it costs the next request a connect."""

    def __init__(self, host: str, port: int, gzip_ok: bool) -> None:
        self.address = (host, port)
        zipped = "Accept-Encoding: gzip\r\n" if gzip_ok else ""
        self.request = f"GET /metrics HTTP/1.1\r\nHost: {host}:{port}\r\n{zipped}\r\n".encode()
        self.conn: Optional[socket.socket] = None
        self.connects = 0

    def get(self) -> tuple[int, float, bytes]:
        t0 = time.perf_counter()
        data = b""
        for _ in range(2):  # a server that closed the held connection: once more on a new one (as Go does)
            reused = self.conn is not None
            if self.conn is None:
                self.conn = socket.create_connection(self.address, timeout=2)
                self.connects += 1
            try:
                self.conn.sendall(self.request)
                data = self.conn.recv(262144)
            except (BrokenPipeError, ConnectionResetError):
                data = b""
            if data or not reused:
                break
            self.close()
        if not data:
            raise ConnectionError("the server closed the connection before answering")
        while b"\r\n\r\n" not in data:
            data += self._recv()
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.lower().split(b"\r\n")
        length = next((int(x.split(b":", 1)[1]) for x in lines if x.startswith(b"content-length:")), None)
        close = any(x.startswith(b"connection:") and b"close" in x for x in lines) or length is None
        while length is None or len(body) < length:
            more = self._recv(allow_eof=length is None)
            if not more:
                break
            body += more
        took = time.perf_counter() - t0
        if close:
            self.close()
        return int(head.split(b" ", 2)[1]), took, body

    def _recv(self, allow_eof: bool = False) -> bytes:
        assert self.conn is not None
        data = self.conn.recv(262144)
        if not data and not allow_eof:
            raise ConnectionError("the server closed the connection mid-response")
        return data

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None
