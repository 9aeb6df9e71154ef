"""Compile the fake ``libnvidia-ml.so.1`` of every simulated driver branch (docs/fake-nvml.md).

Standard library only: ``sim/setup.py`` loads this file by path at install time (``pip install ./sim``,
``pip install -e ./sim``), before the package is importable. Each branch's library exports exactly its
column of ``symbols.tsv``: a linker version script made from that column hides every other symbol.

``python -m nodehealth_sim.fakenvml_build [OUT_DIR]`` builds them again (into the package by default).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Optional, Sequence

# The driver branches simulated (nodehealth_sim.driver.BRANCHES reads them from here).
BRANCHES = (470, 525, 535, 550, 570, 580)
SONAME = "libnvidia-ml.so.1"
SOURCE_DIR = Path(__file__).resolve().parent / "fakenvml"
CFLAGS = ("-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror")


class BuildError(Exception):
    """The libraries cannot be built here (no C compiler, a compiler error, a bad symbols.tsv)."""


def version_script(symbols_tsv: str, branch: int) -> str:
    """The linker version script exporting ``branch``'s symbols of ``symbols_tsv`` (its text) and nothing else.

    The table: ``#`` comment lines, a header ``symbol<TAB>470<TAB>525...``, one row per symbol with 1 where
    that branch's nvml.h declares it."""
    column: Optional[int] = None
    names = []
    for line in symbols_tsv.splitlines():
        if not line or line.startswith("#"):
            continue
        cells = line.split("\t")
        if cells[0] == "symbol":
            column = cells.index(str(branch)) if str(branch) in cells[1:] else None
            continue
        if column is not None and column < len(cells) and cells[column] == "1":
            names.append(cells[0])
    if column is None:
        raise BuildError(f"no column {branch} in symbols.tsv")
    body = "".join(f"    {name};\n" for name in names)
    return "{\n  global:\n" + body + "  local: *;\n};\n"


def compiler() -> list[str]:
    """The C compiler's argv: ``$CC`` if set, else ``cc``; BuildError saying what to install when none."""
    import shlex  # here, as subprocess in build: loading the simulated driver (BRANCHES, SONAME) needs neither

    argv = shlex.split(os.environ.get("CC", "") or "cc")
    if not argv or shutil.which(argv[0]) is None:
        raise BuildError(
            f"nodehealth-sim compiles the simulated NVIDIA driver (a small C library) when it is installed and "
            f"needs a C compiler: {argv[0] if argv else 'cc'!r} was not found (Debian/Ubuntu: apt-get install gcc; "
            f"RHEL: dnf install gcc; or set CC)"
        )
    return argv


def build(out_dir: Path, branches: Sequence[int] = BRANCHES, source_dir: Path = SOURCE_DIR) -> list[Path]:
    """Build ``out_dir/<branch>/libnvidia-ml.so.1`` (and its ``exports.map``) for each branch; the paths built.

    A library newer than its sources and the table is kept (a second install compiles nothing)."""
    import shlex
    import subprocess  # noqa: TID251 - the simulator's build runs the C compiler; not product code

    cc = compiler()
    sources = sorted(source_dir.glob("*.c"))
    inputs = sources + sorted(source_dir.glob("*.h")) + [source_dir / "symbols.tsv"]
    table = (source_dir / "symbols.tsv").read_text()
    newest = max(p.stat().st_mtime for p in inputs)
    built = []
    for branch in branches:
        where = out_dir / str(branch)
        where.mkdir(parents=True, exist_ok=True)
        lib, script = where / SONAME, where / "exports.map"
        text = version_script(table, branch)
        if not (script.is_file() and script.read_text() == text):
            _replace(script, text.encode())
        if lib.is_file() and lib.stat().st_mtime >= max(newest, script.stat().st_mtime):
            built.append(lib)
            continue
        tmp = where / f".{SONAME}.tmp"
        argv = [
            *cc,
            f"-DNVML_BRANCH={branch}",
            *CFLAGS,
            f"-Wl,-soname,{SONAME}",
            f"-Wl,--version-script={script}",
            "-o",
            str(tmp),
            *map(str, sources),
        ]
        proc = subprocess.run(argv, capture_output=True, text=True)
        if proc.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise BuildError(
                f"building the simulated driver for branch {branch} failed:\n{shlex.join(argv)}\n"
                f"{proc.stdout}{proc.stderr}"
            )
        os.replace(tmp, lib)
        built.append(lib)
    return built


def _replace(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    out = Path(args[0]) if args else SOURCE_DIR / "build"
    try:
        for lib in build(out):
            print(lib)
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
