"""The XID catalog as data, its decisions, enrichment, XID 154 and the application-XID rate rule."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Optional

import pytest

from nodehealth.model import Action
from nodehealth.observations import GpuObservation
from nodehealth.xid.attribution import attribute, gpu_map, normalize_pci
from nodehealth.xid.catalog import (
    DEFAULT_CATALOG_PATH,
    application_xid_bursts,
    enrich,
    judge,
    load_catalog,
    parse_recovery_action,
)
from nodehealth.xid.events import KIND_FALLEN_OFF_BUS, Severity, XidEvent
from nodehealth.xid.parse import parse_line

CATALOG = load_catalog()

# Every XID in the reference table (shared REFERENCE.md) must be in the catalog.
REFERENCE_XIDS = [
    8,
    13,
    31,
    32,
    38,
    43,
    44,
    45,
    46,
    48,
    54,
    61,
    62,
    63,
    64,
    68,
    69,
    74,
    79,
    92,
    94,
    95,
    109,
    110,
    119,
    120,
    121,
    136,
    140,
    143,
    144,
    145,
    146,
    147,
    148,
    149,
    150,
    151,
    154,
    155,
    156,
    157,
    158,
    159,
]


def test_catalog_names_its_source() -> None:
    assert "docs.nvidia.com/deploy/xid-errors" in CATALOG.source
    head = DEFAULT_CATALOG_PATH.read_text(encoding="utf-8").splitlines()[:5]
    assert any("Source" in line and "nvidia.com" in line for line in head)


@pytest.mark.parametrize("xid", REFERENCE_XIDS, ids=lambda x: f"xid{x}")
def test_reference_xid_is_catalogued(xid: int) -> None:
    entry = CATALOG.entry(xid)
    assert entry.known
    assert entry.mnemonic and entry.meaning and entry.nvidia_action


# Where the sources agree on "drain the node".
@pytest.mark.parametrize("xid", [46, 48, 62, 64, 74, 79, 95, 119, 120, 140, 143], ids=lambda x: f"xid{x}")
def test_agreed_drain_xids_drain(xid: int) -> None:
    assert CATALOG.entry(xid).severity is Severity.DRAIN


@pytest.mark.parametrize("xid", [13, 31, 43, 45], ids=lambda x: f"xid{x}")
def test_application_xids(xid: int) -> None:
    assert CATALOG.entry(xid).severity is Severity.APPLICATION
    assert xid in CATALOG.application_xids


# The disputed XIDs: our decision, and its reasoning written next to the data.
DISPUTED = {
    32: (Severity.WARNING, Action.RESTART_APP),
    38: (Severity.WARNING, Action.INSPECT),
    44: (Severity.WARNING, Action.INSPECT),
    63: (Severity.WARNING, Action.RESET_GPU),
    68: (Severity.WARNING, Action.RESTART_APP),
    92: (Severity.WARNING, Action.INSPECT),
    94: (Severity.WARNING, Action.RESTART_APP),
    109: (Severity.DRAIN, Action.RESET_GPU),
}


@pytest.mark.parametrize("xid", sorted(DISPUTED), ids=lambda x: f"xid{x}")
def test_disputed_decision_and_reasoning(xid: int) -> None:
    entry = CATALOG.entry(xid)
    assert (entry.severity, entry.action) == DISPUTED[xid]
    text = DEFAULT_CATALOG_PATH.read_text(encoding="utf-8")
    before = text[: text.index(f"[xid.{xid}]")].rstrip().splitlines()
    comments: list[str] = []
    for line in reversed(before):
        if not line.startswith("#"):
            break
        comments.insert(0, line)
    reasoning = " ".join(comments)
    assert re.search(rf"#\s*{xid}\b|same reasoning", reasoning), f"no reasoning comment above [xid.{xid}]"
    assert "Decision" in reasoning or "reasoning" in reasoning


def test_unknown_xid_is_warning_inspect() -> None:
    entry = CATALOG.entry(4242)
    assert not entry.known
    assert (entry.severity, entry.action) == (Severity.WARNING, Action.INSPECT)
    event = enrich(XidEvent(xid=4242, pci="0000:3b:00"), CATALOG)
    assert (event.severity, event.action) == (Severity.WARNING, Action.INSPECT)


def test_override_changes_severity_only() -> None:
    catalog = load_catalog(overrides={63: "drain", 109: "application"})
    assert catalog.entry(63).severity is Severity.DRAIN
    assert catalog.entry(63).action is Action.RESET_GPU
    assert catalog.entry(63).overridden
    assert catalog.entry(109).severity is Severity.APPLICATION
    assert CATALOG.entry(63).severity is Severity.WARNING, "overrides must not leak into other catalogs"


def test_override_of_uncatalogued_xid() -> None:
    catalog = load_catalog(overrides={4242: "drain"})
    assert catalog.entry(4242).severity is Severity.DRAIN


def test_override_keys_may_be_strings_from_config() -> None:
    catalog = load_catalog(overrides={"63": "drain"})  # type: ignore[dict-item]
    assert catalog.entry(63).severity is Severity.DRAIN


def test_unknown_severity_override_names_the_xid() -> None:
    with pytest.raises(ValueError, match=r"XID 63.*'fatal'"):
        load_catalog(overrides={63: "fatal"})


def test_override_with_bad_xid_number() -> None:
    with pytest.raises(ValueError, match="not an XID number"):
        load_catalog(overrides={"sixty-three": "drain"})  # type: ignore[dict-item]


def _write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "catalog.toml"
    path.write_text('[meta]\nsource = "test"\n' + body, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("body", "message"),
    [
        pytest.param(
            '[xid.48]\nmnemonic="DBE"\nmeaning="m"\nnvidia_action="X"\nseverity="awful"\naction="reboot"\n',
            r"XID 48: severity",
            id="bad-severity",
        ),
        pytest.param(
            '[xid.48]\nmnemonic="DBE"\nmeaning="m"\nnvidia_action="X"\nseverity="drain"\naction="pray"\n',
            r"XID 48: action",
            id="bad-action",
        ),
        pytest.param(
            '[xid.48]\nmeaning="m"\nnvidia_action="X"\nseverity="drain"\naction="reboot"\n',
            r"XID 48: mnemonic",
            id="missing-mnemonic",
        ),
        pytest.param(
            '[xid.48]\nmnemonic="DBE"\nmeaning="m"\nnvidia_action="X"\nseverity="drain"\n'
            'action="reboot"\ncolour="red"\n',
            r"XID 48: unknown key\(s\) colour",
            id="unknown-key",
        ),
        pytest.param(
            '[xid.48]\nmnemonic="DBE"\nmeaning="m"\nnvidia_action="X"\nseverity="drain"\n'
            'action="reboot"\nfatal_severity="drain"\n',
            r"XID 48: fatal_severity and fatal_action",
            id="fatal-half",
        ),
        pytest.param('[xid.abc]\nmnemonic="DBE"\n', r"\[xid.abc\]: not an XID number", id="bad-key"),
        pytest.param(
            '[recovery_actions.1]\nname="Reset"\nseverity="drain"\naction="jump"\n',
            r"recovery action 1: action",
            id="bad-recovery-action",
        ),
    ],
)
def test_invalid_catalog_file(tmp_path: Path, body: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_catalog(_write(tmp_path, body))


def test_catalog_without_source_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[xid]\n", encoding="utf-8")
    with pytest.raises(ValueError, match="source"):
        load_catalog(path)


RECOVERY_LINES = [
    (
        "none-to-drain-and-reset",
        "GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)",
        (4, "Drain and Reset"),
        Severity.DRAIN,
        Action.RESET_GPU,
    ),
    (
        "drain-to-gpu-reset",
        "GPU recovery action changed from 0x4 (Drain and Reset) to 0x1 (GPU Reset Required)",
        (1, "GPU Reset Required"),
        Severity.DRAIN,
        Action.RESET_GPU,
    ),
    (
        "node-reboot",
        "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
        (2, "Node Reboot Required"),
        Severity.DRAIN,
        Action.REBOOT,
    ),
    (
        "os-reboot-spelling",
        "GPU recovery action changed from 0x0 (None) to 0x2 (OS Reboot)",
        (2, "OS Reboot"),
        Severity.DRAIN,
        Action.REBOOT,
    ),
    (
        "pf-flr-spelling",
        "GPU recovery action changed from 0x0 (None) to 0x1 (PF FLR)",
        (1, "PF FLR"),
        Severity.DRAIN,
        Action.RESET_GPU,
    ),
    (
        "back-to-none",
        "GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)",
        (0, "None"),
        Severity.WARNING,
        Action.NONE,
    ),
    (
        "drain-p2p",
        "GPU recovery action changed from 0x0 (None) to 0x3 (Drain P2P)",
        (3, "Drain P2P"),
        Severity.DRAIN,
        Action.RESET_GPU,
    ),
    (
        "future-code-named-reboot",
        "GPU recovery action changed from 0x0 (None) to 0x1f (Rack Reboot)",
        (31, "Rack Reboot"),
        Severity.DRAIN,
        Action.REBOOT,
    ),
    (
        "future-code-unnamed",
        "GPU recovery action changed from 0x0 (None) to 0x1f",
        (31, ""),
        Severity.WARNING,
        Action.INSPECT,
    ),
    ("unparsable", "GPU recovery action is now something else", None, Severity.WARNING, Action.INSPECT),
]


@pytest.mark.parametrize(
    ("payload", "parsed", "severity", "action"), [pytest.param(*case[1:], id=case[0]) for case in RECOVERY_LINES]
)
def test_xid154_recovery_action(
    payload: str, parsed: Optional[tuple[int, str]], severity: Severity, action: Action
) -> None:
    assert parse_recovery_action(payload) == parsed
    event = parse_line(f"[171167.621162] NVRM: Xid (PCI:0009:01:00): 154, {payload}")
    assert event is not None
    assert judge(event, CATALOG) == (severity, action)


def test_xid154_override_wins_over_payload() -> None:
    catalog = load_catalog(overrides={154: "warning"})
    event = parse_line(
        "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"
    )
    assert event is not None
    assert judge(event, catalog) == (Severity.WARNING, Action.INSPECT)


@pytest.mark.parametrize(
    ("line", "severity", "action"),
    [
        pytest.param(
            "[171167.620236] NVRM: Xid (PCI:0009:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 01 "
            "(0x021425c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
            Severity.DRAIN,
            Action.RESET_GPU,
            id="nvlink5-fatal",
        ),
        pytest.param(
            "NVRM: Xid (PCI:0018:01:00): 145, pid=876767, name=ray::WorkerDict, RLW_RXPIPE Nonfatal "
            "XC0 i0 Link 13 (0x0409a0c2 0x00000008 0x00000001 0x00000000 0x00100000 0x00000004)",
            Severity.WARNING,
            Action.NONE,
            id="nvlink5-nonfatal",
        ),
    ],
)
def test_nvlink5_fatal_refinement(line: str, severity: Severity, action: Action) -> None:
    event = parse_line(line)
    assert event is not None
    assert judge(event, CATALOG) == (severity, action)


def test_override_drops_fatal_refinement() -> None:
    catalog = load_catalog(overrides={149: "warning"})
    event = parse_line("NVRM: Xid (PCI:0009:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 01")
    assert event is not None
    assert judge(event, catalog) == (Severity.WARNING, Action.NONE)


def test_enrich_fills_verdict_gpu_and_job() -> None:
    event = parse_line(
        "[Sun Feb 23 16:24:18 2025] NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, "
        "name=nvidia-smi, Timeout after 6s of waiting for RPC response from GPU4 GSP!"
    )
    assert event is not None
    gpus = gpu_map(
        [
            GpuObservation(index=4, uuid="GPU-4", pci_bus_id="00000000:9B:00.0"),
            GpuObservation(index=0, uuid="GPU-0", pci_bus_id="00000000:1A:00.0"),
        ]
    )
    enriched = attribute(enrich(event, CATALOG, job_id="81234"), gpus)
    assert enriched is not event
    assert event.severity is None, "enrich returns a new event"
    data = enriched.to_json()
    for key in ("xid", "pci", "gpu", "pid", "process", "job_id", "kind", "severity", "action", "message", "time"):
        assert key in data
    assert data["gpu"] == 4
    assert data["job_id"] == "81234"
    assert (data["severity"], data["action"]) == ("drain", "reset_gpu")
    assert data["mnemonic"] == "GSP_RPC_TIMEOUT"
    assert data["time"] == "Sun Feb 23 16:24:18 2025"


def test_enrich_keeps_existing_job_and_unknown_gpu() -> None:
    event = XidEvent(xid=13, pci="0000:3b:00", job_id="7")
    enriched = attribute(enrich(event, CATALOG), {"0000:1a:00": (0, None)})
    assert (enriched.job_id, enriched.gpu) == ("7", None)
    assert enriched.severity is Severity.APPLICATION


def test_fallen_off_bus_is_treated_like_xid79() -> None:
    event = parse_line("NVRM: GPU 0000:01:00.0: GPU has fallen off the bus.")
    assert event is not None
    assert event.kind == KIND_FALLEN_OFF_BUS
    enriched = attribute(enrich(event, CATALOG), {"0000:01:00": (0, None)})
    assert (enriched.xid, enriched.severity, enriched.action, enriched.gpu) == (79, Severity.DRAIN, Action.REBOOT, 0)
    assert enriched.to_json()["kind"] == "fallen_off_bus"


@pytest.mark.parametrize(
    ("bus_id", "expected"),
    [
        pytest.param("00000000:3B:00.0", "0000:3b:00", id="nvml"),
        pytest.param("0000:3b:00.0", "0000:3b:00", id="sysfs"),
        pytest.param("PCI:0009:01:00", "0009:01:00", id="kernel-log"),
        pytest.param("3b:00.0", "0000:3b:00", id="no-domain"),
        pytest.param("00010000:01:00.0", "10000:01:00", id="wide-domain"),
    ],
)
def test_normalize_pci(bus_id: str, expected: str) -> None:
    assert normalize_pci(bus_id) == expected


def _app(xid: int, t: Optional[float], pci: Optional[str] = "0000:3b:00") -> XidEvent:
    return XidEvent(xid=xid, pci=pci, uptime_s=t)


def test_rate_rule_below_the_limit_is_quiet() -> None:
    events = [_app(13, float(t)) for t in range(0, 50, 10)]  # 5 in 40 s
    assert application_xid_bursts(events, max_events=5, window_s=60) == []


def test_rate_rule_above_the_limit_warns_per_gpu() -> None:
    events = [_app(13, float(t)) for t in range(6)] + [_app(31, 100.0), _app(43, 101.0)]
    events += [_app(13, float(t), pci="0000:1a:00") for t in range(3)]
    events += [_app(48, float(t)) for t in range(10)]  # not an application XID
    bursts = application_xid_bursts(events, max_events=5, window_s=60)
    assert len(bursts) == 1
    burst = bursts[0]
    assert (burst.pci, burst.count, burst.first_s, burst.last_s) == ("0000:3b:00", 6, 0.0, 5.0)
    assert burst.xids == (13,)
    assert burst.severity is Severity.WARNING


def test_rate_rule_window_slides() -> None:
    events = [_app(13, t) for t in (0.0, 100.0, 130.0, 150.0, 400.0)]
    bursts = application_xid_bursts(events, max_events=2, window_s=60)
    assert [(b.count, b.first_s, b.last_s) for b in bursts] == [(3, 100.0, 150.0)]
    assert application_xid_bursts(events, max_events=2, window_s=49) == []


def test_rate_rule_mixes_application_xids_and_ignores_untimed() -> None:
    events = [_app(13, 1.0), _app(31, 2.0), _app(43, 3.0), _app(45, 4.0), _app(13, None), _app(13, None)]
    bursts = application_xid_bursts(events, max_events=3, window_s=10)
    assert [(b.count, b.xids) for b in bursts] == [(4, (13, 31, 43, 45))]


def test_rate_rule_custom_clock_and_xids() -> None:
    events = [replace(_app(68, None), seq=s) for s in range(4)]
    bursts = application_xid_bursts(
        events,
        max_events=3,
        window_s=10,
        application_xids=[68],
        timestamp=lambda e: float(e.seq) if e.seq is not None else None,
    )
    assert [b.count for b in bursts] == [4]


@pytest.mark.parametrize(("max_events", "window_s"), [(-1, 10.0), (3, 0.0)])
def test_rate_rule_rejects_bad_parameters(max_events: int, window_s: float) -> None:
    with pytest.raises(ValueError):
        application_xid_bursts([], max_events=max_events, window_s=window_s)
