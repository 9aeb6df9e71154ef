#!/usr/bin/env python3
"""Write the source commit into a staged tree, at package build time: TREE/nodehealth/_commit.py,
which ``nodehealth --version`` reads (nodehealth/commands/version.py). An installed nodehealth never
runs git; this script runs it once, in the checkout the package is built from.

  python3 scripts/stamp-commit.py TREE [COMMIT]

COMMIT defaults to ``git rev-parse --short=12 HEAD`` in this checkout, with ``+dirty`` when tracked
files differ from it. Outside a git checkout (a release tarball) nothing is written.
"""

from __future__ import annotations

import re
import subprocess  # noqa: TID251 (a build script reading git, not the agent)
import sys
from pathlib import Path
from typing import Optional

CHECKOUT = Path(__file__).resolve().parent.parent
SHAPE = re.compile(r"^[0-9a-f]{7,40}(\+dirty)?$")


def head() -> Optional[str]:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(CHECKOUT), *args], capture_output=True, text=True, check=True, timeout=30
        ).stdout.strip()

    try:
        sha = git("rev-parse", "--short=12", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return None
    return sha + ("+dirty" if dirty else "")


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    tree = Path(argv[0])
    sha = argv[1] if len(argv) > 1 else head()
    if sha is None:
        print("stamp-commit: not a git checkout; --version will name no commit", file=sys.stderr)
        return 0
    if not SHAPE.match(sha):
        print(f"stamp-commit: {sha!r} is not a commit id", file=sys.stderr)
        return 2
    target = tree / "nodehealth" / "_commit.py"
    target.write_text(
        f'"""Written at build time by scripts/stamp-commit.py: the commit this package was built from."""\n\n'
        f'COMMIT = "{sha}"\n',
        encoding="utf-8",
    )
    print(f"stamp-commit: {target} ({sha})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
