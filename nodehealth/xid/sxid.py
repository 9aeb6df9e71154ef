"""NVSwitch SXid errors: the kernel-log line, the SXid catalog's shape and the verdict on one event. Pure.

The NVSwitch driver reports a fault of an NVSwitch as
``nvidia-nvswitch<N>: SXid (PCI:<dddd:bb:dd.f>): <sxid>, Fatal|Non-fatal, Link <L> <what>``, followed
by detail lines of the same error (``Severity 1 Engine instance ...``, ``Data {0x...}``) that carry no
severity word and are not events of their own. An SXid is an event of the kernel-log pipeline like an
XID (same reader, store and follower), of kind ``sxid``: its ``xid`` field holds the SXid number and its
``pci`` the NVSwitch's address (not a GPU's). The ``gpu_sxid`` check judges them; ``gpu_xid`` leaves them.

Severity: the line's own word first (NVIDIA's Fabric Manager User Guide, DU-09883-001, "NVSwitch SXid
errors": a fatal SXid stalls the fabric until the NVSwitches and GPUs are reset, on bare metal a
reboot), then the catalog (``nodehealth/data/sxid_catalog.toml``: numbers, names and the guide's class;
the "always fatal" ones drain whatever the line says), then the site's overrides. Non-fatal SXids are
counted; the check warns past a rate. The catalog file is read by ``nodehealth.xid.catalog``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import field, replace
from types import MappingProxyType
from typing import Any, Optional

from nodehealth.observations.action import Action
from nodehealth.observations.record import record
from nodehealth.xid.events import Severity, XidEvent
from nodehealth.xid.pattern_kit import (
    EVENT,
    GPUD_SXID_KMSG_TEST,
    GPUD_SXID_README,
    PCI,
    SWITCH_TAG,
    TESTS,
    Pattern,
    Regex,
    gives,
    no_match,
)

KIND_SXID = "sxid"

# The guide's classes of an SXid (its sections "Non-Fatal", "Fatal", "Always Fatal" and "Other Notable").
NON_FATAL = "non_fatal"
FATAL = "fatal"
ALWAYS_FATAL = "always_fatal"
NOTABLE = "notable"
CLASSES = (NON_FATAL, FATAL, ALWAYS_FATAL, NOTABLE)

SXID_LINE = Pattern(
    name="sxid",
    role=EVENT,
    about="the NVSwitch driver's SXid line `nvidia-nvswitch<N>: SXid (PCI:<switch>): <sxid>, Fatal|Non-fatal, "
    "<payload>` right at the message's start (`message_start`), kind `sxid`: the number is the SXid, the PCI "
    "address the NVSwitch's; the detail lines of the same error (`Severity 1 Engine instance`, `Data {...}`) "
    "name no severity and are not events",
    regex=Regex(
        SWITCH_TAG + r"[ \t]*SXid[ \t]*\((?:PCI:)?(?P<pci>" + PCI + r")(?:\.[0-7])?\):[ \t]*"
        r"(?P<xid>\d{1,5})[ \t]*,[ \t]*(?P<payload>(?:Fatal|Non-fatal)\b.*)",
        re.DOTALL,
    ),
    needles=("SXid", "nvidia-nvswitch"),
    kind=KIND_SXID,
    samples=(
        gives(
            "[6781753.400584] nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up",
            GPUD_SXID_README,
            xid=20034,
            pci="0000:06:00",
            kind=KIND_SXID,
            uptime_s=6781753.400584,
            message="Fatal, Link 48 LTSSM Fault Up",
        ),
        gives(
            "[6781753.408138] nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 62 LTSSM Fault Up",
            GPUD_SXID_README,
            xid=20034,
            pci="0000:05:00",
        ),
        gives(
            "[111111111.111] nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress "
            "non-posted PRIV error (First)",
            GPUD_SXID_KMSG_TEST,
            xid=12028,
            pci="0000:05:00",
            message="Non-fatal, Link 32 egress non-posted PRIV error (First)",
        ),
        gives(
            "nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error",
            GPUD_SXID_KMSG_TEST,
            xid=12028,
            time=None,
        ),
        gives(
            "May 19 07:08:57 gpu017 kernel: nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 20034, Fatal, Link 37 LTSSM",
            TESTS,
            xid=20034,
            pci="0000:07:00",
            time="May 19 07:08:57",
        ),
        gives(
            "6,2301,6781753407899,-;nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 20034, Fatal, Link 37 LTSSM Fault Up",
            TESTS,
            xid=20034,
            seq=2301,
        ),
        # The detail lines of one error: no severity of their own, no second event.
        no_match(
            "[6781753.404848] nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 20034, Severity 1 Engine instance 60 "
            "Sub-engine instance 00",
            GPUD_SXID_README,
        ),
        no_match(
            "[131453.740758] nvidia-nvswitch0: SXid (PCI:0000:a9:00.0): 20034, Data {0x50610002, 0x10100030}",
            GPUD_SXID_KMSG_TEST,
        ),
        no_match("nvidia-nvswitch0: SXid (PCI:0000:00:00.0): xyz, Fatal error", GPUD_SXID_KMSG_TEST),
        no_match("nvidia-nvswitch0: SXid (invalid): some error", GPUD_SXID_KMSG_TEST),
        # Quoted inside another record, or logged by a program rather than the kernel.
        no_match(
            "4,2211,5123456789,-;process 'python3' launched 'nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, "
            "Fatal, Link 1' with NULL argv: empty string added",
            TESTS,
        ),
        no_match("May 19 07:08:57 gpu017 root: nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, x", TESTS),
        no_match("NVRM: nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 1", TESTS),
        no_match(
            "The SXid 20034 means a link went down: nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal", TESTS
        ),
    ),
)

_LINK: Regex[str] = Regex(r"\bLink[ \t]+(\d{1,4})\b")
_FATAL_WORD: Regex[str] = Regex(r"Fatal\b")


def link_of(event: XidEvent) -> Optional[int]:
    """The NVSwitch port (``Link <L>``) an SXid names, None when it names none."""
    m = _LINK.search(event.message)
    return int(m.group(1)) if m else None


def says_fatal(event: XidEvent) -> bool:
    """True when the line itself calls the SXid fatal (``Fatal,``; ``Non-fatal`` is not)."""
    return _FATAL_WORD.match(event.message) is not None


@record
class SxidEntry:
    """What the catalog says of one SXid: its name in the guide and the guide's class (``CLASSES``)."""

    sxid: int
    name: str
    klass: str


@record
class SxidCatalog:
    """The SXid entries, where they come from, and the site's severity per SXid (``overrides``)."""

    source: str
    entries: Mapping[int, SxidEntry]
    overrides: Mapping[int, Severity] = field(default_factory=dict)

    def name(self, sxid: int) -> str:
        found = self.entries.get(sxid)
        return found.name if found is not None else "UNKNOWN"


def sxid_catalog_from_mapping(
    data: Mapping[str, Any], overrides: Mapping[int, Severity] = MappingProxyType({}), where: str = "catalog"
) -> SxidCatalog:
    """The catalog from parsed TOML (``[meta] source``, ``[sxid.<N>] name, class``); ValueError names the entry."""
    meta = data.get("meta")
    if not isinstance(meta, Mapping) or not isinstance(meta.get("source"), str) or not meta["source"]:
        raise ValueError(f"{where}: [meta] must name the catalog's source")
    table = data.get("sxid", {})
    if not isinstance(table, Mapping):
        raise ValueError(f"{where}: [sxid] must be a table")
    entries: dict[int, SxidEntry] = {}
    for key, raw in table.items():
        label = f"{where}: [sxid.{key}]"
        if not (isinstance(key, str) and key.isdigit() and len(key) <= 5):
            raise ValueError(f"{label}: the key must be an SXid number")
        if not isinstance(raw, Mapping) or not isinstance(raw.get("name"), str) or not raw["name"]:
            raise ValueError(f"{label}: expected a table with a name")
        klass = raw.get("class")
        if klass not in CLASSES:
            raise ValueError(f"{label}: class must be one of {', '.join(CLASSES)}, not {klass!r}")
        entries[int(key)] = SxidEntry(int(key), raw["name"], klass)
    return SxidCatalog(meta["source"], MappingProxyType(entries), MappingProxyType(dict(overrides)))


def parse_sxid_overrides(items: Iterable[str]) -> dict[int, Severity]:
    """``["20034=warning", "12028=drain"]`` as a mapping; ValueError names the bad item."""
    out: dict[int, Severity] = {}
    for item in items:
        number, sep, value = str(item).partition("=")
        number, value = number.strip(), value.strip()
        if not sep or not number.isdigit() or len(number) > 5:
            raise ValueError(f'SXid override {item!r}: expected "SXID=severity", e.g. "20034=warning"')
        if value not in (Severity.WARNING.value, Severity.DRAIN.value):
            raise ValueError(f"SXid override {item!r}: severity must be warning or drain")
        out[int(number)] = Severity(value)
    return out


def judge_sxid(event: XidEvent, catalog: SxidCatalog) -> tuple[Severity, Action]:
    """Our severity and action for one SXid: the site's override, else drain (reboot) when the line says
    Fatal or the guide says always fatal, else warning (counted; the check warns past a rate)."""
    override = catalog.overrides.get(event.xid)
    if override is not None:
        return override, Action.REBOOT if override == Severity.DRAIN else Action.NONE
    entry = catalog.entries.get(event.xid)
    if says_fatal(event) or (entry is not None and entry.klass == ALWAYS_FATAL):
        return Severity.DRAIN, Action.REBOOT
    return Severity.WARNING, Action.NONE


def enrich_sxid(event: XidEvent, catalog: SxidCatalog) -> XidEvent:
    """A copy of the SXid ``event`` with its severity, action and name (``mnemonic``)."""
    severity, action = judge_sxid(event, catalog)
    return replace(event, severity=severity, action=action, mnemonic=catalog.name(event.xid), gpu=None)
