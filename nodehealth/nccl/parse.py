"""Parse what NVIDIA's nccl-tests print (``all_reduce_perf`` and the other ``*_perf`` programs).

Every output version since 2017 is read, as the format strings in NVIDIA/nccl-tests define it
(src/common.cu, and since the JSON writer src/util.cu):

* the 2017 layout: header ``bytes N type op time algbw busbw res``, time in **milliseconds**
  (``PRINT("  %7.3f  %5.2f  %5.2f  %7.0le", deltaSec * 1.0E3, ...)``), ``res`` the largest delta;
* 2019-2021: ``size count type redop time algbw busbw error`` with a units row ``(us)``;
  ``error`` is still the largest delta (``%5.0le``), not a count; broadcast/reduce print ``root``
  where the reductions print ``redop``;
* 2022 on: ``size count type redop root time algbw busbw #wrong`` (``%5g`` / ``%6g`` count, or
  ``N/A`` with ``-c 0``), the ``copybw`` column of the side-work builds, the per-iteration columns
  (``i_min i_max i_p99 i_cv%`` after each ``#wrong``, ``-I 1``), ``cputime`` for ``-C 1``, a
  trailing ``timestamp`` (two words) and values written by ``getFloatStr`` (``1.2e+07`` when a
  number is wider than its column);
* the header lines: ``# nThread ...``, the device lines of every version
  (``#   Rank %2d on %10s device %2d [0x%02x] %s``, ``... Pid %6d ...``,
  ``#  Rank %2d Group %2d Pid %6d on %10s device %2d [%04x:%02x:%02x] %s``),
  ``# nccl-tests version %s nccl-headers=%d nccl-library=%d`` (2.17.6 on),
  ``# Collective test starting: %s``, NCCL's own ``NCCL version 2.x+cudaY`` line;
* the footer ``# Out of bounds values : %d OK|FAILED`` and ``# Avg bus bandwidth    : %g [OK|FAILED]``
  (the verdict when ``NCCL_TESTS_MIN_BW`` is set); in 2017 the footer had no ``#``;
* the ``-J FILE.json`` document (``nccl/perf_json.py`` reads it).

The table's columns and rows are ``nccl/perf_table.py``'s; this module reads the lines around them.

Output pasted into GitHub issues often lost its leading ``#`` (Markdown made headings of those
lines): such lines are read the same. Lines that belong to neither table nor header (NCCL INFO
and WARN lines of every rank, MPI or srun tags, shell prompts) are skipped; WARN and test-failure
lines are kept in ``warnings``. A line prefixed by ``[1,0]<stdout>:`` (``mpirun --tag-output``),
``0: `` (``srun --label``), ``[rank0]:``/``[default0]:`` (torchrun) or an RFC 3339 timestamp
(``kubectl logs --timestamps``) is read without its prefix.

Input that holds no table at all, or a table without one complete row, raises ``ParseError``
naming the line; a row cut short (a truncated file, another process's output written into the
middle of it) is left out, its line number in ``skipped_lines``.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Iterator
from typing import Callable, Optional

from nodehealth.nccl.perf_json import MAX_WARNINGS, parse_json
from nodehealth.nccl.perf_table import Layout, is_int, new_row, read_row
from nodehealth.nccl.results import ParseError, PerfResult, PerfRow

__all__ = ["ParseError", "busbw", "bus_factor", "parse_perf", "strip_prefix"]

# nccl-tests' GetBw functions (src/<collective>.cu): busBw = algBw * factor.
_FACTORS: dict[str, Callable[[int], float]] = {
    "allreduce": lambda n: 2.0 * (n - 1) / n,
    "allgather": lambda n: (n - 1) / n,
    "reducescatter": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
    "alltoallv": lambda n: (n - 1) / n,
    "gather": lambda n: (n - 1) / n,
    "scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "sendrecv": lambda n: 1.0,
    "hypercube": lambda n: 1.0,
}


def bus_factor(n: int, collective: str = "all_reduce") -> float:
    """The factor nccl-tests multiplies algbw by to get busbw, for ``n`` ranks."""
    key = collective.lower().rsplit("/", 1)[-1]
    if key.endswith("_perf"):
        key = key[:-5]
    key = key.replace("_", "").replace("-", "")
    if key not in _FACTORS:
        raise ValueError(f"unknown collective {collective!r}")
    if n < 1:
        raise ValueError(f"rank count must be at least 1, not {n}")
    return float(_FACTORS[key](n))


def busbw(algbw: float, n: int, collective: str = "all_reduce") -> float:
    """Bus bandwidth from algorithm bandwidth as nccl-tests computes it (all_reduce: ``algbw * 2(n-1)/n``)."""
    return algbw * bus_factor(n, collective)


# ---------------------------------------------------------------- line prefixes

# Prefixes that launchers and log collectors put before a program's line; removed repeatedly.
_PREFIX_RE = re.compile(
    r"^[ \t]*(?:"
    r"\[\d+,\d+\]<(?:stdout|stderr)>:"  # mpirun --tag-output
    r"|\[\d+\]<(?:stdout|stderr)>:"
    r"|\[(?:rank|default)?\d+\]:"  # torchrun --tee / PyTorch rank prefix
    r"|\d+:[ \t]"  # srun --label
    r"|\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?(?:[ \t]|$)"  # RFC 3339
    r"|\[\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\][ \t]?"  # NCCL's [%F %T]
    r")"
)


def strip_prefix(line: str) -> str:
    """``line`` without the launcher / timestamp prefixes listed above (at most four of them)."""
    for _ in range(4):
        m = _PREFIX_RE.match(line)
        if not m or not m.end():
            break
        line = line[m.end() :]
    return line


# ---------------------------------------------------------------- text

_RANK_RE = re.compile(
    r"Rank\s+(\d+)\s+(?:Group\s+-?\d+\s+)?(?:Pid\s+\d+\s+)?on\s+(\S+)\s+device\s+(\d+)\s+\[([^\]]*)\]\s*(.*)$"
)
_NCCL_VERSION_RE = re.compile(r"NCCL version (\S+)")
_TESTS_VERSION_RE = re.compile(r"nccl-tests version (\S+)")
_STARTING_RE = re.compile(r"Collective test (?:starting|concluded): (\S+)")
_FAILURE_RE = re.compile(r"Test (?:NCCL |CUDA )?failure|Test timeout|NCCL WARN|^error: ")
_NOISE_START = frozenset("0123456789#")


def _lines(text: str) -> Iterator[tuple[int, str]]:
    return enumerate(text.splitlines(), 1)


def parse_perf(text: str) -> PerfResult:
    """Parse nccl-tests output (text, or the ``-J`` JSON document)."""
    if not isinstance(text, str):
        raise TypeError("parse_perf takes str (decode bytes with errors='replace')")
    head = text.lstrip()
    if not head:
        raise ParseError("empty input: no nccl-tests output", 0)
    if head.startswith("{"):
        return parse_json(text)
    return _parse_text(text)


def _parse_text(text: str) -> PerfResult:
    rows: list[PerfRow] = []
    skipped: list[int] = []
    warnings: list[str] = []
    ranks: dict[int, str] = {}
    layout: Optional[Layout] = None
    header_line = 0
    avg: Optional[float] = None
    avg_verdict: Optional[str] = None
    oob: Optional[int] = None
    oob_total = 0
    oob_seen = False
    nccl_version = tests_version = collective = None
    tables = 0
    first_failure = 0
    rank_ids: set[str] = set()
    fast_get: Optional[Callable[[list[str]], tuple[str, ...]]] = None  # the current layout's usual row
    fast_need = 0
    layouts: dict[tuple[str, ...], Layout] = {}  # the same header again (runs concatenated): same layout

    for no, raw in _lines(text):
        tokens = None
        if raw[:1] == "#":  # most lines of a run: the header and the footer
            body = raw[1:].strip()
            if not body or body[0] == "(":  # "#" alone, the units row
                continue
            if body[0] == "R" and body.startswith("Rank"):
                parts = body.split(None, 2)
                if len(parts) > 2 and parts[1] not in rank_ids and parts[1].isdigit():
                    m = _RANK_RE.match(body)
                    if m:
                        rank_ids.add(parts[1])
                        ranks[int(m.group(1))] = m.group(5).strip()
                continue
            s = raw
            c = "#"
        else:
            tokens = raw.split()
            if not tokens:
                continue
            if fast_get is not None and len(tokens) >= fast_need:
                # the usual row, read in place (_row is the general path, and says why a row is not one)
                sz, ct, ty, op, t1, a1, b1, w1, t2, a2, b2, w2 = fast_get(tokens)
                if sz.isdigit() and ct.isdigit() and w1.isdigit() and w2.isdigit():
                    try:
                        rows.append(
                            new_row(
                                (
                                    int(sz),
                                    int(ct),
                                    ty,
                                    op,
                                    float(t1),
                                    float(a1),
                                    float(b1),
                                    int(w1),
                                    float(t2),
                                    float(a2),
                                    float(b2),
                                    int(w2),
                                )
                            )
                        )
                        continue
                    except ValueError:
                        pass
            s = raw.strip()
            c = s[0]
        if c not in _NOISE_START:
            s = strip_prefix(s).strip()
            if not s:
                continue
            c = s[0]
            tokens = None
        if "0" <= c <= "9":
            if tokens is None:
                tokens = s.split()
            if not tokens[0].isdigit():  # "0: " (srun --label), a timestamp
                s = strip_prefix(s).strip()
                tokens = s.split()
                if not tokens:
                    continue
                if not tokens[0].isdigit():
                    if _FAILURE_RE.search(s):
                        if not first_failure and "NCCL WARN" not in s:
                            first_failure = no
                        _keep(warnings, s)
                    continue
            if len(tokens) < 2 or not tokens[1].isdigit():
                if _FAILURE_RE.search(s):
                    if not first_failure and "NCCL WARN" not in s:
                        first_failure = no
                    _keep(warnings, s)
                continue
            lay = layout
            if lay is None:
                lay = Layout.default(tokens)
            try:
                rows.append(read_row(tokens, lay))
            except (ValueError, IndexError, OverflowError):
                skipped.append(no)
            continue
        body = s[1:].strip() if c == "#" else s
        if not body:
            continue
        b0 = body[0]
        if b0 == "(":
            continue  # units row
        if body.startswith("Rank"):  # '#' lost to Markdown
            m = _RANK_RE.match(body)
            if m:
                ranks.setdefault(int(m.group(1)), m.group(5).strip())
            continue
        if b0 == "s" or b0 == "b":  # "size count ..." / "bytes N ..." column names
            names = body.split()
            if len(names) >= 6 and names[0] in ("size", "bytes") and "algbw" in names:
                key = tuple(names)
                lay = layouts.get(key) or layouts.setdefault(key, Layout(names, no))
                if lay.valid:
                    layout, header_line = lay, no
                    fast_get = operator.itemgetter(*lay.fast) if lay.fast else None
                    fast_need = lay.needed
                    tables += 1
                continue
        if body.startswith("Out of bounds values"):
            val = body.split(":", 1)[-1].split()
            if val and is_int(val[0]):
                oob = int(val[0])
                oob_total += oob
                oob_seen = True
            continue
        if body.startswith("Avg bus bandwidth"):
            val = body.split(":", 1)[-1].split()
            if val:
                try:
                    avg = float(val[0])
                except ValueError:
                    avg = None
                avg_verdict = val[1] if len(val) > 1 else None
            continue
        if "nccl-tests version" in body:
            m = _TESTS_VERSION_RE.search(body)
            tests_version = m.group(1) if m else tests_version
            continue
        if body.startswith("Collective test"):
            m = _STARTING_RE.search(body)
            collective = m.group(1) if m else collective
            continue
        if "NCCL version" in body and nccl_version is None:
            m = _NCCL_VERSION_RE.search(body)
            nccl_version = m.group(1) if m else None
            # fall through: an INFO line may still be a WARN-free noise line
        if _FAILURE_RE.search(body):
            if "NCCL WARN" not in body:
                first_failure = first_failure or no
            _keep(warnings, s)

    if not rows:
        if skipped:
            raise ParseError("incomplete table row: no complete row in the output", skipped[0])
        if header_line:
            raise ParseError("table header has no rows below it (truncated output?)", header_line)
        if first_failure:
            raise ParseError("no nccl-tests table: the test failed", first_failure)
        raise ParseError("no nccl-tests table found (no size/count/.../busbw rows)", 0)
    row_wrong = sum((r.oop_wrong or 0) + (r.ip_wrong or 0) for r in rows)
    for no in skipped[:20]:
        _keep(warnings, f"line {no}: incomplete table row ignored")
    return PerfResult(
        rows=tuple(rows),
        avg_busbw_gbps=avg,
        wrong=oob_total if oob_seen else row_wrong,
        collective=collective,
        nccl_version=nccl_version,
        tests_version=tests_version,
        ranks=len(ranks) or None,
        warnings=tuple(warnings),
        devices=tuple(ranks[k] for k in sorted(ranks)),
        skipped_lines=tuple(skipped),
        avg_busbw_verdict=avg_verdict,
        tables=max(tables, 1),
        complete=avg is not None or oob_seen,
    )


def _keep(warnings: list[str], line: str) -> None:
    if len(warnings) < MAX_WARNINGS:
        warnings.append(line.strip()[:500])
