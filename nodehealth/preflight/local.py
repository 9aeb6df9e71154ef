"""This node's side of the pre-flight: health, paths, versions, NCCL. Never acts, needs no privilege.

Order matters: the path children are forked first (before the runner starts any thread), then
the prolog-phase checks run through the runner (``look_only``: no Slurm call, nothing written),
then the path children are collected under their deadline.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

from nodehealth.config.schema import Config
from nodehealth.model import Action, Report, Status
from nodehealth.observations import NvmlSnapshot, Observations
from nodehealth.platform import child
from nodehealth.probes import host

# File systems whose files every node of a cluster sees (by mountinfo's type field).
SHARED_FS = frozenset(
    {
        "nfs",
        "nfs4",
        "lustre",
        "gpfs",
        "beegfs",
        "fhgfs",
        "ceph",
        "cephfs",
        "glusterfs",
        "fuse.glusterfs",
        "cifs",
        "smb3",
        "wekafs",
        "panfs",
        "pvfs2",
        "orangefs",
        "fuse.weka",
        "fuse.juicefs",
        "fuse.cephfs",
        "9p",
        "virtiofs",
        "afs",
        "fuse.gcsfuse",
        "fuse.s3fs",
    }
)
# File systems that live on the node: RAM, an overlay, a local disk.
LOCAL_FS = frozenset(
    {
        "tmpfs",
        "ramfs",
        "devtmpfs",
        "overlay",
        "aufs",
        "squashfs",
        "ext2",
        "ext3",
        "ext4",
        "xfs",
        "btrfs",
        "f2fs",
        "vfat",
        "zram",
    }
)
LOCAL_PREFIXES = ("/tmp", "/var/tmp", "/dev/shm", "/run")
HARDWARE_ACTIONS = (Action.RESET_GPU, Action.REBOOT, Action.INSPECT)


def containing_mount(entries: Sequence[host.MountEntry], path: str) -> Optional[host.MountEntry]:
    """The mount that holds ``path`` (the longest mount point above it; the last one wins)."""
    best: Optional[host.MountEntry] = None
    for e in entries:
        mp = e.mount_point
        if path == mp or path.startswith(mp.rstrip("/") + "/") or mp == "/":
            if best is None or len(mp) >= len(best.mount_point):
                best = e
    return best


def locality(path: str, entry: Optional[host.MountEntry]) -> Optional[str]:
    """Why ``path`` is node-local storage (None: shared, or not known to be local)."""
    for prefix in LOCAL_PREFIXES:
        if path == prefix or path.startswith(prefix + "/"):
            where = f" ({entry.fstype} at {entry.mount_point})" if entry else ""
            return f"under {prefix}{where}"
    if entry is not None and entry.fstype in LOCAL_FS:
        return f"{entry.fstype} at {entry.mount_point}"
    return None


def mountinfo(procfs_root: str = "/proc") -> list[host.MountEntry]:
    try:
        with open(os.path.join(procfs_root, "self", "mountinfo"), encoding="utf-8", errors="surrogateescape") as fh:
            return host.parse_mountinfo(fh.read())
    except OSError:
        return []


def _probe_path(path: str) -> Callable[[], str]:
    """Runs in a child: stat, then read (a directory's listing, a file's first byte)."""

    def run() -> str:
        os.stat(path)
        if os.path.isdir(path):
            with os.scandir(path) as it:
                next(it, None)
            return "dir"
        with open(path, "rb") as fh:
            fh.read(1)
        return "file"

    return run


@dataclass
class PendingPaths:
    paths: tuple[str, ...]
    checkpoints: tuple[str, ...]
    children: list[child.Child]
    trips: host.PendingRoundTrips
    timeout_s: float

    def collect(self, procfs_root: str = "/proc") -> list[dict[str, Any]]:
        outcomes = child.wait_all(self.children, self.timeout_s)
        trips = {t.path: t for t in self.trips.collect()}
        entries = mountinfo(procfs_root)
        out = []
        for path, outcome in zip(self.paths + self.checkpoints, outcomes):
            kind = "checkpoint" if path in self.checkpoints else "path"
            real = os.path.realpath(path) if outcome.ok else os.path.abspath(path)
            entry = containing_mount(entries, real)
            rec: dict[str, Any] = {
                "path": path,
                "kind": kind,
                "ok": outcome.ok,
                "fstype": entry.fstype if entry else None,
                "mount": entry.mount_point if entry else None,
                "local": locality(real, entry),
            }
            if outcome.timed_out:
                rec["error"] = f"did not answer within {self.timeout_s:g} s (hung mount?)"
            elif not outcome.ok:
                rec["error"] = str(outcome.value)
            trip = trips.get(path)
            if trip is not None and outcome.ok and not trip.ok:
                rec["ok"] = False
                rec["error"] = f"not writable: {trip.error}"
            out.append(rec)
        return out


def start_paths(paths: Sequence[str], checkpoints: Sequence[str], timeout_s: float) -> PendingPaths:
    """Fork one child per path (readable?) and a write round trip per checkpoint dir (writable?)."""
    every = tuple(paths) + tuple(checkpoints)
    children = [child.start(_probe_path(p)) for p in every]
    trips = host.start_shared_dirs([p for p in checkpoints if os.path.isdir(p)], timeout_s)
    return PendingPaths(tuple(paths), tuple(checkpoints), children, trips, timeout_s)


def health(report: Report, unknown_policy: str) -> dict[str, Any]:
    """The prolog-phase verdict as the exchange carries it: what is not OK, and whether it is hardware."""
    bad = [r for r in report.results if r.status >= Status.WARN]
    failing = [
        r
        for r in report.results
        if r.status == Status.FAIL or (r.status == Status.UNKNOWN and unknown_policy == "fail")
    ]
    return {
        "status": report.status.name,
        "failed": bool(failing),
        "hardware": any(r.action in HARDWARE_ACTIONS for r in failing),
        "results": [
            {
                "name": r.name,
                "status": r.status.name,
                "summary": r.summary,
                "action": r.action.value,
                "fails": r in failing,
            }
            for r in bad
        ],
    }


def daemon_fault(environ: Mapping[str, str]) -> Optional[dict[str, Any]]:
    """The daemon's fresh verdict, when it holds a fault (``faces.fast.prolog(act=False)``; reads only)."""
    from nodehealth.faces import fast

    got = fast.prolog(environ, act=False)
    if isinstance(got, fast.Fault):
        return {
            "status": got.verdict.status,
            "age_s": round(got.verdict.age_s, 1),
            "results": [c for c in got.report.to_json().get("checks", []) if c.get("status") == "FAIL"],
        }
    return None


def _version(*dists: str) -> Optional[str]:
    for dist in dists:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def facts(obs: Observations) -> dict[str, Any]:
    """What must agree across nodes. torch and NCCL from installed metadata (no import: torch costs seconds)."""
    out: dict[str, Any] = {"kernel": os.uname().release}
    nv = obs.nvml
    if isinstance(nv, NvmlSnapshot):
        out["driver"] = nv.driver_version
        if nv.cuda_driver_version:
            major, minor = divmod(int(nv.cuda_driver_version), 1000)
            out["cuda"] = f"{major}.{minor // 10}"
        out["gpu_count"] = nv.device_count
        names = sorted({g.name for g in nv.gpus if g.name})
        out["gpu_model"] = ", ".join(names) if names else None
    torch = _version("torch")
    if torch:
        out["torch"] = torch
    nccl = _version("nvidia-nccl-cu12", "nvidia-nccl-cu13", "nvidia-nccl-cu11", "nccl4py")
    if nccl:
        out["nccl"] = nccl
    return out


def nccl(cfg: Config, expect_ib: bool, timeout_s: float, node: str) -> dict[str, Any]:
    """This node's NCCL self-test (``nccl_selftest`` through the runner), with the transport when asked."""
    from nodehealth import runner

    name = "nccl_selftest"
    modes = ("nvlink", "ib_loopback") if expect_ib else ("nvlink",)
    settings = dataclasses.replace(
        cfg.checks[name],
        modes=modes,
        require_ib=expect_ib,  # type: ignore[call-arg]
        timeout_s=timeout_s,
    )
    cfg = dataclasses.replace(cfg, checks={**cfg.checks, name: settings})
    outcome = runner.execute(cfg, phase="manual", only=(name,), node=node, own_budget_s=timeout_s + 1.0)
    res = outcome.report.results[0]
    runs = []
    obs = outcome.observations.nccl
    for run in getattr(obs, "runs", ()) or ():
        tr = run.transport
        runs.append(
            {
                "mode": run.mode,
                "runner": run.runner,
                "setup_error": run.setup_error,
                "transport": tr.transport if tr else None,
                "paths": list(tr.paths) if tr else [],
                "network": tr.network if tr else None,
            }
        )
    return {"status": res.status.name, "summary": res.summary, "runs": runs}
