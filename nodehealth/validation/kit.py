"""``run``: the whole validation of one node into one directory (docs/validation.md).

1. ``calls.jsonl`` (+ ``observations.jsonl``): the probe reads the node through the recorder.
2. ``symbols.json``: the ``nvml*`` symbols the driver library that pynvml loaded exports.
3. ``nvidia-smi-q.txt``, ``nvrm.txt``: ``nvidia-smi -q`` and the kernel's NVRM/Xid lines.
4. ``report.md`` / ``report.json``: what was run and the timings.

Then, when the simulator (``nodehealth-sim``, package ``nodehealth_sim``) is installed, its
``nodehealth_sim.validation.replay.complete``, imported by name, writes ``scenario.toml`` (the node
as a scenario) and ``replay/`` (that scenario recorded through the simulator) and adds every
difference to the report. Without it the report says how to replay the record elsewhere
(``nodehealth-sim replay DIR``): a production node needs no simulator code.

Nothing here changes a GPU setting or touches Slurm.
"""

from __future__ import annotations

import datetime
import importlib
import json
import os
import re
import stat
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from nodehealth.platform import evidence, ground
from nodehealth.probes import source
from nodehealth.probes.source import install_sim
from nodehealth.validation import elf, record, report

SYMBOLS_FILE = "symbols.json"
SMI_FILE = "nvidia-smi-q.txt"
NVRM_FILE = "nvrm.txt"
SMI_TIMEOUT_S = 60.0
KERNEL_LINE = re.compile(r"NVRM|Xid|nvidia", re.IGNORECASE)
# The simulator's distribution, imported by name only (the product has no static import of it), as the
# NVML probe's source does (nodehealth.probes.source: the same package and the same words, install_sim).
SIM_PACKAGE = source.SIM_PACKAGE
SIM_REPLAY = f"{SIM_PACKAGE}.validation.replay"


class SimulatorMissing(Exception):
    """--simulate without the simulator installed."""


class ScenarioRefused(Exception):
    """The simulator refused the scenario file (the message names the file and the key)."""


def simulated_loader(path: str) -> tuple[Callable[[], Any], tuple[str, ...]]:
    """(loader, PCI bus ids) for a scenario file, as ``[nvml] simulate`` gets them: the simulator's
    ``nvml_source`` (the simulated driver library of the scenario's branch under the real pynvml).

    SimulatorMissing when nodehealth-sim is not installed; ScenarioRefused for a bad scenario."""
    try:
        sim: Any = importlib.import_module(SIM_PACKAGE)
    except ImportError:
        raise SimulatorMissing(source.needs_sim()) from None
    try:
        simulated = sim.nvml_source(path)
    except sim.ScenarioError as exc:
        raise ScenarioRefused(str(exc)) from None
    return simulated.loader, tuple(simulated.pci_bus_ids or ())


def files_in(out_fd: int) -> list[str]:
    """The report's list of files: the plain files in the ``--out`` directory, and the report itself."""
    files = [
        f
        for f in os.listdir(out_fd)
        if not f.startswith(".") and stat.S_ISREG(os.stat(f, dir_fd=out_fd, follow_symlinks=False).st_mode)
    ]
    return sorted(set(files) | {"report.json", "report.md"})


def _real_loader() -> Callable[[], Any]:
    from nodehealth.probes import nvml as probe

    return probe.load_module


def _pci_bus_ids(sysfs_root: str) -> tuple[list[str], str]:
    from nodehealth.observations import PciGpus
    from nodehealth.probes import pci

    found = pci.nvidia_gpus(sysfs_root)
    if isinstance(found, PciGpus):
        return list(found.bus_ids), f"{len(found.bus_ids)} NVIDIA GPU(s) on PCI ({sysfs_root})"
    return [], f"PCI not read: {getattr(found, 'message', found)}"


def _put(dir_fd: int, name: str, text: str) -> None:
    """One file of the evidence: a fresh temp name renamed over ours (a planted link is replaced, never followed)."""
    ground.replace_own(dir_fd, name, text.encode("utf-8", errors="replace"), 0o644)


def _symbols(out_fd: int, recording: record.Recording) -> dict[str, Any]:
    libs = recording.libraries
    doc: dict[str, Any] = {"libraries_mapped": libs, "library": libs[0] if libs else None, "exported": None}
    if libs:
        path = os.path.realpath(libs[0])
        doc["library_realpath"] = path
        try:
            doc["exported"] = elf.exported(path, "nvml")
        except elf.ElfError as exc:
            doc["error"] = str(exc)
    else:
        doc["error"] = "no libnvidia-ml.so* was mapped in the recording process" + (
            f" (NVML module {recording.meta.get('module')})" if recording.meta.get("module") else ""
        )
    _put(out_fd, SYMBOLS_FILE, json.dumps(doc, indent=1) + "\n")
    return doc


def _host_evidence(out_fd: int, simulated: bool, kmsg_path: str, smi: Optional[str]) -> dict[str, str]:

    notes: dict[str, str] = {}
    if simulated:
        text = "not collected: --simulate (the host's driver does not describe the simulated GPUs)\n"
        for name in (SMI_FILE, NVRM_FILE):
            _put(out_fd, name, text)
        return {SMI_FILE: text.strip(), NVRM_FILE: text.strip()}
    program = smi if smi is not None else evidence.find_program("nvidia-smi")
    if program is None:
        _put(out_fd, SMI_FILE, "nvidia-smi: not found\n")
        notes[SMI_FILE] = "nvidia-smi not found"
    else:
        out = evidence.run_readonly([program, "-q"], SMI_TIMEOUT_S)
        text = f"# {program} -q: exit {out.rc}{'; ' + out.error if out.error else ''}\n" + out.stdout
        if out.stderr:
            text += "\n# stderr\n" + out.stderr
        _put(out_fd, SMI_FILE, text)
        notes[SMI_FILE] = f"{program} -q: exit {out.rc}{', ' + out.error if out.error else ''}"
    log = kernel_lines(lambda line: bool(KERNEL_LINE.search(line)), kmsg_path)
    _put(
        out_fd,
        NVRM_FILE,
        f"# source: {log.source or 'none'}; {len(log.lines)} NVRM/Xid/nvidia line(s)"
        f"{' (the last ones only)' if log.truncated else ''}\n"
        + "".join(f"# {note}\n" for note in log.notes)
        + "".join(line + "\n" for line in log.lines),
    )
    notes[NVRM_FILE] = (
        f"{len(log.lines)} line(s) from {log.source}" if log.source else "kernel log not read: " + "; ".join(log.notes)
    )
    return notes


def _models(calls: list[record.Call]) -> list[str]:
    return sorted({str(c.value) for c in calls if c.fn == "nvmlDeviceGetName" and c.returned and c.rc == 0})


def _value(calls: list[record.Call], fn: str) -> Any:
    return next((c.value for c in calls if c.fn == fn and c.returned and c.rc == 0), None)


def _init_error(calls: list[record.Call]) -> Optional[str]:
    """``"nvmlInit: LIBRARY_NOT_FOUND"`` when NVML's initialisation failed (no GPU answered: a record with
    nothing to compare), else None."""
    first = next((c for c in calls if c.fn.startswith("nvmlInit")), None)
    if first is None or not first.returned or first.rc == 0:
        return None
    return f"{first.fn}: {first.error or f'return code {first.rc}'}"


def run(
    out_dir: str,
    simulate: Optional[str] = None,
    timeout_s: float = 60.0,
    replay: bool = True,
    sysfs_root: str = "/sys",
    kmsg_path: str = "/dev/kmsg",
    nvidia_smi: Optional[str] = None,
    date: Optional[datetime.datetime] = None,
) -> dict[str, Any]:
    """Validate this node's NVML (or, with ``simulate``, a scenario's) into ``out_dir``; the report.

    ``out_dir`` must be a directory of our own, or not exist (it is made): a link, another user's
    directory or one others may write is refused (``ground.Foreign``, naming its owner) before
    anything is written. Every file in it is new or replaces our own (never written through a link).
    A scenario (``simulate``) is resolved first: without the simulator or with a bad file nothing is made.
    """
    source = simulated_loader(simulate) if simulate else None
    out_fd = ground.ensure_own_dir(out_dir)
    try:
        return _run(out_fd, out_dir, simulate, source, timeout_s, replay, sysfs_root, kmsg_path, nvidia_smi, date)
    finally:
        os.close(out_fd)


def _run(
    out_fd: int,
    out_dir: str,
    simulate: Optional[str],
    source: Optional[tuple[Callable[[], Any], tuple[str, ...]]],
    timeout_s: float,
    replay: bool,
    sysfs_root: str,
    kmsg_path: str,
    nvidia_smi: Optional[str],
    date: Optional[datetime.datetime],
) -> dict[str, Any]:
    from nodehealth import __version__

    when = (date or datetime.datetime.now(datetime.timezone.utc)).strftime("%Y-%m-%dT%H:%M:%SZ")
    if source is not None:
        loader, bus_ids = source
        pci, pci_note = list(bus_ids), "the scenario's PCI bus"
    else:
        loader = _real_loader()
        pci, pci_note = _pci_bus_ids(sysfs_root)
    done = record.record(out_fd, loader, timeout_s)
    recording = record.read_at(out_fd, record.CALLS_FILE)
    calls = recording.calls
    symbols = _symbols(out_fd, recording)
    host = _host_evidence(out_fd, bool(simulate), kmsg_path, nvidia_smi)
    host["pci"] = pci_note

    driver_version = _value(calls, "nvmlSystemGetDriverVersion")
    doc: dict[str, Any] = {
        "run": {
            "date_utc": when,
            "host": os.uname().nodename,
            "mode": "simulated" if simulate else "real",
            "scenario": simulate,
            "driver_version": driver_version,
            "cuda_driver_version": _value(calls, "nvmlSystemGetCudaDriverVersion"),
            "gpu_models": _models(calls),
            "gpu_count": _value(calls, "nvmlDeviceGetCount"),
            "nvml_init_error": _init_error(calls),
            "pynvml_version": recording.meta.get("pynvml_version"),
            "pynvml_path": recording.meta.get("pynvml_path"),
            "nvml_module": recording.meta.get("module"),
            "library": symbols.get("library"),
            "timeout_s": timeout_s,
            "outcome": done.outcome,
            "message": done.message,
            "elapsed_s": round(done.elapsed_s, 3),
            "nodehealth": __version__,
        },
        "record": {"pci_bus_ids": list(pci)},  # what the replay needs beside calls.jsonl and symbols.json
        "files": files_in(out_fd),
        "timing": report.timing(calls),
        "symbols": {
            "status": "the simulator's symbol table comes with nodehealth-sim (the replay)",
            "library": symbols.get("library"),
        },
        "scenario_notes": [],
        "scenario_error": None,
        "replay": None,
        "host_evidence": host,
    }
    report.write(out_fd, doc)  # the record stands on its own: the replay may run here, later or elsewhere
    try:
        sim_replay: Any = importlib.import_module(SIM_REPLAY)
    except ImportError:
        doc["replay"] = {
            "skipped": f"the simulator is not installed here ({install_sim()}); replay this directory "
            f"where it is: nodehealth-sim replay {out_dir}"
        }
        report.write(out_fd, doc)
        return doc
    return dict(sim_replay.complete(out_fd, out_dir, doc, replay=replay))


@dataclass(frozen=True)
class KernelLog:
    """The kernel log lines ``keep`` accepted, where they came from, and why a source failed."""

    source: Optional[str]  # "/dev/kmsg", "dmesg", or None when neither could be read
    lines: tuple[str, ...]
    notes: tuple[str, ...]
    truncated: bool = False


def kernel_lines(
    keep: Callable[[str], bool],
    kmsg_path: str = "/dev/kmsg",
    timeout_s: float = 10.0,
    max_bytes: int = evidence.MAX_OUTPUT_BYTES,
    max_lines: int = 20000,
) -> KernelLog:
    """The kernel log lines ``keep`` accepts (the last ``max_lines``): the backlog of ``kmsg_path``
    through the one kmsg reader (never waiting for new records), else ``dmesg``."""
    from nodehealth.probes.kernel_log import KernelLogUnavailable, KmsgReader

    notes: list[str] = []
    try:
        lines: list[str] = []
        total, truncated = 0, False
        for raw in KmsgReader(kmsg_path).lines(deadline=time.monotonic() + timeout_s):
            total += len(raw)
            if total > max_bytes:
                truncated = True
                break
            text = raw.decode("utf-8", errors="replace")
            if keep(text):
                lines.append(text)
    except KernelLogUnavailable as exc:
        notes.append(str(exc))
    else:
        return KernelLog(kmsg_path, tuple(lines[-max_lines:]), tuple(notes), truncated or len(lines) > max_lines)
    dmesg = evidence.find_program("dmesg")
    if dmesg is None:
        notes.append("dmesg: not found")
        return KernelLog(None, (), tuple(notes))
    out = evidence.run_readonly([dmesg], timeout_s, max_bytes)
    if out.rc != 0:
        notes.append(f"dmesg: {out.error or f'exit {out.rc}'}: {out.stderr.strip()[:500]}")
        return KernelLog(None, (), tuple(notes))
    kept = [r for r in out.stdout.splitlines() if keep(r)]
    return KernelLog("dmesg", tuple(kept[-max_lines:]), tuple(notes), out.truncated or len(kept) > max_lines)
