"""Starting the daemon as a subprocess for tests and the benchmark."""

from __future__ import annotations

import os
import resource
import site
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Optional

from nodehealth.registry import CHECKS

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "examples" / "scenarios"
# The checks that judge only the (simulated) GPUs, from the registry.
GPU_CHECKS = tuple(
    spec.name for spec in CHECKS if "nvml" in spec.needs and set(spec.needs) <= {"nvml", "pci_gpus", "slurm_node"}
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_config(
    tmp: Path,
    scenario: str,
    port: int,
    interval_s: float = 1.0,
    nvml_timeout_s: Optional[float] = None,
    extra: str = "",
    kmsg_path: Optional[str] = None,
) -> Path:
    """The daemon's config in ``tmp``; its kernel log an empty file there unless ``kmsg_path`` names one
    (the benchmark's /dev/kmsg, read only)."""
    state = tmp / "state"
    kmsg = Path(kmsg_path) if kmsg_path else tmp / "kmsg"
    if not kmsg_path:
        kmsg.touch()
    lines = [
        'node_name = "gpu001"',
        "[nvml]",
        f'simulate = "{SCENARIOS / (scenario + ".toml")}"',
        "[paths]",
        f'state_dir = "{state}"',
        "[daemon]",
        f'listen = "127.0.0.1:{port}"',
        f"interval_s = {interval_s}",
        "slurm_actions = false",
    ]
    body = "\n".join(lines) + "\n" + extra + "\n"
    body += f'[checks.gpu_xid]\nkmsg_path = "{kmsg}"\n'
    if nvml_timeout_s is not None:
        for name in GPU_CHECKS:
            body += f"[checks.{name}]\ntimeout_s = {nvml_timeout_s}\n"
    path = tmp / "nodehealth.toml"
    path.write_text(body)
    return path


def start(config: Path, env: Optional[dict[str, str]] = None) -> subprocess.Popen[bytes]:
    e = dict(os.environ)
    e.pop("NOTIFY_SOCKET", None)
    e.update(env or {})
    return subprocess.Popen(
        [sys.executable, "-m", "nodehealth", "daemon", "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=e,
        cwd=str(ROOT),
    )


def get(url: str, timeout: float = 2.0) -> tuple[int, bytes, float]:
    t0 = time.perf_counter()
    with urllib.request.urlopen(url, timeout=timeout) as r:
        body = r.read()
        return r.status, body, time.perf_counter() - t0


def wait_for(url: str, predicate: object = None, timeout: float = 20.0) -> bytes:
    end = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < end:
        try:
            _, body, _ = get(url)
            if predicate is None or predicate(body):  # type: ignore[operator]
                return body
        except OSError as exc:
            last = exc
        time.sleep(0.1)
    raise AssertionError(f"{url} not ready in {timeout} s ({last})")


def stop(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> tuple[int, str]:
    if proc.poll() is None:
        proc.terminate()
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate(timeout=5)
    return proc.returncode, err.decode("utf-8", "replace")


def sample(text: str, name: str, **labels: str) -> Optional[float]:
    """The value of the first sample of ``name`` whose labels include ``labels``."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            return float(value)
    return None


NOBODY = 65534


def _searchable_by_all(path: str) -> bool:
    parts = Path(path).parts
    dirs = [Path(*parts[:i]) for i in range(1, len(parts))]
    return all(os.stat(d).st_mode & 0o001 for d in dirs) and bool(os.stat(path).st_mode & 0o001)


def unprivileged_python(tree: Path = ROOT) -> Optional[tuple[str, dict[str, str]]]:
    """A Python that user nobody can run with ``tree`` and this one's dependencies, and its
    environment; None when there is none. A Python under root's home is not searchable by
    others: then the system's of the same version, given this one's site-packages."""
    env = {k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"}
    # The simulator is its own distribution in tree/sim (installed editable: a .pth file, which a
    # PYTHONPATH entry does not run), so it goes on the path beside the agent.
    env["PYTHONPATH"] = os.pathsep.join([str(tree), str(tree / "sim")])
    mine = os.path.realpath(sys.executable)
    if _searchable_by_all(mine):
        return mine, env
    system = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"
    if not os.path.exists(system) or not _searchable_by_all(system):
        return None
    return system, dict(env, PYTHONPATH=os.pathsep.join([env["PYTHONPATH"], *site.getsitepackages()]))


def as_nobody_with_tasks(tasks: int):  # type: ignore[no-untyped-def]
    """A ``preexec_fn``: become user nobody with RLIMIT_NPROC ``tasks`` (threads count), as a
    unit's ``TasksMax`` would bound the daemon (root is exempt from RLIMIT_NPROC)."""

    def drop() -> None:
        resource.setrlimit(resource.RLIMIT_NPROC, (tasks, tasks))
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)

    return drop
