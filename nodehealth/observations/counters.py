"""The latest per-GPU counter reading the state dir keeps, as the start of a window."""

from __future__ import annotations

from typing import Any, Mapping, Optional

from nodehealth.observations.record import record


@record
class CounterReading:
    """The latest per-GPU counter reading kept in the state dir (``statedir.counters``), read before
    this run writes its own: the start of the window a rate is judged over (``gpu_throttle``)."""

    reading: Optional[Mapping[str, Any]]  # None: no usable reading (``problem`` says why)
    problem: Optional[str]
    boot_id: Optional[str]  # this boot's id, to refuse a reading from another boot
    now: float  # Unix time of this observation (the end of the window)
