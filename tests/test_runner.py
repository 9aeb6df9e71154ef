"""The runner owns time: deadlines inside the budget, probe failures and check bugs contained."""

from __future__ import annotations

import tempfile
import threading
import time

import pytest
from conftest import Timing

from nodehealth import runner
from nodehealth.config.loader import resolve
from nodehealth.model import Status
from nodehealth.observations import NvmlSnapshot, PciGpus, ProbeError
from nodehealth.probes import PROBES, Probe
from nodehealth.registry import CHECKS


def _snapshot(n: int = 2) -> NvmlSnapshot:
    from nodehealth.observations import GpuObservation

    gpus = tuple(GpuObservation(index=i, pci_bus_id=f"0000:{i + 1:02x}:00.0") for i in range(n))
    return NvmlSnapshot("550.1", 12040, n, gpus, elapsed_s=0.01)


def _own(raw: dict) -> dict:
    """``raw`` with a state dir of its own (the real probes in the table write there, not on the host)."""
    return {**raw, "paths": {**raw.get("paths", {}), "state_dir": tempfile.mkdtemp(prefix="nh-runner-")}}


def _table(**overrides: Probe) -> dict[str, Probe]:
    table = dict(PROBES)
    table |= {
        "nvml": Probe("nvml", lambda ctx, t: _snapshot()),
        "pci_gpus": Probe("pci_gpus", lambda ctx, t: PciGpus(("0000:01:00.0", "0000:02:00.0"), "sysfs")),
        "slurm_node": Probe("slurm_node", lambda ctx, t: ProbeError("slurm_node", "unavailable", "no slurm")),
    }
    table.update(overrides)
    return table


def test_only_runs_the_named_checks_and_needed_probes():
    called = []

    def nvml(ctx, t):
        called.append("nvml")
        return _snapshot()

    cfg = resolve(_own({}), "<test>")
    report = runner.run(cfg, only=("gpu_count",), probes=_table(nvml=Probe("nvml", nvml)), node="n1")
    assert [r.name for r in report.results] == ["gpu_count"]
    assert report.results[0].status == Status.OK
    assert called == ["nvml"]


@pytest.mark.timing
def test_a_probe_that_never_returns_becomes_a_timeout_within_its_deadline(timing: Timing):
    never = threading.Event()

    def stuck(ctx, t):
        never.wait(60)
        return _snapshot()

    cfg = resolve(_own({"checks": {"nvml": {"timeout_s": 0.5}, "gpu_count": {"timeout_s": 0.5}}}), "<test>")
    t0 = time.monotonic()
    report = runner.run(cfg, only=("nvml", "gpu_count"), probes=_table(nvml=Probe("nvml", stuck)), node="n1")
    elapsed = time.monotonic() - t0
    never.set()
    assert elapsed < 0.5 + runner.GRACE_S + timing.slack(0.5), elapsed
    nvml = report.results[0]
    assert nvml.status == Status.FAIL
    assert "did not finish" in nvml.summary


def test_probe_deadline_is_capped_by_the_phase_budget():
    seen = {}

    def spy(ctx, t):
        seen["timeout"] = t
        return _snapshot()

    ticks = iter([100.0] + [101.5] * 50)  # 1.5 s of the 2 s budget gone before the probe starts
    gpu = {"timeout_s": 2}
    cfg = resolve(
        _own({"phases": {"manual": {"budget_s": 2}}, "checks": {spec.name: gpu for spec in CHECKS}}), "<test>"
    )
    runner.run(cfg, only=("gpu_count",), probes=_table(nvml=Probe("nvml", spy)), node="n1", clock=lambda: next(ticks))
    assert seen["timeout"] == pytest.approx(0.5)


def test_a_probe_exception_becomes_a_probe_error():
    def boom(ctx, t):
        raise RuntimeError("sysfs exploded")

    cfg = resolve(_own({}), "<test>")
    report = runner.run(cfg, only=("gpu_ecc",), probes=_table(nvml=Probe("nvml", boom)), node="n1")
    assert report.results[0].status == Status.UNKNOWN
    assert "sysfs exploded" in report.results[0].summary


def test_a_check_exception_becomes_unknown(monkeypatch):
    from nodehealth.checks import gpu_ecc

    def broken(obs, settings, ctx):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(gpu_ecc, "evaluate", broken)
    cfg = resolve(_own({}), "<test>")
    report = runner.run(cfg, only=("gpu_ecc", "gpu_count"), probes=_table(), node="n1")
    by = {r.name: r for r in report.results}
    assert by["gpu_ecc"].status == Status.UNKNOWN
    assert "ZeroDivisionError" in by["gpu_ecc"].summary
    assert by["gpu_count"].status == Status.OK


def test_disabled_checks_do_not_run_in_a_phase():
    cfg = resolve(_own({"checks": {"gpu_ecc": {"enabled": False}}}), "<test>")
    report = runner.run(cfg, phase="prolog", probes=_table(), node="n1")
    names = [r.name for r in report.results]
    assert "gpu_ecc" not in names and "gpu_count" in names


@pytest.mark.parametrize("phase", ["prolog", "epilog", "healthcheck", "manual"])
def test_every_phase_runs_in_registry_order(phase):
    cfg = resolve(_own({}), "<test>")
    report = runner.run(
        cfg,
        phase=phase,
        probes={**PROBES, **_table()},
        node="n1",
        only=tuple(s.name for s in CHECKS if s.needs[0] == "nvml"),
    )
    order = [s.name for s in CHECKS]
    names = [r.name for r in report.results]
    assert names == sorted(names, key=order.index)
