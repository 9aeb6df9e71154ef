"""``gpu_throttle``: time throttled per reason over a window, a power limit below its default.

The check's pure judgement over tables of windows (a job's baseline, the latest stored reading);
the reader's field ids per driver branch and its refusal of values that are not counters (a stub
NVML module); the ``counter_reading`` probe over a state dir in tmp_path; and the whole way through
the simulated driver (fields 74-79 on every branch, 252/253 only on 580).
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional

import pytest
from test_gpu_checks import h100, node

from nodehealth import runner
from nodehealth.checks import gpu_throttle
from nodehealth.checks.base import Context
from nodehealth.config.loader import resolve
from nodehealth.model import Action, Status
from nodehealth.observations import FieldError, JobObservation, Observations, gpu_counters
from nodehealth.observations.counters import CounterReading
from nodehealth.probes import PROBES, ProbeContext
from nodehealth.probes.nvml_h import THROTTLE_FIELDS, THROTTLE_FIELDS_580
from nodehealth.probes.nvml_read import GpuReader, _major
from nodehealth.statedir import counters, layout

BOOT = "0f0e0d0c-0b0a-0908-0706-050403020100"
SECOND = 1_000_000_000  # ns
NOW = 1_800_000_000.0


def gpus(**ns: int) -> Any:
    """8 H100s; GPU 3 has these throttle counters now, the others zero."""
    zero = tuple((r, 0) for _, r in THROTTLE_FIELDS + THROTTLE_FIELDS_580)
    return tuple(h100(i, throttle_ns=tuple(ns.items()) or zero if i == 3 else zero) for i in range(8))


def before(age_s: float, boot: Optional[str] = BOOT, **changes: Any) -> dict[str, Any]:
    """A stored reading of 8 GPUs with every counter at zero, ``age_s`` before NOW."""
    rec = counters.counters_record(gpu_counters(gpus()), NOW - age_s, boot, "daemon")
    rec.update(changes)
    return rec


def by_reading(now_gpus: Any, rec: Optional[dict[str, Any]], problem: Optional[str] = None) -> Observations:
    obs = node(*now_gpus)
    return replace(obs, counter_reading=CounterReading(rec, problem, BOOT, NOW))


def by_job(now_gpus: Any, baseline: Optional[dict[str, Any]], reading: Optional[dict[str, Any]] = None) -> Observations:
    obs = by_reading(now_gpus, reading)
    return replace(obs, job=JobObservation("42", (3,), NOW - 600, baseline, BOOT, NOW))


def judge(obs: Observations, **settings: Any) -> Any:
    ctx = Context(name="gpu_throttle", phase="daemon", node="n1", expected_gpus=8)
    return gpu_throttle.evaluate(obs, gpu_throttle.Settings(**settings), ctx)


CASES = [
    # (id, observations, settings, status, piece of the summary)
    (
        "thermal-30pct-of-a-minute",
        by_reading(gpus(thermal=18 * SECOND), before(60)),
        {},
        Status.WARN,
        "GPU 3: thermal throttling 30% of the time since the latest reading (60 s)",
    ),
    (
        "hw-power-brake",
        by_reading(gpus(hw_power_brake=9 * SECOND), before(60)),
        {},
        Status.WARN,
        "hw power brake throttling 15%",
    ),
    (
        "below-the-share",
        by_reading(gpus(thermal=3 * SECOND), before(60)),
        {},
        Status.OK,
        "not throttled over the time since the latest reading (60 s)",
    ),
    ("power-capping-is-normal", by_reading(gpus(power=60 * SECOND), before(60)), {}, Status.OK, "not throttled"),
    (
        "sync-boost-and-low-util-normal",
        by_reading(gpus(sync_boost=60 * SECOND, low_utilization=60 * SECOND), before(60)),
        {},
        Status.OK,
        "",
    ),
    (
        "fail-when-configured",
        by_reading(gpus(reliability=30 * SECOND), before(60)),
        {"throttle": "fail"},
        Status.FAIL,
        "reliability throttling 50%",
    ),
    (
        "ignore-when-configured",
        by_reading(gpus(thermal=60 * SECOND), before(60)),
        {"throttle": "ignore"},
        Status.OK,
        "",
    ),
    (
        "clock-skew-clamped-at-100",
        by_reading(gpus(board_limit=600 * SECOND), before(60)),
        {},
        Status.WARN,
        "board limit throttling 100%",
    ),
    (
        "another-boot-not-judged",
        by_reading(gpus(thermal=60 * SECOND), before(60, boot="other")),
        {},
        Status.OK,
        "from another boot",
    ),
    (
        "no-boot-id-not-judged",
        by_reading(gpus(thermal=60 * SECOND), before(60, boot=None)),
        {},
        Status.OK,
        "from another boot",
    ),
    (
        "too-short-not-judged",
        by_reading(gpus(thermal=5 * SECOND), before(5)),
        {},
        Status.OK,
        "shorter than min_window_s",
    ),
    (
        "too-old-not-judged",
        by_reading(gpus(thermal=3600 * SECOND), before(7200)),
        {},
        Status.OK,
        "longer than max_window_s",
    ),
    ("no-reading-yet", by_reading(gpus(thermal=60 * SECOND), None), {}, Status.OK, "no earlier counter reading"),
    (
        "unusable-reading-says-why",
        by_reading(gpus(thermal=60 * SECOND), None, "gpu-counters.json: not a JSON object"),
        {},
        Status.OK,
        "not a JSON object",
    ),
    ("braces-in-the-reason", by_reading(gpus(), None, "{n} {0} {x"), {}, Status.OK, "{n} {0} {x"),
    ("no-time", by_reading(gpus(thermal=60 * SECOND), before(60, time="soon")), {}, Status.OK, "no time or counters"),
    ("bool-time", by_reading(gpus(thermal=60 * SECOND), before(60, time=True)), {}, Status.OK, "no time or counters"),
    (
        "gpus-not-a-table",
        by_reading(gpus(thermal=60 * SECOND), before(60, gpus=[1, 2])),
        {},
        Status.OK,
        "no time or counters",
    ),
    # The job's own window (the epilog): the prolog's baseline, not capped by max_window_s.
    (
        "job-window",
        by_job(gpus(thermal=3600 * SECOND), before(7200)),
        {},
        Status.WARN,
        "thermal throttling 50% of job 42 (7200 s)",
    ),
    ("job-window-ok", by_job(gpus(), before(7200)), {}, Status.OK, "over job 42 (7200 s)"),
    (
        "job-without-baseline-uses-reading",
        by_job(gpus(thermal=30 * SECOND), None, before(60)),
        {},
        Status.WARN,
        "since the latest reading",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_window(case: tuple[str, Observations, dict[str, Any], Status, str]) -> None:
    _, obs, settings, status, piece = case
    res = judge(obs, **settings)
    assert res.status == status, res.summary
    assert piece in res.summary
    if status > Status.OK:
        assert (res.gpu, res.action) == (3, Action.INSPECT)


def test_a_counter_that_went_backwards_is_not_judged() -> None:
    """A driver reload resets the counters: a smaller value now is no throttling at all."""
    rec = before(60)
    rec["gpus"]["3"]["throttle_thermal_ns"] = 900 * SECOND
    assert judge(by_reading(gpus(thermal=5 * SECOND), rec)).status == Status.OK


def test_another_gpu_in_the_slot_is_not_judged() -> None:
    rec = before(60)
    rec["gpus"]["3"]["uuid"] = "GPU-replaced"
    assert judge(by_reading(gpus(thermal=60 * SECOND), rec)).status == Status.OK


@pytest.mark.parametrize("bad", [True, -1, 1.5, "0", None])
def test_a_stored_value_that_is_not_a_counter_is_not_judged(bad: Any) -> None:
    rec = before(60)
    rec["gpus"]["3"]["throttle_thermal_ns"] = bad
    assert judge(by_reading(gpus(thermal=60 * SECOND), rec)).status == Status.OK


def test_power_limit_within_the_tolerance_is_fine() -> None:
    obs = node(*(h100(i, power_limit_w=695.0 if i == 2 else 700.0) for i in range(8)))
    assert judge(obs).status == Status.OK
    assert judge(obs, power_limit_tolerance_pct=0).status == Status.WARN


def test_a_failed_throttle_field_is_unknown_never_ok() -> None:
    err = (FieldError("throttle_time", "unknown", "nvmlDeviceGetFieldValues field 75: unknown (NVML return 999)"),)
    obs = node(*(h100(i, errors=err) if i == 5 else h100(i) for i in range(8)))
    res = judge(obs)
    assert (res.status, res.gpu) == (Status.UNKNOWN, 5)


def test_defaults_never_drain() -> None:
    """Unconfigured, the check can WARN and never FAIL: a WARN drains no node (slurm.policy)."""
    s = gpu_throttle.Settings()
    assert (s.throttle, s.power_limit) == ("warn", "warn")
    obs = by_reading(gpus(thermal=60 * SECOND, reliability=60 * SECOND), before(60))
    assert (
        judge(
            replace(obs, nvml=replace(obs.nvml, gpus=tuple(replace(g, power_limit_w=100.0) for g in obs.nvml.gpus)))
        ).status
        == Status.WARN
    )


# --------------------------------------------------------------------------- the reader


class _Field:
    def __init__(self, fid: int, value: Any, ret: int = 0) -> None:
        self.fieldId, self.nvmlReturn = fid, ret
        if isinstance(value, float):
            self.valueType, self.value = 0, SimpleNamespace(dVal=value)
        else:
            self.valueType, self.value = 3, SimpleNamespace(ullVal=value)


class StubNvml:
    """Only a handle and the field-values call: every other function is missing (AttributeError)."""

    class NVMLError(Exception):
        pass

    def __init__(self, values: dict[int, Any], fail: Optional[dict[int, int]] = None) -> None:
        self.values, self.fail, self.asked = values, fail or {}, []

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        return f"h{index}"

    def nvmlDeviceGetFieldValues(self, handle: Any, wanted: list[tuple[int, int]]) -> list[_Field]:
        self.asked.append([fid for fid, _ in wanted])
        out = []
        for fid, _ in wanted:
            if fid in self.fail:
                out.append(_Field(fid, 0, self.fail[fid]))
            elif fid in self.values:
                out.append(_Field(fid, self.values[fid]))
            else:
                out.append(_Field(fid, 0, 3))  # NOT_SUPPORTED
        return out


def read(nv: StubNvml, driver_major: int) -> Any:
    return GpuReader(nv, lambda frame: None, {"driver_major": driver_major}).read(0)  # type: ignore[arg-type]


ALL_IDS = {fid: 1000 + fid for fid, _ in THROTTLE_FIELDS + THROTTLE_FIELDS_580}


def test_the_580_fields_are_asked_only_of_580_and_later() -> None:
    """In the 12.8 header (570) ids 252/253 are power-smoothing fields a 570 driver answers."""
    for major, expect_hw in ((570, False), (580, True), (0, False)):
        nv = StubNvml(ALL_IDS)
        gpu = read(nv, major)
        asked = set(nv.asked[0])
        assert {74, 75, 76, 77, 78, 79} <= asked
        assert ({252, 253} <= asked) is expect_hw and (not asked & {252, 253}) is (not expect_hw)
        reasons = dict(gpu.throttle_ns)
        assert reasons["thermal"] == 1075 and reasons["reliability"] == 1079
        assert ("hw_thermal" in reasons) is expect_hw


@pytest.mark.parametrize("bad", [-5, 1 << 64, 2.5, True])
def test_a_value_that_is_not_a_counter_is_refused(bad: Any) -> None:
    gpu = read(StubNvml({**ALL_IDS, 75: bad}), 580)
    assert "thermal" not in dict(gpu.throttle_ns)
    assert dict(gpu.throttle_ns)["power"] == 1074


def test_no_throttle_field_supported_is_none() -> None:
    assert read(StubNvml({}), 580).throttle_ns is None


def test_a_failed_throttle_field_is_an_error_of_its_own() -> None:
    gpu = read(StubNvml(ALL_IDS, fail={77: 999}), 580)
    assert [e.field for e in gpu.errors] == ["throttle_time"]
    assert "board_limit" not in dict(gpu.throttle_ns)


@pytest.mark.parametrize(
    ("text", "major"), [("580.65.06", 580), (b"570.86.15", 570), ("", 0), (None, 0), ("r580", 0), ("99999999.1", 0)]
)
def test_driver_major(text: Any, major: int) -> None:
    assert _major(text) == major


# --------------------------------------------------------------------------- the probe and the state dir


def _config(tmp: Path, **nvml: Any) -> Any:
    procfs = tmp / "proc"
    (procfs / "sys/kernel/random").mkdir(parents=True)
    (procfs / "sys/kernel/random/boot_id").write_text(BOOT + "\n")
    paths = {"state_dir": str(tmp / "state"), "procfs_root": str(procfs)}
    return resolve({"paths": paths, "gpu": {"expected_count": 2}, **({"nvml": nvml} if nvml else {})}, "<test>")


def test_counters_file_keeps_the_throttle_counters(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    layout_dir = cfg.paths.state_dir
    Path(layout_dir).mkdir(mode=0o700)
    counters.write_latest(layout_dir, gpu_counters(gpus(thermal=7 * SECOND)), BOOT, "daemon")
    got = PROBES["counter_reading"].gather(ProbeContext(cfg, "n1"), 1.0)
    assert isinstance(got, CounterReading) and got.problem is None and got.boot_id == BOOT
    assert got.reading["gpus"]["3"]["throttle_thermal_ns"] == 7 * SECOND


def test_a_symlinked_or_hostile_counters_file_is_no_reading(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    state = Path(cfg.paths.state_dir)
    state.mkdir(mode=0o700)
    target = tmp_path / "elsewhere.json"
    target.write_text(json.dumps(before(60)))
    (state / Path(layout.path(str(state), layout.COUNTERS)).name).symlink_to(target)
    got = PROBES["counter_reading"].gather(ProbeContext(cfg, "n1"), 1.0)
    assert got.reading is None
    link = Path(layout.path(str(state), layout.COUNTERS))
    link.unlink()
    link.write_text('{"time": 1, "gpus": {"0": {"throttle_thermal_ns": -1}}}')
    got = PROBES["counter_reading"].gather(ProbeContext(cfg, "n1"), 1.0)
    assert got.reading is None and "not a counter" in (got.problem or "")


SCENARIO = """[node]
driver_version = "{driver}"
driver_branch = {branch}

[[gpu]]
throttle_time_ns = {{ thermal = 60_000_000_000, hw_thermal = 30_000_000_000, power = 90_000_000_000 }}

[[gpu]]
"""


@pytest.mark.parametrize(("branch", "driver"), [(570, "570.86.15"), (580, "580.65.06")])
def test_through_the_simulated_driver(tmp_path: Path, branch: int, driver: str) -> None:
    """The scenario's counters through the fake library, the probe, the stored reading and the check."""
    (tmp_path / "node.toml").write_text(SCENARIO.format(branch=branch, driver=driver))
    cfg = _config(tmp_path, simulate=str(tmp_path / "node.toml"))
    state = Path(cfg.paths.state_dir)
    state.mkdir(mode=0o700)
    judged = runner.execute(cfg, only=("gpu_throttle",), node="sim01")
    gpu0 = judged.observations.nvml.gpus[0]
    reasons = dict(gpu0.throttle_ns)
    assert reasons["thermal"] == 60 * SECOND and reasons["power"] == 90 * SECOND
    assert ("hw_thermal" in reasons) is (branch >= 580)
    assert gpu0.power_default_limit_w == gpu0.power_limit_w
    # No earlier reading: nothing judged, said so. Then a reading of zeros two minutes ago.
    assert "no earlier counter reading" in judged.report.results[0].summary
    zero = {str(g.index): {"uuid": g.uuid} for g in judged.observations.nvml.gpus}
    rec = counters.counters_record(zero, time.time() - 120, BOOT, "daemon")
    for rec_gpu in rec["gpus"].values():
        rec_gpu.update({f"throttle_{r}_ns": 0 for _, r in THROTTLE_FIELDS + THROTTLE_FIELDS_580})
    Path(layout.path(str(state), layout.COUNTERS)).write_text(json.dumps(rec))
    res = runner.run(cfg, only=("gpu_throttle",), node="sim01").results[0]
    assert (res.status, res.gpu) == (Status.WARN, 0), res.summary
    assert "thermal throttling" in res.summary
