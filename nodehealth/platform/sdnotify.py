"""systemd: service notifications (sd_notify) and journal logging.

``notify("READY=1")`` uses the systemd bindings (``python3-systemd``) when importable, else
sends the protocol's one datagram to ``$NOTIFY_SOCKET`` itself (a path, or an abstract
socket when it starts with ``@``). Outside systemd (no ``$NOTIFY_SOCKET``) it does nothing.
``journal_sender()`` returns the bindings' ``journal.send`` (structured fields) or None: the one place
that looks for the journal (``platform.log.Log`` asks it at its first event).
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:  # the faces import this at their first log line: no typing at run time
    from typing import Any, Callable, Mapping, Optional

JOURNAL_SOCKET = "/run/systemd/journal/socket"


def _bindings() -> Any:
    try:
        from systemd import daemon
    except ImportError:
        return None
    return daemon


def notify(state: str, environ: Optional[Mapping[str, str]] = None, use_bindings: bool = True) -> bool:
    """Send ``state`` (``READY=1``, ``STATUS=…``, ``WATCHDOG=1``, ``STOPPING=1``); True when sent."""
    env = os.environ if environ is None else environ
    target = env.get("NOTIFY_SOCKET", "")
    if not target:
        return False
    daemon = _bindings() if use_bindings and environ is None else None
    if daemon is not None:
        try:
            return bool(daemon.notify(state))
        except Exception:  # noqa: BLE001 - fall back to the datagram
            pass
    import socket

    address = "\0" + target[1:] if target.startswith("@") else target
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.sendto(state.encode("utf-8", "replace"), address)
    except OSError:
        return False
    return True


def watchdog_interval_s(environ: Optional[Mapping[str, str]] = None) -> Optional[float]:
    """Half of systemd's ``WatchdogSec`` (``$WATCHDOG_USEC``) when the watchdog is meant for us."""
    env = os.environ if environ is None else environ
    usec, pid = env.get("WATCHDOG_USEC", ""), env.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) <= 0:
        return None
    if pid and pid.isdigit() and int(pid) != os.getpid():
        return None
    return int(usec) / 2e6


def journal_sender() -> Optional[Callable[..., Any]]:
    """``systemd.journal.send`` when the bindings are importable and journald listens, else None."""
    if not os.path.exists(JOURNAL_SOCKET):
        return None
    try:
        from systemd import journal
    except ImportError:
        return None
    send: Callable[..., Any] = journal.send
    return send
