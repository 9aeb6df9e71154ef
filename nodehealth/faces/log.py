"""A face's log: one line per event on stderr, decisions also to syslog (standard library only).

slurmd keeps a failing prolog's stderr in its log; drain, resume and breaker decisions go to
syslog as well (``notable=True``), where an administrator's log search finds them.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional

_NOTABLE = ("corrupt", "partial", "incomplete", "empty", "future", "unreadable", "larger than", "not a nodehealth")


class Log:
    """``nodehealth-prolog[job 12]: ...`` on stderr; ``log(message, notable=True)`` also to syslog."""

    def __init__(self, face: str, job: Optional[str] = None) -> None:
        self.face = face
        self.tag = f"nodehealth-{face}" + (f"[job {job}]" if job else "")

    def __call__(self, message: str, notable: bool = False) -> None:
        try:
            sys.stderr.write(f"{self.tag}: {message}\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        if notable:
            try:
                import syslog

                syslog.openlog(f"nodehealth-{self.face}", syslog.LOG_PID, syslog.LOG_DAEMON)
                syslog.syslog(syslog.LOG_WARNING, message)
            except Exception:  # noqa: BLE001 - no syslog is not a reason to fail
                pass


def notable_miss(why: str) -> bool:
    """A reason the fast path was not taken that an administrator should hear about (syslog)."""
    return any(word in why for word in _NOTABLE)
