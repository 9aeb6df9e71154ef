"""``nodehealth validate-nvml``: record what NVML answers on this node, as evidence for the simulator.

    nodehealth validate-nvml --out DIR [--simulate SCENARIO] [--timeout S] [--no-replay]

Read-only: no NVML call that changes a GPU setting can be made (the recorder refuses them),
nothing is cleared or reset, Slurm is not touched. docs/validation.md.

The recording is the product's; writing the scenario and replaying it in the simulator need
``nodehealth-sim`` (imported by name when installed; otherwise the record is written and the
output says to run ``nodehealth-sim replay DIR`` where the simulator is).

Exit codes: 0 evidence written and the simulator agrees with every call (or, without the
simulator, the recording completed); 1 evidence written and the report lists differences (or
the recording did not complete, or NVML did not start: a node without a driver validates nothing);
2 usage error (--simulate without the simulator included).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser(
        "validate-nvml",
        help="record this node's NVML answers (read-only) and where the simulator disagrees",
        description="Run the NVML probe on this node through a read-only recorder and write the evidence "
        "into DIR: calls.jsonl (every NVML call), symbols.json (the driver library's exported NVML "
        "symbols), nvidia-smi-q.txt, nvrm.txt (kernel NVRM/Xid lines), report.md/report.json; with the "
        "simulator installed (nodehealth-sim) also scenario.toml (this node as a simulator scenario), replay/ "
        "and where the simulator disagrees (else: nodehealth-sim replay DIR, where it is installed). "
        "Never changes a GPU setting and never touches Slurm. Exit 0 recorded (and the simulator agrees), "
        "1 differences, an incomplete record or an NVML that did not start (nothing validated), 2 usage error.",
    )
    p.add_argument("--out", required=True, metavar="DIR", help="directory to write into (created if missing)")
    p.add_argument("--simulate", metavar="SCENARIO", help="record a simulated node from this scenario file instead")
    p.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="deadline for the whole NVML reading, in seconds (default: %(default)s)",
    )
    p.add_argument("--no-replay", action="store_true", help="do not replay the written scenario in the simulator")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from nodehealth.validation import kit

    if not args.timeout > 0:
        print("nodehealth: --timeout must be a positive number of seconds", file=sys.stderr)
        return 2
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        print(f"nodehealth: --out {args.out}: not a directory", file=sys.stderr)
        return 2
    simulate = os.path.abspath(args.simulate) if args.simulate else None
    from nodehealth.platform.ground import Foreign

    try:
        doc = kit.run(args.out, simulate=simulate, timeout_s=args.timeout, replay=not args.no_replay)
    except (kit.ScenarioRefused, kit.SimulatorMissing) as exc:
        print(f"nodehealth: {exc}", file=sys.stderr)
        return 2
    except Foreign as exc:  # nothing was written: --out is not a directory of this user's
        print(
            f"nodehealth: --out {args.out}: not written into: {exc} (choose a directory of your own, or a new name)",
            file=sys.stderr,
        )
        return 2
    run_info, replay = doc["run"], doc.get("replay") or {}
    init_error = run_info.get("nvml_init_error")
    if init_error:  # a record of NVML refusing to start validates nothing: no "complete", no "0 differences"
        print(
            f"{args.out}: not validated: NVML did not start here ({init_error}), so no GPU answered; the host "
            "evidence is written. Run validate-nvml on a node whose NVIDIA driver loads (nvidia-smi works there)"
        )
        return 1
    print(
        f"{args.out}: {doc['timing']['total_calls']} NVML calls recorded ({run_info['outcome']}), "
        f"driver {run_info.get('driver_version') or 'unknown'}, "
        f"{run_info.get('gpu_count') if run_info.get('gpu_count') is not None else 'no'} GPU(s)"
    )
    if replay.get("skipped"):
        print(f"replay: not done here: {replay['skipped']}")
    elif replay.get("error"):
        print(f"replay: not done: {replay['error']}")
    elif replay:
        print(
            f"replay: {len(replay['differences'])} difference(s) between the node and the simulator "
            f"(see {os.path.join(args.out, 'report.md')})"
        )
    differs = bool(replay.get("differences")) or bool(replay.get("error"))
    return 1 if differs or run_info["outcome"] != "complete" else 0
