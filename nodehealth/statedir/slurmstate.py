"""The Slurm faces' memory between runs: ``<state_dir>/slurm-state.json`` (standard library only).

What nodehealth drained this node for (``DrainRecord``), the clean-run count since, the boot
id, the breaker's last hold, the cached Slurm view of this node (``NodeInfo.to_json``), which
the prolog and epilog use instead of asking slurmctld, the recent drains (``DrainEvent``: the
flap damping counts them), the orphan reason already said, and what each face last logged of
its findings (so a drained faulty node logs a change, not every round).

Every field is bounded when read back: lists keep their newest ``MAX_*`` entries, numbers must
be finite, texts are cut, and an entry of an unknown shape is dropped (never a reason to lose
the rest of the state).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

from nodehealth.statedir import files, layout, upgrade

STATE_VERSION = 1
FILE_NAME = layout.SLURM_STATE
MAX_HISTORY = 32  # drains remembered; [resume] flap_drains is at most this
MAX_CHECK_CHARS = 64  # a check's name (the registry's are under 30)
MAX_GPUS = 64  # GPU indexes a drain record names
MAX_LOGGED = 64  # findings remembered as logged (one per check; the registry has fewer)
MAX_LOGGED_CHARS = 512  # each remembered line, cut
MAX_TEXT_CHARS = 2048  # the orphan reason remembered (Slurm's reason, as the cache bounds it)


@dataclass(frozen=True)
class DrainEvent:
    """One drain nodehealth made of this node: the check it was for and when (Unix time)."""

    check: str
    time: float

    def to_json(self) -> dict[str, Any]:
        return {"check": self.check, "time": self.time}

    @classmethod
    def from_json(cls, raw: Any) -> Optional[DrainEvent]:
        if not isinstance(raw, Mapping):
            return None
        check, when = raw.get("check"), raw.get("time")
        if not isinstance(check, str) or not 0 < len(check) <= MAX_CHECK_CHARS or not check.isprintable():
            return None
        t = _finite(when)
        if t <= 0.0:
            return None
        return cls(check, t)


@dataclass(frozen=True)
class DrainRecord:
    """What nodehealth drained this node for."""

    reason: str
    check: str
    action: str
    boot_id: Optional[str]
    time: float
    phase: str
    job_id: Optional[str] = None
    drains: int = 1  # drains for this check within [resume] flap_window_s, this one included
    flapping: bool = False  # held for a person: never resumed by nodehealth
    gpus: tuple[int, ...] = ()  # the GPUs the fault named (a process drain ends when NVML lists none there)

    def to_json(self) -> dict[str, Any]:
        return {
            "reason": self.reason,
            "check": self.check,
            "action": self.action,
            "boot_id": self.boot_id,
            "time": self.time,
            "phase": self.phase,
            "job_id": self.job_id,
            "drains": self.drains,
            "flapping": self.flapping,
            "gpus": list(self.gpus),
        }

    @classmethod
    def from_json(cls, raw: Any) -> Optional[DrainRecord]:
        if not isinstance(raw, Mapping):
            return None
        try:
            return cls(
                reason=str(raw["reason"]),
                check=str(raw.get("check", "")),
                action=str(raw.get("action", "none")),
                boot_id=_opt_str(raw.get("boot_id")),
                time=_finite(raw.get("time", 0.0)),
                phase=str(raw.get("phase", "")),
                job_id=layout.valid_job_id(raw.get("job_id")),
                drains=min(max(1, _count(raw.get("drains", 1))), MAX_HISTORY),
                flapping=raw.get("flapping") is True,
                gpus=_gpus(raw.get("gpus")),
            )
        except (KeyError, TypeError, ValueError):
            return None


@dataclass(frozen=True)
class State:
    """The Slurm faces' memory between runs (``<state_dir>/slurm-state.json``)."""

    clean_runs: int = 0
    last_status: Optional[str] = None
    last_run: float = 0.0
    boot_id: Optional[str] = None
    drain: Optional[DrainRecord] = None
    breaker_held: Optional[dict[str, Any]] = None
    slurm_node: Optional[dict[str, Any]] = None  # cached Gres/state/reason of this node
    disowned: Optional[str] = None  # a reason seen on this node that was ours and is not any more (logged once)
    history: tuple[DrainEvent, ...] = ()  # our recent drains, oldest first (flap damping)
    orphan: Optional[str] = None  # a nodehealth reason on this node with no record of ours (logged once)
    logged: Optional[dict[str, dict[str, str]]] = None  # face/phase -> {check: the line last logged}

    def to_json(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "clean_runs": self.clean_runs,
            "last_status": self.last_status,
            "last_run": self.last_run,
            "boot_id": self.boot_id,
            "drain": self.drain.to_json() if self.drain else None,
            "breaker_held": self.breaker_held,
            "slurm_node": self.slurm_node,
            "disowned": self.disowned,
            "history": [e.to_json() for e in self.history[-MAX_HISTORY:]],
            "orphan": self.orphan,
            "logged": self.logged,
        }

    @classmethod
    def from_json(cls, raw: Any) -> State:
        """A state from its JSON; anything unreadable becomes the empty state."""
        if not isinstance(raw, Mapping) or raw.get("version") != STATE_VERSION:
            return cls()
        clean = _count(raw.get("clean_runs", 0))
        last_run = _finite(raw.get("last_run", 0.0))
        held = raw.get("breaker_held")
        node = raw.get("slurm_node")
        return cls(
            clean_runs=max(0, clean),
            last_status=_opt_str(raw.get("last_status")),
            last_run=last_run,
            boot_id=_opt_str(raw.get("boot_id")),
            drain=DrainRecord.from_json(raw.get("drain")),
            breaker_held=dict(held) if isinstance(held, Mapping) else None,
            slurm_node=dict(node) if isinstance(node, Mapping) else None,
            disowned=_opt_str(raw.get("disowned")),
            history=_history(raw.get("history")),
            orphan=_text(raw.get("orphan")),
            logged=_logged(raw.get("logged")),
        )


def _history(raw: Any) -> tuple[DrainEvent, ...]:
    """The newest ``MAX_HISTORY`` well-formed drains, oldest first; anything else dropped."""
    if not isinstance(raw, list):
        return ()
    events = [e for e in (DrainEvent.from_json(x) for x in raw[-4 * MAX_HISTORY :]) if e is not None]
    return tuple(sorted(events, key=lambda e: e.time)[-MAX_HISTORY:])


def _gpus(raw: Any) -> tuple[int, ...]:
    if not isinstance(raw, list):
        return ()
    return tuple(
        sorted({g for g in raw[:MAX_GPUS] if isinstance(g, int) and not isinstance(g, bool) and 0 <= g < 1 << 16})
    )


def _text(raw: Any) -> Optional[str]:
    return raw[:MAX_TEXT_CHARS] if isinstance(raw, str) and raw else None


def _logged(raw: Any) -> Optional[dict[str, dict[str, str]]]:
    """face -> {check: line}: string keys and values only, each bounded; a few faces."""
    if not isinstance(raw, Mapping):
        return None
    out: dict[str, dict[str, str]] = {}
    for face, lines in list(raw.items())[:8]:
        if not isinstance(face, str) or not 0 < len(face) <= MAX_CHECK_CHARS or not isinstance(lines, Mapping):
            continue
        out[face] = {
            k: v[:MAX_LOGGED_CHARS]
            for k, v in list(lines.items())[:MAX_LOGGED]
            if isinstance(k, str) and 0 < len(k) <= MAX_CHECK_CHARS and isinstance(v, str)
        }
    return out or None


def _opt_str(value: Any) -> Optional[str]:
    return None if value is None else str(value)


def _finite(value: Any) -> float:
    """A finite JSON number as a float; 0.0 for anything else (text, a bool, NaN, infinity)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not -1e300 < value < 1e300:
        return 0.0  # NaN fails the comparison too
    return float(value)


def _count(value: Any) -> int:
    """A count of runs: an integer from 0 to 10**9; 0 for anything else."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 10**9:
        return 0
    return value


# ``paths`` below: the config's [paths] (the file lives in its persistent dir: ``layout.path_for``),
# or one directory for everything (a test's). The upgrade from one directory is ``upgrade.upgrade``.
def path(paths: Any) -> str:
    return layout.path_for(paths, FILE_NAME)


def load(paths: Any) -> State:
    """The state; the empty state when the file is absent or unusable, or the state dir is not safe."""
    return State.from_json(upgrade.read_json_or_earlier(path(paths), layout.earlier_path(paths, FILE_NAME)))


def update(paths: Any, change: Any, lock_timeout_s: float, log: Any = None) -> Optional[State]:
    """Re-read the state under its lock, apply ``change`` (State -> State), write it atomically.

    Returns the new state, or None when it could not be written (OSError, logged; an unsafe
    state dir is one). A file that is not strict JSON (NaN, deep nesting) is logged, treated
    as absent and rewritten.
    """
    p = path(paths)
    try:
        files.require_state_dir(layout.dir_for(paths, FILE_NAME))
        upgrade.upgrade(layout.earlier_path(paths, FILE_NAME), p, lock_timeout_s, log)
        new: State = files.update_json(
            p, lambda raw: change(State.from_json(raw)), lock_timeout_s, encode=State.to_json, log=log
        )
        return new
    except OSError as exc:
        if log is not None:
            log(f"cannot write state {p}: {exc}", notable=True)
        return None
