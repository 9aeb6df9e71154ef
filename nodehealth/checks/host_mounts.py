"""Required file systems are mounted, of the right type, writable and with free space."""

from __future__ import annotations

import os

from nodehealth.checks.base import CheckSettings, Context, result, setting
from nodehealth.model import CheckResult, Finding, Status, fold
from nodehealth.observations import MountObservation, Observations, ProbeError
from nodehealth.observations.record import record

# The drain reason's code (``nh:<code>``, a published contract: never changes meaning) and what it says.
REASON = ("mount", "a required file system missing, of the wrong type, read-only or full")

GIB = 1 << 30


@record
class MountSpec:
    """One required mount point (an element of ``mounts``)."""

    path: str = setting("", "the mount point, an absolute path")
    fstype: str = setting("", 'required file-system type as mountinfo names it (nfs4, lustre, xfs, gpfs ...); "" = any')
    writable: bool = setting(True, "FAIL when the file system is mounted read-only")
    min_free_gib: float = setting(
        0.0,
        "FAIL when less than this is free (for unprivileged users); 0 = not checked",
        unit="GiB",
        min=0,
        max=1 << 30,
    )


@record
class Settings(CheckSettings):
    mounts: tuple[MountSpec, ...] = setting(
        (),
        'required mounts, an array of tables with keys path, fstype ("" = any), writable '
        "(default true), min_free_gib (GiB, 0 = not checked), e.g. "
        '[{ path = "/scratch", fstype = "lustre", min_free_gib = 100.0 }]; empty = check skipped',
    )
    timeout_s: float = setting(
        5.0,
        "deadline for reading mountinfo and statvfs of every mount (a hung mount is a FAIL)",
        unit="s",
        min=0.1,
        max=600,
    )


def evaluate(obs: Observations, settings: Settings, ctx: Context) -> CheckResult:
    if not settings.mounts:
        return result(ctx, Status.SKIPPED, "no mounts configured")
    if isinstance(obs.mounts, ProbeError):
        if obs.mounts.kind == "timeout":  # cut off by the runner: as good as a hung mount
            return result(ctx, Status.FAIL, f"mounts did not answer: {obs.mounts.message}")
        return result(ctx, Status.UNKNOWN, f"cannot read mounts: {obs.mounts.message}")
    if obs.mounts is None:
        return result(ctx, Status.UNKNOWN, "mounts were not probed")
    seen = {os.path.normpath(m.path): m for m in obs.mounts}
    findings: list[Finding] = []
    details: dict[str, dict[str, object]] = {}
    for spec in settings.mounts:
        if not os.path.isabs(spec.path):
            findings.append(Finding(Status.UNKNOWN, f"mount path {spec.path!r} is not absolute (config)"))
            continue
        found = seen.get(os.path.normpath(spec.path))
        if found is None:
            findings.append(Finding(Status.UNKNOWN, f"{spec.path}: not probed"))
            continue
        details[spec.path] = _facts(found)
        findings.extend(_judge(spec, found))
    ok = f"{len(settings.mounts)} mount(s) present" + (
        "" if not details else ": " + ", ".join(f"{p} ({d.get('fstype')})" for p, d in details.items())
    )
    return fold(ctx.name, findings, ok, {"mounts": details})


def _judge(spec: MountSpec, m: MountObservation) -> list[Finding]:
    if not m.present:
        return [Finding(Status.FAIL, f"{spec.path}: not mounted")]
    out = []
    if spec.fstype and m.fstype != spec.fstype:
        out.append(Finding(Status.FAIL, f"{spec.path}: {m.fstype} from {m.source} mounted, {spec.fstype} expected"))
    if spec.writable and m.read_only:
        out.append(Finding(Status.FAIL, f"{spec.path}: mounted read-only"))
    if m.error is not None:
        out.append(Finding(Status.FAIL, f"{spec.path}: {m.error}"))
    elif spec.min_free_gib:
        if m.free_bytes is None:
            out.append(Finding(Status.UNKNOWN, f"{spec.path}: free space unknown"))
        elif m.free_bytes < spec.min_free_gib * GIB:
            out.append(
                Finding(Status.FAIL, f"{spec.path}: {m.free_bytes / GIB:.1f} GiB free, below {spec.min_free_gib:g} GiB")
            )
    return out


def _facts(m: MountObservation) -> dict[str, object]:
    facts: dict[str, object] = {"present": m.present}
    if m.present:
        facts.update(fstype=m.fstype, source=m.source, read_only=m.read_only)
        if m.total_bytes is not None and m.free_bytes is not None:
            facts.update(total_gib=round(m.total_bytes / GIB, 2), free_gib=round(m.free_bytes / GIB, 2))
        if m.error is not None:
            facts["error"] = m.error
    return facts
