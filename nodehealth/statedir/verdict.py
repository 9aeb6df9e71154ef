"""The daemon's verdict as the prolog reads it: ``<state_dir>/daemon-state.json``.

The daemon writes this file atomically after every round (temp file, fsync, rename; ``write``),
and in the same call, after it, the same value in ``marshal`` form (``daemon-state.marshal``,
``strictjson.dumps_marshal``): the JSON is the source of truth for every other reader, the
marshal form is the prolog's fast path's (``read(..., form="marshal")``), so that path imports
no ``json`` (nor the ``re`` it pulls in). Both forms are judged by the same rules below. This
module imports only ``os``, ``time`` and ``files`` (no pynvml, psutil, prometheus_client, not
even ``dataclasses`` or ``typing``), so reading a fresh verdict costs well under a millisecond on
top of the interpreter's start-up.

File format (version 1), one JSON object::

    {"v": 1, "kind": "nodehealth-daemon-state", "boot_id": "…", "written_at": 1732912345.1,
     "interval_s": 30.0, "pid": 1234, "pid_start": 8812345, "round": 17,
     "xid": {"follower": "alive" | "dead" | "absent" | "off", "since": 1732912000.0 | null},
     "report": {… Report.to_json() …}}

``read`` returns ``(DaemonState, "fresh")`` or ``(None, why)`` where ``why`` says which rule
failed: a state dir that is not safe (``files.check_dir``: another owner, writable by others,
a symlink), missing, unreadable (a symlink in its place is not followed), corrupt or partial
(not strict JSON, or not a strict marshal value: a truncated file, NaN or infinite numbers, deep
nesting, a type JSON has not), wrong kind or
version, another boot, too old (a NaN age or limit is too old), written in the future, XID
follower not alive. The caller then runs its cold path and logs ``why``; nothing here raises.
"""

from __future__ import annotations

import os
import time

from nodehealth.statedir import files, layout
from nodehealth.statedir.strictjson import dumps_marshal, parse_marshal

TYPE_CHECKING = False
if TYPE_CHECKING:  # no typing import at run time: the fast path pays for every module
    from typing import Any, Optional, Union

FILE_NAME = layout.DAEMON_STATE
FORMS = {"json": layout.DAEMON_STATE, "marshal": layout.DAEMON_STATE_MARSHAL}
KIND = "nodehealth-daemon-state"
VERSION = 1
MAX_BYTES = 4 << 20  # a report is a few KiB; anything this large is not ours
CLOCK_SKEW_S = 5.0  # a file written this far "in the future" is not trusted
XID_STATES = ("alive", "dead", "absent", "off")


class DaemonState:
    """A fresh daemon verdict: the Report as JSON plus where and when it was made."""

    __slots__ = ("path", "boot_id", "written_at", "age_s", "xid_follower", "report", "round", "pid")

    def __init__(
        self,
        path: str,
        boot_id: str,
        written_at: float,
        age_s: float,
        xid_follower: str,
        report: dict[str, Any],
        round: int = 0,
        pid: int = 0,
    ) -> None:
        self.path = path
        self.boot_id = boot_id
        self.written_at = written_at
        self.age_s = age_s
        self.xid_follower = xid_follower
        self.report = report
        self.round = round
        self.pid = pid

    @property
    def status(self) -> str:
        """The node verdict the daemon reached: OK, WARN, UNKNOWN or FAIL."""
        return str(self.report.get("status", "UNKNOWN"))

    def __repr__(self) -> str:
        return f"DaemonState(status={self.status}, age_s={self.age_s:.1f}, xid={self.xid_follower}, round={self.round})"


def path_in(state_dir: str, form: str = "json") -> str:
    return layout.path(state_dir, FORMS[form])


def read(
    state_dir: str,
    max_age_s: float,
    boot_id: Optional[str] = None,
    now: Optional[float] = None,
    require_xid: bool = True,
    procfs_root: str = layout.PROCFS_ROOT,
    pid_root: str = "/proc",
    form: str = "json",
) -> tuple[Optional[DaemonState], str]:
    """The daemon's verdict if it may be used now, else ``(None, why)``.

    ``form``: ``"json"`` (``daemon-state.json``) or ``"marshal"`` (the fast path's
    ``daemon-state.marshal``, the same value), judged alike.

    ``boot_id``: this boot's id (read under ``procfs_root`` when None); a verdict from another
    boot is never used. ``require_xid``: the XID follower must have been alive when the
    verdict was written (``absent`` = a daemon without a follower, ``off`` = disabled in
    config are refused too); False accepts any follower state except ``dead``. The daemon
    process that wrote the verdict must still be running: its pid and start time (clock ticks
    since boot, ``/proc/<pid>/stat``) are in the file and are checked under ``pid_root`` (one
    small read), so a dead daemon's verdict is never trusted, however young.
    """
    path = path_in(state_dir, form)
    unsafe = files.check_dir(state_dir)
    if unsafe:
        if not os.path.lexists(state_dir):
            return None, f"no daemon state ({path} missing)"
        return None, f"daemon state not trusted: {unsafe}"
    data, why = files.read_checked(path, MAX_BYTES + 1)
    if data is None:
        return None, f"daemon state unreadable: {why}" if why else f"no daemon state ({path} missing)"
    if len(data) > MAX_BYTES:
        return None, f"daemon state {path} larger than {MAX_BYTES} bytes"
    if not data.strip():
        return None, f"daemon state {path} is empty (partial write?)"
    try:
        raw = files.parse_json(data) if form == "json" else parse_marshal(data)
    except ValueError as exc:  # UnicodeDecodeError is a ValueError too; NaN, 1e400, deep nesting
        return None, f"daemon state {path} is corrupt or partial: {str(exc)[:200]}"
    if not isinstance(raw, dict) or raw.get("kind") != KIND:
        return None, f"daemon state {path} is not a nodehealth daemon state"
    if raw.get("v") != VERSION:
        return None, f"daemon state {path} has version {raw.get('v')!r}, this reader knows {VERSION}"
    written = raw.get("written_at")
    report = raw.get("report")
    file_boot = raw.get("boot_id")
    xid = raw.get("xid")
    follower = xid.get("follower") if isinstance(xid, dict) else None
    if (
        not isinstance(written, (int, float))
        or isinstance(written, bool)
        or not isinstance(report, dict)
        or not isinstance(report.get("checks"), list)
        or not isinstance(report.get("status"), str)
        or not isinstance(file_boot, str)
        or follower not in XID_STATES
    ):
        return None, f"daemon state {path} is incomplete (missing or malformed fields)"
    current_boot = layout.read_boot_id(procfs_root) if boot_id is None else boot_id
    if current_boot is None:
        return None, "this boot's id is unknown; daemon state not trusted"
    if file_boot != current_boot:
        return None, f"daemon state is from another boot ({file_boot})"
    t = time.time() if now is None else now
    age = t - float(written)
    if age < -CLOCK_SKEW_S:
        return None, f"daemon state written {-age:.0f} s in the future (clock step?)"
    if not age <= max_age_s:  # a NaN limit trusts nothing
        return None, f"daemon state is {age:.0f} s old (limit {max_age_s:g} s)"
    if follower == "dead" or (require_xid and follower != "alive"):
        return None, f"XID follower {follower} when the daemon state was written"
    rnd = raw.get("round")
    pid = raw.get("pid")
    rnd = rnd if isinstance(rnd, int) and not isinstance(rnd, bool) else 0
    pid = pid if isinstance(pid, int) and not isinstance(pid, bool) else 0
    started = raw.get("pid_start")
    if not isinstance(started, int) or isinstance(started, bool) or pid <= 0:
        return None, "daemon state does not say which daemon process wrote it (pid and start time)"
    if start_ticks(pid, pid_root) != started:
        return None, f"the daemon that wrote the state (pid {pid}) is no longer running"
    return DaemonState(path, file_boot, float(written), max(0.0, age), follower, report, rnd, pid), "fresh"


def start_ticks(pid: Union[int, str], pid_root: str = "/proc") -> Optional[int]:
    """When process ``pid`` (or ``"self"``) started (field 22 of ``/proc/<pid>/stat``, clock ticks
    since boot), or None."""
    try:
        with open(os.path.join(pid_root, str(pid), "stat"), "rb") as f:
            stat = f.read(4096).decode("ascii", "replace")
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def encode(
    report: dict[str, Any],
    boot_id: str,
    written_at: float,
    xid_follower: str,
    xid_since: Optional[float] = None,
    interval_s: float = 0.0,
    round: int = 0,
    pid: Optional[int] = None,
    pid_start: Optional[int] = None,
) -> str:
    """The file's text for a Report's JSON (the daemon writes it atomically); ``pid`` and
    ``pid_start`` default to this process's."""
    if xid_follower not in XID_STATES:
        raise ValueError(f"xid_follower must be one of {XID_STATES}")
    pid = os.getpid() if pid is None else pid
    if pid_start is None:
        pid_start = start_ticks(pid)
    obj = {
        "v": VERSION,
        "kind": KIND,
        "boot_id": boot_id,
        "written_at": written_at,
        "interval_s": interval_s,
        "pid": pid,
        "pid_start": pid_start,
        "round": round,
        "xid": {"follower": xid_follower, "since": xid_since},
        "report": report,
    }
    return files.dumps(obj, compact=True) + "\n"


def write(state_dir: str, text: str) -> None:
    """Write ``encode``'s ``text`` as the verdict (``files.write_state``: the state dir checked
    first, the file 0600), then the same value in marshal form for the fast path; raises OSError."""
    files.write_state(state_dir, path_in(state_dir), text)
    files.write_state(state_dir, path_in(state_dir, "marshal"), dumps_marshal(text))
