"""``run``: the whole validation of one node into one directory (docs/validation.md).

1. ``calls.jsonl`` (+ ``observations.jsonl``): the probe reads the node through the recorder.
2. ``symbols.json``: the ``nvml*`` symbols the driver library that pynvml loaded exports.
3. ``nvidia-smi-q.txt``, ``nvrm.txt``: ``nvidia-smi -q`` and the kernel's NVRM/Xid lines.
4. ``scenario.toml``: the node as a simulator scenario.
5. ``replay/``: that scenario recorded through the simulator; ``report.md`` / ``report.json``:
   timings and every difference between the node and the simulator.

Nothing here changes a GPU setting or touches Slurm.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import stat
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from nodehealth.platform import evidence, ground
from nodehealth.validation import elf, record, report, scenario_writer

SYMBOLS_FILE = "symbols.json"
SMI_FILE = "nvidia-smi-q.txt"
NVRM_FILE = "nvrm.txt"
SCENARIO_FILE = "scenario.toml"
REPLAY_DIR = "replay"
SMI_TIMEOUT_S = 60.0
KERNEL_LINE = re.compile(r"NVRM|Xid|nvidia", re.IGNORECASE)
# A recording that ended at its deadline is replayed for at most this long: the replay of a
# hung call hangs too, and what came before it is quick.
REPLAY_AFTER_HANG_S = 10.0


def simulated_loader(path: str) -> tuple[Callable[[], Any], Any]:
    """(loader, scenario) for a scenario file, as the project's ``[nvml] simulate`` builds it:
    the simulated driver library of the scenario's branch under the real pynvml."""
    from nodehealth_sim import nvml as simnvml

    scenario = simnvml.parse(path)
    simnvml.check_built(scenario)
    return simnvml.loader(scenario), scenario


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
        doc["error"] = ("no libnvidia-ml.so* was mapped in the recording process"
                        + (f" (NVML module {recording.meta.get('module')})" if recording.meta.get("module") else ""))
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
    _put(out_fd, NVRM_FILE, f"# source: {log.source or 'none'}; {len(log.lines)} NVRM/Xid/nvidia line(s)"
                            f"{' (the last ones only)' if log.truncated else ''}\n"
                            + "".join(f"# {note}\n" for note in log.notes)
                            + "".join(line + "\n" for line in log.lines))
    notes[NVRM_FILE] = (f"{len(log.lines)} line(s) from {log.source}" if log.source
                        else "kernel log not read: " + "; ".join(log.notes))
    return notes


def _models(calls: list[record.Call]) -> list[str]:
    return sorted({str(c.value) for c in calls if c.fn == "nvmlDeviceGetName" and c.returned and c.rc == 0})


def _value(calls: list[record.Call], fn: str) -> Any:
    return next((c.value for c in calls if c.fn == fn and c.returned and c.rc == 0), None)


def _replay(out_fd: int, scenario_path: str, calls: list[record.Call], limit: float) -> dict[str, Any]:
    """Record the written scenario in the simulator into ``replay/`` (a directory of ours) and compare."""
    try:
        replay_loader, _ = simulated_loader(scenario_path)
    except Exception as exc:  # noqa: BLE001 - e.g. the simulated driver is not built
        return {"error": f"{type(exc).__name__}: {exc}"}
    try:
        replay_fd = ground.ensure_own_dir(REPLAY_DIR, dir_fd=out_fd)
    except ground.Foreign as exc:
        return {"error": f"{REPLAY_DIR}/ not written into: {exc}"}
    try:
        again = record.record(replay_fd, replay_loader, limit)
        replayed = record.read_at(replay_fd, record.CALLS_FILE)
    finally:
        os.close(replay_fd)
    diffs = report.diff_calls(calls, replayed.calls)
    return {"dir": REPLAY_DIR, "outcome": again.outcome, "recorded_calls": len(calls),
            "replayed_calls": len(replayed.calls), "differences": diffs,
            "summary": report.summarise_differences(diffs),
            "library": replayed.libraries[0] if replayed.libraries else None}


def run(out_dir: str, simulate: Optional[str] = None, timeout_s: float = 60.0, replay: bool = True,
        sysfs_root: str = "/sys", kmsg_path: str = "/dev/kmsg", nvidia_smi: Optional[str] = None,
        date: Optional[datetime.datetime] = None) -> dict[str, Any]:
    """Validate this node's NVML (or, with ``simulate``, a scenario's) into ``out_dir``; the report.

    ``out_dir`` must be a directory of our own, or not exist (it is made): a link, another user's
    directory or one others may write is refused (``ground.Foreign``, naming its owner) before
    anything is written. Every file in it is new or replaces our own (never written through a link).
    """
    out_fd = ground.ensure_own_dir(out_dir)
    try:
        return _run(out_fd, out_dir, simulate, timeout_s, replay, sysfs_root, kmsg_path, nvidia_smi, date)
    finally:
        os.close(out_fd)


def _run(out_fd: int, out_dir: str, simulate: Optional[str], timeout_s: float, replay: bool, sysfs_root: str,
         kmsg_path: str, nvidia_smi: Optional[str], date: Optional[datetime.datetime]) -> dict[str, Any]:
    from nodehealth import __version__

    when = (date or datetime.datetime.now(datetime.timezone.utc)).strftime("%Y-%m-%dT%H:%M:%SZ")
    if simulate:
        loader, scenario = simulated_loader(simulate)
        pci, pci_note = list(scenario.pci_bus_ids), "the scenario's PCI bus"
    else:
        loader = _real_loader()
        pci, pci_note = _pci_bus_ids(sysfs_root)
    done = record.record(out_fd, loader, timeout_s)
    recording = record.read_at(out_fd, record.CALLS_FILE)
    calls = recording.calls
    symbols = _symbols(out_fd, recording)
    host = _host_evidence(out_fd, bool(simulate), kmsg_path, nvidia_smi)
    host["pci"] = pci_note

    unavailable = recording.meta.get("unavailable")
    built = scenario_writer.scenario_from_calls(calls, pci, tuple(unavailable) if unavailable else None)
    header = (f"The node {os.uname().nodename} as nodehealth validate-nvml recorded it on {when}\n"
              f"({'simulated: ' + simulate if simulate else 'real NVML'}; {len(calls)} NVML calls, "
              f"recording {done.outcome}).\nReplay: nodehealth validate-nvml --simulate scenario.toml --out DIR")
    scenario_path = os.path.join(out_dir, SCENARIO_FILE)
    try:
        notes = built.notes + scenario_writer.write(scenario_path, built, header, dir_fd=out_fd)
        scenario_error = None
    except Exception as exc:  # noqa: BLE001 - the evidence stands without a checked scenario
        notes = built.notes
        scenario_error = f"{type(exc).__name__}: {exc}"
        _put(out_fd, SCENARIO_FILE,
             scenario_writer.to_toml(built, header + f"\nNOT ACCEPTED by the simulator: {scenario_error}"))

    replay_doc: Optional[dict[str, Any]] = None
    if replay:
        if scenario_error is not None:
            replay_doc = {"error": f"the scenario was not accepted ({scenario_error})"}
        else:
            limit = timeout_s if done.outcome == "complete" else min(timeout_s, REPLAY_AFTER_HANG_S)
            replay_doc = _replay(out_fd, scenario_path, calls, limit)

    driver_version = _value(calls, "nvmlSystemGetDriverVersion")
    symbol_cmp = report.compare_symbols(symbols.get("exported"),
                                        None if driver_version is None else str(driver_version))
    symbol_cmp["library"] = symbols.get("library")
    files = [f for f in os.listdir(out_fd) if not f.startswith(".")
             and stat.S_ISREG(os.stat(f, dir_fd=out_fd, follow_symlinks=False).st_mode)] + ["report.json", "report.md"]
    doc: dict[str, Any] = {
        "run": {
            "date_utc": when, "host": os.uname().nodename, "mode": "simulated" if simulate else "real",
            "scenario": simulate, "driver_version": driver_version,
            "cuda_driver_version": _value(calls, "nvmlSystemGetCudaDriverVersion"),
            "gpu_models": _models(calls), "gpu_count": _value(calls, "nvmlDeviceGetCount"),
            "pynvml_version": recording.meta.get("pynvml_version"),
            "pynvml_path": recording.meta.get("pynvml_path"), "nvml_module": recording.meta.get("module"),
            "library": symbols.get("library"), "timeout_s": timeout_s, "outcome": done.outcome,
            "message": done.message, "elapsed_s": round(done.elapsed_s, 3), "nodehealth": __version__,
        },
        "files": sorted(set(files)),
        "timing": report.timing(calls),
        "symbols": symbol_cmp,
        "scenario_notes": notes,
        "scenario_error": scenario_error,
        "replay": replay_doc,
        "host_evidence": host,
    }
    report.write(out_fd, doc)
    return doc


@dataclass(frozen=True)
class KernelLog:
    """The kernel log lines ``keep`` accepted, where they came from, and why a source failed."""

    source: Optional[str]  # "/dev/kmsg", "dmesg", or None when neither could be read
    lines: tuple[str, ...]
    notes: tuple[str, ...]
    truncated: bool = False


def kernel_lines(keep: Callable[[str], bool], kmsg_path: str = "/dev/kmsg", timeout_s: float = 10.0,
                 max_bytes: int = evidence.MAX_OUTPUT_BYTES, max_lines: int = 20000) -> KernelLog:
    """The kernel log lines ``keep`` accepts (the last ``max_lines``): the backlog of ``kmsg_path``
    through the one kmsg reader (never waiting for new records), else ``dmesg``."""
    from nodehealth.xid.kmsg import KernelLogUnavailable, KmsgReader

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
