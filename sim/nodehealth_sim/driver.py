"""The simulated NVIDIA driver: the fake ``libnvidia-ml.so.1`` of ``sim/nodehealth_sim/fakenvml`` (docs/fake-nvml.md).

One library per driver branch (built when nodehealth-sim is installed, into the package's
``fakenvml/build/<branch>/``; ``nodehealth_sim.fakenvml_build``), each exporting
exactly the NVML symbols of that branch's ``nvml.h``. The real, unmodified pynvml runs over it: :func:`preload`
loads the branch's library with ``RTLD_GLOBAL`` under its soname, so pynvml's own ``CDLL("libnvidia-ml.so.1")``
is resolved by the dynamic loader to the object already in the process. The library reads the node from
:data:`SPEC_ENV` (the spec text itself) at every ``nvmlInit*`` and, when :data:`LOG_ENV` names a file, appends a
line per NVML call there (:func:`read_log`).
"""

from __future__ import annotations

import ctypes
import os
import pathlib
from dataclasses import dataclass
from typing import Optional

# BRANCHES: the driver branches simulated, each built against the nvml.h of its CUDA release (symbols.tsv cites
# the commits); the build at install time (fakenvml_build) and the loader share them.
from nodehealth_sim.fakenvml_build import BRANCHES, SONAME

__all__ = [
    "BRANCHES",
    "SONAME",
    "SPEC_ENV",
    "LOG_ENV",
    "BUILD_DIR",
    "FakeDriverMissing",
    "branch_for",
    "library_path",
    "preload",
    "Call",
    "read_log",
]
SPEC_ENV = "NODEHEALTH_FAKE_NVML_SPEC"
LOG_ENV = "NODEHEALTH_FAKE_NVML_LOG"
BUILD_DIR = pathlib.Path(__file__).resolve().parent / "fakenvml" / "build"

_preloaded: dict[int, ctypes.CDLL] = {}


class FakeDriverMissing(Exception):
    """The simulated driver library for a branch is not built."""


def branch_for(driver_version: str) -> int:
    """The simulated branch for a driver version: its major number's nearest branch at or below, the lowest as
    floor ("550.127.05" -> 550, "560.35" -> 550, "590" -> 580, "460.32.03" -> 470)."""
    head = driver_version.strip().split(".", 1)[0]
    if not head.isdigit():
        raise ValueError(f"not a driver version: {driver_version!r}")
    major = int(head)
    at_or_below = [b for b in BRANCHES if b <= major]
    return max(at_or_below) if at_or_below else BRANCHES[0]


def library_path(branch: int) -> pathlib.Path:
    """The built library of ``branch``; FakeDriverMissing (saying how to build it) when it is not there."""
    if branch not in BRANCHES:
        raise ValueError(f"{branch} is not a simulated driver branch (one of: {', '.join(map(str, BRANCHES))})")
    path = BUILD_DIR / str(branch) / SONAME
    if not path.is_file():
        raise FakeDriverMissing(
            f"the simulated NVIDIA driver for branch {branch} is not built ({path} is missing): "
            "install nodehealth-sim again (pip install ./sim in the source tree, `make fakenvml` "
            "for the dev venv; needs a C compiler, cc)"
        )
    return path


def preload(branch: int) -> ctypes.CDLL:
    """Load ``branch``'s library into this process under its soname, before pynvml loads ``libnvidia-ml.so.1``.

    A process holds one NVML: a second branch cannot be preloaded after the first (the loader would keep
    answering the soname with the first)."""
    if branch in _preloaded:
        return _preloaded[branch]
    if _preloaded:
        (other,) = _preloaded
        raise RuntimeError(
            f"the simulated driver of branch {other} is already loaded in this process; "
            f"branch {branch} needs a new process"
        )
    path = library_path(branch)
    lib = ctypes.CDLL(str(path), mode=os.RTLD_GLOBAL | os.RTLD_NOW)
    _preloaded[branch] = lib
    return lib


@dataclass(frozen=True)
class Call:
    """One NVML call as the library logged it."""

    symbol: str  # the exported symbol called, e.g. nvmlDeviceGetHandleByIndex_v2
    gpu: int  # the GPU index it was about (the index argument of nvmlDeviceGetHandleByIndex*), -1 for none
    rc: int  # the nvmlReturn_t it returned
    elapsed_us: int  # from entry to return, injected delays included
    values: Optional[int] = None  # nvmlDeviceGetFieldValues: how many values were asked for


def read_log(path: str | os.PathLike[str]) -> list[Call]:
    """The calls logged in ``path`` (``<symbol> <gpu> <rc> <elapsed_us> [<values>]`` a line), oldest first; an
    absent file is no calls. A line cut short (a process killed mid-write) is skipped."""
    try:
        text = pathlib.Path(path).read_text()
    except FileNotFoundError:
        return []
    calls = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) not in (4, 5):
            continue
        try:
            nums = [int(p) for p in parts[1:]]
        except ValueError:
            continue
        calls.append(Call(parts[0], nums[0], nums[1], nums[2], nums[3] if len(nums) == 4 else None))
    return calls
