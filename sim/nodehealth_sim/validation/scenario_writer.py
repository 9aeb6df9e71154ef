"""A simulator scenario that reproduces a recorded node (docs/simulation.md's format).

``scenario_from_calls`` turns the calls of ``calls.jsonl`` into the scenario's tables: each
call that answered sets the keys the simulator answers that call from (``CALL_RULES``, one
entry per NVML function; ``FIELD_KEYS`` for ``nvmlDeviceGetFieldValues``), a call that answered
NOT_SUPPORTED puts the function in the GPU's ``unsupported`` list, any other error becomes a
``[[faults.errors]]`` entry, and a call that never returned a ``[[faults.hangs]]`` entry.
What the format cannot say is kept as a note for the report.

The rules per call are ``call_rules``; ``scenario_toml`` renders the tables as TOML and checks
the file with the simulator's parser (``to_toml``, ``write``, re-exported here), so the writer
may know keys ahead of the simulator.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any, Optional

from nodehealth.validation.record import Call
from nodehealth_sim.validation.call_rules import (
    CALL_RULES,
    DRIVER_SHAPE_CODES,
    FEATURE_ENABLED,
    INIT_STATES,
    INVALID_ARGUMENT,
    NODE_RULES,
    NOT_SUPPORTED,
    NOTING_RULES,
    NVLINK_CALLS,
    SUCCESS,
    GpuTables,
    arg,
    sysfs_bus_id,
)
from nodehealth_sim.validation.scenario_toml import GPU_KEY_ORDER, Built, to_toml, write

__all__ = ["Built", "GPU_KEY_ORDER", "group_notes", "scenario_from_calls", "sysfs_bus_id", "to_toml", "write"]


def _driver_branch(version: str) -> Optional[int]:
    """The simulator's driver branch for ``version`` (nodehealth_sim.driver.branch_for), None when unparsable."""
    from nodehealth_sim import driver

    try:
        return driver.branch_for(version)
    except ValueError:  # an unparsable version: no branch
        return None


def scenario_from_calls(
    calls: list[Call], pci_bus_ids: Optional[list[str]] = None, unavailable: Optional[tuple[str, str]] = None
) -> Built:
    """The scenario tables that make the simulator answer ``calls`` as the node did."""
    built = Built()
    gpus: dict[int, GpuTables] = {}
    errors: list[dict[str, Any]] = []
    hangs: list[dict[str, Any]] = []
    count: Optional[int] = None
    if unavailable is not None and unavailable[0] == "library_not_found":
        built.faults["nvml"] = "library_not_found"
    for c in calls:
        where = f"GPU {c.gpu}" if c.gpu is not None else "node"
        if c.fn == "nvmlDeviceGetHandleByIndex" and isinstance(arg(c, 0), int):
            index = int(arg(c, 0))
            gpus.setdefault(index, GpuTables())
            gpu: Optional[int] = index
        else:
            gpu = c.gpu
        g = gpus.setdefault(gpu, GpuTables()) if gpu is not None else None
        if not c.returned:
            hangs.append({"call": c.fn, **({"gpu": gpu} if gpu is not None else {})})
            continue
        if c.rc == SUCCESS:
            if c.fn in NODE_RULES:
                built.node[NODE_RULES[c.fn]] = c.value if c.fn != "nvmlSystemGetDriverVersion" else str(c.value)
            elif c.fn == "nvmlDeviceGetCount":
                count = int(c.value)
            elif g is not None and c.fn in CALL_RULES:
                try:
                    CALL_RULES[c.fn](g, c)
                except (TypeError, ValueError, AttributeError) as exc:
                    built.notes.append(f"{where}: {c.fn} answered {c.value!r}, not understood ({exc})")
            elif g is not None and c.fn in NOTING_RULES:
                NOTING_RULES[c.fn](g, c, built.notes, where)
            elif c.fn not in ("nvmlInit", "nvmlInitWithFlags", "nvmlShutdown", "nvmlDeviceGetHandleByIndex"):
                built.notes.append(f"{where}: {c.fn}: no scenario key answers this call (not reproduced)")
            continue
        if not isinstance(c.rc, int):
            built.notes.append(
                f"{where}: {c.fn} raised {c.rc} ({c.error}): the wheel and driver disagree; "
                "modelled by the driver branch, not by a fault"
            )
            continue
        if c.fn.startswith("nvmlInit"):
            if c.rc in INIT_STATES:
                built.faults["nvml"] = INIT_STATES[c.rc]
            else:
                errors.append({"call": "nvmlInit", "error": c.error})
            continue
        if c.rc in DRIVER_SHAPE_CODES:
            built.notes.append(f"{where}: {c.fn} answered {c.error}: modelled by the driver branch, not by a fault")
            continue
        if g is not None and c.fn in NVLINK_CALLS and c.rc in (INVALID_ARGUMENT, NOT_SUPPORTED):
            link = int(arg(c, 1) or 0)
            if c.fn == "nvmlDeviceGetNvLinkState" and link == 0 and c.rc == NOT_SUPPORTED:
                g.unsupport(c.fn)
            elif c.fn == "nvmlDeviceGetNvLinkState":
                g.link_end = link if g.link_end is None else min(g.link_end, link)
            else:
                g.counters_unsupported = True
            continue
        if g is not None and c.rc == NOT_SUPPORTED:
            g.unsupport(c.fn)
            continue
        entry = {"call": c.fn, **({"gpu": gpu} if gpu is not None else {}), "error": c.error}
        if entry not in errors:
            errors.append(entry)
    if "driver_version" in built.node:
        branch = _driver_branch(built.node["driver_version"])
        if branch is not None:
            built.node["driver_branch"] = branch
    for index in sorted(gpus):
        built.gpus.append(_finish(gpus[index], index, built.notes))
    if count is not None and count > len(built.gpus):
        built.gpus += [{} for _ in range(count - len(built.gpus))]
    _place_buses(built.gpus, pci_bus_ids or [])
    if errors:
        built.faults["errors"] = errors
    if hangs:
        built.faults["hangs"] = hangs
    built.notes = group_notes(built.notes)
    return built


def group_notes(notes: list[str]) -> list[str]:
    """The same note for several GPUs as one line naming them: "GPU 0-3, 5: ..."."""
    by_text: dict[str, list[int]] = {}
    order: list[str] = []
    for note in notes:
        m = re.match(r"^GPU (\d+): (.*)$", note, re.S)
        text, gpu = (m.group(2), int(m.group(1))) if m else (note, None)
        if text not in by_text:
            by_text[text] = []
            order.append(text)
        if gpu is not None and gpu not in by_text[text]:
            by_text[text].append(gpu)
    out = []
    for text in order:
        gpus = sorted(by_text[text])
        out.append(f"GPU {_ranges(gpus)}: {text}" if gpus else text)
    return out


def _ranges(numbers: list[int]) -> str:
    parts: list[str] = []
    for n in numbers:
        if parts and _last(parts[-1]) == n - 1:
            first = parts[-1].split("-")[0]
            parts[-1] = f"{first}-{n}"
        else:
            parts.append(str(n))
    return ", ".join(parts)


def _last(part: str) -> int:
    return int(part.split("-")[-1])


def _finish(g: GpuTables, index: int, notes: list[str]) -> dict[str, Any]:
    values = g.values
    if g.link_state or g.link_end is not None:
        links = max(list(g.link_state) + [-1]) + 1 if g.link_state else 0
        if g.link_end is not None and not g.link_state:
            links = g.link_end
        nvlink = values.setdefault("nvlink", {})
        nvlink.setdefault("links", links)
        nvlink["down"] = sorted(n for n, state in g.link_state.items() if state != FEATURE_ENABLED)
    if g.link_counters:
        nvlink = values.setdefault("nvlink", {})
        names = sorted({n for counters in g.link_counters.values() for n in counters})
        base = {}
        for name in names:
            seen = Counter(c[name] for c in g.link_counters.values() if name in c)
            base[name] = max(seen.items(), key=lambda kv: (kv[1], -kv[0]))[0]  # a tie: the smaller
            nvlink[name] = base[name]
        per_link = []
        for link in sorted(g.link_counters):
            diff = {n: v for n, v in g.link_counters[link].items() if v != base.get(n)}
            if diff:
                per_link.append({"link": link, **diff})
        if per_link:
            nvlink["errors"] = per_link
    if g.counters_unsupported:
        values.setdefault("nvlink", {})["counters"] = False
    if g.unsupported:
        values["unsupported"] = list(g.unsupported)
    ordered = {k: values[k] for k in GPU_KEY_ORDER if k in values}
    ordered.update({k: v for k, v in values.items() if k not in ordered})
    return ordered


def _default_bus(i: int) -> str:
    return f"0000:{(0x18 + 0x11 * i) & 0xFF:02x}:00.0"


def _place_buses(gpus: list[dict[str, Any]], pci_bus_ids: list[str]) -> None:
    """A GPU NVML counts but whose address was not read takes the next PCI address no read GPU
    has (NVML numbers GPUs in bus order); PCI addresses left over are GPUs NVML does not see
    (``missing`` tables, in bus order); a GPU with no address at all gets one nobody has."""
    seen = {str(g["pci_bus_id"]).lower() for g in gpus if g.get("pci_bus_id")}
    unclaimed = [b.lower() for b in pci_bus_ids if b.lower() not in seen]
    for i, g in enumerate(gpus):
        if g.get("pci_bus_id"):
            continue
        g.pop("pci_bus_id", None)
        if unclaimed:
            bus = unclaimed.pop(0)
        else:
            n, bus = i, _default_bus(i)
            while bus in seen:
                n += 1
                bus = f"0000:{0xE0 + n % 0x20:02x}:{n // 0x20:02x}.0"
        g["pci_bus_id"] = bus
        seen.add(bus)
    if not unclaimed:
        return
    buses = [g["pci_bus_id"] for g in gpus]
    tables = [{"pci_bus_id": b, "missing": True} for b in unclaimed]
    if buses == sorted(buses):
        gpus[:] = sorted(gpus + tables, key=lambda t: str(t["pci_bus_id"]))
    else:
        gpus.extend(tables)
