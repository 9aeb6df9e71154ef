"""Where the simulator disagrees with a recorded node (the replay's half of the validation kit).

``compare_symbols`` sets the driver library's exported NVML symbols against the simulator's
per-branch table (``fakenvml/symbols.tsv`` of this package); ``diff_calls`` aligns the recorded
calls with the replayed ones and lists every difference (function sequence, return codes, values);
``summarise_differences`` groups them for report.md (``nodehealth.validation.report``).
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any, Optional

from nodehealth.validation.record import Call

ABSENT = "<absent>"


# --------------------------------------------------------------------------- symbols


def default_symbol_table() -> Path:
    """The simulator's own per-branch table of exported symbols."""
    from nodehealth_sim import driver

    return driver.BUILD_DIR.parent / "symbols.tsv"


def read_symbol_table(path: Path) -> tuple[list[int], dict[str, set[int]]]:
    """symbols.tsv: a header ``symbol<TAB>branch...``, then one row per symbol with 1/0 per branch.

    Returns (branches, {symbol: the branches that export it}).
    """
    branches: list[int] = []
    table: dict[str, set[int]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        cols = line.split("\t")
        if not branches:
            if cols[0].strip().lower() != "symbol":
                raise ValueError(f"{path}: expected a header 'symbol<TAB>branch...', got {line!r}")
            branches = [int(c) for c in cols[1:]]
            continue
        table[cols[0].strip()] = {b for b, flag in zip(branches, cols[1:]) if flag.strip() == "1"}
    return branches, table


def nearest_branch(driver_version: Optional[str], branches: list[int]) -> Optional[int]:
    """The newest of ``branches`` not newer than the version's major number (the oldest below them all),
    as ``nodehealth_sim.driver.branch_for`` places it for the simulator's own branches."""
    if not driver_version or not branches:
        return None
    try:
        major = int(driver_version.split(".")[0])
    except ValueError:
        return None
    older = [b for b in branches if b <= major]
    return max(older) if older else min(branches)


def compare_symbols(
    exported: Optional[list[str]], driver_version: Optional[str], table_path: Optional[Path] = None
) -> dict[str, Any]:
    """The exported NVML symbols against the simulator's table, for the functions it implements."""
    path = table_path or default_symbol_table()
    out: dict[str, Any] = {"table": str(path)}
    if exported is None:
        out["status"] = "no driver library was read: nothing to compare"
        return out
    if not path.exists():
        out["status"] = f"the simulator has no symbol table ({path} does not exist)"
        return out
    try:
        branches, table = read_symbol_table(path)
    except (OSError, ValueError) as exc:
        out["status"] = f"unreadable symbol table: {exc}"
        return out
    branch = nearest_branch(driver_version, branches)
    have = set(exported)
    in_branch = {s for s, bs in table.items() if branch in bs}
    out.update(
        {
            "status": "compared",
            "branch": branch,
            "branches": branches,
            "implemented": len(table),
            "exported_nvml": len(have),
            "simulator_only": sorted(in_branch - have),  # the simulator exports it, the driver does not
            "driver_only": sorted((set(table) - in_branch) & have),  # the driver exports it, the simulator's branch not
            "agree": len((in_branch & have) | (set(table) - in_branch - have)),
            "not_implemented": len(have - set(table)),
        }
    )
    return out


# --------------------------------------------------------------------------- the call diff


def _key(c: Call) -> tuple[str, Optional[int], str]:
    return c.fn, c.gpu, json.dumps(c.argv, sort_keys=True)


def deep_diff(a: Any, b: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    """Every leaf where ``a`` and ``b`` differ: (path, a's value, b's value); ABSENT for a missing key."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in list(a) + [k for k in b if k not in a]:
            sub = f"{path}.{k}" if path else str(k)
            if k not in b:
                out.append((sub, a[k], ABSENT))
            elif k not in a:
                out.append((sub, ABSENT, b[k]))
            else:
                out += deep_diff(a[k], b[k], sub)
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        out = []
        for i, (x, y) in enumerate(zip(a, b)):
            out += deep_diff(x, y, f"{path}[{i}]")
        return out
    if a != b or isinstance(a, bool) != isinstance(b, bool):
        return [(path, a, b)]
    return []


def _entry(
    kind: str, rec: Optional[Call], rep: Optional[Call], path: str = "", a: Any = None, b: Any = None
) -> dict[str, Any]:
    base = rec or rep
    assert base is not None
    return {
        "kind": kind,
        "fn": base.fn,
        "gpu": base.gpu,
        "args": base.args,
        "seq": rec.seq if rec else None,
        "replay_seq": rep.seq if rep else None,
        "path": path,
        "recorded": a,
        "replayed": b,
    }


def _outcome(c: Call) -> str:
    if not c.returned:
        return "never returned"
    return "0" if c.rc == 0 else f"{c.rc} ({c.error})"


def diff_calls(recorded: list[Call], replayed: list[Call]) -> list[dict[str, Any]]:
    """Every difference between two recordings, call by call, in the recording's order."""
    out: list[dict[str, Any]] = []
    matcher = difflib.SequenceMatcher(a=[_key(c) for c in recorded], b=[_key(c) for c in replayed], autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            for rec, rep in zip(recorded[i1:i2], replayed[j1:j2]):
                out += _compare(rec, rep)
            continue
        left, right = recorded[i1:i2], replayed[j1:j2]
        # Same function in the same place with other arguments: one difference, not two.
        while left and right and (left[0].fn, left[0].gpu) == (right[0].fn, right[0].gpu):
            rec, rep = left.pop(0), right.pop(0)
            out.append(_entry("args", rec, rep, "args", rec.args, rep.args))
            out += _compare(rec, rep)
        out += [_entry("only_recorded", c, None, "", _outcome(c), ABSENT) for c in left]
        out += [_entry("only_replayed", None, c, "", ABSENT, _outcome(c)) for c in right]
    return out


def _compare(rec: Call, rep: Call) -> list[dict[str, Any]]:
    if rec.returned != rep.returned or rec.rc != rep.rc:
        return [_entry("return", rec, rep, "rc", _outcome(rec), _outcome(rep))]
    out = [
        _entry("value", rec, rep, f"value.{p}" if p else "value", a, b) for p, a, b in deep_diff(rec.value, rep.value)
    ]
    out += [_entry("value", rec, rep, f"out.{p}" if p else "out", a, b) for p, a, b in deep_diff(rec.out, rep.out)]
    return out


def summarise_differences(diffs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The differences grouped by (kind, function, path without indices): how many, which GPUs."""
    import re

    groups: dict[tuple[str, str, str], dict[str, Any]] = {}
    for d in diffs:
        path = re.sub(r"\[\d+\]", "[]", d["path"])
        g = groups.setdefault(
            (d["kind"], d["fn"], path),
            {"kind": d["kind"], "fn": d["fn"], "path": path, "count": 0, "gpus": set(), "example": d},
        )
        g["count"] += 1
        if d["gpu"] is not None:
            g["gpus"].add(d["gpu"])
    return [{**g, "gpus": sorted(g["gpus"])} for g in groups.values()]


# --------------------------------------------------------------------------- report.md
