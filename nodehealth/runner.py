"""The runner owns time: it gathers what the selected checks need, under deadlines, then judges.

Probes run in parallel: forking probes (NVML) first, from this thread, then each of the
others in a daemon thread. Each probe gets the largest deadline among the checks that need
it, capped by what is left of the phase's budget; the runner waits for it no longer than
that (plus a small grace), so a probe that does not come back becomes a ``timeout``
ProbeError and the run still ends on time. Checks are pure; an exception in one becomes an
UNKNOWN result with the error text.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Optional

from nodehealth import __version__
from nodehealth.checks.base import Context
from nodehealth.config.lean import node_name
from nodehealth.config.loader import phase_budget
from nodehealth.config.schema import Config
from nodehealth.model import CheckResult, Report, Status
from nodehealth.observations import NvmlSnapshot, Observations, ProbeError
from nodehealth.observations.record import record
from nodehealth.probes import PROBES, Probe, ProbeContext, source
from nodehealth.registry import CheckSpec, select

GRACE_S = 0.25


@dataclass
class _Slot:
    probe: str
    deadline: float
    budget_s: float = 0.0  # the time the probe was given (its deadline less the runner's grace)
    value: Any = None
    done: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    elapsed: float = 0.0

    def settle(self, value: Any, elapsed: float) -> None:
        """Record the probe's outcome once; a late answer after the deadline is dropped."""
        with self.lock:
            if not self.done.is_set():
                self.value, self.elapsed = value, elapsed
                self.done.set()


@record
class Judged:
    """A run's Report and the observations it judged (the daemon publishes both as metrics)."""

    report: Report
    observations: Observations


def run(config: Config, *args: Any, **kwargs: Any) -> Report:
    """Run the checks of ``phase`` (or just ``only``) and return the Report: ``execute``'s arguments."""
    return execute(config, *args, **kwargs).report


def execute(
    config: Config,
    phase: str = "manual",
    only: tuple[str, ...] = (),
    probes: Optional[dict[str, Probe]] = None,
    node: Optional[str] = None,
    clock: Callable[[], float] = time.monotonic,
    wallclock: Callable[[], float] = time.time,
    environ: Optional[Mapping[str, str]] = None,
    budget_s: Optional[float] = None,
    look_only: bool = False,
    own_budget_s: Optional[float] = None,
    gpus: Optional[tuple[int, ...]] = None,
    read_only: bool = False,
) -> Judged:
    """Like ``run``, also returning the observations.

    ``environ``: the job's environment (the prolog's and epilog's; the ``job`` probe reads it).
    ``budget_s``: what is left of the caller's deadline, when less than the phase's budget.
    ``look_only``: a look by hand (``--dry-run``, ``check --as``): no probe asks slurmctld or writes.
    ``read_only``: ``nodehealth check`` by hand: probes may ask slurmctld but write nothing to the
    state dir (docs/operations.md, "What check reads and writes").
    ``gpus``: judge only these GPUs (NVML indexes; ``check -i``): the others are left out of the
    snapshot the checks see (NVML's count stays the node's).
    ``own_budget_s``: the budget of a run that is not one of the phase's rounds (the daemon's
    scheduled NCCL self-test, ``nodehealth nccl run``), instead of the phase's.
    """
    table = probes or PROBES
    started, started_wall = clock(), wallclock()
    if own_budget_s is not None:
        budget = max(0.0, own_budget_s)
    else:
        budget = (
            phase_budget(config, phase) if budget_s is None else max(0.0, min(budget_s, phase_budget(config, phase)))
        )
    name = node or node_name(config.node_name)
    specs = select(phase, config.enabled(), only)
    needed = Deadlines(specs, config)
    pctx = ProbeContext(
        config=config,
        node=name,
        environ=dict(environ or {}),
        phase=phase,
        look_only=look_only,
        writes=not (read_only or look_only),
    )
    slots = _gather(table, needed, pctx, started, budget, clock)
    obs = Observations(**{n: s.value for n, s in slots.items()})
    if gpus is not None and isinstance(obs.nvml, NvmlSnapshot):
        chosen = dataclasses.replace(obs.nvml, gpus=tuple(g for g in obs.nvml.gpus if g.index in gpus))
        obs = dataclasses.replace(obs, nvml=chosen)
    results = []
    for spec in specs:
        ctx = Context(name=spec.name, phase=phase, node=name, expected_gpus=config.gpu.expected_count)
        results.append(_judge(spec, obs, config, ctx, slots, clock))
    report = Report(
        node=name,
        phase=phase,
        results=tuple(results),
        duration_s=clock() - started,
        version=__version__,
        started_at=started_wall,
        source=source.label(config),
    )
    return Judged(report, obs)


class Deadlines(Mapping[str, float]):
    """Probe -> its deadline: the largest ``timeout_s`` among the selected checks that need it (a probe
    only used, none of them needing it, takes its users' largest).

    Which probes, and in which order, is the registry's data; a deadline reads its checks' settings,
    which imports their modules, when ``_gather`` starts that probe. So the NVML child is forked after
    only the GPU checks' modules are imported, and the others (``gpu_xid``'s XID catalog) load while it
    reads the GPUs.
    """

    def __init__(self, specs: tuple[CheckSpec, ...], config: Config) -> None:
        self.specs, self.config = specs, config
        order: dict[str, None] = {}
        for spec in specs:
            order.update(dict.fromkeys(spec.needs))
        for spec in specs:
            order.update((probe, None) for probe in spec.uses if probe not in order)
        self.names = tuple(order)

    def __getitem__(self, probe: str) -> float:
        if probe not in self.names:
            raise KeyError(probe)
        users = [s for s in self.specs if probe in s.needs] or [s for s in self.specs if probe in s.uses]
        return max(self.config.checks[s.name].timeout_s for s in users)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


def _gather(
    table: dict[str, Probe],
    needed: Mapping[str, float],
    pctx: ProbeContext,
    started: float,
    budget: float,
    clock: Callable[[], float],
) -> dict[str, _Slot]:
    slots: dict[str, _Slot] = {}
    ordered = sorted(needed, key=lambda n: not table[n].forks)  # forking probes first
    for name in ordered:
        probe = table[name]
        left = max(0.0, budget - (clock() - started))
        timeout = min(needed[name], left)
        slot = _Slot(name, deadline=clock() + timeout + GRACE_S, budget_s=timeout)
        slots[name] = slot
        if probe.forks:
            t0 = clock()
            try:
                pending = probe.gather(pctx, timeout)
            except Exception as exc:  # noqa: BLE001 - a probe bug must not stop the run
                slot.settle(ProbeError(name, "error", f"{type(exc).__name__}: {exc}"), clock() - t0)
                continue
            if isinstance(pending, ProbeError):
                slot.settle(pending, clock() - t0)
                continue
            _thread(slot, pending.collect, clock)
        else:
            _thread(slot, functools.partial(probe.gather, pctx, timeout), clock)
    for slot in slots.values():
        left = slot.deadline - clock()
        if not slot.done.wait(max(0.0, left)):
            slot.settle(
                ProbeError(slot.probe, "timeout", f"{slot.probe} probe did not finish within {slot.budget_s:.3g} s"),
                clock() - started,
            )
    return slots


def _thread(slot: _Slot, fn: Callable[[], Any], clock: Callable[[], float]) -> None:
    def body() -> None:
        t0 = clock()
        try:
            value = fn()
        except Exception as exc:  # noqa: BLE001 - becomes the probe's error
            value = ProbeError(slot.probe, "error", f"{type(exc).__name__}: {exc}")
        slot.settle(value, clock() - t0)

    threading.Thread(target=body, name=f"probe-{slot.probe}", daemon=True).start()


def _judge(
    spec: CheckSpec,
    obs: Observations,
    config: Config,
    ctx: Context,
    slots: dict[str, _Slot],
    clock: Callable[[], float],
) -> CheckResult:
    t0 = clock()
    gathered = max((slots[n].elapsed for n in spec.needs if n in slots), default=0.0)
    try:
        res = spec.evaluate(obs, config.checks[spec.name], ctx)
        if not isinstance(res, CheckResult):
            raise TypeError(f"evaluate returned {type(res).__name__}, not CheckResult")
    except Exception as exc:  # noqa: BLE001 - a check bug is UNKNOWN, never a crash
        res = CheckResult(spec.name, Status.UNKNOWN, f"check failed: {type(exc).__name__}: {exc}")
    return CheckResult(
        res.name, res.status, res.summary, res.action, res.gpu, res.details, duration_s=gathered + (clock() - t0)
    )
