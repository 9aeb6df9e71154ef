"""The console scripts, derived from the one table of faces (``nodehealth/faces/table.py``).

pyproject.toml declares ``scripts`` dynamic; setuptools takes them from here. The table is a standard
library module of its own: it is run by path (``runpy``), so the build imports no part of the package
and a new face is its module and its row, with no script line to add anywhere. Everything else is in
pyproject.toml.
"""

import runpy
from pathlib import Path

from setuptools import setup

TABLE = Path(__file__).resolve().parent / "nodehealth" / "faces" / "table.py"
SCRIPTS = runpy.run_path(str(TABLE))["scripts"]()

setup(entry_points={"console_scripts": [f"{name} = {target}" for name, target in SCRIPTS.items()]})
