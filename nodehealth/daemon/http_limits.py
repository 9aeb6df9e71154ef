"""What a client, or many, can hold of the ``/metrics`` endpoint (daemon/http.py): the listen
address's form, the limits, and the token bucket that spends the endpoint's CPU budget."""

from __future__ import annotations

from dataclasses import dataclass

TICK_S = 1.0  # the longest the endpoint's thread sleeps in its selector


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


@dataclass(frozen=True)
class Limits:
    """What one client, or many, can hold of the endpoint."""

    max_connections: int = 64
    max_header_bytes: int = 8192
    read_timeout_s: float = 5.0
    # Prometheus keeps its connection to a target between scrapes (prometheus/common's HTTP client:
    # keep-alives on, idle connections kept 5 minutes), and scrapes every 15 s to 1 min (its default).
    # Held longer than that, the connection serves the next scrape (no connect, no accept: half the
    # time of one on a new connection); at 15 s it was closed just as a 15 s scrape came. An idle
    # connection is still one the cap closes first (it waits for a whole request).
    idle_timeout_s: float = 90.0
    write_timeout_s: float = 10.0
    # After a response that closes the connection: how long, and how much, unread input is
    # drained so that the client reads the response instead of a reset.
    linger_s: float = 1.0
    linger_bytes: int = 65536
    # What the endpoint's one thread may spend, so that a flood costs the daemon's other work
    # (the XID follower, the rounds: all under the unit's CPUQuota) next to nothing: connections
    # taken per second (the rest wait in the kernel's backlog), and requests answered per
    # second (one over that gets a 503 and is closed). A scrape every 15 s is far below both.
    accepts_per_s: float = 300.0
    accept_burst: int = 64
    requests_per_s: float = 100.0
    request_burst: int = 100


class Bucket:
    """A token bucket: ``take`` is True while the rate (with its burst) allows one more."""

    def __init__(self, rate: float, burst: int, now: float) -> None:
        self.rate, self.burst = rate, float(burst)
        self.tokens, self.at = float(burst), now

    def _fill(self, now: float) -> None:
        self.tokens = min(self.burst, self.tokens + max(0.0, now - self.at) * self.rate)
        self.at = now

    def ready(self, now: float) -> bool:
        self._fill(now)
        return self.tokens >= 1.0

    def take(self, now: float) -> bool:
        if not self.ready(now):
            return False
        self.tokens -= 1.0
        return True

    def next_at(self, now: float) -> float:
        """When the next token will be there."""
        self._fill(now)
        return now + max(0.0, 1.0 - self.tokens) / self.rate if self.rate > 0 else now + TICK_S
