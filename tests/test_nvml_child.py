"""The NVML child: streamed frames, deadlines, abandonment, crashes."""

from __future__ import annotations

import os
import time
from pathlib import Path

from nodehealth.observations import NvmlSnapshot, ProbeError
from nodehealth.probes import nvml
from nodehealth.sim import nvml as simnvml


def scenario(tmp_path: Path, text: str):
    path = tmp_path / "s.toml"
    path.write_text(text)
    return simnvml.loader(simnvml.parse(str(path)))


def test_a_hang_in_shutdown_after_all_data_costs_only_the_grace(tmp_path):
    loader = scenario(tmp_path, '[[gpu]]\n[[gpu]]\n[[faults.hangs]]\ncall = "nvmlShutdown"\n')
    t0 = time.monotonic()
    snap = nvml.start(loader, timeout_s=5.0, simulated=True).collect()
    elapsed = time.monotonic() - t0
    assert isinstance(snap, NvmlSnapshot) and snap.complete and len(snap.gpus) == 2
    assert elapsed < nvml.SHUTDOWN_GRACE_S + 0.5


def test_a_hang_mid_node_keeps_what_was_read_and_names_the_call(tmp_path):
    loader = scenario(tmp_path, '[[gpu]]\n[[gpu]]\n[[gpu]]\n[[faults.hangs]]\ncall = "nvmlDeviceGetEccMode"\ngpu = 2\n')
    pending = nvml.start(loader, timeout_s=5.0, simulated=True, call_timeout_s=1.0)
    t0 = time.monotonic()
    snap = pending.collect()
    assert time.monotonic() - t0 < 1.5
    assert isinstance(snap, NvmlSnapshot) and not snap.complete
    assert [g.index for g in snap.gpus] == [0, 1]
    assert (snap.stalled_gpu, snap.stalled_call) == (2, "nvmlDeviceGetEccMode")
    # The child was killed; it is gone (or a zombie about to be reaped), never left running.
    time.sleep(0.1)
    try:
        os.waitpid(pending.pid, os.WNOHANG)
    except ChildProcessError:
        pass
    assert not Path(f"/proc/{pending.pid}").exists() or "Z" in Path(f"/proc/{pending.pid}/stat").read_text().split()[2]


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
