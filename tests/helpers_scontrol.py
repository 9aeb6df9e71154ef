"""A fake ``scontrol`` for the tests of the faces and of preflight (no Slurm needed): it logs its calls and
answers from, and updates, a JSON file of node states."""

from __future__ import annotations

import sys
from pathlib import Path

# ``show node [-o NAME[,NAME...]]`` answers from nodes.json ({name: [state, reason]}), ``update`` drains or
# resumes there; every call is logged to calls.jsonl; an update is refused while a file ``refuse`` exists.
FAKE_SCONTROL = """#!{python}
import json, os, sys
d = {d!r}
with open(d + "/calls.jsonl", "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
args = sys.argv[1:]
if os.path.exists(d + "/refuse") and args[0] == "update":
    print("slurm_update error: Access/permission denied", file=sys.stderr)
    sys.exit(1)
nodes = json.load(open(d + "/nodes.json"))
if args[:2] == ["show", "node"]:
    want = args[3].split(",") if len(args) > 3 else None
    for name, (state, reason) in nodes.items():
        if want is None or name in want:
            line = f"NodeName={{name}} Arch=x86_64 Gres=gpu:8 State={{state}} Partitions=p"
            if reason:
                line += f" Reason={{reason}} [root@2026-11-29T21:45:19]"
            print(line)
elif args[0] == "update":
    kv = dict(a.split("=", 1) for a in args[1:])
    name = kv["nodename"]
    state, reason = nodes[name]
    if kv["state"] == "drain":
        nodes[name] = [state.split("+")[0] + "+DRAIN", kv["reason"]]
    elif kv["state"] == "resume":
        nodes[name] = [state.split("+")[0], None]
    json.dump(nodes, open(d + "/nodes.json", "w"))
"""


def write_fake_scontrol(d: Path) -> Path:
    """``d/scontrol``, the fake above keeping its log and its nodes in ``d`` (nodes.json is the caller's)."""
    path = d / "scontrol"
    path.write_text(FAKE_SCONTROL.format(python=sys.executable, d=str(d)))
    path.chmod(0o755)
    return path
