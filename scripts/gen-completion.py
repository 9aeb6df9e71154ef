#!/usr/bin/env python3
"""Write the shell completion files the packages install, generated from the argument parser
(nodehealth/commands/completion.py):

  python scripts/gen-completion.py OUTDIR

OUTDIR/nodehealth (bash: /usr/share/bash-completion/completions/), OUTDIR/_nodehealth (zsh: Debian's
/usr/share/zsh/vendor-completions/, RHEL's /usr/share/zsh/site-functions/) and OUTDIR/nodehealth.fish
(fish: /usr/share/fish/vendor_completions.d/).
"""

from __future__ import annotations

import sys
from pathlib import Path

from nodehealth.cli import build_parser
from nodehealth.commands.completion import script

FILES = {"bash": "nodehealth", "zsh": "_nodehealth", "fish": "nodehealth.fish"}


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "build/completions")
    out.mkdir(parents=True, exist_ok=True)
    parser = build_parser()
    parser.prog = "nodehealth"
    for shell, name in FILES.items():
        (out / name).write_text(script(parser, shell), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
