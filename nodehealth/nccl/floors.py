"""The bus-bandwidth floors of the NCCL self-test (data in ``nodehealth/data/nccl_floors.toml``).

Each floor is what a healthy node of one GPU model, GPU count and mode reaches (a vendor's
pass threshold or a published run), with its source. ``lookup`` finds the one for a node; the
``nccl_selftest`` check applies its fail and warn fractions to it.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.9/3.10
    import tomli as tomllib

DEFAULT_PATH = Path(__file__).resolve().parent.parent / "data" / "nccl_floors.toml"
MODES = ("nvlink", "ib_loopback")


@dataclass(frozen=True)
class Floor:
    model: str  # a substring of the NVML GPU name, matched case-insensitively
    gpus: int
    mode: str
    floor_gbps: float
    source: str
    size: str = ""
    kind: str = ""  # "threshold" or "measured"

    def matches(self, model: str, gpus: int, mode: str) -> bool:
        return self.mode == mode and self.gpus == gpus and self.model.lower() in model.lower()


def parse(text: str) -> tuple[Floor, ...]:
    """The floors of a data file's text; a ValueError names the entry that is wrong."""
    raw = tomllib.loads(text)
    out = []
    for i, entry in enumerate(raw.get("floor", [])):
        try:
            floor = Floor(
                model=str(entry["model"]),
                gpus=int(entry["gpus"]),
                mode=str(entry["mode"]),
                floor_gbps=float(entry["floor_gbps"]),
                source=str(entry["source"]),
                size=str(entry.get("size", "")),
                kind=str(entry.get("kind", "")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"floor[{i}]: {type(exc).__name__}: {exc}") from None
        if floor.mode not in MODES or floor.gpus < 1 or not floor.floor_gbps > 0 or not floor.model or not floor.source:
            raise ValueError(f"floor[{i}]: mode in {MODES}, gpus >= 1, floor_gbps > 0, model and source are required")
        out.append(floor)
    return tuple(out)


@functools.lru_cache(maxsize=1)
def default_floors() -> tuple[Floor, ...]:
    return parse(DEFAULT_PATH.read_text(encoding="utf-8"))


def lookup(
    model: Optional[str], gpus: Optional[int], mode: str, floors: Optional[tuple[Floor, ...]] = None
) -> Optional[Floor]:
    """The first floor for this GPU model, count and mode; None when the table has none."""
    if not model or not gpus:
        return None
    for floor in default_floors() if floors is None else floors:
        if floor.matches(model, gpus, mode):
            return floor
    return None


def as_json(floor: Floor) -> dict[str, Any]:
    return {
        "model": floor.model,
        "gpus": floor.gpus,
        "mode": floor.mode,
        "floor_gbps": floor.floor_gbps,
        "size": floor.size,
        "kind": floor.kind,
        "source": floor.source,
    }
