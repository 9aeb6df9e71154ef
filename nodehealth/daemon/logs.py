"""Daemon logging: to the journal with structured fields when the systemd bindings are there,
else one line per event on stderr (which systemd also puts in the journal, without fields)."""

from __future__ import annotations

import sys
import threading
from typing import Any, Callable, Optional

PRIORITIES = {"err": 3, "warning": 4, "notice": 5, "info": 6, "debug": 7}
# A result's status as a priority, when the caller gives a status and no priority of its own.
BY_STATUS = {"FAIL": "err", "UNKNOWN": "warning", "WARN": "warning", "OK": "info", "SKIPPED": "info"}


class Log:
    def __init__(self, tag: str = "nodehealth-daemon", journal: Optional[Callable[..., Any]] = None,
                 stream: Any = None) -> None:
        self.tag = tag
        self.journal = journal
        self.stream = stream
        self._lock = threading.Lock()
        self.lines: list[str] = []  # the last few lines, for tests and the status line
        self.keep = 50

    @classmethod
    def default(cls) -> Log:
        from nodehealth.platform.sdnotify import journal_sender

        return cls(journal=journal_sender())

    def __call__(self, message: str, priority: Optional[str] = None, **fields: Any) -> None:
        """``log(message, "warning", check="gpu_ecc", gpu=3, job="12", status="FAIL")``: the fields become
        ``NODEHEALTH_CHECK=``, ``NODEHEALTH_GPU=``, ... in the journal (``journalctl NODEHEALTH_CHECK=gpu_ecc``)."""
        if priority is None:
            priority = BY_STATUS.get(str(fields.get("status", "")), "info")
        with self._lock:
            self.lines.append(message)
            del self.lines[:-self.keep]
        if self.journal is not None:
            extra = {f"NODEHEALTH_{k.upper()}": str(v) for k, v in fields.items() if v is not None}
            try:
                self.journal(message, PRIORITY=PRIORITIES.get(priority, 6), SYSLOG_IDENTIFIER=self.tag, **extra)
                return
            except Exception:  # noqa: BLE001 - fall back to stderr
                pass
        tail = " ".join(f"{k}={v}" for k, v in fields.items() if v is not None)
        line = f"{self.tag}: {priority}: {message}" + (f" [{tail}]" if tail else "")
        try:
            out = self.stream or sys.stderr
            out.write(line + "\n")
            out.flush()
        except (OSError, ValueError):
            pass
