"""A face's log: one line per event on stderr, and each event to the journal with structured fields.

slurmd keeps a failing prolog's stderr in its log. Where the systemd bindings (``python3-systemd``) are
importable and journald listens, every event also goes to the journal with ``NODEHEALTH_FACE=``,
``NODEHEALTH_JOB=``, ``NODEHEALTH_CHECK=``, ``NODEHEALTH_GPU=``, ``NODEHEALTH_STATUS=`` and a priority by status
(``journalctl NODEHEALTH_CHECK=gpu_ecc``); without them, drain, resume and breaker decisions
(``notable=True``) go to syslog instead. The bindings are imported at the first event, never on a fast path
that logs nothing.
"""

from __future__ import annotations

import os
import re
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Optional

_NOTABLE = ("corrupt", "partial", "incomplete", "empty", "future", "unreadable", "larger than", "not a nodehealth")
JOURNAL_SOCKET = "/run/systemd/journal/socket"
# syslog(3) priorities by a result's status; a line without one is info, or warning when notable.
PRIORITY = {"FAIL": 3, "UNKNOWN": 4, "WARN": 4, "OK": 6, "SKIPPED": 6}
# "FAIL gpu_ecc: GPU 3: ..." as the faces write a result; the GPU from the summary when it names one.
_RESULT = re.compile(r"^(OK|SKIPPED|WARN|UNKNOWN|FAIL) ([a-z][a-z0-9_]*): (?:GPU (\d+)\b)?")
_UNSET = object()


def journal_fields(message: str, job: Optional[str], face: str, notable: bool = False,
                   **fields: Any) -> dict[str, Any]:
    """The journal entry for one event (``MESSAGE`` aside): explicit ``check=``, ``gpu=``, ``status=``
    win over what the message says."""
    found = _RESULT.match(message)
    status = fields.pop("status", None) or (found.group(1) if found else None)
    out: dict[str, Any] = {"NODEHEALTH_FACE": face}
    if found:
        out["NODEHEALTH_CHECK"] = found.group(2)
        if found.group(3) is not None:
            out["NODEHEALTH_GPU"] = found.group(3)
    if job:
        out["NODEHEALTH_JOB"] = job
    if status:
        out["NODEHEALTH_STATUS"] = status
    for key, value in fields.items():
        if value is not None:
            out[f"NODEHEALTH_{key.upper()}"] = str(value)
    out["PRIORITY"] = str(PRIORITY.get(str(status), 4 if notable else 6))
    out["SYSLOG_IDENTIFIER"] = f"nodehealth-{face}"
    return out


def _journal() -> Optional[Callable[..., Any]]:
    if not os.path.exists(JOURNAL_SOCKET):
        return None
    try:
        from systemd import journal
    except ImportError:
        return None
    send: Callable[..., Any] = journal.send
    return send


class Log:
    """``nodehealth-prolog[job 12]: ...`` on stderr; the journal (or, for ``notable=True``, syslog) too."""

    def __init__(self, face: str, job: Optional[str] = None) -> None:
        self.face = face
        self.job = job
        self.tag = f"nodehealth-{face}" + (f"[job {job}]" if job else "")
        self._send: Any = _UNSET

    def __call__(self, message: str, notable: bool = False, **fields: Any) -> None:
        try:
            sys.stderr.write(f"{self.tag}: {message}\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        if self._send is _UNSET:
            self._send = _journal()
        if self._send is not None:
            try:
                self._send(message, **journal_fields(message, self.job, self.face, notable, **fields))
                return
            except Exception:  # noqa: BLE001 - journald gone: syslog below
                self._send = None
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
