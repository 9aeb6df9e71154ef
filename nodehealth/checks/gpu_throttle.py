"""Time spent throttled per reason as a share of a window, and a power limit set below its default.

NVML counts the time each GPU spent throttled per reason since the driver loaded (the perf-policy
fields, and from driver 580 the HW thermal and power-brake ones: ``probes.nvml_h.THROTTLE_FIELDS``).
One sample says nothing about now, so this check judges the difference over a window: in the epilog
the job (the baseline the prolog wrote: the job's GPUs' counters at its start), elsewhere the time
since the latest reading the state dir keeps (the daemon's previous round, or the last face that read
NVML). A window shorter than ``min_window_s``, longer than ``max_window_s`` (a job's is not capped),
from another boot, of another GPU (UUID) or with a counter that went backwards (driver reload) is not
judged, and the summary says why.

Judged reasons: ``thermal``, ``reliability``, ``board_limit``, ``hw_thermal`` and ``hw_power_brake``
(the GPU or its board protecting itself). Power capping, sync boost and low utilisation are normal
operation and only published as metrics.

Why the defaults: WARN-only, so a site that has not configured the check is never drained by it.
gpud (components/accelerator/nvidia/hw-slowdown/component.go) calls a GPU unhealthy at 0.6 HW-slowdown
events a minute over 10 minutes: a sampled event rate. NVML's counters give the time itself; 10 % of
the window spent throttled for the GPU's own protection is a job running visibly slower, and one short
spike in a long window is not. A power limit below the default (``nvidia-smi -pl``) is a common silent
slowdown (issue 25); a site that caps power on purpose sets ``power_limit = "ignore"``.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from nodehealth.checks.base import CheckSettings, Context, field_error, judge_gpus, setting
from nodehealth.model import Action, CheckResult, Finding, Status
from nodehealth.observations import GpuObservation, JobObservation, Observations
from nodehealth.observations.counters import CounterReading
from nodehealth.observations.record import record

# The drain reason's code (``nh:<code>``, a published contract: never changes meaning) and what it says.
REASON = ("throttle", "GPU throttled for its own protection over a window, or a power limit below its default")

JUDGED = ("thermal", "reliability", "board_limit", "hw_thermal", "hw_power_brake")
_STATUS = {"warn": Status.WARN, "fail": Status.FAIL}


@record
class Settings(CheckSettings):
    throttle: str = setting(
        "warn",
        "status when a GPU spent throttle_warn_pct of the window throttled (thermal, reliability, board limit, HW)",
        choices=("ignore", "warn", "fail"),
    )
    throttle_warn_pct: float = setting(
        10.0, "share of the window spent throttled for one judged reason that is reported", unit="%", min=0.1, max=100
    )
    min_window_s: float = setting(
        10.0, "shortest window judged (a shorter one says too little)", unit="s", min=1, max=3600
    )
    max_window_s: float = setting(
        3600.0,
        "longest window judged since the latest reading (a job's window is not capped)",
        unit="s",
        min=60,
        max=604800,
    )
    power_limit: str = setting(
        "warn",
        "status when a GPU's enforced power limit is below its default limit",
        choices=("ignore", "warn", "fail"),
    )
    power_limit_tolerance_pct: float = setting(
        1.0, "how far below the default the enforced power limit may be", unit="%", min=0, max=90
    )


@record
class Window:
    """The start of the window: the per-GPU counters then, and how long ago that was."""

    gpus: Mapping[str, Any]
    seconds: float
    label: str  # "job 42", "the time since the latest reading"


def window(obs: Observations, settings: Settings) -> tuple[Optional[Window], str]:
    """The window to judge the throttle counters over, or None and why not."""
    job = obs.job
    if isinstance(job, JobObservation) and isinstance(job.baseline, Mapping):
        return _window(job.baseline, job.now, job.boot_id, f"job {job.job_id}", None, settings)
    cr = obs.counter_reading
    if not isinstance(cr, CounterReading):
        return None, "no counter reading"
    if cr.reading is None:
        return None, cr.problem or "no earlier counter reading"
    return _window(cr.reading, cr.now, cr.boot_id, "the time since the latest reading", settings.max_window_s, settings)


def _window(
    rec: Mapping[str, Any], now: float, boot: Optional[str], label: str, longest: Optional[float], settings: Settings
) -> tuple[Optional[Window], str]:
    when, gpus = rec.get("time"), rec.get("gpus")
    if isinstance(when, bool) or not isinstance(when, (int, float)) or not isinstance(gpus, Mapping):
        return None, f"{label}: the earlier reading has no time or counters"
    if rec.get("boot_id") != boot or boot is None:
        return None, f"{label}: the earlier reading is from another boot"
    seconds = now - float(when)
    if seconds < settings.min_window_s:
        return None, f"{label}: {seconds:.0f} s is shorter than min_window_s ({settings.min_window_s:g} s)"
    if longest is not None and seconds > longest:
        return None, f"{label}: {seconds:.0f} s is longer than max_window_s ({longest:g} s)"
    return Window(gpus, seconds, label), ""


def throttled_share(gpu: GpuObservation, win: Window) -> dict[str, float]:
    """Share (0-1) of the window each reason's counter advanced, for the reasons both readings have."""
    before = win.gpus.get(str(gpu.index))
    if not isinstance(before, Mapping) or (before.get("uuid") and gpu.uuid and before.get("uuid") != gpu.uuid):
        return {}
    out = {}
    for reason, ns in gpu.throttle_ns or ():
        old = before.get(f"throttle_{reason}_ns")
        # The job's baseline is read as any JSON object: a value that is no counter is not one.
        if isinstance(old, int) and not isinstance(old, bool) and 0 <= old <= ns < 1 << 64:
            out[reason] = min(1.0, (ns - old) / (win.seconds * 1e9))
    return out


def evaluate(obs: Observations, settings: Settings, ctx: Context) -> CheckResult:
    win, why = window(obs, settings)

    def judge(gpu: GpuObservation) -> Optional[list[Finding]]:
        err = field_error(gpu, "power", "throttle_time")
        if err is not None:
            return [err]
        applies = False
        findings: list[Finding] = []
        limit, default = gpu.power_limit_w, gpu.power_default_limit_w
        if limit is not None and default:
            applies = True
            if settings.power_limit in _STATUS and limit < default * (1 - settings.power_limit_tolerance_pct / 100):
                findings.append(
                    Finding(
                        _STATUS[settings.power_limit],
                        f"GPU {gpu.index}: power limit {limit:g} W, below its default {default:g} W",
                        Action.INSPECT,
                        gpu.index,
                    )
                )
        if win is not None and gpu.throttle_ns:
            share = throttled_share(gpu, win)
            applies = applies or bool(share)
            for reason in JUDGED:
                pct = 100 * share.get(reason, 0.0)
                if settings.throttle in _STATUS and pct >= settings.throttle_warn_pct:
                    findings.append(
                        Finding(
                            _STATUS[settings.throttle],
                            f"GPU {gpu.index}: {reason.replace('_', ' ')} throttling {pct:.0f}% of "
                            f"{win.label} ({win.seconds:.0f} s)",
                            Action.INSPECT,
                            gpu.index,
                        )
                    )
        return findings if applies else None

    where = f"over {win.label} ({win.seconds:.0f} s)" if win is not None else f"(throttle time not judged: {why})"
    where = where.replace("{", "{{").replace("}", "}}")  # the summary is a format string ({n})
    return judge_gpus(obs, ctx, judge, "{n} GPU(s) at their default power limit, not throttled " + where)
