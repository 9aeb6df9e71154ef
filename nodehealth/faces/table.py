"""The one table of faces: what each face Slurm starts is, and everything that lists them derives from it.

A face is a module under ``nodehealth/faces/`` with a ``cli()`` (the installed script) and a ``main(argv)``,
plus its row here. The faces' command line (``faces/args.py``: usage text), ``faces/preview.py`` (which
phase a face runs), ``nodehealth check --as`` (its choices), the packaging and the faces' tests all read
it. The console scripts derive from it: setup.py runs this file by path for the wheel's and the .deb's
entry points (pyproject.toml declares ``scripts`` dynamic), and the RPM spec runs it as a script
(``python3 nodehealth/faces/table.py`` prints ``NAME=MODULE:FUNCTION``, one script a line), so a new face
is its module and its row. Standard library only, importing nothing of the package (both run it before
the package is installed), and nothing of the prolog's fast path imports it (it is read only when a face
is given arguments).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # no typing import at run time
    from typing import Mapping


class Face:
    """One row: ``name`` (``check --as NAME``), the module holding ``cli``/``main``, the registry phase it
    runs, the console script's name, what a person calls it, the slurm.conf key that starts it and what it
    does when Slurm runs it (the last three for ``--help``)."""

    __slots__ = ("name", "module", "phase", "script", "title", "started_by", "does")

    def __init__(self, name: str, module: str, phase: str, script: str, title: str, started_by: str, does: str) -> None:
        self.name, self.module, self.phase, self.script = name, module, phase, script
        self.title, self.started_by, self.does = title, started_by, does

    @property
    def entry_point(self) -> str:
        """The console script's entry point: ``nodehealth.faces.prolog:cli``."""
        return f"{self.module}:cli"

    def __repr__(self) -> str:
        return f"Face({self.name!r})"


FACES = (
    Face(
        "prolog",
        "nodehealth.faces.prolog",
        "prolog",
        "nodehealth-prolog",
        "prolog",
        "Prolog=",
        "checks the node before a job starts and, on a fault, drains it (exit 1)",
    ),
    Face(
        "epilog",
        "nodehealth.faces.epilog",
        "epilog",
        "nodehealth-epilog",
        "epilog",
        "Epilog=",
        "checks what the job left behind or broke and, on a fault, drains the node (exit 1)",
    ),
    Face(
        "healthcheck",
        "nodehealth.faces.healthcheck",
        "healthcheck",
        "nodehealth-healthcheck",
        "health check",
        "HealthCheckProgram=",
        "drains the node on a fault and resumes one it drained once clean runs allow",
    ),
)
BY_NAME = {face.name: face for face in FACES}
NAMES = tuple(face.name for face in FACES)

# The administrator's command, installed beside the faces.
CLI_SCRIPT, CLI_ENTRY_POINT = "nodehealth", "nodehealth.cli:main"


def scripts() -> dict[str, str]:
    """Every console script the distribution installs: name -> ``module:function``."""
    out = {CLI_SCRIPT: CLI_ENTRY_POINT}
    out.update((face.script, face.entry_point) for face in FACES)
    return out


def disagreements(declared: Mapping[str, str], where: str) -> list[str]:
    """How ``declared`` (a packaging's script name -> entry point) differs from ``scripts()``, one line each
    (empty: they agree)."""
    want = scripts()
    out = [f"{where}: missing {name} = {target!r}" for name, target in want.items() if name not in declared]
    out += [
        f"{where}: {name} = {declared[name]!r}, the table says {target!r}"
        for name, target in want.items()
        if name in declared and declared[name] != target
    ]
    out += [f"{where}: {name} is in no row of nodehealth.faces.table" for name in declared if name not in want]
    return out


if __name__ == "__main__":  # the RPM spec's list of console scripts: NAME=MODULE:FUNCTION, one a line
    print("\n".join(f"{name}={target}" for name, target in scripts().items()))
