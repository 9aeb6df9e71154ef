#!/usr/bin/env python3
"""Write the shell completion files the packages install, generated from the argument parser
(nodehealth/commands/completion.py) and, for each face's own script, from the table of faces
(nodehealth/faces/table.py) and the faces' options (nodehealth/faces/args.py):

  python scripts/gen-completion.py OUTDIR

One file per command and shell, named as each shell looks it up by the command's name:
OUTDIR/bash/COMMAND (/usr/share/bash-completion/completions/), OUTDIR/zsh/_COMMAND (Debian's
/usr/share/zsh/vendor-completions/, RHEL's /usr/share/zsh/site-functions/) and OUTDIR/fish/COMMAND.fish
(/usr/share/fish/vendor_completions.d/), for nodehealth and every face (nodehealth-prolog, ...).
The packages install each directory whole, so a new face's files follow its row.
"""

from __future__ import annotations

import sys
from pathlib import Path

from nodehealth.cli import build_parser
from nodehealth.commands.completion import face_script, face_scripts, script

NAMES = {"bash": "{}", "zsh": "_{}", "fish": "{}.fish"}  # shell -> file name of a command's completion


def files() -> dict[str, str]:
    """Every completion file, ``shell/name`` -> its text."""
    parser = build_parser()
    parser.prog = "nodehealth"
    out = {}
    for shell, name in NAMES.items():
        out[f"{shell}/{name.format('nodehealth')}"] = script(parser, shell)
        for command, face in face_scripts().items():
            out[f"{shell}/{name.format(command)}"] = face_script(face, shell)
    return out


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1].startswith("-"):  # an option is no OUTDIR: never a directory "--help"
        print(__doc__.strip(), file=sys.stdout if sys.argv[1] in ("-h", "--help") else sys.stderr)
        return 0 if sys.argv[1] in ("-h", "--help") else 2
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "build/completions")
    for rel, text in files().items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
