"""What the validation kit found: timings, and where the simulator disagrees with the node.

``timing`` summarises the calls; ``render_markdown`` writes ``report.md`` from the report: the
recording's part (written on the node) and, once the simulator replayed it, the symbol comparison
and the call differences that ``nodehealth_sim.validation.compare`` computed (``symbols``,
``replay``). Without the simulator the report says how to replay the record elsewhere.
"""

from __future__ import annotations

import json
import statistics
from collections import Counter, defaultdict
from typing import Any

from nodehealth.validation.record import Call

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
        fn: {
            "count": counts[fn],
            "median_us": statistics.median(by_fn[fn]) if by_fn[fn] else None,
            "max_us": max(by_fn[fn]) if by_fn[fn] else None,
            "total_us": sum(by_fn[fn]),
        }
        for fn in sorted(counts, key=lambda f: (-sum(by_fn[f]), f))
    }
    return {
        "total_calls": len(calls),
        "total_us": sum(sum(v) for v in by_fn.values()),
        "functions": functions,
        "calls_per_gpu": dict(
            sorted(per_gpu.items(), key=lambda kv: (kv[0] != "node", int(kv[0]) if kv[0].isdigit() else -1))
        ),
        "never_returned": never,
    }


def _cell(value: Any, limit: int = 80) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def render_markdown(report: dict[str, Any]) -> str:
    run = report["run"]
    lines = [f"# NVML validation: {run.get('host')}, {run.get('date_utc')}", ""]
    lines += ["## What was run", "", "| | |", "|---|---|"]
    for key, label in (
        ("date_utc", "date (UTC)"),
        ("host", "host"),
        ("mode", "driver"),
        ("scenario", "scenario"),
        ("driver_version", "driver version"),
        ("cuda_driver_version", "CUDA driver version"),
        ("gpu_models", "GPU model(s)"),
        ("gpu_count", "GPUs"),
        ("pynvml_version", "nvidia-ml-py"),
        ("pynvml_path", "pynvml path"),
        ("nvml_module", "NVML module"),
        ("library", "NVML library"),
        ("timeout_s", "timeout (s)"),
        ("outcome", "recording"),
        ("elapsed_s", "recording took (s)"),
        ("nodehealth", "nodehealth"),
    ):
        value = run.get(key)
        if value not in (None, "", []):
            lines.append(f"| {label} | {_cell(', '.join(value) if isinstance(value, list) else value, 200)} |")
    lines += ["", "Files: " + ", ".join(f"`{f}`" for f in report.get("files", [])), ""]

    t = report["timing"]
    lines += [
        "## NVML calls",
        "",
        f"{t['total_calls']} calls, {t['total_us']} µs in NVML in all. Calls per GPU: "
        + ", ".join(f"{k}: {v}" for k, v in t["calls_per_gpu"].items())
        + ".",
        "",
    ]
    if t["never_returned"]:
        lines += [
            "**Never returned** (started, no answer by the deadline): "
            + ", ".join(f"`{n['fn']}` (GPU {n['gpu']}, call {n['seq']})" for n in t["never_returned"]),
            "",
        ]
    lines += ["| function | count | median µs | max µs | total µs |", "|---|---:|---:|---:|---:|"]
    for fn, s in t["functions"].items():
        lines.append(
            f"| `{fn}` | {s['count']} | {s['median_us'] if s['median_us'] is not None else '—'} | "
            f"{s['max_us'] if s['max_us'] is not None else '—'} | {s['total_us']} |"
        )
    lines.append("")

    lines += ["## Where the simulator disagrees", "", "### Exported symbols", ""]
    sym = report["symbols"]
    if sym.get("status") != "compared":
        lines += [f"Not compared: {sym.get('status')}.", ""]
    else:
        lines += [
            f"Driver library: `{sym.get('library')}`, {sym['exported_nvml']} exported `nvml*` symbols. "
            f"Simulator table `{sym['table']}`, branch {sym['branch']}: {sym['implemented']} functions "
            f"implemented, {sym['agree']} agree, {sym['not_implemented']} exported functions the simulator "
            "does not implement (not compared).",
            "",
        ]
        for key, label in (
            ("simulator_only", "The simulator's branch exports, the driver does not"),
            ("driver_only", "The driver exports, the simulator's branch does not"),
        ):
            names = sym[key]
            lines.append(f"- {label}: " + (", ".join(f"`{n}`" for n in names) if names else "none"))
        lines.append("")
    lines += ["### Calls (the node against its scenario replayed in the simulator)", ""]
    replay = report.get("replay")
    if not replay:
        lines += ["Not replayed.", ""]
    elif replay.get("skipped"):
        lines += [f"Not replayed here: {replay['skipped']}", ""]
    elif replay.get("error"):
        lines += [f"Not replayed: {replay['error']}", ""]
    else:
        diffs = replay["differences"]
        same_seq = not any(d["kind"] in ("only_recorded", "only_replayed", "args") for d in diffs)
        same_rc = not any(d["kind"] == "return" for d in diffs)
        same_val = not any(d["kind"] == "value" for d in diffs)
        lines += [
            f"Recorded {replay['recorded_calls']} calls, replayed {replay['replayed_calls']} "
            f"(replay: {replay['outcome']}).",
            "",
            f"- same function sequence: {'yes' if same_seq else 'no'}",
            f"- same return codes: {'yes' if same_rc else 'no'}",
            f"- same values: {'yes' if same_val else 'no'}",
            f"- differences: {len(diffs)}",
            "",
        ]
        if diffs:
            lines += [
                "Grouped:",
                "",
                "| kind | function | path | count | GPUs | example (recorded → replayed) |",
                "|---|---|---|---:|---|---|",
            ]
            for g in replay["summary"]:
                ex = g["example"]
                lines.append(
                    f"| {g['kind']} | `{g['fn']}` | `{g['path']}` | {g['count']} | "
                    f"{','.join(str(x) for x in g['gpus']) or '—'} | "
                    f"{_cell(ex['recorded'], 60)} → {_cell(ex['replayed'], 60)} |"
                )
            lines += [
                "",
                "Every difference:",
                "",
                "| call | replay call | GPU | function | arguments | kind | path | recorded | replayed |",
                "|---:|---:|---|---|---|---|---|---|---|",
            ]
            for d in diffs[:MAX_MD_DIFFERENCES]:
                lines.append(
                    f"| {d['seq'] or '—'} | {d['replay_seq'] or '—'} | "
                    f"{'—' if d['gpu'] is None else d['gpu']} | `{d['fn']}` | "
                    f"{_cell(', '.join(d['args']), 50)} "
                    f"| {d['kind']} | `{d['path']}` | {_cell(d['recorded'])} | {_cell(d['replayed'])} |"
                )
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

    ground.replace_own(
        out_fd, "report.json", (json.dumps(report, indent=1, sort_keys=True, default=str) + "\n").encode(), 0o644
    )
    ground.replace_own(out_fd, "report.md", render_markdown(report).encode("utf-8", errors="replace"), 0o644)
