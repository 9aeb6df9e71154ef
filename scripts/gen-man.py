#!/usr/bin/env python3
"""Write man pages generated from the argument parsers (argparse-manpage): nodehealth(8) and the faces.

python scripts/gen-man.py OUTDIR
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from argparse_manpage.manpage import Manpage

from nodehealth import __version__
from nodehealth.cli import build_parser
from nodehealth.faces.args import usage
from nodehealth.faces.table import BY_NAME, FACES

FACE_SECTION = "8"


def face_parser(face: str) -> argparse.ArgumentParser:
    """The faces parse their few options by hand (nothing to import on the prolog's path); this is
    the same surface for the page, kept honest by tests/test_man_completion.py."""
    row = BY_NAME[face]
    p = argparse.ArgumentParser(
        prog=row.script, description=usage(face).split("\n\n", 1)[1].split("\n\n")[0].replace("\n", " ")
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="decide as Slurm's run would and print it; change "
        "nothing (no drain, no resume, no state written, no Slurm call)",
    )
    p.add_argument("--config", metavar="FILE", help="the config file")
    p.add_argument("--version", action="store_true", help="print the version and exit")
    return p


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "build/man")
    out.mkdir(parents=True, exist_ok=True)
    pages = {"nodehealth": build_parser()}
    pages.update({row.script: face_parser(row.name) for row in FACES})
    titles = {row.script: f"the Slurm {row.title} ({row.started_by}) of nodehealth" for row in FACES}
    for name, parser in pages.items():
        parser.prog = name
        summary = titles.get(name, "node-health checks for the GPU nodes of a Slurm cluster")
        page = Manpage(
            parser,
            _data={
                "project_name": "nodehealth",
                "version": __version__,
                "manual_section": FACE_SECTION,
                "manual_title": "nodehealth",
                "description": summary,
            },
        )
        (out / f"{name}.{FACE_SECTION}").write_text(str(page), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
