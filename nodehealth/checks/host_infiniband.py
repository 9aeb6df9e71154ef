"""InfiniBand ports are up: state ACTIVE, physical state LinkUp, at the expected rate."""

from __future__ import annotations

from nodehealth.checks.base import CheckSettings, Context, result, setting
from nodehealth.model import Action, CheckResult, Finding, Status, fold
from nodehealth.observations import IbPort, Observations, ProbeError
from nodehealth.observations.record import record

# The drain reason's code (``nh:<code>``, a published contract: never changes meaning) and what it says.
REASON = ("ib", "an InfiniBand port not active, down or below its rate")


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


def evaluate(obs: Observations, settings: Settings, ctx: Context) -> CheckResult:
    ports = obs.infiniband
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
    details = {
        f"{p.device}/{p.port}": {
            "state": p.state,
            "phys_state": p.phys_state,
            "rate_gbps": p.rate_gbps,
            "link_layer": p.link_layer,
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
