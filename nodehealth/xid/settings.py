"""The XID watch's settings: the ``[checks.gpu_xid]`` table, typed, and the one way to read it.

The ``gpu_xid`` check, the ``xid`` probe, the daemon's follower and ``nodehealth xid`` all read
the same keys: the judging windows (the check), where the kernel log is and how the event store
is bounded (the probe and the follower), the severity overrides (all of them). ``XidSettings``
declares each key once (its default, unit and documentation: the config loader, the sample
config and ``nodehealth config defaults`` read them from here), and ``xid_settings(cfg)``
returns it typed from a loaded configuration.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from nodehealth.checks.base import CheckSettings, setting
from nodehealth.xid.catalog import catalog_for
from nodehealth.xid.patterns import KMSG_PATH

CHECK = "gpu_xid"  # the check, and its config table [checks.gpu_xid]


class HasChecks(Protocol):
    """What ``xid_settings`` needs of a configuration (``nodehealth.config.schema.Config``).

    A protocol, not the class: the config schema imports the registry, which imports the check
    that imports this module.
    """

    @property
    def checks(self) -> Mapping[str, CheckSettings]: ...


@dataclass(frozen=True)
class XidSettings(CheckSettings):
    window_s: float = setting(
        0.0, "FAIL on drain-class XIDs this recent; 0 = every one since boot (until a reboot clears "
        "it, or `nodehealth xid clear`)", unit="s", min=0)
    warning_window_s: float = setting(
        86400.0, "WARN on warning-class XIDs this recent; 0 = every one since boot", unit="s",
        min=0)
    severity_overrides: tuple[str, ...] = setting(
        (), "the site's severity per XID, \"XID=severity\" with severity application, warning or "
        "drain, e.g. [\"63=drain\", \"94=application\"]; replaces the catalog's (docs/xid.md)")
    application_max_events: int = setting(
        20, "WARN when one GPU logs more application XIDs (13, 31, 43, 45) than this within "
        "application_window_s", unit="events", min=0, max=100000)
    application_window_s: float = setting(
        3600.0, "window of the application-XID rate", unit="s", min=1)
    kmsg_path: str = setting(KMSG_PATH, "kernel log device the XID watch reads")
    kernel_facility_only: bool = setting(
        True, "count only kernel-facility records of the live kernel log (/dev/kmsg, the journal): "
        "the kernel gives every record written from user space (a forwarder, journald's "
        "ForwardToKMsg=, a test) another facility; false also counts those")
    store_max_events: int = setting(
        1000, "most XID events the event store keeps (oldest non-drain events go first)",
        unit="events", min=10, max=100000)

    def validate(self) -> None:
        catalog_for(tuple(self.severity_overrides))  # ValueError names the bad entry


def xid_settings(cfg: HasChecks) -> XidSettings:
    """The ``[checks.gpu_xid]`` settings of ``cfg`` (the defaults when the table is absent)."""
    found = cfg.checks.get(CHECK)
    if found is None:
        return XidSettings()
    if not isinstance(found, XidSettings):
        raise TypeError(f"[checks.{CHECK}] holds {type(found).__name__}, not XidSettings")
    return found
