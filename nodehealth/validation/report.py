"""What the validation kit found: timings, and where the simulator disagrees with the node.

``timing`` summarises the calls; ``compare_symbols`` sets the driver library's exported NVML
symbols against the simulator's per-branch table (``sim/nodehealth_sim/fakenvml/symbols.tsv``);
``diff_calls`` aligns the recorded calls with the replayed ones and lists every difference
(function sequence, return codes, values); ``render_markdown`` writes ``report.md``.
"""

from __future__ import annotations

import difflib
import json
import statistics
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Optional

from nodehealth.validation.record import Call

ABSENT = "<absent>"
MAX_MD_DIFFERENCES = 2000


# --------------------------------------------------------------------------- timings


def timing(calls: list[Call]) -> dict[str, Any]:
    """Per function: count, median and max µs; calls per GPU; calls that never returned."""
    by_fn: dict[str, list[int]] = defaultdict(list)
    counts: Counter[str] = Counter()
    per_gpu: Counter[str] = Counter()
    never = []
    for c in calls:
        counts[c.fn] += 1
        per_gpu["node" if c.gpu is None else str(c.gpu)] += 1
        if c.returned and c.us is not None:
            by_fn[c.fn].append(int(c.us))
        elif not c.returned:
            never.append({"seq": c.seq, "fn": c.fn, "gpu": c.gpu})
    functions = {
        fn: {"count": counts[fn],
             "median_us": statistics.median(by_fn[fn]) if by_fn[fn] else None,
             "max_us": max(by_fn[fn]) if by_fn[fn] else None,
             "total_us": sum(by_fn[fn])}
        for fn in sorted(counts, key=lambda f: (-sum(by_fn[f]), f))
    }
    return {"total_calls": len(calls), "total_us": sum(sum(v) for v in by_fn.values()),
            "functions": functions, "calls_per_gpu": dict(sorted(per_gpu.items(), key=lambda kv: (
                kv[0] != "node", int(kv[0]) if kv[0].isdigit() else -1))),
            "never_returned": never}


# --------------------------------------------------------------------------- symbols


def default_symbol_table() -> Path:
    import nodehealth_sim as sim

    return Path(sim.__file__).resolve().parent / "fakenvml" / "symbols.tsv"


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
    """The simulator's branch for a driver version: ``nodehealth.sim.driver.branch_for`` when
    there is one, else the newest branch not newer than the version's major number."""
    if not driver_version or not branches:
        return None
    try:
        from nodehealth_sim import driver  # type: ignore[attr-defined,unused-ignore]

        return int(driver.branch_for(driver_version))
    except Exception:  # noqa: BLE001 - no simulator driver module, or a version it cannot place
        pass
    try:
        major = int(driver_version.split(".")[0])
    except ValueError:
        return None
    older = [b for b in branches if b <= major]
    return max(older) if older else min(branches)


def compare_symbols(exported: Optional[list[str]], driver_version: Optional[str],
                    table_path: Optional[Path] = None) -> dict[str, Any]:
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
    out.update({
        "status": "compared", "branch": branch, "branches": branches, "implemented": len(table),
        "exported_nvml": len(have),
        "simulator_only": sorted(in_branch - have),  # the simulator exports it, the driver does not
        "driver_only": sorted((set(table) - in_branch) & have),  # the driver exports it, the simulator's branch not
        "agree": len((in_branch & have) | (set(table) - in_branch - have)),
        "not_implemented": len(have - set(table)),
    })
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


def _entry(kind: str, rec: Optional[Call], rep: Optional[Call], path: str = "", a: Any = None,
           b: Any = None) -> dict[str, Any]:
    base = rec or rep
    assert base is not None
    return {"kind": kind, "fn": base.fn, "gpu": base.gpu, "args": base.args,
            "seq": rec.seq if rec else None, "replay_seq": rep.seq if rep else None,
            "path": path, "recorded": a, "replayed": b}


def _outcome(c: Call) -> str:
    if not c.returned:
        return "never returned"
    return "0" if c.rc == 0 else f"{c.rc} ({c.error})"


def diff_calls(recorded: list[Call], replayed: list[Call]) -> list[dict[str, Any]]:
    """Every difference between two recordings, call by call, in the recording's order."""
    out: list[dict[str, Any]] = []
    matcher = difflib.SequenceMatcher(a=[_key(c) for c in recorded], b=[_key(c) for c in replayed],
                                      autojunk=False)
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
    out = [_entry("value", rec, rep, f"value.{p}" if p else "value", a, b)
           for p, a, b in deep_diff(rec.value, rep.value)]
    out += [_entry("value", rec, rep, f"out.{p}" if p else "out", a, b) for p, a, b in deep_diff(rec.out, rep.out)]
    return out


def summarise_differences(diffs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The differences grouped by (kind, function, path without indices): how many, which GPUs."""
    import re

    groups: dict[tuple[str, str, str], dict[str, Any]] = {}
    for d in diffs:
        path = re.sub(r"\[\d+\]", "[]", d["path"])
        g = groups.setdefault((d["kind"], d["fn"], path), {"kind": d["kind"], "fn": d["fn"], "path": path,
                                                            "count": 0, "gpus": set(), "example": d})
        g["count"] += 1
        if d["gpu"] is not None:
            g["gpus"].add(d["gpu"])
    return [{**g, "gpus": sorted(g["gpus"])} for g in groups.values()]


# --------------------------------------------------------------------------- report.md


def _cell(value: Any, limit: int = 80) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= limit else text[:limit - 1] + "…"


def render_markdown(report: dict[str, Any]) -> str:
    run = report["run"]
    lines = [f"# NVML validation: {run.get('host')}, {run.get('date_utc')}", ""]
    lines += ["## What was run", "", "| | |", "|---|---|"]
    for key, label in (("date_utc", "date (UTC)"), ("host", "host"), ("mode", "driver"),
                       ("scenario", "scenario"), ("driver_version", "driver version"),
                       ("cuda_driver_version", "CUDA driver version"), ("gpu_models", "GPU model(s)"),
                       ("gpu_count", "GPUs"), ("pynvml_version", "nvidia-ml-py"), ("pynvml_path", "pynvml path"),
                       ("nvml_module", "NVML module"), ("library", "NVML library"), ("timeout_s", "timeout (s)"),
                       ("outcome", "recording"), ("elapsed_s", "recording took (s)"), ("nodehealth", "nodehealth")):
        value = run.get(key)
        if value not in (None, "", []):
            lines.append(f"| {label} | {_cell(', '.join(value) if isinstance(value, list) else value, 200)} |")
    lines += ["", "Files: " + ", ".join(f"`{f}`" for f in report.get("files", [])), ""]

    t = report["timing"]
    lines += ["## NVML calls", "",
              f"{t['total_calls']} calls, {t['total_us']} µs in NVML in all. Calls per GPU: "
              + ", ".join(f"{k}: {v}" for k, v in t["calls_per_gpu"].items()) + ".", ""]
    if t["never_returned"]:
        lines += ["**Never returned** (started, no answer by the deadline): " + ", ".join(
            f"`{n['fn']}` (GPU {n['gpu']}, call {n['seq']})" for n in t["never_returned"]), ""]
    lines += ["| function | count | median µs | max µs | total µs |", "|---|---:|---:|---:|---:|"]
    for fn, s in t["functions"].items():
        lines.append(f"| `{fn}` | {s['count']} | {s['median_us'] if s['median_us'] is not None else '—'} | "
                     f"{s['max_us'] if s['max_us'] is not None else '—'} | {s['total_us']} |")
    lines.append("")

    lines += ["## Where the simulator disagrees", "", "### Exported symbols", ""]
    sym = report["symbols"]
    if sym.get("status") != "compared":
        lines += [f"Not compared: {sym.get('status')}.", ""]
    else:
        lines += [f"Driver library: `{sym.get('library')}`, {sym['exported_nvml']} exported `nvml*` symbols. "
                  f"Simulator table `{sym['table']}`, branch {sym['branch']}: {sym['implemented']} functions "
                  f"implemented, {sym['agree']} agree, {sym['not_implemented']} exported functions the simulator "
                  "does not implement (not compared).", ""]
        for key, label in (("simulator_only", "The simulator's branch exports, the driver does not"),
                           ("driver_only", "The driver exports, the simulator's branch does not")):
            names = sym[key]
            lines.append(f"- {label}: " + (", ".join(f"`{n}`" for n in names) if names else "none"))
        lines.append("")
    lines += ["### Calls (the node against its scenario replayed in the simulator)", ""]
    replay = report.get("replay")
    if not replay:
        lines += ["Not replayed.", ""]
    elif replay.get("error"):
        lines += [f"Not replayed: {replay['error']}", ""]
    else:
        diffs = replay["differences"]
        same_seq = not any(d["kind"] in ("only_recorded", "only_replayed", "args") for d in diffs)
        same_rc = not any(d["kind"] == "return" for d in diffs)
        same_val = not any(d["kind"] == "value" for d in diffs)
        lines += [f"Recorded {replay['recorded_calls']} calls, replayed {replay['replayed_calls']} "
                  f"(replay: {replay['outcome']}).", "",
                  f"- same function sequence: {'yes' if same_seq else 'no'}",
                  f"- same return codes: {'yes' if same_rc else 'no'}",
                  f"- same values: {'yes' if same_val else 'no'}",
                  f"- differences: {len(diffs)}", ""]
        if diffs:
            lines += ["Grouped:", "", "| kind | function | path | count | GPUs | example (recorded → replayed) |",
                      "|---|---|---|---:|---|---|"]
            for g in replay["summary"]:
                ex = g["example"]
                lines.append(f"| {g['kind']} | `{g['fn']}` | `{g['path']}` | {g['count']} | "
                             f"{','.join(str(x) for x in g['gpus']) or '—'} | "
                             f"{_cell(ex['recorded'], 60)} → {_cell(ex['replayed'], 60)} |")
            lines += ["", "Every difference:", "", "| call | replay call | GPU | function | arguments | kind | path | "
                      "recorded | replayed |", "|---:|---:|---|---|---|---|---|---|---|"]
            for d in diffs[:MAX_MD_DIFFERENCES]:
                lines.append(f"| {d['seq'] or '—'} | {d['replay_seq'] or '—'} | "
                             f"{'—' if d['gpu'] is None else d['gpu']} | `{d['fn']}` | "
                             f"{_cell(', '.join(d['args']), 50)} "
                             f"| {d['kind']} | `{d['path']}` | {_cell(d['recorded'])} | {_cell(d['replayed'])} |")
            if len(diffs) > MAX_MD_DIFFERENCES:
                lines.append(f"\n{len(diffs) - MAX_MD_DIFFERENCES} more in report.json.")
            lines.append("")
    notes = report.get("scenario_notes") or []
    lines += ["### What the scenario cannot say", ""]
    lines += [f"- {n}" for n in notes] if notes else ["Nothing: every recorded answer has a scenario key."]
    lines.append("")
    host = report.get("host_evidence") or {}
    if host:
        lines += ["## Host evidence", ""]
        lines += [f"- `{name}`: {desc}" for name, desc in host.items()]
        lines.append("")
    return "\n".join(lines)


def write(out_fd: int, report: dict[str, Any]) -> None:
    """report.json and report.md into the ``--out`` directory (its descriptor), each replacing our own earlier one."""
    from nodehealth.platform import ground

    ground.replace_own(out_fd, "report.json", (json.dumps(report, indent=1, sort_keys=True, default=str)
                                               + "\n").encode(), 0o644)
    ground.replace_own(out_fd, "report.md", render_markdown(report).encode("utf-8", errors="replace"), 0o644)
