"""The table of nccl-tests output: where each value sits in a row, from the column-name header line,
and one row read into a ``PerfRow``.

The headers of every version (``nccl.parse``'s docstring lists them): ``size``/``bytes``, ``count``,
``type``, ``redop``/``op``, ``root``, then one group per placement (out-of-place, in-place) of
``time`` (or ``cputime``), ``algbw``, ``busbw`` and ``#wrong`` (a count) or ``error``/``res`` (the
largest delta, before 2022). ``nccl.parse`` reads the lines around the table.
"""

from __future__ import annotations

import math
from typing import Any, Optional

from nodehealth.nccl.results import PerfRow

__all__ = ["Layout", "is_int", "new_row", "read_row"]

_WRONG_NAMES = {"#wrong": "count", "wrong": "count", "error": "delta", "res": "delta"}


class Layout:
    """Where each value sits in a table row, from the column-name header line."""

    def __init__(self, names: list[str], line: int) -> None:
        self.line = line
        self.size = self.count = self.type = self.redop = self.root = -1
        self.time_ms = bool(names) and names[0] == "bytes"  # the 2017 layout timed in ms
        # per group: [time, algbw, busbw, wrong, wrong_kind]
        self.groups: list[list[Any]] = []
        for i, name in enumerate(names):
            low = name.lower()
            if low in ("size", "bytes") and self.size < 0:
                self.size = i
            elif low in ("count", "n") and self.count < 0:
                self.count = i
            elif low == "type" and self.type < 0:
                self.type = i
            elif low in ("redop", "op") and self.redop < 0:
                self.redop = i
            elif low == "root" and self.root < 0 and not self.groups:
                self.root = i
            elif low in ("time", "cputime"):
                self.groups.append([i, -1, -1, -1, "count"])
            elif self.groups and low == "algbw":
                self.groups[-1][1] = i
            elif self.groups and low == "busbw":
                self.groups[-1][2] = i
            elif self.groups and low in _WRONG_NAMES:
                self.groups[-1][3] = i
                self.groups[-1][4] = _WRONG_NAMES[low]
        self.groups = [g for g in self.groups if g[1] >= 0 and g[2] >= 0][:2]
        last = [self.size, self.count, self.type, self.redop, self.root]
        for g in self.groups:
            last += g[:4]
        self.needed = max(last) + 1 if self.groups else 0
        # The usual layout (two full groups, counts, microseconds) is read without the general path.
        self.fast: Optional[tuple[int, ...]] = None
        if (
            len(self.groups) == 2
            and not self.time_ms
            and self.type >= 0
            and self.redop >= 0
            and all(g[3] >= 0 and g[4] == "count" for g in self.groups)
        ):
            self.fast = (self.size, self.count, self.type, self.redop, *self.groups[0][:4], *self.groups[1][:4])

    @property
    def valid(self) -> bool:
        return self.size >= 0 and self.count >= 0 and bool(self.groups)

    @classmethod
    def default(cls, tokens: list[str]) -> Layout:
        """A layout guessed from a row when no header was read (a pasted table without its header)."""
        n = len(tokens)
        if n >= 13 or n == 9:  # 2022 on: size count type redop root ... (one group: 9)
            names = ["size", "count", "type", "redop", "root"]
        elif n >= 4 and is_int(tokens[3]):  # broadcast/reduce before 2022: root, no redop
            names = ["size", "count", "type", "root"]
        else:
            names = ["size", "count", "type", "redop"]
        group = ["time", "algbw", "busbw", "#wrong"]
        names += group + group if n >= len(names) + 8 else group
        return cls(names, 0)


def is_int(tok: str) -> bool:
    return tok.lstrip("-").isdigit()


def _num(tok: str) -> Optional[float]:
    """A printed number; None for ``N/A``/``-``; raises ValueError for anything else."""
    if tok in ("N/A", "n/a", "-"):
        return None
    return float(tok)


def _wrong(tok: str, kind: str) -> Optional[int]:
    value = _num(tok)
    if value is None or kind != "count" or not math.isfinite(value):
        return None
    return int(value)


_ROW_FIELDS = tuple(PerfRow.__dataclass_fields__)


def new_row(values: tuple[Any, ...]) -> PerfRow:
    """``PerfRow(*values)`` at half the cost: a frozen dataclass's ``__init__`` sets each field through
    ``object.__setattr__``; filling the instance dict at once gives the same object (equal, hashable)."""
    row = object.__new__(PerfRow)
    row.__dict__.update(zip(_ROW_FIELDS, values))
    return row


def read_row(tokens: list[str], layout: Layout) -> PerfRow:
    """One table row; ValueError/IndexError when the tokens do not make one."""
    if len(tokens) < layout.needed:
        raise IndexError("row has too few fields")
    fast = layout.fast
    if fast is not None:
        w0, w1 = tokens[fast[7]], tokens[fast[11]]
        if w0.isdigit() and w1.isdigit():
            try:
                return PerfRow(
                    int(tokens[fast[0]]),
                    int(tokens[fast[1]]),
                    tokens[fast[2]],
                    tokens[fast[3]],
                    float(tokens[fast[4]]),
                    float(tokens[fast[5]]),
                    float(tokens[fast[6]]),
                    int(w0),
                    float(tokens[fast[8]]),
                    float(tokens[fast[9]]),
                    float(tokens[fast[10]]),
                    int(w1),
                )
            except ValueError:
                pass  # N/A, a negative size...: the general path says which
    size = int(tokens[layout.size])
    count = int(tokens[layout.count])
    if size < 0 or count < 0:
        raise ValueError("negative size")
    vals: list[Any] = []
    for g in layout.groups:
        t = _num(tokens[g[0]])
        if t is not None and layout.time_ms:
            t *= 1000.0
        vals += [t, _num(tokens[g[1]]), _num(tokens[g[2]]), _wrong(tokens[g[3]], g[4]) if g[3] >= 0 else None]
    while len(vals) < 8:
        vals.append(None)
    return PerfRow(
        size_bytes=size,
        count=count,
        type=tokens[layout.type] if layout.type >= 0 else "",
        redop=tokens[layout.redop] if layout.redop >= 0 else "",
        oop_time_us=vals[0],
        oop_algbw_gbps=vals[1],
        oop_busbw_gbps=vals[2],
        oop_wrong=vals[3],
        ip_time_us=vals[4],
        ip_algbw_gbps=vals[5],
        ip_busbw_gbps=vals[6],
        ip_wrong=vals[7],
    )
