"""The one ``Log`` of the faces and the daemon: one line per event, to the journal with structured fields.

``log(message, priority=None, notable=False, check=..., gpu=..., status=..., job=...)``: the fields become
``NODEHEALTH_CHECK=``, ``NODEHEALTH_GPU=``, ... in the journal (``journalctl NODEHEALTH_CHECK=gpu_ecc``). The
priority is ``priority`` when given (``err``, ``warning``, ``notice``, ``info``, ``debug``), else the
result's status (FAIL err; UNKNOWN and WARN warning; OK and SKIPPED info, also read from a line that
starts like ``FAIL gpu_ecc: GPU 3: ...``), else ``warning`` for a ``notable`` event and ``info``.

Where the lines go depends on who runs: a face (started by slurmd or cron; ``Log("prolog", job)``) writes
every line on stderr too (slurmd keeps a failing prolog's stderr), and without the journal sends its
notable events (drain, resume, breaker, a bad config) to syslog; the daemon (``Log("daemon")``, under
systemd, whose journal already takes its stderr) writes stderr only when the journal is not there, with the
priority and the fields on the line. The journal is found at the first event (``sdnotify.journal_sender``:
python3-systemd importable and journald listening), never on a fast path that logs nothing; standard
library only, no ``typing`` or ``dataclasses`` at run time (the prolog's fast path imports this).
"""

from __future__ import annotations

import _thread  # a lock without importing threading (2 ms of the prolog's fast path)
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import IO, Any, Callable, Optional

PRIORITIES = {"err": 3, "warning": 4, "notice": 5, "info": 6, "debug": 7}
# A result's status as a priority, when the caller gives a status and no priority of its own.
BY_STATUS = {"FAIL": "err", "UNKNOWN": "warning", "WARN": "warning", "OK": "info", "SKIPPED": "info"}
# "FAIL gpu_ecc: GPU 3: ..." as the faces write a result; the GPU from the summary when it names one.
# Compiled at the first journal entry: ``re`` (and ``enum``) cost the prolog's fast path ~9 ms.
_RESULT_PATTERN = r"^(OK|SKIPPED|WARN|UNKNOWN|FAIL) ([a-z][a-z0-9_]*): (?:GPU (\d+)\b)?"
_RESULT: list[Any] = []
_FIND = object()  # ``journal``: look for it at the first event
DAEMON = "daemon"
KEEP_LINES = 50


def journal_fields(
    message: str,
    job: Optional[str],
    face: Optional[str],
    notable: bool = False,
    priority: Optional[str] = None,
    tag: Optional[str] = None,
    **fields: Any,
) -> dict[str, Any]:
    """The journal entry for one event (``MESSAGE`` aside): explicit ``check=``, ``gpu=``, ``status=`` win
    over what the message says; ``face`` None: the daemon's entry (no ``NODEHEALTH_FACE``)."""
    if not _RESULT:
        import re

        _RESULT.append(re.compile(_RESULT_PATTERN))
    found = _RESULT[0].match(message)
    status = fields.pop("status", None) or (found.group(1) if found else None)
    out: dict[str, Any] = {"NODEHEALTH_FACE": face} if face else {}
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
    out["PRIORITY"] = str(PRIORITIES.get(level(priority, status, notable), 6))
    out["SYSLOG_IDENTIFIER"] = tag or f"nodehealth-{face or DAEMON}"
    return out


def level(priority: Optional[str], status: Any, notable: bool) -> str:
    """The priority's name: the given one, else by status, else ``warning`` when notable, else ``info``."""
    if priority in PRIORITIES:
        return str(priority)
    by_status = BY_STATUS.get(str(status)) if status else None
    return by_status or ("warning" if notable else "info")


class Log:
    """``Log("prolog", "12")``, ``Log("daemon")``: see the module's doc. ``journal``: a ``journal.send``-like
    callable, None for none (the default with a ``stream``: a test's or a file's lines stay there), or found
    at the first event; ``stream``: where stderr lines go (default ``sys.stderr``)."""

    def __init__(
        self, face: str = DAEMON, job: Optional[str] = None, journal: Any = _FIND, stream: Optional[IO[str]] = None
    ) -> None:
        self.face, self.job, self.stream = face, job, stream
        self.daemon = face == DAEMON
        self.tag = f"nodehealth-{face}"
        self.prefix = self.tag + (f"[job {job}]" if job else "")
        self.journal: Optional[Callable[..., Any]] = None
        self._find = journal is _FIND and stream is None
        if journal is not _FIND:
            self.journal = journal
        self._lock = _thread.allocate_lock()
        self.lines: list[str] = []  # the last few messages, for tests and the status line

    @classmethod
    def default(cls) -> Log:
        """The daemon's log with the journal looked up now."""
        log = cls(DAEMON)
        log._journal()
        return log

    def _journal(self) -> Optional[Callable[..., Any]]:
        if self._find:
            from nodehealth.platform.sdnotify import journal_sender

            self._find, self.journal = False, journal_sender()
        return self.journal

    def __call__(self, message: str, priority: Optional[str] = None, notable: bool = False, **fields: Any) -> None:
        with self._lock:
            self.lines.append(message)
            del self.lines[:-KEEP_LINES]
        if not self.daemon:
            self._write(f"{self.prefix}: {message}")  # slurmd's copy
        send = self._journal()
        if send is not None:
            job = fields.get("job") or self.job  # the daemon names the job of each event
            rest = {k: v for k, v in fields.items() if k != "job"}
            try:
                send(
                    message,
                    **journal_fields(
                        message, job, None if self.daemon else self.face, notable, priority, self.tag, **rest
                    ),
                )
                return
            except Exception:  # noqa: BLE001 - journald gone: the fallbacks below
                self.journal = None
        if self.daemon:
            tail = " ".join(f"{k}={v}" for k, v in fields.items() if v is not None)
            name = level(priority, fields.get("status"), notable)
            self._write(f"{self.prefix}: {name}: {message}" + (f" [{tail}]" if tail else ""))
        elif notable:
            _syslog(self.tag, message)

    def _write(self, line: str) -> None:
        try:
            out = self.stream or sys.stderr
            out.write(line + "\n")
            out.flush()
        except (OSError, ValueError):
            pass


def _syslog(tag: str, message: str) -> None:
    try:
        import syslog

        syslog.openlog(tag, syslog.LOG_PID, syslog.LOG_DAEMON)
        syslog.syslog(syslog.LOG_WARNING, message)
    except Exception:  # noqa: BLE001 - no syslog is not a reason to fail
        pass
