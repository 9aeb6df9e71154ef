"""Where a dotted key sits in a config file's text: ``tomllib`` gives the tree but no positions, so an
error about ``checks.gpu_ecc.max_sbe`` or ``override[1].gpu.expected_count`` finds its line here.

A line-by-line read of the TOML the sample config and administrators write: table headers
(``[a.b]``, which also places ``a``), arrays of tables (``[[override]]``, counted, so ``[override.gpu]``
after the second one is ``override[1].gpu``), ``key = value`` and dotted ``a.b = value`` lines, bare or
quoted keys; lines inside a multi-line string are skipped. A key not found (an inline table, a value spread over lines)
takes the line of its nearest enclosing table or key that is found; None when none is.
Standard library only; pure.
"""

from __future__ import annotations

import re
from typing import Optional

_KEY = r'(?:[A-Za-z0-9_-]+|"[^"\\\n]*"|\'[^\'\n]*\')'
_DOTTED = rf"{_KEY}(?:\s*\.\s*{_KEY})*"
_ARRAY = re.compile(rf"^\s*\[\[\s*({_DOTTED})\s*\]\]")
_TABLE = re.compile(rf"^\s*\[\s*({_DOTTED})\s*\]")
_ASSIGN = re.compile(rf"^\s*({_DOTTED})\s*=")
_PART = re.compile(_KEY)
_INDEX = re.compile(r"\[\d+\]$")


def _parts(dotted: str) -> list[str]:
    return [p.strip("\"'") for p in _PART.findall(dotted)]


def index(text: str) -> dict[str, int]:
    """Every table and key of ``text`` as its dotted path (``override[0].gpu.expected_count``) -> its first
    line (1-based)."""
    lines: dict[str, int] = {}
    counts: dict[str, int] = {}  # an array of tables' dotted name -> how many so far
    prefix: list[str] = []
    in_string: Optional[str] = None
    for number, line in enumerate(text.splitlines(), 1):
        if in_string is not None:
            if line.count(in_string) % 2 == 1:
                in_string = None
            continue
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        m = _ARRAY.match(line)
        if m:
            parts = _parts(m.group(1))
            parents = _resolve(parts[:-1], counts)
            name = ".".join([*(_INDEX.sub("", p) for p in parents), parts[-1]])
            counts[name] = counts.get(name, -1) + 1
            prefix = [*parents, f"{parts[-1]}[{counts[name]}]"]
            lines.setdefault(".".join(prefix), number)
            continue
        m = _TABLE.match(line)
        if m:
            prefix = _resolve(_parts(m.group(1)), counts)
            for depth in range(1, len(prefix) + 1):  # [a.b] also places the table a (a typo there is a's)
                lines.setdefault(".".join(prefix[:depth]), number)
            continue
        m = _ASSIGN.match(line)
        if m:
            parts = [*prefix, *_parts(m.group(1))]
            for depth in range(len(prefix) + 1, len(parts) + 1):  # a.b = 1 also places the table a
                lines.setdefault(".".join(parts[:depth]), number)
            rest = line[m.end() :]
            for quote in ('"""', "'''"):
                if rest.count(quote) % 2 == 1:
                    in_string = quote
    return lines


def _resolve(parts: list[str], counts: dict[str, int]) -> list[str]:
    """``[override.gpu]``'s parts with the array of tables it continues indexed: ``override[1]``, ``gpu``."""
    out: list[str] = []
    for part in parts:
        plain = ".".join([*(_INDEX.sub("", p) for p in out), part])
        out.append(f"{part}[{counts[plain]}]" if plain in counts else part)
    return out


def line_of(lines: dict[str, int], key: str) -> Optional[int]:
    """The line of ``key`` (``checks.gpu_ecc.max_sbe``, ``gpu.allowed[2]``) in ``index``'s map, else of the
    nearest enclosing table or key found; None when none is."""
    parts = key.split(".")
    while parts:
        found = lines.get(".".join(parts))
        if found is not None:
            return found
        last = _INDEX.sub("", parts[-1])
        if last != parts[-1]:  # an item of an array: the array's line
            parts[-1] = last
            continue
        parts.pop()
    return None


def near(name: str, known: list[str]) -> str:
    """``" (did you mean X?)"`` for the closest of ``known`` to a mistyped ``name``, else ``""``."""
    import difflib

    match = difflib.get_close_matches(name, known, n=1)
    return f" (did you mean {match[0]}?)" if match else ""
