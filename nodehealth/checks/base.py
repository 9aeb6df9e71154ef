"""What every check shares: its settings base class and the context it is judged in.

A check is a module with a ``Settings`` dataclass (subclass of ``CheckSettings``) and a pure
``evaluate(obs, settings, ctx) -> CheckResult``. Config validation reads the fields of
``Settings`` (with their ``metadata``: unit, min, max, choices, doc), so a check's keys are
declared exactly once.
"""

from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import Any, Callable, Optional, Sequence, TypeVar, Union

from nodehealth.model import Action, CheckResult, Finding, Status, fold
from nodehealth.observations import (
    GpuObservation,
    NvmlSnapshot,
    Observations,
    PciGpus,
    ProbeError,
    SlurmNode,
)
from nodehealth.observations.record import record


def setting(
    default: Any,
    doc: str,
    unit: str = "",
    min: Optional[float] = None,
    max: Optional[float] = None,
    choices: Optional[tuple[Any, ...]] = None,
) -> Any:
    """A config field with its documentation and bounds (read by the config validator)."""
    meta = {"doc": doc, "unit": unit, "min": min, "max": max, "choices": choices}
    if isinstance(default, (list, dict)):
        raise TypeError("use tuples for sequence defaults")
    return field(default=default, metadata=meta)


@record
class CheckSettings:
    """Keys every ``[checks.<name>]`` table accepts."""

    enabled: Optional[bool] = setting(None, "run this check; unset = the registry's default for the check")
    timeout_s: float = setting(10.0, "deadline for gathering this check's observations", unit="s", min=0.1, max=600)

    def validate(self) -> None:
        """Checks beyond type and range (a ValueError names the problem); called at config load."""


@record
class Context:
    """What a check may know besides its observations and its own settings."""

    name: str
    phase: str
    node: str
    expected_gpus: Union[int, str]  # [gpu] expected_count: a number or "auto"


def result(
    ctx: Context, status: Status, summary: str, action: Action = Action.NONE, gpu: Optional[int] = None, **details: Any
) -> CheckResult:
    return CheckResult(ctx.name, status, summary, action=action, gpu=gpu, details=details)


def nvml_gate(obs: Observations, ctx: Context) -> Optional[CheckResult]:
    """The common answer of a per-GPU check when there is no NVML data to judge.

    Returns None when the snapshot is usable. When NVML is unavailable on a node where no
    GPU is expected the check does not apply (SKIPPED); when GPUs are expected it is
    UNKNOWN here, and the ``nvml`` check carries the FAIL. A snapshot cut off at its deadline
    before any GPU was read is no data either (UNKNOWN), not "no GPU".
    """
    obs_nvml = obs.nvml
    if isinstance(obs_nvml, NvmlSnapshot):
        if not obs_nvml.complete and not obs_nvml.gpus:  # cut off before any GPU was read
            # The runner's words for a probe past its deadline (runner.gather): one cause, one text.
            return result(
                ctx, Status.UNKNOWN, f"no NVML data: nvml probe did not finish within {obs_nvml.timeout_s:.3g} s"
            )
        return None
    reason = obs_nvml.message if isinstance(obs_nvml, ProbeError) else "NVML was not probed"
    if isinstance(obs_nvml, ProbeError) and obs_nvml.kind == "unavailable" and not gpus_expected(obs, ctx):
        return result(ctx, Status.SKIPPED, no_gpu_expected(obs, ctx, reason))
    return result(ctx, Status.UNKNOWN, f"no NVML data: {reason}")


def expected_gpu_count(obs: Observations, ctx: Context) -> tuple[Optional[int], str]:
    """How many GPUs this node should have, and where that number came from.

    A configured number wins. ``auto``: this node's ``Gres=gpu:N`` in Slurm when slurmctld
    answered, else the NVIDIA GPUs on the PCI bus (a GPU that vanished from NVML usually
    still shows on PCI), else unknown (None).
    """
    if isinstance(ctx.expected_gpus, int):
        return ctx.expected_gpus, "config"
    if isinstance(obs.slurm_node, SlurmNode) and obs.slurm_node.gres_gpus is not None:
        return obs.slurm_node.gres_gpus, "slurm gres"
    if isinstance(obs.pci_gpus, PciGpus):
        return len(obs.pci_gpus.bus_ids), f"pci ({obs.pci_gpus.source})"
    return None, "unknown"


def gpus_expected(obs: Observations, ctx: Context) -> bool:
    count, _ = expected_gpu_count(obs, ctx)
    return count is None or count > 0


# Why no GPU is expected, by expected_gpu_count's source: an admin reading "no GPU expected" on a GPU
# node learns what said so.
_NONE_EXPECTED = {"config": "[gpu] expected_count = 0", "slurm gres": "Slurm's Gres names no GPU here"}


def no_gpu_expected(obs: Observations, ctx: Context, why: str) -> str:
    """The SKIPPED summary of a GPU check on a node where no GPU is expected and NVML is unavailable."""
    _, source = expected_gpu_count(obs, ctx)
    said = _NONE_EXPECTED.get(source, "no NVIDIA GPU on the PCI bus" if source.startswith("pci") else source)
    return f"no GPU expected ({said}) and NVML not available ({why})"


def nvml_snapshot(obs: Observations, ctx: Context) -> Union[NvmlSnapshot, CheckResult]:
    """The NVML snapshot a per-GPU check judges, or ``nvml_gate``'s answer when there is none to judge."""
    gate = nvml_gate(obs, ctx)
    if gate is not None:
        return gate
    assert isinstance(obs.nvml, NvmlSnapshot)
    return obs.nvml


Judge = Callable[[GpuObservation], Optional[Sequence[Finding]]]


def judge_gpus(obs: Observations, ctx: Context, judge: Judge, ok_summary: str) -> CheckResult:
    """Run a per-GPU judgement over the NVML snapshot and fold it into one result.

    ``judge`` returns None when the check does not apply to that GPU (not supported), else
    its findings (an empty list means fine). If it applies to no GPU the result is SKIPPED.
    ``ok_summary`` may use ``{n}``, the number of GPUs judged.
    """
    snap = nvml_snapshot(obs, ctx)
    if isinstance(snap, CheckResult):
        return snap
    findings: list[Finding] = []
    judged: list[int] = []
    not_applicable: list[int] = []
    not_read: list[int] = []
    for gpu in snap.gpus:
        if gpu.lost or gpu.unreachable:
            not_read.append(gpu.index)
            continue  # the nvml check reports a lost or unreachable GPU
        verdict = judge(gpu)
        if verdict is None:
            not_applicable.append(gpu.index)
            continue
        judged.append(gpu.index)
        findings.extend(verdict)
    details: dict[str, Any] = {"gpus_judged": judged}
    if not_applicable:
        details["not_supported_on"] = not_applicable
    if not_read:
        details["not_read"] = not_read
    if not judged and not_read and not not_applicable:
        # Nothing was read, which is not "does not apply": the nvml check carries the failure.
        return result(
            ctx,
            Status.UNKNOWN,
            f"not read: NVML failed on GPU(s) {', '.join(map(str, not_read))} (see the nvml check)",
            **details,
        )
    if not judged:
        why = "no GPU" if not snap.gpus else "not supported on this GPU/driver"
        return result(ctx, Status.SKIPPED, f"does not apply: {why}", **details)
    bad = [f for f in findings if f.status > Status.OK]
    if bad:
        details["gpus"] = {str(f.gpu): f.message for f in bad if f.gpu is not None}
    folded = fold(ctx.name, findings, ok_summary.format(n=len(judged)), details)
    if not snap.complete and snap.device_count is not None:
        unread = snap.device_count - len(snap.gpus)
        details["gpus_not_read"] = unread
        folded = dataclasses.replace(
            folded,
            summary=f"{folded.summary} ({unread} GPU(s) not read: NVML "
            f"{'too slow for the budget' if snap.stop == 'budget' else 'stopped answering'})",
            details=details,
        )
    return folded


def field_error(gpu: GpuObservation, *fields: str) -> Optional[Finding]:
    """An UNKNOWN finding when NVML failed (other than "not supported") on one of ``fields``."""
    for err in gpu.errors:
        if err.field in fields:
            action = (
                Action.REBOOT
                if err.kind == "gpu_lost"
                else (Action.RESET_GPU if err.kind == "reset_required" else Action.NONE)
            )
            status = Status.FAIL if err.kind in ("gpu_lost", "reset_required") else Status.UNKNOWN
            return Finding(status, f"GPU {gpu.index}: {err.field}: {err.message}", action, gpu.index)
    return None


T = TypeVar("T")


def probe_data(
    x: Union[T, ProbeError, None], ctx: Context, cannot: str, missing: str, error_kind: bool = False
) -> Union[T, CheckResult]:
    """A probe's observation to judge, or the check's answer when the probe gave nothing: not probed
    (UNKNOWN, ``missing``), not on this node (SKIPPED, "does not apply"), failed (UNKNOWN, ``cannot:
    <why>``; with ``error_kind`` the probe's error kind in the details). A caller returns a CheckResult
    as it is: ``if isinstance(got, CheckResult): return got``."""
    if x is None:
        return result(ctx, Status.UNKNOWN, missing)
    if isinstance(x, ProbeError):
        if x.kind == "unavailable":
            return result(ctx, Status.SKIPPED, f"does not apply: {x.message}")
        if error_kind:
            return result(ctx, Status.UNKNOWN, f"{cannot}: {x.message}", error_kind=x.kind)
        return result(ctx, Status.UNKNOWN, f"{cannot}: {x.message}")
    return x


def kernel_log_data(x: Union[T, ProbeError, None], ctx: Context, what: str) -> Union[T, CheckResult]:
    """``probe_data`` of a kernel-log check (``gpu_xid``, ``gpu_sxid``) over the ``xid`` probe."""
    return probe_data(x, ctx, f"cannot watch {what}", "the kernel log was not read", error_kind=True)
