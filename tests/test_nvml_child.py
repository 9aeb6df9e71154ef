"""The NVML child: streamed frames, deadlines, abandonment, crashes."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from conftest import Timing
from nodehealth_sim import nvml as simnvml

from nodehealth.observations import NvmlSnapshot, ProbeError
from nodehealth.probes import nvml


def scenario(tmp_path: Path, text: str):
    path = tmp_path / "s.toml"
    path.write_text(text)
    return simnvml.loader(simnvml.parse(str(path)))


@pytest.mark.timing
def test_a_hang_in_shutdown_after_all_data_costs_only_the_grace(tmp_path, timing: Timing):
    loader = scenario(tmp_path, '[[gpu]]\n[[gpu]]\n[[faults.hangs]]\ncall = "nvmlShutdown"\n')
    t0 = time.monotonic()
    snap = nvml.start(loader, timeout_s=5.0).collect()
    elapsed = time.monotonic() - t0
    assert isinstance(snap, NvmlSnapshot) and snap.complete and len(snap.gpus) == 2
    assert elapsed < nvml.SHUTDOWN_GRACE_S + timing.slack(0.5), elapsed


def test_a_hang_mid_node_keeps_what_was_read_and_names_the_call(tmp_path):
    loader = scenario(tmp_path, '[[gpu]]\n[[gpu]]\n[[gpu]]\n[[faults.hangs]]\ncall = "nvmlDeviceGetEccMode"\ngpu = 2\n')
    # The budget is far beyond the call's deadline: whatever the machine's load, the call's own
    # deadline ends the read ("hung"), never the budget.
    pending = nvml.start(loader, timeout_s=120.0, call_timeout_s=1.0)
    snap = pending.collect()
    assert isinstance(snap, NvmlSnapshot) and not snap.complete and snap.stop == "hung"
    assert [g.index for g in snap.gpus] == [0, 1]
    assert (snap.stalled_gpu, snap.stalled_call) == (2, "nvmlDeviceGetEccMode")
    # The child was killed; it is gone (or a zombie about to be reaped), never left running. A killed
    # process may wait for a CPU before it is gone: poll, the deadline only stops a broken test.
    stat = Path(f"/proc/{pending.pid}/stat")

    def ended() -> bool:
        try:
            os.waitpid(pending.pid, os.WNOHANG)
        except ChildProcessError:
            pass
        try:
            return "Z" in stat.read_text().split()[2]
        except FileNotFoundError:
            return True

    end = time.monotonic() + 60
    while not ended() and time.monotonic() < end:
        time.sleep(0.01)
    assert ended()


def test_a_crashing_loader_is_a_probe_error_not_an_exception():
    def loader():
        raise RuntimeError("libnvidia-ml.so exploded")

    res = nvml.start(loader, timeout_s=2.0).collect()
    assert isinstance(res, ProbeError) and res.kind == "error" and "exploded" in res.message


def test_missing_nvidia_ml_py_is_unavailable():
    def loader():
        raise nvml.NvmlUnavailable("library_not_found", "nvidia-ml-py is not installed")

    res = nvml.start(loader, timeout_s=2.0).collect()
    assert isinstance(res, ProbeError) and res.kind == "unavailable"


def test_real_pynvml_without_a_driver_is_unavailable_here():
    # This machine has nvidia-ml-py but no NVIDIA driver: the real module, loaded in the child.
    res = nvml.start(nvml.load_module, timeout_s=5.0).collect()
    if isinstance(res, NvmlSnapshot):  # a machine with a GPU: the real probe must have read it
        assert res.complete and res.device_count == len(res.gpus)
    else:
        assert res.kind == "unavailable", res


# --------------------------------------------------------------------------- slow is not hung


def test_a_slow_gpu_open_that_makes_progress_is_not_hung(tmp_path):
    """Without persistence mode each first open brings the GPU up (1.5 s here, mapping memory as
    it goes): past its 0.5 s deadline, but never without progress for 0.5 s, so the read finishes."""
    loader = scenario(tmp_path, "[defaults]\npersistence_mode = false\ninit_ms = 1500\n[[gpu]]\n[[gpu]]\n")
    snap = nvml.start(loader, timeout_s=120.0, slow_call_timeout_s=0.5).collect()
    assert isinstance(snap, NvmlSnapshot) and snap.complete, snap
    assert [g.persistence_mode for g in snap.gpus] == [False, False]


def test_a_stuck_gpu_open_is_hung_after_its_deadline_without_progress(tmp_path):
    loader = scenario(tmp_path, '[[gpu]]\n[[gpu]]\n[[faults.hangs]]\ncall = "nvmlDeviceGetHandleByIndex"\ngpu = 1\n')
    snap = nvml.start(loader, timeout_s=120.0, slow_call_timeout_s=0.5).collect()
    assert isinstance(snap, NvmlSnapshot) and snap.stop == "hung"
    assert (snap.stalled_gpu, snap.stalled_call, snap.call_timeout_s) == (1, "nvmlDeviceGetHandleByIndex", 0.5)
    assert [g.index for g in snap.gpus] == [0]


def test_the_reader_starting_slowly_does_not_count_against_its_first_call(tmp_path):
    """A loaded machine may take seconds to fork and import pynvml; no driver call runs then, so
    that time is no call's: a hung nvmlInit is still named hung, after its own deadline."""
    inner = scenario(tmp_path, '[[gpu]]\n[[faults.hangs]]\ncall = "nvmlInit"\n')

    def slow_start():
        time.sleep(1.0)  # longer than either deadline below
        return inner()

    snap = nvml.start(slow_start, timeout_s=120.0, call_timeout_s=0.3, slow_call_timeout_s=0.3).collect()
    assert isinstance(snap, NvmlSnapshot) and snap.stop == "hung", snap
    assert snap.stalled_call == "nvmlInit" and snap.stalled_gpu is None


def test_a_budget_that_ends_inside_a_slow_init_is_slow_not_hung(tmp_path):
    """nvmlInit still within its own deadline when the read's budget ends: the driver is slow;
    however much of the budget the call took, nothing says it is stuck."""
    loader = scenario(tmp_path, '[[gpu]]\n[[faults.slow]]\ncall = "nvmlInit"\nms = 60000\n')
    snap = nvml.start(loader, timeout_s=5.0, slow_call_timeout_s=120.0).collect()
    assert isinstance(snap, NvmlSnapshot) and snap.stop == "budget", snap
    assert snap.device_count is None and snap.stalled_call in ("nvmlInit", None)
