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
