"""A face's deadline, counted from the start of its process (standard library only).

slurmd counts a prolog's time from the moment it started the script; so does this deadline.
``Deadline.from_process_start(budget_s)`` subtracts what the interpreter's start-up and the
imports before it already took (``/proc/self/stat`` start time against ``CLOCK_BOOTTIME``),
so config load, the checks and every Slurm call all fit in the one budget. ``call_timeout``
gives a call at most what is left; with almost nothing left it gives None: no call is started
that would outlive the budget.
"""

from __future__ import annotations

import os
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Optional

MIN_CALL_S = 0.05  # below this, a call (an scontrol round trip) is not worth starting
# A process older than this when its deadline is set was not started for this run (a test
# harness or another long-lived caller running a face in-process): its run counts from now.
STARTUP_ALLOWANCE_S = 5.0


def process_age_s(procfs_root: str = "/proc") -> float:
    """Seconds since this process started (0.0 when it cannot be told)."""
    from nodehealth.statedir.verdict import start_ticks  # the one reader of a process's start time

    ticks = start_ticks("self", procfs_root)
    if ticks is None:
        return 0.0
    try:
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, AttributeError):
        return 0.0
    return age if 0.0 <= age < 3600.0 else 0.0


class Deadline:
    """The end of a budget on the monotonic clock."""

    __slots__ = ("clock", "end", "budget_s")

    def __init__(self, budget_s: float, clock: Optional[Callable[[], float]] = None, spent_s: float = 0.0) -> None:
        self.clock = clock or time.monotonic
        self.budget_s = budget_s
        self.end = self.clock() + budget_s - spent_s

    @classmethod
    def from_process_start(cls, budget_s: float, procfs_root: str = "/proc") -> Deadline:
        """``budget_s`` counted from the process's start (from now in a process older than
        ``STARTUP_ALLOWANCE_S``: one not started for this run)."""
        age = process_age_s(procfs_root)
        return cls(budget_s, spent_s=age if age <= STARTUP_ALLOWANCE_S else 0.0)

    def left(self) -> float:
        return self.end - self.clock()

    def spent(self) -> float:
        return self.budget_s - self.left()

    def call_timeout(self, per_call: float) -> Optional[float]:
        """A call's deadline: at most ``per_call`` and what is left; None when too little is left."""
        left = self.left()
        if left < MIN_CALL_S:
            return None
        return min(per_call, left)
