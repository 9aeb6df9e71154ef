"""A reader of ``nvidia-smi -q`` text, for checking the simulator's GPU models against real output.

``parse_smi_q(text)`` returns one dict per ``GPU dddd:bb:dd.f`` section. Every ``Key : value`` line
is kept in ``fields`` under its section path joined with ``/`` (``"Temperature/GPU Shutdown Temp"``),
and the values the GPU models use are read out into typed keys (``None`` where the output says
``N/A`` or does not have the line). It reads the layouts of drivers 418 to 565: the old ``Power
Readings``/``Enforced Power Limit`` and the new ``GPU Power Readings``/``Current Power Limit``, the
absolute ``GPU Shutdown Temp`` and the relative ``GPU Shutdown T.Limit Temp`` of newer drivers on
Hopper, ``Ecc Mode`` and ``ECC Mode``.

Standard library only: this runs in tests and tools, never in the agent's hot path.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Tuple

_GPU_HEADER = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$")
_KEY_VALUE = re.compile(r"^( *)(\S.*?)\s*: (.*)$")
_SECTION = re.compile(r"^( *)(\S.*?)\s*$")
_NUMBER = re.compile(r"^(-?\d+(?:\.\d+)?)")


def _number(value: Optional[str]) -> Optional[float]:
    if value is None:
        return None
    m = _NUMBER.match(value.strip())
    return float(m.group(1)) if m else None


def _int(value: Optional[str]) -> Optional[int]:
    n = _number(value)
    return None if n is None else int(n)


def _yes(value: Optional[str]) -> Optional[bool]:
    if value is None:
        return None
    v = value.strip().lower()
    if v in ("yes", "enabled", "active"):
        return True
    if v in ("no", "disabled", "not active"):
        return False
    return None


def _split_sections(text: str) -> List[Tuple[str, List[str]]]:
    gpus: List[Tuple[str, List[str]]] = []
    for line in text.splitlines():
        m = _GPU_HEADER.match(line)
        if m:
            gpus.append((m.group(1), []))
        elif gpus:
            if line and not line.startswith(" "):
                # a top-level line after a GPU section (for example "..." or the end of a paste)
                gpus[-1][1].append("")
                continue
            gpus[-1][1].append(line)
    return gpus


def _fields(lines: List[str]) -> Dict[str, str]:
    fields: Dict[str, str] = {}
    stack: List[Tuple[int, str]] = []  # (indent, section name)
    for raw in lines:
        line = raw.rstrip()
        if not line.strip():
            continue
        kv = _KEY_VALUE.match(line)
        indent = len(line) - len(line.lstrip(" "))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = "/".join(name for _, name in stack)
        if kv:
            key = kv.group(2)
            value = kv.group(3).strip()
            full = f"{path}/{key}" if path else key
            fields.setdefault(full, value)
            # a "Key : value" line may also open a section ("Remapped Rows : N/A" has none, but
            # some drivers print "Processes : None"); push it so deeper lines nest under it
            stack.append((indent, key))
        else:
            sec = _SECTION.match(line)
            if sec:
                stack.append((indent, sec.group(2)))
    return fields


def _first(fields: Dict[str, str], *keys: str) -> Optional[str]:
    for key in keys:
        value = fields.get(key)
        if value is not None:
            return None if value.strip() in ("N/A", "Unknown Error", "") else value
    return None


def _present(fields: Dict[str, str], *keys: str) -> bool:
    return any(key in fields for key in keys)


def parse_smi_q(text: str) -> List[Dict[str, Any]]:
    """Parse ``nvidia-smi -q`` output into one dict per GPU section, in file order."""
    gpus: List[Dict[str, Any]] = []
    for bus_id, lines in _split_sections(text):
        f = _fields(lines)
        power = "GPU Power Readings" if _present(f, "GPU Power Readings/Power Draw") else "Power Readings"
        ecc = "ECC Mode" if _present(f, "ECC Mode/Current") else "Ecc Mode"
        device_id = _first(f, "PCI/Device Id")
        retired_sbe = f.get("Retired Pages/Single Bit ECC")
        remapped_correctable = f.get("Remapped Rows/Correctable Error")
        gpu: Dict[str, Any] = {
            "bus_id": bus_id,
            "product_name": _first(f, "Product Name"),
            "architecture": _first(f, "Product Architecture"),
            "pci_device_id": int(device_id, 16) if device_id else None,
            "persistence_mode": _yes(f.get("Persistence Mode")),
            "ecc_enabled": _yes(f.get(f"{ecc}/Current")),
            "memory_total_mib": _int(_first(f, "FB Memory Usage/Total")),
            "pcie_max_gen": _int(_first(f, "PCI/GPU Link Info/PCIe Generation/Max")),
            "pcie_gen": _int(_first(f, "PCI/GPU Link Info/PCIe Generation/Current")),
            "pcie_max_width": _int(_first(f, "PCI/GPU Link Info/Link Width/Max")),
            "pcie_width": _int(_first(f, "PCI/GPU Link Info/Link Width/Current")),
            "temperature_c": _int(_first(f, "Temperature/GPU Current Temp")),
            "shutdown_c": _int(_first(f, "Temperature/GPU Shutdown Temp")),
            "slowdown_c": _int(_first(f, "Temperature/GPU Slowdown Temp")),
            "gpu_max_c": _int(_first(f, "Temperature/GPU Max Operating Temp")),
            "memory_temp_c": _int(_first(f, "Temperature/Memory Current Temp")),
            "mem_max_c": _int(_first(f, "Temperature/Memory Max Operating Temp")),
            "tlimit_c": _int(_first(f, "Temperature/GPU T.Limit Temp")),
            "shutdown_tlimit_c": _int(_first(f, "Temperature/GPU Shutdown T.Limit Temp")),
            "slowdown_tlimit_c": _int(_first(f, "Temperature/GPU Slowdown T.Limit Temp")),
            "power_w": _number(_first(f, f"{power}/Power Draw")),
            "power_limit_w": _number(
                _first(f, f"{power}/Enforced Power Limit", f"{power}/Current Power Limit", f"{power}/Power Limit")
            ),
            "default_power_limit_w": _number(_first(f, f"{power}/Default Power Limit")),
            "max_power_limit_w": _number(_first(f, f"{power}/Max Power Limit")),
            # Retired Pages: "N/A" on Ampere and later (page retirement replaced by row remapping)
            "retired_pages_supported": None if retired_sbe is None else retired_sbe.strip() != "N/A",
            "retired_pages_sbe": _int(_first(f, "Retired Pages/Single Bit ECC")),
            "retired_pages_dbe": _int(_first(f, "Retired Pages/Double Bit ECC")),
            "retired_pages_pending": _yes(_first(f, "Retired Pages/Pending Page Blacklist", "Retired Pages/Pending")),
            # Remapped Rows: a section on Ampere and later; "Remapped Rows : N/A" or no line before
            "remapped_rows_supported": remapped_correctable is not None and remapped_correctable.strip() != "N/A",
            "remapped_rows_correctable": _int(_first(f, "Remapped Rows/Correctable Error")),
            "remapped_rows_uncorrectable": _int(_first(f, "Remapped Rows/Uncorrectable Error")),
            "remapped_rows_pending": _yes(_first(f, "Remapped Rows/Pending")),
            "remapped_rows_failure": _yes(_first(f, "Remapped Rows/Remapping Failure Occurred")),
            "fabric_state": _first(f, "Fabric/State"),
            "fields": f,
        }
        gpus.append(gpu)
    return gpus
