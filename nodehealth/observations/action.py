"""The remedies, ordered by how invasive they are: what the driver or the XID catalog says a fault
needs (an observation's verdict: the XID event, NVML's recovery action) and what a check's result
asks of an administrator (``nodehealth.model`` re-exports it). Pure; standard library only."""

from __future__ import annotations

import enum


class Action(str, enum.Enum):
    """What an administrator (or automation) should do about a result.

    Ordered by how invasive the remedy is; ``worst`` picks the most invasive one.
    """

    NONE = "none"
    RESTART_APP = "restart_app"
    RESET_GPU = "reset_gpu"
    REBOOT = "reboot"
    INSPECT = "inspect"  # hardware inspection / RMA

    @property
    def rank(self) -> int:
        return _ACTION_RANK[self]

    @classmethod
    def parse(cls, text: str) -> Action:
        try:
            return cls(text)
        except ValueError:
            allowed = ", ".join(a.value for a in cls)
            raise ValueError(f"unknown action {text!r} (expected one of: {allowed})") from None


_ACTION_RANK = {
    Action.NONE: 0,
    Action.RESTART_APP: 1,
    Action.RESET_GPU: 2,
    Action.REBOOT: 3,
    Action.INSPECT: 4,
}
