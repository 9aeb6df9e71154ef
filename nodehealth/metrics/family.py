"""One row of the metrics table (``families.FAMILIES``) and what a rendering publishes of it.

A row says what a family is: its exposed name, type (``gauge``, ``counter`` or ``info``), label
names (with their values where the set is fixed), the HELP text, the unit its name ends in, and
which section of docs/metrics.md lists it. It also says what the default page carries of it
(the series budget, docs/metrics.md): a ``detail`` family is published only with
``[daemon] metrics_detail = true``; a family with a ``quiet`` value leaves out, by default, the
samples that have it (the healthy value: a link that is up, a throttle reason not active); a
label with ``default_values`` takes only those values by default.

An ``info`` family has the value 1 and carries its data in labels; the Prometheus text format
exposes it as a gauge whose name ends in ``_info``. A counter's name ends in ``_total``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Optional

GAUGE, COUNTER, INFO = "gauge", "counter", "info"

# The labels of every per-GPU family (NVML index, UUID, PCI address, NVML name).
GPU = ("gpu", "uuid", "pci_bus_id", "model")

# What one series of a family stands for, beyond the GPU (``Family.per``): "" one per combination
# of the fixed label values; "one": one of them at a time; "check", "probe", "link", "mode": one per
# check that ran, probe, NVLink link, NCCL self-test mode (times the fixed values); "event": none
# on a node where nothing happened (one per distinct event after).
PER = ("", "one", "check", "probe", "link", "mode", "event")


@dataclass(frozen=True, eq=False)
class Family:
    """One row of the table."""

    section: str  # the docs/metrics.md table that lists it
    name: str  # as exposed: counters end in _total, info families in _info
    type: str  # GAUGE, COUNTER or INFO
    labels: tuple[str, ...]
    help: str  # the HELP line
    unit: str = ""  # base unit the name ends in (seconds, bytes, ...); "" for counts and states
    values: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # label -> every value it takes
    note: str = ""  # what docs/metrics.md says beyond the HELP line
    detail: bool = False  # published only with [daemon] metrics_detail = true
    quiet: Optional[float] = None  # by default, samples with this value (the healthy one) are left out
    default_values: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # label -> values by default
    per: str = ""  # what one series stands for (PER), for the series budget

    @property
    def base(self) -> str:
        """The name without the suffix the text format adds back (``_total``, ``_info``)."""
        suffix = {COUNTER: "_total", INFO: "_info"}.get(self.type, "")
        return self.name[: -len(suffix)] if suffix else self.name

    @property
    def per_gpu(self) -> bool:
        return self.labels[: len(GPU)] == GPU

    def published(self, labels: Mapping[str, str], value: float, detail: bool) -> bool:
        """Whether a sample is on the page: always with ``detail``, else by ``detail``, ``quiet``
        and ``default_values``."""
        if detail:
            return True
        if self.left_out(value):
            return False
        return all(labels[k] in allowed for k, allowed in self.default_values.items())

    def left_out(self, value: float) -> bool:
        """Off the default page whatever its labels: a detail family, or the quiet value."""
        return self.detail or (self.quiet is not None and value == self.quiet)


def row(
    section: str,
    name: str,
    typ: str,
    labels: tuple[str, ...],
    help: str,
    unit: str = "",
    values: Optional[Mapping[str, tuple[str, ...]]] = None,
    note: str = "",
    detail: bool = False,
    quiet: Optional[float] = None,
    default_values: Optional[Mapping[str, tuple[str, ...]]] = None,
    per: str = "",
) -> Family:
    if per not in PER:
        raise ValueError(f"{name}: per={per!r} not one of {PER}")
    return Family(
        section, name, typ, labels, help, unit, dict(values or {}), note, detail, quiet, dict(default_values or {}), per
    )
