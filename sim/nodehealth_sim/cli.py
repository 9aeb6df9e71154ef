"""``nodehealth-sim``: the simulator's own commands.

    nodehealth-sim replay DIR [--timeout S]

``replay``: a directory ``nodehealth validate-nvml`` recorded (on a node without the simulator) made whole:
``scenario.toml``, ``replay/`` and the differences in ``report.md``/``report.json`` (docs/validation.md).
Exit codes: 0 the simulator agrees with every call; 1 the report lists differences, the replay failed or the
recording did not complete; 2 usage error.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nodehealth-sim", description="Simulated NVIDIA GPUs for nodehealth.")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser(
        "replay",
        help="write the scenario of a validate-nvml record, replay it, report differences",
        description="Complete a directory written by `nodehealth validate-nvml` on a node without "
        "the simulator: scenario.toml (the node as a scenario), replay/ (that scenario recorded "
        "through the simulator) and report.md/report.json (where the simulator disagrees).",
    )
    r.add_argument("dir", metavar="DIR", help="the directory validate-nvml wrote (--out)")
    r.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="S",
        help="deadline for the replay, in seconds (default: the recording's own)",
    )
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    from nodehealth.platform.ground import Foreign
    from nodehealth_sim.validation import replay

    if args.timeout is not None and not args.timeout > 0:
        print("nodehealth-sim: --timeout must be a positive number of seconds", file=sys.stderr)
        return 2
    try:
        doc = replay.replay_dir(args.dir, timeout_s=args.timeout)
    except (replay.NotARecord, Foreign) as exc:
        print(f"nodehealth-sim: {exc}", file=sys.stderr)
        return 2
    result = doc.get("replay") or {}
    if result.get("error"):
        print(f"replay: not done: {result['error']}")
    else:
        print(
            f"replay: {len(result['differences'])} difference(s) between the node and the simulator "
            f"(see {os.path.join(args.dir, 'report.md')})"
        )
    differs = bool(result.get("differences")) or bool(result.get("error"))
    return 1 if differs or doc["run"].get("outcome") != "complete" else 0


if __name__ == "__main__":
    sys.exit(main())
