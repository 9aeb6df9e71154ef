"""The XID catalog (data in ``nodehealth/data/xid_catalog.toml``) and the judgements made with it.

Pure apart from ``load_catalog`` reading its TOML file: ``enrich`` turns a parsed event into
one with severity, action and mnemonic; ``application_xid_bursts`` finds GPUs whose
application XIDs repeat faster than the configured rate. The payload patterns it judges by
(XID 154's recovery action, "Fatal") are entries of ``nodehealth.xid.patterns``.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Optional, Union

from nodehealth.model import Action
from nodehealth.observations.record import record
from nodehealth.xid.events import Severity, XidEvent
from nodehealth.xid.patterns import FATAL, RECOVERY_ACTION
from nodehealth.xid.sxid import KIND_SXID, SxidCatalog, enrich_sxid, parse_sxid_overrides, sxid_catalog_from_mapping

DEFAULT_CATALOG_PATH = Path(__file__).resolve().parent.parent / "data" / "xid_catalog.toml"
SXID_CATALOG_PATH = DEFAULT_CATALOG_PATH.with_name("sxid_catalog.toml")
RECOVERY_ACTION_XID = 154

_EMPTY: Mapping[Any, Any] = MappingProxyType({})


@record
class CatalogEntry:
    """What the catalog says about one XID.

    ``nvidia_action`` is NVIDIA's immediate-resolution bucket as NVIDIA spells it (empty for
    XIDs not in the catalog). ``severity``/``action`` are our defaults (after config
    overrides); ``fatal_severity``/``fatal_action``, when set, apply instead to events whose
    payload says "Fatal". ``known`` is False for the stand-in entry of an unlisted XID;
    ``overridden`` is True when the site's configuration set the severity.
    """

    xid: int
    mnemonic: str
    meaning: str
    nvidia_action: str
    severity: Severity
    action: Action
    fatal_severity: Optional[Severity] = None
    fatal_action: Optional[Action] = None
    known: bool = True
    overridden: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "xid": self.xid,
            "mnemonic": self.mnemonic,
            "meaning": self.meaning,
            "nvidia_action": self.nvidia_action,
            "severity": self.severity.value,
            "action": self.action.value,
            "fatal_severity": self.fatal_severity.value if self.fatal_severity else None,
            "fatal_action": self.fatal_action.value if self.fatal_action else None,
            "known": self.known,
            "overridden": self.overridden,
        }


@record
class RecoveryAction:
    """One value of the driver's GPU recovery action (NVML ``nvmlDeviceGpuRecoveryAction_t``)."""

    code: int
    name: str
    severity: Severity
    action: Action


@record
class Catalog:
    """All XID entries, the recovery-action table for XID 154, and the application XIDs."""

    source: str
    entries: Mapping[int, CatalogEntry]
    recovery_actions: Mapping[int, RecoveryAction]
    application_xids: frozenset[int]
    unknown_severity: Severity = Severity.WARNING
    unknown_action: Action = Action.INSPECT

    def entry(self, xid: int) -> CatalogEntry:
        """The entry for ``xid``; an unlisted XID gets the configured unknown verdict."""
        found = self.entries.get(xid)
        if found is not None:
            return found
        return CatalogEntry(
            xid=xid,
            mnemonic="UNKNOWN",
            meaning="Not in nodehealth's XID catalog; see NVIDIA's XID documentation.",
            nvidia_action="",
            severity=self.unknown_severity,
            action=self.unknown_action,
            known=False,
        )

    def __contains__(self, xid: object) -> bool:
        return xid in self.entries


def _toml() -> Any:
    """The TOML reader, imported when the catalog is first read (not by importing the catalog)."""
    if sys.version_info >= (3, 11):
        import tomllib  # novermin - tomli below 3.11
    else:
        import tomli as tomllib
    return tomllib


def load_catalog(path: Union[str, Path, None] = None, overrides: Mapping[int, str] = _EMPTY) -> Catalog:
    """Read and validate the catalog; ``overrides`` maps an XID to the severity to use instead.

    Raises ValueError naming the XID (and field) for any invalid entry or override.
    """
    file = Path(path) if path is not None else DEFAULT_CATALOG_PATH
    with open(file, "rb") as fh:
        data = _toml().load(fh)
    return catalog_from_mapping(data, overrides, where=str(file))


def catalog_from_mapping(
    data: Mapping[str, Any], overrides: Mapping[int, str] = _EMPTY, where: str = "catalog"
) -> Catalog:
    """Build a Catalog from already-parsed TOML data (see ``load_catalog``)."""
    meta = data.get("meta", {})
    if not isinstance(meta, Mapping) or not isinstance(meta.get("source"), str) or not meta["source"]:
        raise ValueError(f"{where}: [meta] must name the catalog's source")
    unknown_severity = _severity(meta.get("unknown_severity", "warning"), f"{where}: meta.unknown_severity")
    unknown_action = _action(meta.get("unknown_action", "inspect"), f"{where}: meta.unknown_action")
    app_xids = meta.get("application_xids", [])
    if not isinstance(app_xids, list) or not all(isinstance(x, int) for x in app_xids):
        raise ValueError(f"{where}: meta.application_xids must be a list of XID numbers")

    entries: dict[int, CatalogEntry] = {}
    for key, raw in _table(data, "xid", where).items():
        xid = _xid_key(key, f"{where}: [xid.{key}]")
        entries[xid] = _entry(xid, raw, f"{where}: XID {xid}")

    recovery: dict[int, RecoveryAction] = {}
    for key, raw in _table(data, "recovery_actions", where).items():
        code = _xid_key(key, f"{where}: [recovery_actions.{key}]")
        label = f"{where}: recovery action {code}"
        if not isinstance(raw, Mapping):
            raise ValueError(f"{label}: expected a table")
        recovery[code] = RecoveryAction(
            code=code,
            name=_text(raw, "name", label),
            severity=_severity(raw.get("severity"), f"{label}: severity"),
            action=_action(raw.get("action"), f"{label}: action"),
        )

    for override_key, value in overrides.items():
        xid = _xid_key(override_key, f"XID override {override_key!r}")
        severity = _severity(value, f"XID {xid}: severity override")
        base = entries.get(xid)
        if base is None:
            base = CatalogEntry(
                xid, "UNKNOWN", "Not in nodehealth's XID catalog.", "", severity, unknown_action, known=False
            )
        # An override is the site's verdict: it replaces the Fatal refinement too.
        entries[xid] = replace(base, severity=severity, fatal_severity=None, fatal_action=None, overridden=True)

    return Catalog(
        source=meta["source"],
        entries=MappingProxyType(entries),
        recovery_actions=MappingProxyType(recovery),
        application_xids=frozenset(app_xids),
        unknown_severity=unknown_severity,
        unknown_action=unknown_action,
    )


def _table(data: Mapping[str, Any], name: str, where: str) -> Mapping[str, Any]:
    table = data.get(name, {})
    if not isinstance(table, Mapping):
        raise ValueError(f"{where}: [{name}] must be a table")
    return table


def _xid_key(key: object, label: str) -> int:
    if isinstance(key, bool):
        raise ValueError(f"{label}: not an XID number")
    try:
        value: int = int(key)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        raise ValueError(f"{label}: not an XID number") from None
    if value < 0:
        raise ValueError(f"{label}: not an XID number")
    return value


def _entry(xid: int, raw: object, label: str) -> CatalogEntry:
    if not isinstance(raw, Mapping):
        raise ValueError(f"{label}: expected a table")
    allowed = {"mnemonic", "meaning", "nvidia_action", "severity", "action", "fatal_severity", "fatal_action"}
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise ValueError(f"{label}: unknown key(s) {', '.join(unknown)}")
    fatal_sev = raw.get("fatal_severity")
    fatal_act = raw.get("fatal_action")
    if (fatal_sev is None) != (fatal_act is None):
        raise ValueError(f"{label}: fatal_severity and fatal_action go together")
    return CatalogEntry(
        xid=xid,
        mnemonic=_text(raw, "mnemonic", label),
        meaning=_text(raw, "meaning", label),
        nvidia_action=_text(raw, "nvidia_action", label),
        severity=_severity(raw.get("severity"), f"{label}: severity"),
        action=_action(raw.get("action"), f"{label}: action"),
        fatal_severity=_severity(fatal_sev, f"{label}: fatal_severity") if fatal_sev is not None else None,
        fatal_action=_action(fatal_act, f"{label}: fatal_action") if fatal_act is not None else None,
    )


def _text(raw: Mapping[str, Any], key: str, label: str) -> str:
    value = raw.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{label}: {key} must be a non-empty string")
    return value


def _severity(value: object, label: str) -> Severity:
    if not isinstance(value, str):
        raise ValueError(f"{label}: expected a severity name, got {value!r}")
    try:
        return Severity.parse(value)
    except ValueError as exc:
        raise ValueError(f"{label}: {exc}") from None


def _action(value: object, label: str) -> Action:
    if not isinstance(value, str):
        raise ValueError(f"{label}: expected an action name, got {value!r}")
    try:
        return Action.parse(value)
    except ValueError as exc:
        raise ValueError(f"{label}: {exc}") from None


def parse_recovery_action(message: str) -> Optional[tuple[int, str]]:
    """The new recovery action (code, name as printed) an XID 154 payload names, or None."""
    m = RECOVERY_ACTION.regex.search(message)
    if not m:
        return None
    return int(m.group("new"), 0), (m.group("new_name") or "").strip()


def recovery_verdict(message: str, catalog: Catalog) -> Optional[RecoveryAction]:
    """Our severity and action for the recovery action an XID 154 payload names.

    The code decides; drivers spell the names differently ("OS Reboot", "PF FLR"), so a code
    we do not know is judged by the words of its name. None when nothing can be told.
    """
    parsed = parse_recovery_action(message)
    if parsed is None:
        return None
    code, name = parsed
    known = catalog.recovery_actions.get(code)
    if known is not None:
        return known
    words = name.lower()
    if "reboot" in words:
        return RecoveryAction(code, name, Severity.DRAIN, Action.REBOOT)
    if "reset" in words or "flr" in words or "drain" in words:
        return RecoveryAction(code, name, Severity.DRAIN, Action.RESET_GPU)
    if words == "none":
        return RecoveryAction(code, name, Severity.WARNING, Action.NONE)
    return None


def judge(event: XidEvent, catalog: Catalog) -> tuple[Severity, Action]:
    """Our severity and action for one event (pure; see ``enrich``).

    XID 154 takes the verdict of the recovery action its payload names, unless the site
    overrode 154's severity; entries with a Fatal refinement use it when the payload says
    "Fatal"; everything else takes the entry's severity and action.
    """
    entry = catalog.entry(event.xid)
    if event.xid == RECOVERY_ACTION_XID and not entry.overridden:
        verdict = recovery_verdict(event.message, catalog)
        if verdict is not None:
            return verdict.severity, verdict.action
    fatal_severity, fatal_action = entry.fatal_severity, entry.fatal_action
    if fatal_severity is not None and fatal_action is not None and FATAL.regex.search(event.message):
        return fatal_severity, fatal_action
    return entry.severity, entry.action


def enrich(event: XidEvent, catalog: Catalog, job_id: Optional[str] = None) -> XidEvent:
    """A copy of ``event`` with the catalog's severity, action and mnemonic (and ``job_id``
    when given; the event's own is kept otherwise). GPU and job attribution:
    ``nodehealth.xid.attribution``.
    """
    if event.kind == KIND_SXID:  # an NVSwitch's SXid: its own catalog (nodehealth.xid.sxid)
        return enrich_sxid(event, sxid_catalog_for())
    severity, action = judge(event, catalog)
    return replace(
        event,
        severity=severity,
        action=action,
        mnemonic=catalog.entry(event.xid).mnemonic,
        job_id=job_id if job_id is not None else event.job_id,
    )


@record
class ApplicationXidBurst:
    """Application XIDs on one GPU arriving faster than the allowed rate.

    ``count`` events with timestamps from ``first_s`` to ``last_s`` (the event clock, seconds)
    fell within one ``window_s`` window, more than ``max_events``. ``pci`` None groups events
    that named no GPU. ``severity`` is always WARNING.
    """

    pci: Optional[str]
    count: int
    max_events: int
    window_s: float
    first_s: float
    last_s: float
    xids: tuple[int, ...]
    severity: Severity = Severity.WARNING


def _uptime(event: XidEvent) -> Optional[float]:
    return event.uptime_s


DEFAULT_APPLICATION_XIDS = frozenset({13, 31, 43, 45})


def application_xid_bursts(
    events: Iterable[XidEvent],
    *,
    max_events: int,
    window_s: float,
    application_xids: Iterable[int] = DEFAULT_APPLICATION_XIDS,
    timestamp: Callable[[XidEvent], Optional[float]] = _uptime,
) -> list[ApplicationXidBurst]:
    """GPUs on which more than ``max_events`` application XIDs fell within ``window_s`` seconds.

    One result per GPU, for its busiest window (earliest such window on ties), ordered by PCI
    address. ``timestamp`` gives an event's time in seconds (default: seconds since boot from
    the line); events without one cannot be placed in a window and are not counted.
    """
    if max_events < 0:
        raise ValueError("max_events must be >= 0")
    if window_s <= 0:
        raise ValueError("window_s must be > 0")
    wanted = frozenset(application_xids)
    per_gpu: dict[Optional[str], list[tuple[float, int]]] = {}
    for event in events:
        if event.xid not in wanted:
            continue
        t = timestamp(event)
        if t is None:
            continue
        per_gpu.setdefault(event.pci, []).append((t, event.xid))

    bursts: list[ApplicationXidBurst] = []
    for pci in sorted(per_gpu, key=lambda p: (p is None, p or "")):
        times = sorted(per_gpu[pci])
        best: Optional[tuple[int, int]] = None  # (count, start index)
        start = 0
        for end in range(len(times)):
            while times[end][0] - times[start][0] > window_s:
                start += 1
            count = end - start + 1
            if count > max_events and (best is None or count > best[0]):
                best = (count, start)
        if best is None:
            continue
        count, first = best
        window = times[first : first + count]
        bursts.append(
            ApplicationXidBurst(
                pci=pci,
                count=count,
                max_events=max_events,
                window_s=window_s,
                first_s=window[0][0],
                last_s=window[-1][0],
                xids=tuple(sorted({x for _, x in window})),
            )
        )
    return bursts


def parse_overrides(items: Iterable[str]) -> dict[int, str]:
    """``("63=drain", "94=application")`` → ``{63: "drain", 94: "application"}``."""
    out: dict[int, str] = {}
    for item in items:
        xid, sep, severity = item.partition("=")
        if not sep or not xid.strip().isdigit():
            raise ValueError(f'severity override {item!r}: expected "XID=severity", e.g. "63=drain"')
        out[int(xid.strip())] = severity.strip()
    return out


@functools.lru_cache(maxsize=8)
def catalog_for(overrides: tuple[str, ...] = ()) -> Catalog:
    """The XID catalog with the site's ``"XID=severity"`` overrides (ValueError if malformed)."""
    return load_catalog(overrides=parse_overrides(overrides))


@functools.lru_cache(maxsize=8)
def sxid_catalog_for(overrides: tuple[str, ...] = ()) -> SxidCatalog:
    """The SXid catalog (``data/sxid_catalog.toml``) with the site's ``"SXID=severity"`` overrides."""
    with open(SXID_CATALOG_PATH, "rb") as fh:
        data = _toml().load(fh)
    return sxid_catalog_from_mapping(data, parse_sxid_overrides(overrides), where=str(SXID_CATALOG_PATH))
