"""InfiniBand ports are up, ACTIVE at the expected rate, not flapping, their error counters not rising.

State ACTIVE and physical state LinkUp, at min_rate_gbps or more.

Flaps and counters are judged over the ports' history (``probes.ib_history``: every round of the
daemon and of each face adds one), so they need rounds: a node's first look sees none.

Defaults, and why. ``flap_max = 3`` in ``flap_window_s = 600`` follows gpud (a port down and back
3 times is a flapping port, the finding kept 10 minutes); it WARNs (``flap_status``) and never drains
until a site chooses FAIL: a port that went down and came back is up now, and a subnet manager
restart moves every port at once. A flap is a down round followed by an up round, or one step of the
``link_downed`` counter (it counts the downs a round did not see); the larger of the two counts.
The error counters (``symbol_error``, ``port_rcv_errors`` ... : gcm #119) are not judged by default
(``error_increase_max = 0``): the rate a healthy NDR link shows is not published in a form we can
cite, and some rise slowly on healthy links. The expected port count and rate per node type
(8 x 400 Gb/s on H100/H200/B200 nodes) are ``min_ports`` and ``min_rate_gbps``, set per host
pattern with ``[[override]] hosts = ...``: off by default, a node's fabric is the site's design.
"""

from __future__ import annotations

from typing import Optional

from nodehealth.checks.base import CheckSettings, Context, result, setting
from nodehealth.model import Action, CheckResult, Finding, Status, fold
from nodehealth.observations import IbPort, IbSample, Observations, ProbeError
from nodehealth.observations.record import record

# The drain reason's code (``nh:<code>``, a published contract: never changes meaning) and what it says.
REASON = ("ib", "an InfiniBand port not active, down or below its rate")

# The counters a port may have (probes.infiniband.COUNTERS; checks import no probe), each with the
# value it stops at: the IBA PortCounters fields are 16, 8 or 4 bits wide and saturate, never wrap
# (drivers/infiniband/core/sysfs.c PORT_PMA_ATTR gives each its width). A saturated counter rises no more.
SATURATED = {
    "symbol_error": 0xFFFF,
    "link_error_recovery": 0xFF,
    "link_downed": 0xFF,
    "port_rcv_errors": 0xFFFF,
    "port_rcv_remote_physical_errors": 0xFFFF,
    "port_xmit_discards": 0xFFFF,
    "local_link_integrity_errors": 0xF,
    "excessive_buffer_overrun_errors": 0xF,
}
COUNTERS = tuple(SATURATED)


@record
class Settings(CheckSettings):
    min_ports: int = setting(
        0,
        "FAIL when fewer ports than this are found (after the devices and link_layer filters); "
        "0 = not checked, and a node without ports is SKIPPED",
        unit="ports",
        min=0,
        max=256,
    )
    min_rate_gbps: float = setting(
        0.0,
        "FAIL when an up port runs below this rate (NDR 4X = 400, HDR 4X = 200, EDR 4X = 100); 0 = not checked",
        unit="Gb/s",
        min=0,
        max=10000,
    )
    devices: tuple[str, ...] = setting(
        (),
        "RDMA devices to check, as named in /sys/class/infiniband (mlx5_0 ...); a listed device "
        "that is missing is a FAIL; empty = every device",
    )
    link_layer: str = setting(
        "InfiniBand",
        "which ports to check by link layer: InfiniBand, Ethernet (RoCE) or any",
        choices=("InfiniBand", "Ethernet", "any"),
    )
    flap_max: int = setting(
        3,
        "flap_status when a port went down and came back this many times within flap_window_s "
        "(gpud: 3 in 10 min); 0 = not checked",
        unit="flaps",
        min=0,
        max=1000,
    )
    flap_window_s: float = setting(600.0, "the window flaps are counted in", unit="s", min=60, max=86400)
    flap_status: str = setting(
        "WARN", "what a flapping port is: WARN (no drain) or FAIL (drain, inspect the link)", choices=("WARN", "FAIL")
    )
    error_counters: tuple[str, ...] = setting(
        (
            "symbol_error",
            "link_error_recovery",
            "port_rcv_errors",
            "port_rcv_remote_physical_errors",
            "local_link_integrity_errors",
            "excessive_buffer_overrun_errors",
        ),
        "the ports/<n>/counters/ files whose increase is judged",
        choices=COUNTERS,
    )
    error_increase_max: int = setting(
        0,
        "WARN when one of error_counters rose by more than this within error_window_s; 0 = not checked",
        unit="errors",
        min=0,
        max=1_000_000_000,
    )
    error_window_s: float = setting(
        3600.0, "the window the counters' increase is taken over", unit="s", min=60, max=86400
    )


def evaluate(obs: Observations, settings: Settings, ctx: Context) -> CheckResult:
    ports = obs.infiniband
    if isinstance(ports, ProbeError) and ports.kind == "unavailable":
        return result(ctx, Status.SKIPPED, f"does not apply: {ports.message}")
    if isinstance(ports, ProbeError):
        return result(ctx, Status.UNKNOWN, f"cannot read InfiniBand ports: {ports.message}")
    if ports is None:
        return result(ctx, Status.UNKNOWN, "InfiniBand ports were not probed")
    chosen = [p for p in ports if _wanted(p, settings)]
    findings: list[Finding] = []
    present = {p.device for p in ports}
    for device in settings.devices:
        if device not in present:
            findings.append(Finding(Status.FAIL, f"{device}: no such RDMA device", Action.INSPECT))
    if not chosen and not findings and not settings.min_ports:
        others = len(ports) - len(chosen)
        why = f" ({others} other port(s) not checked: link_layer = {settings.link_layer})" if others else ""
        return result(ctx, Status.SKIPPED, f"no {_layer_name(settings)} port{why}")
    if settings.min_ports and len(chosen) < settings.min_ports:
        findings.append(
            Finding(
                Status.FAIL,
                f"{len(chosen)} {_layer_name(settings)} port(s) found, {settings.min_ports} expected",
                Action.INSPECT,
            )
        )
    for port in chosen:
        findings.extend(_judge(port, settings))
        findings.extend(_judge_history(port, settings))
    details = {
        f"{p.device}/{p.port}": {
            "state": p.state,
            "phys_state": p.phys_state,
            "rate_gbps": p.rate_gbps,
            "link_layer": p.link_layer,
            "flaps": flaps(p.history, settings.flap_window_s),
            "counters": dict(p.counters),
            # Each judged counter's increase within error_window_s (the nodehealth_ib_port_error_increase metric).
            "increase": {
                c: v
                for c in settings.error_counters
                if (v := increase(p.history, c, settings.error_window_s)) is not None
            },
        }
        for p in chosen
    }
    rates = sorted({p.rate_gbps for p in chosen if p.rate_gbps is not None})
    at = f" at {'/'.join(f'{r:g}' for r in rates)} Gb/s" if rates else ""
    return fold(ctx.name, findings, f"{len(chosen)} port(s) ACTIVE, LinkUp{at}", {"ports": details})


def _wanted(port: IbPort, settings: Settings) -> bool:
    if settings.devices and port.device not in settings.devices:
        return False
    # A port whose link layer could not be read stays in: its error is reported.
    return settings.link_layer == "any" or port.link_layer in (None, settings.link_layer)


def _layer_name(settings: Settings) -> str:
    return "RDMA" if settings.link_layer == "any" else settings.link_layer


def _judge(port: IbPort, settings: Settings) -> list[Finding]:
    name = f"{port.device} port {port.port}"
    out = []
    if port.error is not None:
        out.append(Finding(Status.UNKNOWN, f"{name}: {port.error}"))
    if port.phys_state is not None and port.phys_state != "LinkUp":
        # No physical link: cable, transceiver, HCA or the switch port.
        out.append(Finding(Status.FAIL, f"{name}: physical state {port.phys_state}, expected LinkUp", Action.INSPECT))
    elif port.state is not None and port.state != "ACTIVE":
        # The link is up but the subnet manager has not (yet) brought the port to ACTIVE.
        out.append(Finding(Status.FAIL, f"{name}: state {port.state}, expected ACTIVE (subnet manager?)"))
    elif settings.min_rate_gbps and port.rate_gbps is not None and port.rate_gbps < settings.min_rate_gbps:
        out.append(
            Finding(
                Status.FAIL,
                f"{name}: rate {port.rate_gbps:g} Gb/s, below {settings.min_rate_gbps:g} "
                "Gb/s (degraded link: cable or transceiver?)",
                Action.INSPECT,
            )
        )
    return out


def flaps(history: tuple[IbSample, ...], window_s: float) -> int:
    """How often the port went down within ``window_s`` of its last sample: the down-to-up steps the
    rounds saw, or the ``link_downed`` counter's increase (the downs no round saw), the larger."""
    if not history:
        return 0
    start = history[-1].t - window_s
    seen = sum(1 for a, b in zip(history, history[1:]) if b.t >= start and not a.up and b.up)
    return max(seen, increase(history, "link_downed", window_s) or 0)


def increase(history: tuple[IbSample, ...], name: str, window_s: float) -> Optional[int]:
    """How much counter ``name`` rose within ``window_s`` of the last sample (from the sample in effect
    at the window's start); a step down is a reset (driver reload, ``perfquery -R``) and counts its new
    value. None when the last sample has no such counter."""
    if not history or name not in dict(history[-1].counters):
        return None
    start = history[-1].t - window_s
    first = max([i for i, s in enumerate(history) if s.t <= start] or [0])
    values = [v for v in (dict(s.counters).get(name) for s in history[first:]) if v is not None]
    return sum(b - a if b >= a else b for a, b in zip(values, values[1:]))


def _judge_history(port: IbPort, settings: Settings) -> list[Finding]:
    name = f"{port.device} port {port.port}"
    out = []
    count = flaps(port.history, settings.flap_window_s)
    if settings.flap_max and count >= settings.flap_max:
        status = Status.FAIL if settings.flap_status == "FAIL" else Status.WARN
        out.append(
            Finding(
                status,
                f"{name}: down and back {count} time(s) in {settings.flap_window_s:g} s (flapping link: cable, "
                "transceiver or switch port?)",
                Action.INSPECT if status is Status.FAIL else Action.NONE,
            )
        )
    if settings.error_increase_max:
        rose = {c: increase(port.history, c, settings.error_window_s) for c in settings.error_counters}
        if all(v is None for v in rose.values()):
            out.append(Finding(Status.UNKNOWN, f"{name}: none of error_counters under counters/"))
        now = dict(port.counters)
        over = [f"{c} +{v}" for c, v in rose.items() if v is not None and v > settings.error_increase_max]
        # A saturated counter shows no increase however many errors come: say so, never a quiet OK.
        full = [f"{c} saturated at {now[c]}" for c in settings.error_counters if now.get(c) == SATURATED[c]]
        if full:
            out.append(Finding(Status.WARN, f"{name}: {', '.join(full)} (it counts no more: perfquery -R resets it)"))
        if over:
            out.append(
                Finding(
                    Status.WARN,
                    f"{name}: {', '.join(over)} in {settings.error_window_s:g} s (more than "
                    f"{settings.error_increase_max}: a bad cable or transceiver?)",
                )
            )
    return out
