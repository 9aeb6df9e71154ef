"""The read-only NVML validation kit (``nodehealth validate-nvml``, docs/validation.md), on simulated GPUs.

Every file is written; calls.jsonl covers every call the probe announces; a hung call is on
disk as started and never returned, within the deadline; the written scenario parses and its
replay agrees with the recording, while a changed copy does not; the ELF reader lists a real
library's exports (libc, and the simulated libnvidia-ml per branch); mutating calls are refused.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from nodehealth_sim import nvml as simnvml
from nodehealth_sim.validation import compare, scenario_writer

from nodehealth import cli
from nodehealth.probes.nvml import NVML_FUNCTIONS
from nodehealth.validation import elf, kit, record, report
from nodehealth.validation.record import Call

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "examples" / "scenarios"
KIT_SCENARIOS = ("healthy-8x-h100", "nvlink-down", "gpu-lost", "hung-nvml-call")
FILES = (
    "calls.jsonl",
    "observations.jsonl",
    "symbols.json",
    "nvidia-smi-q.txt",
    "nvrm.txt",
    "scenario.toml",
    "report.md",
    "report.json",
    "replay/calls.jsonl",
)
HANG_TIMEOUT_S = 2.0


def _simulator_ready() -> None:
    try:
        kit.simulated_loader(str(SCENARIOS / "healthy-8x-h100.toml"))
    except kit.ScenarioRefused as exc:
        pytest.skip(f"the simulated driver is not usable here: {exc}")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The kit run once on each scenario: {name: (dir, report, seconds)}."""
    _simulator_ready()
    out = {}
    for name in KIT_SCENARIOS:
        path = tmp_path_factory.mktemp(name)
        timeout = HANG_TIMEOUT_S if name.startswith("hung") else 30.0
        t0 = time.monotonic()
        doc = kit.run(str(path), simulate=str(SCENARIOS / f"{name}.toml"), timeout_s=timeout)
        out[name] = (path, doc, time.monotonic() - t0)
    return out


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("name", KIT_SCENARIOS)
def test_every_file_is_written_and_calls_jsonl_covers_every_call(runs, name):
    path, doc, _ = runs[name]
    for f in FILES:
        assert (path / f).is_file() and (path / f).stat().st_size > 0, f
    items = _lines(path / "calls.jsonl")  # every line is JSON
    meta = items[0]
    assert meta["type"] == "meta" and meta["pynvml_version"] and meta["pynvml_path"].endswith(".py")
    starts = [i for i in items if i["type"] == "start"]
    ends = {i["seq"] for i in items if i["type"] in ("return", "never_returned")}
    assert starts and {s["seq"] for s in starts} == ends  # each call returned or is marked never returned
    assert [s["seq"] for s in starts] == list(range(1, len(starts) + 1))
    for r in (i for i in items if i["type"] == "return"):
        assert isinstance(r["us"], int) and r["us"] >= 0
        assert r["rc"] == 0 or r["error"]
    # The probe announces each call before making it: the recording has every one, in order.
    announced = [o["value"] for o in _lines(path / "observations.jsonl") if o["type"] == "call"]
    made = [s["fn"] for s in starts]
    assert made[: len(announced)] == announced
    assert set(made[len(announced) :]) <= {"nvmlShutdown"}
    assert items[-1]["type"] == "end"
    assert not any(record.mutating(fn) for fn in made)
    # Handles are shown as GPU indices.
    gpu_calls = [s for s in starts if s["gpu"] is not None]
    assert gpu_calls and all(s["args"][0] == f"<gpu {s['gpu']}>" for s in gpu_calls)
    assert doc["timing"]["total_calls"] == len(starts)
    md = (path / "report.md").read_text()
    assert "## What was run" in md and "## Where the simulator disagrees" in md and "median µs" in md


def test_healthy_scenario_replays_without_a_difference(runs):
    path, doc, _ = runs["healthy-8x-h100"]
    scenario = simnvml.parse(str(path / "scenario.toml"))
    assert len(scenario.gpus) == 8
    assert [g.values["pci_bus_id"] for g in scenario.gpus] == list(
        simnvml.parse(str(SCENARIOS / "healthy-8x-h100.toml")).pci_bus_ids
    )
    replay = doc["replay"]
    assert replay["outcome"] == "complete" and replay["differences"] == []
    assert replay["recorded_calls"] == replay["replayed_calls"] == doc["timing"]["total_calls"]
    assert "same function sequence: yes" in (path / "report.md").read_text()
    assert (
        cli.main(
            [
                "validate-nvml",
                "--out",
                str(path / "again"),
                "--simulate",
                str(path / "scenario.toml"),
                "--timeout",
                "30",
            ]
        )
        == 0
    )


@pytest.mark.parametrize("name", ("nvlink-down", "gpu-lost"))
def test_faulty_scenarios_round_trip(runs, name):
    path, doc, _ = runs[name]
    assert doc["replay"]["differences"] == []
    text = (path / "scenario.toml").read_text()
    if name == "nvlink-down":
        assert "down = [5, 11]" in text
    else:
        errors = simnvml.parse(str(path / "scenario.toml")).errors
        assert any(code == simnvml.ERROR_CODES["GPU_IS_LOST"] and gpu == 3 for _, gpu, code in errors)


def test_a_hung_call_is_recorded_as_never_returned_within_the_timeout(runs):
    path, doc, seconds = runs["hung-nvml-call"]
    ((hang_call, hang_gpu),) = simnvml.parse(str(SCENARIOS / "hung-nvml-call.toml")).hangs
    field_calls = getattr(simnvml, "FIELD_CALLS", {})
    expected_fn = "nvmlDeviceGetFieldValues" if hang_call in field_calls else hang_call
    items = _lines(path / "calls.jsonl")
    never = [i for i in items if i["type"] == "never_returned"]
    assert len(never) == 1 and (never[0]["fn"], never[0]["gpu"]) == (expected_fn, hang_gpu)
    assert never[0]["waited_s"] < HANG_TIMEOUT_S + 1.0
    assert items[-1]["outcome"] == "timed_out"
    assert doc["timing"]["never_returned"][0]["fn"] == expected_fn
    # Recording and replay each stop at the deadline.
    assert seconds < 2 * (HANG_TIMEOUT_S + 1.0) + 5
    hangs = simnvml.parse(str(path / "scenario.toml")).hangs
    assert [(expected_fn if c in field_calls else c, g) for c, g in hangs] == [(expected_fn, hang_gpu)]
    assert doc["replay"]["differences"] == []


def test_a_modified_scenario_shows_differences(runs, tmp_path):
    path, _, _ = runs["healthy-8x-h100"]
    text = (path / "scenario.toml").read_text()
    text, n = re.subn(
        r"^temperature_c = (\d+)$", lambda m: f"temperature_c = {int(m.group(1)) + 20}", text, count=1, flags=re.M
    )
    assert n == 1
    text += '\n[[faults.errors]]\ncall = "nvmlDeviceGetPowerUsage"\ngpu = 1\nerror = "GPU_IS_LOST"\n'
    changed = tmp_path / "changed.toml"
    changed.write_text(text)
    loader, _ = kit.simulated_loader(str(changed))
    record.record(str(tmp_path / "rec"), loader, 30.0)
    diffs = compare.diff_calls(
        record.load(str(path / "calls.jsonl")), record.load(str(tmp_path / "rec" / "calls.jsonl"))
    )
    kinds = {d["kind"] for d in diffs}
    assert {"value", "return", "only_recorded"} <= kinds, kinds
    temp = [d for d in diffs if d["fn"] == "nvmlDeviceGetTemperature" and d["kind"] == "value"]
    assert temp and temp[0]["gpu"] == 0 and temp[0]["replayed"] == temp[0]["recorded"] + 20
    lost = [d for d in diffs if d["kind"] == "return"]
    assert lost[0]["fn"] == "nvmlDeviceGetPowerUsage" and lost[0]["gpu"] == 1 and "GPU_IS_LOST" in lost[0]["replayed"]
    md = report.render_markdown(
        {
            "run": {},
            "timing": report.timing([]),
            "symbols": {"status": "x"},
            "replay": {
                "outcome": "complete",
                "recorded_calls": 1,
                "replayed_calls": 1,
                "differences": diffs,
                "summary": compare.summarise_differences(diffs),
            },
        }
    )
    assert "same values: no" in md and "same return codes: no" in md and "same function sequence: no" in md


# --------------------------------------------------------------------------- the read-only guard


def test_the_recorder_refuses_every_mutating_call():
    import pynvml

    sink: list[dict] = []
    proxy = record.RecordingNvml(pynvml, sink.append)
    with pytest.raises(record.MutatingCallRefused, match="never changes a GPU setting"):
        proxy.nvmlDeviceSetPersistenceMode(0, 1)
    for name in (
        "nvmlDeviceClearEccErrorCounts",
        "nvmlDeviceResetGpuLockedClocks",
        "nvmlDeviceSetPowerManagementLimit",
        "nvmlDeviceSetMigMode",
        "nvmlDeviceModifyDrainState",
        "nvmlDeviceRemoveGpu",
        "nvmlEventSetCreate",
        "nvmlDeviceRegisterEvents",
        "nvmlDeviceSetPersistenceMode",
        "nvmlLib",
        "_nvmlCheckReturn",
    ):
        with pytest.raises(record.MutatingCallRefused):
            getattr(proxy, name)
    # The C functions the probe calls itself pass the same guard, by symbol.
    for symbol in ("nvmlDeviceSetPersistenceMode", "nvmlDeviceClearEccErrorCounts", "nvmlDeviceResetGpuLockedClocks"):
        with pytest.raises(record.MutatingCallRefused):
            proxy._nvmlGetFunctionPointer(symbol)
    setters = [
        n
        for n in dir(pynvml)
        if n.startswith("nvml")
        and callable(getattr(pynvml, n))
        and re.search(r"Set|Clear|Reset|Register", n)
        and not re.search(r"Settings|Offset", n)
    ]
    assert setters and all(record.mutating(n) for n in setters)
    assert not [n for n in NVML_FUNCTIONS if record.mutating(n)]  # the probe's calls all go through
    assert not any(n for n in dir(proxy) if n.startswith("nvml") and record.mutating(n))
    assert sink == []  # nothing was called


def test_the_recorder_wraps_calls_and_renders_ctypes_values():
    class Nv:
        NVML_ERROR_NOT_SUPPORTED = 3

        class NVMLError(Exception):
            def __init__(self, value):
                super().__init__(value)
                self.value = value

        def nvmlDeviceGetHandleByIndex(self, i):
            return object()

        def nvmlDeviceGetMemoryInfo(self, handle):
            import pynvml

            mem = pynvml.c_nvmlMemory_t()
            mem.total, mem.used, mem.free = 100, 40, 60
            return mem

        def nvmlDeviceGetFieldValues(self, handle, ids):
            import pynvml

            values = (pynvml.c_nvmlFieldValue_t * 2)()
            values[0].fieldId, values[0].scopeId, values[0].valueType, values[0].nvmlReturn = 230, 0, 1, 0
            values[0].value.uiVal = 2
            values[1].fieldId, values[1].nvmlReturn = 82, 3
            return values

        def nvmlDeviceGetUUID(self, handle):
            raise self.NVMLError(3)

    sink: list[dict] = []
    proxy = record.RecordingNvml(Nv(), sink.append)
    h = proxy.nvmlDeviceGetHandleByIndex(2)
    proxy.nvmlDeviceGetMemoryInfo(h)
    proxy.nvmlDeviceGetFieldValues(h, [230, 82])
    with pytest.raises(Nv.NVMLError):
        proxy.nvmlDeviceGetUUID(h)
    returns = [r for r in sink if r["type"] == "return"]
    assert returns[0]["value"] == {"handle": 2}
    assert returns[1]["gpu"] == 2 and returns[1]["value"] == {"total": 100, "free": 60, "used": 40}
    assert returns[2]["value"] == [
        {"fieldId": 230, "scopeId": 0, "nvmlReturn": 0, "value": 2},
        {"fieldId": 82, "scopeId": 0, "nvmlReturn": 3, "value": None},
    ]
    assert (returns[3]["rc"], returns[3]["error"]) == (3, "NOT_SUPPORTED")
    assert [r["args"] for r in sink if r["type"] == "start"][1] == ["<gpu 2>"]
    json.dumps(sink)


# --------------------------------------------------------------------------- the ELF reader


def _libc() -> str:
    found = record.mapped_libraries("libc.so") or record.mapped_libraries("libc-")
    if not found:
        name = ctypes.util.find_library("c")
        pytest.skip(f"libc not found among this process's mappings (find_library: {name})")
    return os.path.realpath(found[0])


def test_the_elf_reader_lists_libc_exports():
    path = _libc()
    names = elf.exported(path)
    assert {"malloc", "free", "printf", "open"} <= set(names)
    assert elf.exported(path, use_sections=False) == names  # PT_DYNAMIC gives the same table
    nm = shutil.which("nm")
    if nm:  # binutils, where it is installed, as the oracle
        out = subprocess.run([nm, "-D", "--defined-only", path], capture_output=True, text=True, check=True).stdout
        theirs = {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}
        assert set(names) == theirs
    with pytest.raises(elf.ElfError):
        elf.exported(__file__)


def test_the_elf_reader_lists_the_simulated_driver_exports_per_branch():
    if "fakenvml:" not in (ROOT / "Makefile").read_text():
        pytest.skip("the Makefile has no fakenvml target yet (the simulated libnvidia-ml.so.1 is not buildable)")
    try:
        from nodehealth_sim import driver
    except ImportError:
        pytest.skip("nodehealth.sim.driver (library_path) does not exist yet")
    branches, table = compare.read_symbol_table(compare.default_symbol_table())
    try:
        paths = {b: driver.library_path(b) for b in branches}
    except Exception:  # noqa: BLE001 - not built yet: build it, as make test does
        subprocess.run(["make", "-s", "fakenvml"], cwd=ROOT, check=True, capture_output=True)
        paths = {b: driver.library_path(b) for b in branches}
    for branch, path in paths.items():
        expected = sorted(s for s, bs in table.items() if branch in bs)
        assert elf.exported(str(path), "nvml") == expected, branch
        cmp = compare.compare_symbols(elf.exported(str(path), "nvml"), f"{branch}.0.0")
        assert cmp["branch"] == branch and cmp["simulator_only"] == cmp["driver_only"] == []


def test_the_symbol_comparison_names_both_sides(tmp_path):
    table = tmp_path / "symbols.tsv"
    table.write_text("# a comment\nsymbol\t535\t550\nnvmlInit_v2\t1\t1\nnvmlNew\t0\t1\nnvmlOld\t1\t0\n")
    cmp = compare.compare_symbols(["nvmlInit_v2", "nvmlOld", "nvmlExtra"], "550.54.15", table)
    assert cmp["status"] == "compared" and cmp["branch"] == 550
    assert cmp["simulator_only"] == ["nvmlNew"] and cmp["driver_only"] == ["nvmlOld"]
    assert cmp["not_implemented"] == 1
    assert compare.compare_symbols(None, "550", table)["status"].startswith("no driver library")
    assert "does not exist" in compare.compare_symbols([], "550", tmp_path / "none.tsv")["status"]


# --------------------------------------------------------------------------- scenario writer, evidence, CLI


def _call(seq, fn, gpu, argv, value=None, rc=0, error=None, out=None, returned=True):
    return Call(seq, fn, gpu, [repr(a) for a in argv], argv, returned, rc, error, value, None, out or [], 1)


def test_the_writer_reads_field_values_and_errors():
    h = {"handle": 0}
    fields = [[3, 0], [29, 0], [30, 0], [31, 0], [82, 0], [91, 0], [142, 0], [230, 0]]
    values = [
        {"fieldId": 3, "scopeId": 0, "nvmlReturn": 0, "value": 2},
        {"fieldId": 29, "scopeId": 0, "nvmlReturn": 3, "value": None},
        {"fieldId": 30, "scopeId": 0, "nvmlReturn": 3, "value": None},
        {"fieldId": 31, "scopeId": 0, "nvmlReturn": 3, "value": None},
        {"fieldId": 82, "scopeId": 0, "nvmlReturn": 0, "value": 44},
        {"fieldId": 91, "scopeId": 0, "nvmlReturn": 0, "value": 2},
        {"fieldId": 142, "scopeId": 0, "nvmlReturn": 0, "value": 1},
        {"fieldId": 230, "scopeId": 0, "nvmlReturn": 0, "value": 2},
    ]
    links = [
        {"fieldId": 165, "scopeId": 0, "nvmlReturn": 0, "value": 1},
        {"fieldId": 161, "scopeId": 0, "nvmlReturn": 0, "value": 5},
        {"fieldId": 165, "scopeId": 1, "nvmlReturn": 0, "value": 0},
        {"fieldId": 161, "scopeId": 1, "nvmlReturn": 0, "value": 0},
    ]
    calls = [
        _call(1, "nvmlSystemGetDriverVersion", None, [], "550.127.05"),
        _call(2, "nvmlDeviceGetCount", None, [], 2),
        _call(3, "nvmlDeviceGetHandleByIndex", None, [0], h),
        _call(4, "nvmlDeviceGetPciInfo", 0, [h], {"busId": "00000000:3B:00.0"}),
        _call(5, "nvmlDeviceGetFieldValues", 0, [h, fields], values),
        _call(6, "nvmlDeviceGetFieldValues", 0, [h, [[v["fieldId"], v["scopeId"]] for v in links]], links),
        _call(7, "nvmlDeviceGetTemperatureThreshold", 0, [h, 3], 87),
        _call(8, "nvmlDeviceGetMigMode", 0, [h], [1, 1]),
        _call(9, "nvmlDeviceGetPersistenceMode", 0, [h], None, 3, "NOT_SUPPORTED"),
        _call(10, "nvmlDeviceGetUUID", 0, [h], None, 999, "UNKNOWN"),
        _call(11, "nvmlDeviceGetHandleByIndex", None, [1], None, 15, "GPU_IS_LOST"),
        _call(12, "nvmlDeviceGetName", 0, [h], returned=False),
    ]
    built = scenario_writer.scenario_from_calls(calls, ["0000:3b:00.0", "0000:5e:00.0", "0000:86:00.0"])
    g0 = built.gpus[0]
    assert g0["pci_bus_id"] == "0000:3b:00.0" and g0["ecc"] == {"volatile_corrected": 2}
    assert g0["memory_temp_c"] == 44 and g0["gpu_max_c"] == 87 and g0["mig_mode"] is True
    assert g0["recovery_action"] == "node_reboot" and g0["remapped_rows"] == {"correctable": 1}
    assert g0["nvlink"] == {"links": 2, "down": [1], "replay": 0, "errors": [{"link": 0, "replay": 5}]}
    assert sorted(g0["unsupported"]) == ["nvmlDeviceGetPersistenceMode", "nvmlDeviceGetRetiredPages"]
    assert built.gpus[1]["pci_bus_id"] == "0000:5e:00.0"  # counted, unreadable: the next PCI address
    assert built.gpus[2] == {"pci_bus_id": "0000:86:00.0", "missing": True}
    assert built.faults["errors"] == [
        {"call": "nvmlDeviceGetUUID", "gpu": 0, "error": "UNKNOWN"},
        {"call": "nvmlDeviceGetHandleByIndex", "gpu": 1, "error": "GPU_IS_LOST"},
    ]
    assert built.faults["hangs"] == [{"call": "nvmlDeviceGetName", "gpu": 0}]
    assert built.node["driver_version"] == "550.127.05" and built.node["driver_branch"] == 550
    toml = scenario_writer.to_toml(built, "header")
    import sys

    tomllib = __import__("tomllib" if sys.version_info >= (3, 11) else "tomli")
    assert tomllib.loads(toml)["gpu"][0]["nvlink"]["errors"] == [{"link": 0, "replay": 5}]


def test_keys_the_simulator_refuses_are_dropped_with_a_note(tmp_path):
    built = scenario_writer.Built(
        node={"driver_version": "550.127.05", "future_key": 1},
        gpus=[
            {
                "pci_bus_id": "0000:18:00.0",
                "temperature_c": 30,
                "hbm_future_c": 3,
                "unsupported": ["nvmlDeviceGetNoSuchThing", "nvmlDeviceGetName"],
            }
        ],
    )
    notes = scenario_writer.write(str(tmp_path / "s.toml"), built)
    scenario = simnvml.parse(str(tmp_path / "s.toml"))
    assert scenario.gpus[0].values["temperature_c"] == 30
    assert scenario.gpus[0].unsupported == frozenset({"nvmlDeviceGetName"})
    assert len(notes) == 3 and any("node.future_key" in n for n in notes) and any("hbm_future_c" in n for n in notes)


def test_real_mode_without_a_driver_writes_the_host_evidence(tmp_path):
    if ctypes.util.find_library("nvidia-ml"):
        pytest.skip("this machine has an NVIDIA driver: run nodehealth validate-nvml by hand")
    smi = tmp_path / "nvidia-smi"
    smi.write_text('#!/bin/sh\necho "==============NVSMI LOG=============="\necho "args: $*"\n')
    smi.chmod(0o755)
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(
        "6,100,5000,-;usb 1-1: new device\n"
        "4,101,6000,-;NVRM: Xid (PCI:0000:18:00): 79, pid=1234, GPU has fallen off the bus.\n"
    )
    (tmp_path / "sys").mkdir()
    out = tmp_path / "out"
    doc = kit.run(str(out), timeout_s=30.0, sysfs_root=str(tmp_path / "sys"), kmsg_path=str(kmsg), nvidia_smi=str(smi))
    smi_text = (out / "nvidia-smi-q.txt").read_text()
    assert "NVSMI LOG" in smi_text and "args: -q" in smi_text
    nvrm = (out / "nvrm.txt").read_text()
    assert "Xid" in nvrm and "usb" not in nvrm
    calls = record.load(str(out / "calls.jsonl"))
    assert calls[0].fn == "nvmlInit" and calls[0].rc == 12 and calls[0].error == "LIBRARY_NOT_FOUND"
    assert simnvml.parse(str(out / "scenario.toml")).nvml == "library_not_found"
    assert doc["run"]["mode"] == "real" and doc["replay"]["differences"] == []
    assert json.loads((out / "symbols.json").read_text())["exported"] is None


def test_evidence_runs_only_read_only_programs_by_absolute_path(tmp_path):
    from nodehealth.platform import evidence

    with pytest.raises(ValueError):
        evidence.run_readonly(["nvidia-smi", "-q"], 5)
    with pytest.raises(ValueError, match="would change the kernel log"):
        evidence.run_readonly(["/usr/bin/dmesg", "-c"], 5)
    slow = tmp_path / "slow"
    slow.write_text("#!/bin/sh\necho started\nexec sleep 30\n")
    slow.chmod(0o755)
    t0 = time.monotonic()
    out = evidence.run_readonly([str(slow)], 0.5)
    assert out.rc is None and "did not finish" in (out.error or "") and time.monotonic() - t0 < 5
    missing = kit.kernel_lines(lambda line: True, str(tmp_path / "no-such-kmsg"))
    assert missing.notes and str(tmp_path / "no-such-kmsg") in missing.notes[0]


def test_cli_bad_scenario_is_a_usage_error(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text("[[gpu]]\ntemperature = 3\n")
    assert cli.main(["validate-nvml", "--out", str(tmp_path / "o"), "--simulate", str(bad)]) == 2
    assert "gpu[0].temperature" in capsys.readouterr().err
    assert cli.main(["validate-nvml", "--out", str(tmp_path / "o"), "--timeout", "0"]) == 2


def test_a_node_whose_nvml_does_not_start_is_not_validated(tmp_path, capsys):
    """A host without a driver (here its scenario) records one refused nvmlInit: that validates nothing, so
    neither "complete" nor "0 differences", and exit 1; the evidence is still written."""
    out = tmp_path / "o"
    scenario = SCENARIOS / "nvml-not-installed.toml"
    assert cli.main(["validate-nvml", "--out", str(out), "--simulate", str(scenario), "--timeout", "30"]) == 1
    said = capsys.readouterr().out
    assert "not validated: NVML did not start here (nvmlInit: LIBRARY_NOT_FOUND)" in said, said
    assert "complete" not in said and "difference" not in said
    doc = json.loads((out / "report.json").read_text())
    assert doc["run"]["nvml_init_error"] == "nvmlInit: LIBRARY_NOT_FOUND" and (out / "calls.jsonl").is_file()


def test_a_node_whose_nvml_starts_has_no_init_error(runs):
    _, doc, _ = runs["healthy-8x-h100"]
    assert doc["run"]["nvml_init_error"] is None


# ---------------------------------------------------------------- --out on someone else's ground

NOBODY = 65534
OUT_NAMES = (
    "report.md",
    "report.json",
    "calls.jsonl",
    "observations.jsonl",
    "symbols.json",
    "scenario.toml",
    "nvidia-smi-q.txt",
    "nvrm.txt",
)


def _victims(tmp_path: Path) -> dict[str, Path]:
    """root's own 0600 files, one per name the kit writes."""
    d = tmp_path / "root-only"
    d.mkdir(mode=0o700)
    out = {}
    for name in OUT_NAMES:
        p = d / name
        p.write_text(f"root's {name}\n")
        p.chmod(0o600)
        out[name] = p
    return out


def _plant_links(out: Path, victims: dict[str, Path]) -> None:
    for name, victim in victims.items():
        if name == "nvrm.txt":
            os.mkfifo(out / name)  # a reader or writer that opened it would wait for ever
        elif name == "report.json":
            os.link(victim, out / name)  # the same file under a second name
        else:
            (out / name).symlink_to(victim)


def test_links_planted_in_out_are_replaced_never_written_through(tmp_path):
    _simulator_ready()
    victims = _victims(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    _plant_links(out, victims)
    (out / "replay").symlink_to(victims["report.md"].parent)
    doc = kit.run(str(out), simulate=str(SCENARIOS / "healthy-8x-h100.toml"), timeout_s=30.0)
    for name, victim in victims.items():
        assert victim.read_text() == f"root's {name}\n", name
        assert (out / name).is_file() and not (out / name).is_symlink(), name
    assert os.lstat(out / "report.json").st_nlink == 1
    assert "replay/ not written into: replay is a symbolic link" in doc["replay"]["error"]
    assert "report.md" in doc["files"] and "nvrm.txt" in doc["files"]


def test_an_out_dir_of_another_user_is_refused_before_anything_is_written(tmp_path, capsys):
    victims = _victims(tmp_path)
    out = tmp_path / "theirs"
    out.mkdir()
    _plant_links(out, victims)
    os.chown(out, NOBODY, NOBODY)
    before = sorted(p.name for p in out.iterdir())
    with pytest.raises(OSError, match=r"owned by uid 65534 \(nobody\), not by uid 0"):
        kit.run(str(out), simulate=str(SCENARIOS / "healthy-8x-h100.toml"), timeout_s=30.0, replay=False)
    assert (
        cli.main(
            ["validate-nvml", "--out", str(out), "--simulate", str(SCENARIOS / "healthy-8x-h100.toml"), "--no-replay"]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "not written into" in err and "uid 65534 (nobody)" in err, err
    for name, victim in victims.items():
        assert victim.read_text() == f"root's {name}\n", name
    assert sorted(p.name for p in out.iterdir()) == before


@pytest.mark.parametrize("kind", ["symlink to a directory", "world-writable"])
def test_an_out_that_is_a_link_or_others_can_write_is_refused(tmp_path, kind):
    target = tmp_path / "elsewhere"
    target.mkdir()
    out = tmp_path / "out"
    if kind == "world-writable":
        out.mkdir()
        out.chmod(0o777)
        match = r"writable by group or others \(mode 0777\)"
    else:
        out.symlink_to(target)
        match = "is a symbolic link, not a directory"
    with pytest.raises(OSError, match=match):
        kit.run(str(out), simulate=str(SCENARIOS / "healthy-8x-h100.toml"), timeout_s=30.0, replay=False)
    assert list(target.iterdir()) == []
    if kind == "world-writable":
        assert list(out.iterdir()) == []


def test_a_fresh_out_is_made_ours_and_a_rerun_replaces_our_own_files(tmp_path):
    _simulator_ready()
    out = tmp_path / "new" / "out"
    kit.run(str(out), simulate=str(SCENARIOS / "healthy-8x-h100.toml"), timeout_s=30.0, replay=False)
    st = os.lstat(out)
    assert st.st_uid == os.geteuid() and st.st_mode & 0o777 == 0o755
    first = (out / "calls.jsonl").read_text()
    kit.run(str(out), simulate=str(SCENARIOS / "healthy-8x-h100.toml"), timeout_s=30.0, replay=False)
    assert (out / "calls.jsonl").read_text().count('"type": "meta"') == 1 and first
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]  # no temp file left
