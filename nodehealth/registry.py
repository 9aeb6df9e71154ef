"""The one explicit, ordered list of checks.

A check is a module (``Settings`` + ``evaluate`` + ``REASON``, its drain-reason code) and one line
here, which names the module by string: it is imported when a run, the config or a command first
needs it, so ``import nodehealth.registry`` costs no check module. Order is the order of
the report. ``needs`` names the probes (``nodehealth.probes.PROBES``) whose observations the
check judges; the runner gathers only what the enabled checks need.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING, Callable

from nodehealth.observations.record import record

if TYPE_CHECKING:
    from nodehealth.checks.base import CheckSettings

# The phases, in order: a face runs one. Their budgets are config (``config.schema.Phases``, one field
# per name here, ``[phases.<name>] budget_s``); the registry names them so a check can say where it runs.
PHASES: tuple[str, ...] = ("prolog", "epilog", "healthcheck", "manual", "daemon")
ALL = frozenset(PHASES)
EPILOG = frozenset({"epilog"})
# The NCCL self-test takes seconds: never the prolog's; the epilog's and by hand when enabled; the
# daemon runs it on its own schedule while the node is idle (daemon/selftest.py), not in every round.
SELFTEST = frozenset({"epilog", "manual"})


@record
class CheckSpec:
    """One registered check.

    cost: ``cheap`` (milliseconds, fine before every job) or ``slow`` (seconds: health-check
    interval or daemon only unless configured otherwise).
    """

    name: str
    module_name: str  # under nodehealth.checks; imported on first use, so a run pays only for its checks
    needs: tuple[str, ...]
    phases: frozenset[str]
    default_enabled: bool
    cost: str
    description: str = ""
    # Probes the check reads too, whose deadline it does not set while a check that needs
    # them runs: gpu_xid names the GPU of an XID from NVML, but NVML's deadline is the GPU
    # checks' timeout_s, not gpu_xid's (alone, the check's own timeout_s applies).
    uses: tuple[str, ...] = ()

    @property
    def module(self) -> ModuleType:
        """The check's module (``nodehealth.checks.<module_name>``), imported now if not yet."""
        return importlib.import_module(f"nodehealth.checks.{self.module_name}")

    @property
    def reason(self) -> tuple[str, str]:
        """The drain reason's code and its meaning (the module's ``REASON``: docs/operations.md's table)."""
        code, meaning = self.module.REASON
        return str(code), str(meaning)

    @property
    def settings_class(self) -> type[CheckSettings]:
        cls: type[CheckSettings] = self.module.Settings
        return cls

    @property
    def evaluate(self) -> Callable[..., object]:
        fn: Callable[..., object] = self.module.evaluate
        return fn

    @property
    def summary(self) -> str:
        # The docstring's first line, its reST markup dropped: list-checks and the man page print it as it reads.
        return self.description or (self.module.__doc__ or "").strip().splitlines()[0].replace("``", "")


_GPU = ("nvml", "pci_gpus", "slurm_node")

CHECKS: tuple[CheckSpec, ...] = (
    #         name                   module               needs          phases  default cost
    # The epilog's judgement of the job that just ended (first in its report, as its summary names the job).
    CheckSpec("job_forensics", "job_forensics", ("job", "xid"), EPILOG, True, "cheap", uses=("nvml",)),
    CheckSpec("nvml", "nvml", _GPU, ALL, True, "cheap"),
    CheckSpec("gpu_count", "gpu_count", _GPU, ALL, True, "cheap"),
    CheckSpec("gpu_driver", "gpu_driver", _GPU, ALL, True, "cheap"),
    CheckSpec("gpu_temperature", "gpu_temperature", _GPU, ALL, True, "cheap"),
    CheckSpec("gpu_throttle", "gpu_throttle", _GPU, ALL, True, "cheap", uses=("job", "counter_reading")),
    CheckSpec("gpu_ecc", "gpu_ecc", _GPU, ALL, True, "cheap"),
    CheckSpec("gpu_retired_pages", "gpu_retired_pages", _GPU, ALL, True, "cheap"),
    CheckSpec("gpu_remapped_rows", "gpu_remapped_rows", _GPU, ALL, True, "cheap"),
    CheckSpec("gpu_pcie", "gpu_pcie", _GPU, ALL, True, "cheap"),
    CheckSpec("gpu_nvlink", "gpu_nvlink", _GPU, ALL, True, "cheap"),
    CheckSpec("gpu_fabric", "gpu_fabric", _GPU, ALL, True, "cheap"),
    CheckSpec("gpu_recovery_action", "gpu_recovery_action", _GPU, ALL, True, "cheap"),
    CheckSpec("gpu_persistence", "gpu_persistence", _GPU, ALL, True, "cheap"),
    CheckSpec("gpu_processes", "gpu_processes", _GPU + ("job", "node_jobs"), ALL, True, "cheap"),
    CheckSpec("gpu_xid", "gpu_xid", ("xid",), ALL, True, "cheap", uses=("nvml",)),
    # NVSwitch SXids from the same kernel-log store (a node without NVSwitches logs none: OK).
    CheckSpec("gpu_sxid", "gpu_sxid", ("xid",), ALL, True, "cheap"),
    CheckSpec("host_memory", "host_memory", ("memory",), ALL, True, "cheap"),
    CheckSpec("host_mounts", "host_mounts", ("mounts",), ALL, True, "cheap"),
    # Cheap: milliseconds on a healthy file system, and a hung one costs at most its deadline.
    CheckSpec("host_shared_dir", "host_shared_dir", ("shared_dirs",), ALL, True, "cheap"),
    CheckSpec("host_infiniband", "host_infiniband", ("infiniband",), ALL, True, "cheap"),
    # WARN-only by default (each module says why); the D-state scan forks a child and reads /proc.
    CheckSpec("host_pcie_aer", "host_pcie_aer", ("pcie_aer",), ALL, True, "cheap"),
    CheckSpec("host_edac", "host_edac", ("edac",), ALL, True, "cheap"),
    CheckSpec("host_dstate", "host_dstate", ("dstate",), ALL, True, "cheap"),
    # On by default: it demands a unit only where the node shows it needs one (the module says why).
    CheckSpec("host_services", "host_services", ("services",), ALL, True, "cheap"),
    # Off by default (seconds, the GPUs busy): enabled = true runs it in the epilog and `nodehealth check`.
    CheckSpec("nccl_selftest", "nccl_selftest", ("nccl",), SELFTEST, False, "slow", uses=("nvml",)),
)

BY_NAME: dict[str, CheckSpec] = {spec.name: spec for spec in CHECKS}


def select(phase: str, enabled: dict[str, bool], only: tuple[str, ...] = ()) -> tuple[CheckSpec, ...]:
    """The checks to run in ``phase``: ``only`` if given (any phase), else the enabled ones."""
    if only:
        return tuple(spec for spec in CHECKS if spec.name in only)
    return tuple(spec for spec in CHECKS if phase in spec.phases and enabled.get(spec.name, spec.default_enabled))
