"""XID events, the XID catalog and the judgements made with them (pure; no I/O)."""

from nodehealth.xid.catalog import (
    ApplicationXidBurst,
    Catalog,
    CatalogEntry,
    RecoveryAction,
    application_xid_bursts,
    enrich,
    judge,
    load_catalog,
    normalize_pci,
    parse_recovery_action,
)
from nodehealth.xid.events import KIND_FALLEN_OFF_BUS, KIND_XID, Severity, XidEvent

__all__ = [
    "KIND_FALLEN_OFF_BUS",
    "KIND_XID",
    "ApplicationXidBurst",
    "Catalog",
    "CatalogEntry",
    "RecoveryAction",
    "Severity",
    "XidEvent",
    "application_xid_bursts",
    "enrich",
    "judge",
    "load_catalog",
    "normalize_pci",
    "parse_recovery_action",
]
