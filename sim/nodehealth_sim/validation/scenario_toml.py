"""A recorded node's scenario tables as a TOML file the simulator accepts (``scenario_writer``'s output).

``to_toml`` renders ``Built`` (keys of a ``[[gpu]]`` table in ``GPU_KEY_ORDER``); ``write`` writes the
file and checks it with ``nodehealth_sim.nvml.parse``: a key the simulator does not take (an older or
newer scenario format) is dropped, with a note, until the file parses.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

# The order keys are written in (one [[gpu]] table); a key not listed goes last.
GPU_KEY_ORDER = (
    "name",
    "uuid",
    "pci_bus_id",
    "missing",
    "temperature_c",
    "slowdown_c",
    "shutdown_c",
    "gpu_max_c",
    "mem_max_c",
    "memory_temp_c",
    "power_w",
    "power_limit_w",
    "utilization_gpu_pct",
    "utilization_memory_pct",
    "memory_total_mib",
    "memory_used_mib",
    "ecc_enabled",
    "ecc_pending_enabled",
    "ecc",
    "retired_pages",
    "remapped_rows",
    "pcie",
    "nvlink",
    "fabric",
    "processes",
    "throttle_reasons",
    "persistence_mode",
    "mig_mode",
    "recovery_action",
    "unsupported",
)


@dataclass
class Built:
    """The scenario's tables and what could not be said in them."""

    node: dict[str, Any] = field(default_factory=dict)
    gpus: list[dict[str, Any]] = field(default_factory=list)
    faults: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------- TOML


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"not a finite number: {value!r}")
        text = repr(value)
        return text if any(ch in text for ch in ".eE") else text + ".0"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return (
            "{ " + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items()) + " }" if value else "{}"
        )
    raise ValueError(f"no TOML for {type(value).__name__}")


def _toml_key(key: str) -> str:
    return key if re.match(r"^[A-Za-z0-9_-]+$", key) else json.dumps(key)


def to_toml(built: Built, header: str = "") -> str:
    lines = [f"# {line}" if line else "#" for line in header.splitlines()]
    if lines:
        lines.append("")
    if built.node:
        lines.append("[node]")
        lines += [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in built.node.items()]
        lines.append("")
    for i, gpu in enumerate(built.gpus):
        lines.append(f"[[gpu]]  # {'on PCI, not seen by NVML' if gpu.get('missing') else f'GPU {i}'}")
        lines += [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in gpu.items()]
        lines.append("")
    if "nvml" in built.faults:
        lines += ["[faults]", f"nvml = {_toml_value(built.faults['nvml'])}", ""]
    for kind in ("errors", "hangs"):
        for entry in built.faults.get(kind, []):
            lines.append(f"[[faults.{kind}]]")
            lines += [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in entry.items()]
            lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


# --------------------------------------------------------------------------- writing, checked

_ERROR_KEY = re.compile(r"^(?P<key>[A-Za-z_][\w.\[\]]*): (?P<msg>.*)$", re.S)


def _drop(built: Built, key: str, msg: str) -> bool:
    """Remove what the scenario parser named ``key``; False when it names nothing of ours."""
    m = re.match(r"^(node|gpu\[(\d+)\]|faults\.(errors|hangs)\[(\d+)\]|faults)\.?(.*)$", key)
    if not m:
        return False
    head, gpu_i, fault_kind, fault_i, rest = m.groups()
    if fault_kind is not None:
        entries = built.faults.get(fault_kind, [])
        if int(fault_i) < len(entries):
            del entries[int(fault_i)]
            if not entries:
                del built.faults[fault_kind]
            return True
        return False
    table: Any
    if head == "node":
        table = built.node
    elif head == "faults":
        table = built.faults
    else:
        if int(gpu_i) >= len(built.gpus):
            return False
        table = built.gpus[int(gpu_i)]
    parts = re.sub(r"\[\d+\]", "", rest).split(".") if rest else []
    if not parts:
        return False
    for part in parts[:-1]:
        if not isinstance(table.get(part), dict):
            return False
        table = table[part]
    last = parts[-1]
    if last not in table:
        return False
    if isinstance(table[last], list) and all(isinstance(v, str) for v in table[last]):
        named = [v for v in table[last] if repr(v) in msg or f'"{v}"' in msg]
        if named:
            table[last] = [v for v in table[last] if v not in named]
            if not table[last]:
                del table[last]
            return True
    del table[last]
    return True


def write(
    path: str,
    built: Built,
    header: str = "",
    parse: Optional[Callable[[str], Any]] = None,
    max_drops: int = 100,
    dir_fd: Optional[int] = None,
) -> list[str]:
    """Write ``built`` to ``path`` as TOML that ``parse`` (default: the simulator's) accepts.

    The file is a fresh temp name renamed over ``path``'s last component (``ground.replace_own``),
    through ``dir_fd`` when given (the ``--out`` directory's descriptor; ``path`` is then only what
    the parser reads): a link planted there is replaced, never written through.
    Returns the notes for the keys dropped because the parser refused them.
    """
    if parse is None:
        from nodehealth_sim import nvml as simnvml

        parse = simnvml.parse
    dropped: list[str] = []
    own_fd = (
        dir_fd
        if dir_fd is not None
        else os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    )
    try:
        return _write(path, built, header, parse, max_drops, own_fd, dropped)
    finally:
        if dir_fd is None:
            os.close(own_fd)


def _write(
    path: str, built: Built, header: str, parse: Callable[[str], Any], max_drops: int, dir_fd: int, dropped: list[str]
) -> list[str]:
    from nodehealth.platform import ground
    from nodehealth_sim.nvml import ScenarioError

    for _ in range(max_drops):
        ground.replace_own(dir_fd, os.path.basename(path), to_toml(built, header).encode(), 0o644)
        try:
            parse(path)
            return dropped
        except ScenarioError as exc:
            text = str(exc)
            rest = text[len(path) + 2 :] if text.startswith(path + ": ") else text
            m = _ERROR_KEY.match(rest)
            if not m or not _drop(built, m.group("key"), m.group("msg")):
                raise
            dropped.append(f"{m.group('key')}: dropped, the simulator does not take it ({m.group('msg')})")
    raise ValueError(f"{path}: the simulator refused over {max_drops} keys")
