"""The prolog's fast path: decide from the daemon's fresh verdict, without NVML.

``prolog(environ)`` returns an exit code when the daemon's verdict
(``<state_dir>/daemon-state.json``, read by ``nodehealth.statedir.verdict.read``) is fresh, or the
reason it is not (a string): the caller then runs the cold path and logs that reason.

What this path imports is paid for before every job, so it stays lean: the standard
library's ``json``/``os``/``time``, a TOML parser, ``nodehealth.statedir.verdict`` and, for the job
ledger record, ``nodehealth.slurm.jobenv`` (``re`` only; not ``nodehealth.statedir.ledger``, which
brings ``dataclasses``, ``typing``, the Slurm policy and the model: about 8 ms). It does
not import ``nodehealth.config.loader``: that module imports
``hostlist`` and the whole check registry to validate every key. Instead ``read_settings``
reads the handful of keys the fast path needs straight from the same TOML file (with the
same defaults, and the same ``[[override]]`` rules when one of them touches those keys;
``hostlist`` is imported only then). Any doubt (unreadable file, invalid TOML, a value of
the wrong type) sends the prolog to the cold path, where the full loader reports it.
Never imported here: pynvml, psutil, prometheus_client, the runner, the probes.

A fault in the daemon's verdict is rare: only then are the policy and the Slurm machinery
(``nodehealth.faces.common``) imported, and the node is drained through the same
``act_on_fault`` as the cold path.

Files this module keeps in the state dir besides the ledger:

* ``gpu-counters.json``: the latest per-GPU ECC / row-remap counters any cold-path face
  (prolog, epilog, health check) read from NVML, with its time and boot id;
* ``jobs/<job id>.json``: the counters of the job's GPUs at job start (the job baseline the
  epilog compares against). The cold-path prolog writes it from its own NVML reading; the
  fast path copies it from ``gpu-counters.json`` (so the baseline is as old as that reading,
  which the file records).
"""

from __future__ import annotations

import json
import os
import sys
import time

from nodehealth.statedir import verdict as daemon_state

TYPE_CHECKING = False
if TYPE_CHECKING:  # no typing import at run time
    from typing import Any, Mapping, Optional, Union

DEFAULT_CONFIG = "/etc/nodehealth/nodehealth.toml"  # = nodehealth.config.loader.DEFAULT_PATH (a test checks)
ENV_VAR = "NODEHEALTH_CONFIG"
COUNTERS_FILE = "gpu-counters.json"
LEDGER_FILE = "jobs.jsonl"  # = nodehealth.statedir.ledger.FILE_NAME (a test checks)
JOBS_DIR = "jobs"
MAX_JOB_FILES = 512  # baselines of jobs whose epilog never ran are pruned past this many
_NOTABLE = ("corrupt", "partial", "incomplete", "empty", "future", "unreadable", "larger than", "not a nodehealth")


class Log:
    """One line per event on stderr (``nodehealth-prolog[job 12]: ...``); decisions also to syslog."""

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


# --------------------------------------------------------------------------- settings


class Settings:
    """The config keys the fast path needs, with the defaults of ``nodehealth.config.loader``."""

    __slots__ = ("node_name", "state_dir", "max_age_s", "xid_follow", "boot_id_path", "ledger_enabled",
                 "ledger_max_bytes", "unknown")

    def __init__(self) -> None:
        self.node_name = ""
        self.state_dir = "/run/nodehealth"
        self.max_age_s = 90.0
        self.xid_follow = True
        self.boot_id_path = daemon_state.BOOT_ID_PATH
        self.ledger_enabled = True
        self.ledger_max_bytes = 1 << 20
        self.unknown = "pass"


# (table or None for top level, key, attribute, accepted kind)
KEYS = (
    (None, "node_name", "node_name", "str"),
    ("paths", "state_dir", "state_dir", "str"),
    ("daemon", "state_max_age_s", "max_age_s", "number"),
    ("daemon", "xid_follow", "xid_follow", "bool"),
    ("resume", "boot_id_path", "boot_id_path", "str"),
    ("ledger", "enabled", "ledger_enabled", "bool"),
    ("ledger", "max_bytes", "ledger_max_bytes", "int"),
    ("policy", "unknown", "unknown", "str"),
)


def _ok(kind: str, value: Any) -> bool:
    if kind == "str":
        return isinstance(value, str)
    if kind == "bool":
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    return isinstance(value, int) if kind == "int" else isinstance(value, (int, float))


def _apply(s: Settings, raw: Mapping[str, Any]) -> Optional[str]:
    """Copy the fast path's keys from one TOML table tree; the first bad one is returned."""
    for table, key, attr, kind in KEYS:
        where = raw if table is None else raw.get(table)
        if not isinstance(where, dict) or key not in where:
            continue
        value = where[key]
        if not _ok(kind, value):
            return f"{table + '.' if table else ''}{key}"
        setattr(s, attr, float(value) if kind == "number" else value)
    if s.unknown not in ("pass", "fail"):
        return "policy.unknown"
    return None


def _touches(rule: Mapping[str, Any]) -> bool:
    for table, key, _, _ in KEYS:
        where = rule if table is None else rule.get(table)
        if isinstance(where, dict) and key in where:
            return True
    return False


def node_name(environ: Mapping[str, str], configured: str = "") -> str:
    """Like ``nodehealth.config.loader.node_name``: SLURMD_NODENAME, else the config, else the short hostname."""
    if environ.get("SLURMD_NODENAME"):
        return environ["SLURMD_NODENAME"]
    if configured:
        return configured
    import socket

    return socket.gethostname().split(".")[0]


def read_settings(environ: Mapping[str, str]) -> tuple[Optional[Settings], str]:
    """The fast path's settings from the config file, or ``(None, why)`` (then the cold path)."""
    path = environ.get(ENV_VAR) or DEFAULT_CONFIG
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        if environ.get(ENV_VAR):
            return None, f"config {path}: no such file"
        data = b""
    except OSError as exc:
        return None, f"config {path}: cannot read: {exc.strerror or exc}"
    if sys.version_info >= (3, 11):
        import tomllib  # novermin - tomli below 3.11
    else:  # pragma: no cover - Python 3.9/3.10
        import tomli as tomllib
    try:
        raw = tomllib.loads(data.decode("utf-8")) if data.strip() else {}
    except (ValueError, UnicodeDecodeError) as exc:  # TOMLDecodeError is a ValueError
        return None, f"config {path}: invalid TOML ({exc})"
    s = Settings()
    bad = _apply(s, raw)
    if bad:
        return None, f"config {path}: {bad} has an unexpected value"
    rules = raw.get("override", [])
    if not isinstance(rules, list):
        return None, f"config {path}: override is not an array of tables"
    relevant = [r for r in rules if isinstance(r, dict) and _touches(r)]
    if relevant:
        import hostlist

        me = node_name(environ, s.node_name)
        for rule in relevant:
            try:
                names = hostlist.expand_hostlist(str(rule.get("hosts", "")))
            except Exception as exc:  # noqa: BLE001 - hostlist.BadHostlist and friends
                return None, f"config {path}: override hosts: {exc}"
            if me in names:
                bad = _apply(s, rule)
                if bad:
                    return None, f"config {path}: override {bad} has an unexpected value"
    return s, ""


# --------------------------------------------------------------------------- small files


def write_small(path: str, text: str) -> None:
    """Write a small state file atomically (temp file in the same directory, rename)."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, mode=0o755, exist_ok=True)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def read_small(path: str) -> Any:
    """The JSON object in ``path``; None when missing, unreadable or not a JSON object."""
    try:
        with open(path, "rb") as f:
            raw = json.loads(f.read(1 << 20))
    except (OSError, ValueError):
        return None
    return raw if isinstance(raw, dict) else None


def job_file(state_dir: str, job_id: str) -> Optional[str]:
    """``<state_dir>/jobs/<job id>.json``; None for a job id that is not a plain number."""
    if not job_id.isdigit() or len(job_id) > 20:
        return None
    return os.path.join(state_dir, JOBS_DIR, f"{job_id}.json")


def write_job_baseline(state_dir: str, job_id: str, record: Mapping[str, Any]) -> None:
    path = job_file(state_dir, job_id)
    if path is None:
        return
    write_small(path, json.dumps(record, separators=(",", ":")) + "\n")
    prune_jobs(state_dir)


def prune_jobs(state_dir: str, keep: int = MAX_JOB_FILES // 2) -> None:
    """Baselines of jobs whose epilog never ran: past MAX_JOB_FILES, keep the newest ``keep``."""
    d = os.path.join(state_dir, JOBS_DIR)
    try:
        names = [n for n in os.listdir(d) if n.endswith(".json")]
    except OSError:
        return
    if len(names) <= MAX_JOB_FILES:
        return
    aged = []
    for n in names:
        try:
            aged.append((os.stat(os.path.join(d, n)).st_mtime, n))
        except OSError:
            continue
    for _, n in sorted(aged)[:-keep]:
        try:
            os.unlink(os.path.join(d, n))
        except OSError:
            pass


def append_ledger(s: Settings, environ: Mapping[str, str], node: str, boot_id: Optional[str], log: Log) -> None:
    """The job's ``start`` record (one ``write(2)`` in append mode; compaction past max_bytes)."""
    if not s.ledger_enabled:
        return
    from nodehealth.slurm import jobenv

    rec = jobenv.record("start", environ, time.time(), node=node, boot_id=boot_id)
    if rec is None:
        return
    path = os.path.join(s.state_dir, LEDGER_FILE)
    try:
        os.makedirs(s.state_dir, mode=0o755, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, (json.dumps(rec, separators=(",", ":")) + "\n").encode("utf-8"))
            size = os.fstat(fd).st_size
        finally:
            os.close(fd)
        if size > s.ledger_max_bytes:
            from nodehealth.statedir import files as statefile
            from nodehealth.statedir import ledger

            with open(path, encoding="utf-8", errors="replace") as f:
                lines = f.readlines()
            statefile.write_atomic(path, "".join(ledger.compact(lines, s.ledger_max_bytes)))
    except OSError as exc:
        log(f"cannot append to the job ledger: {exc}")


def baseline_from_latest(s: Settings, job_id: str, gpus: Optional[tuple[int, ...]],
                         boot_id: Optional[str]) -> Optional[str]:
    """Copy the job GPUs' latest counters into the job's baseline; a reason when there are none."""
    latest = read_small(os.path.join(s.state_dir, COUNTERS_FILE))
    if latest is None or not isinstance(latest.get("gpus"), dict):
        return f"no GPU counter reading in {s.state_dir} yet"
    if latest.get("boot_id") != boot_id:
        return "the latest GPU counter reading is from another boot"
    keep = None if gpus is None else {str(g) for g in gpus}
    record = {"v": 1, "job_id": job_id, "time": round(time.time(), 3), "boot_id": boot_id,
              "source": f"{latest.get('source', '?')} reading (fast path)", "reading_time": latest.get("time"),
              "gpus": {k: v for k, v in latest["gpus"].items() if keep is None or k in keep}}
    write_job_baseline(s.state_dir, job_id, record)
    return None


# --------------------------------------------------------------------------- the decision


def _busy(checks: list[Any]) -> set[int]:
    """GPUs on which the daemon saw compute processes (``gpu_processes`` outside its idle phases)."""
    out: set[int] = set()
    for c in checks:
        if isinstance(c, dict) and c.get("name") == "gpu_processes":
            procs = (c.get("details") or {}).get("processes")
            if isinstance(procs, dict):
                out.update(int(k) for k, v in procs.items() if str(k).isdigit() and v)
    return out


def prolog(environ: Mapping[str, str]) -> Union[int, str]:
    """The exit code when the daemon's verdict decides, else why it cannot (never raises)."""
    try:
        return _prolog(environ)
    except Exception as exc:  # noqa: BLE001 - the cold path is always there
        return f"fast path failed ({type(exc).__name__}: {exc})"


def _prolog(environ: Mapping[str, str]) -> Union[int, str]:
    s, why = read_settings(environ)
    if s is None:
        return why
    boot = daemon_state.read_boot_id(s.boot_id_path)
    if boot is None:
        return f"this boot's id is unknown ({s.boot_id_path}); daemon state not trusted"
    st, why = daemon_state.read(s.state_dir, s.max_age_s, boot_id=boot, require_xid=s.xid_follow)
    if st is None:
        return why
    checks = st.report.get("checks", [])
    from nodehealth.slurm.jobenv import job_gpus

    gpus = job_gpus(environ)
    busy = _busy(checks)
    if busy and (gpus is None or busy & set(gpus)):
        mine = sorted(busy if gpus is None else busy & set(gpus))
        return (f"the daemon saw compute processes on GPU(s) {','.join(map(str, mine))} of this job "
                f"{st.age_s:.0f} s ago; checking them now")
    job = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID") or ""
    job = job if job.isdigit() else ""
    log = Log("prolog", job or None)
    bad = [c for c in checks if isinstance(c, dict) and (
        c.get("status") == "FAIL" or (s.unknown == "fail" and c.get("status") == "UNKNOWN"))]
    if bad:
        from nodehealth.slurm.policy import scope_processes, worst_failure

        report = scope_processes(st.to_report(), gpus)
        if worst_failure(report, s.unknown) is not None:
            from nodehealth.faces.common import fast_fault

            return fast_fault(report, environ, st, log)
    node = node_name(environ, s.node_name)
    append_ledger(s, environ, node, boot, log)
    if job:
        try:
            missing = baseline_from_latest(s, job, gpus, boot)
        except OSError as exc:
            missing = f"cannot write the job baseline: {exc}"
        if missing:
            log(f"no ECC baseline for the epilog: {missing}")
    log(f"{st.status} from the daemon's verdict (fast path; {st.age_s:.1f} s old, round {st.round})")
    return 0
