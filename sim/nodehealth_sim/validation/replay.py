"""``complete``: a recorded validation directory made whole with the simulator (docs/validation.md).

From what ``nodehealth validate-nvml`` recorded in the directory (``calls.jsonl``, ``symbols.json``, the run
in ``report.json``):

4. ``scenario.toml``: the node as a simulator scenario (``scenario_writer``).
5. ``replay/``: that scenario recorded through the simulator; ``report.md`` / ``report.json``:
   the symbol comparison and every difference between the node and the simulator (``compare``).

The product calls :func:`complete` right after its recording when this package is installed (by name,
``nodehealth.validation.kit``); ``nodehealth-sim replay DIR`` calls :func:`replay_dir` on a directory copied
from a node that has no simulator. Nothing here touches a GPU or Slurm.
"""

from __future__ import annotations

import json
import os
from typing import Any, Optional

from nodehealth.platform import ground
from nodehealth.validation import kit, record, report
from nodehealth_sim.validation import compare, scenario_writer

SCENARIO_FILE = "scenario.toml"
REPLAY_DIR = "replay"
# A recording that ended at its deadline is replayed for at most this long: the replay of a
# hung call hangs too, and what came before it is quick.
REPLAY_AFTER_HANG_S = 10.0


class NotARecord(Exception):
    """The directory holds no validation record (``calls.jsonl`` and ``report.json`` of validate-nvml)."""


def _replay(out_fd: int, scenario_path: str, calls: list[record.Call], limit: float) -> dict[str, Any]:
    """Record the written scenario in the simulator into ``replay/`` (a directory of ours) and compare."""
    try:
        replay_loader, _ = kit.simulated_loader(scenario_path)
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
    diffs = compare.diff_calls(calls, replayed.calls)
    return {
        "dir": REPLAY_DIR,
        "outcome": again.outcome,
        "recorded_calls": len(calls),
        "replayed_calls": len(replayed.calls),
        "differences": diffs,
        "summary": compare.summarise_differences(diffs),
        "library": replayed.libraries[0] if replayed.libraries else None,
    }


def _symbols_doc(out_fd: int) -> dict[str, Any]:
    try:
        fd = os.open(kit.SYMBOLS_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=out_fd)
    except OSError:
        return {}
    try:
        with os.fdopen(fd, "rb") as f:
            doc = json.loads(f.read(16 << 20).decode("utf-8", errors="replace"))
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def complete(
    out_fd: int, out_dir: str, doc: dict[str, Any], replay: bool = True, timeout_s: Optional[float] = None
) -> dict[str, Any]:
    """Write ``scenario.toml`` from the record in ``out_fd`` (the directory ``out_dir``), replay it unless
    ``replay`` is false, compare, and write the report again; the completed report.

    ``doc`` is the recording's report (``nodehealth.validation.kit``); ``timeout_s`` bounds the replay (the
    recording's own timeout by default)."""
    run = doc["run"]
    recording = record.read_at(out_fd, record.CALLS_FILE)
    calls = recording.calls
    limit = float(timeout_s if timeout_s is not None else run.get("timeout_s") or 60.0)
    unavailable = recording.meta.get("unavailable")
    pci = list((doc.get("record") or {}).get("pci_bus_ids") or [])
    built = scenario_writer.scenario_from_calls(calls, pci, tuple(unavailable) if unavailable else None)
    simulate = run.get("scenario")
    header = (
        f"The node {run.get('host')} as nodehealth validate-nvml recorded it on {run.get('date_utc')}\n"
        f"({'simulated: ' + simulate if simulate else 'real NVML'}; {len(calls)} NVML calls, "
        f"recording {run.get('outcome')}).\nReplay: nodehealth validate-nvml --simulate scenario.toml --out DIR"
    )
    scenario_path = os.path.join(out_dir, SCENARIO_FILE)
    try:
        notes = built.notes + scenario_writer.write(scenario_path, built, header, dir_fd=out_fd)
        scenario_error = None
    except Exception as exc:  # noqa: BLE001 - the evidence stands without a checked scenario
        notes = built.notes
        scenario_error = f"{type(exc).__name__}: {exc}"
        ground.replace_own(
            out_fd,
            SCENARIO_FILE,
            scenario_writer.to_toml(built, header + f"\nNOT ACCEPTED by the simulator: {scenario_error}").encode(),
            0o644,
        )

    replay_doc: Optional[dict[str, Any]] = None
    if replay:
        if scenario_error is not None:
            replay_doc = {"error": f"the scenario was not accepted ({scenario_error})"}
        else:
            replay_doc = _replay(
                out_fd,
                scenario_path,
                calls,
                limit if run.get("outcome") == "complete" else min(limit, REPLAY_AFTER_HANG_S),
            )
    symbols = _symbols_doc(out_fd)
    driver_version = run.get("driver_version")
    symbol_cmp = compare.compare_symbols(
        symbols.get("exported"), None if driver_version is None else str(driver_version)
    )
    symbol_cmp["library"] = symbols.get("library")
    doc = dict(
        doc,
        symbols=symbol_cmp,
        scenario_notes=notes,
        scenario_error=scenario_error,
        replay=replay_doc,
        files=kit.files_in(out_fd),
    )
    report.write(out_fd, doc)
    return doc


def replay_dir(out_dir: str, timeout_s: Optional[float] = None) -> dict[str, Any]:
    """:func:`complete` for a directory ``nodehealth validate-nvml`` wrote (here or on another node).

    The directory must be ours (``ground.ensure_own_dir``: a link, another user's directory or one others may
    write is refused); NotARecord when it holds no record."""
    out_fd = ground.ensure_own_dir(out_dir)
    try:
        try:
            fd = os.open("report.json", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=out_fd)
            with os.fdopen(fd, "rb") as f:
                doc = json.loads(f.read(64 << 20).decode("utf-8", errors="replace"))
            os.stat(record.CALLS_FILE, dir_fd=out_fd, follow_symlinks=False)
        except (OSError, ValueError) as exc:
            raise NotARecord(f"{out_dir}: not a validate-nvml record ({exc})") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("run"), dict):
            raise NotARecord(f"{out_dir}: not a validate-nvml record (report.json has no run)")
        return complete(out_fd, out_dir, doc, timeout_s=timeout_s)
    finally:
        os.close(out_fd)
