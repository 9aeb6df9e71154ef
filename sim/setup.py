"""nodehealth-sim: compiles the fake libnvidia-ml.so.1 of every driver branch while it is installed.

``pip install ./sim`` builds the libraries into the wheel's ``nodehealth_sim/fakenvml/build/<branch>/``;
``pip install -e ./sim`` builds them in place, beside the sources. Both need a C compiler (``cc`` or ``$CC``).
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.errors import SetupError

HERE = Path(__file__).resolve().parent
PACKAGE = HERE / "nodehealth_sim"
VERSION = re.search(r'^__version__ = "([^"]+)"', (PACKAGE / "__init__.py").read_text(), re.M).group(1)  # type: ignore[union-attr]
# The oldest nvidia-ml-py nodehealth supports (its pyproject.toml); the simulator runs the real pynvml over it.
NVML_PY = "nvidia-ml-py>=12.535.77"


def _builder():  # the package is not importable yet: load its stdlib-only build module by path
    spec = importlib.util.spec_from_file_location("_nodehealth_sim_build", PACKAGE / "fakenvml_build.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


class BuildPyWithDriver(build_py):
    """build_py, then the fake driver libraries: into build_lib for a wheel, beside the sources when editable."""

    def run(self) -> None:
        super().run()
        builder = _builder()
        editable = getattr(self, "editable_mode", False) or getattr(self.distribution, "editable_mode", False)
        lib_root = PACKAGE if editable else Path(self.build_lib) / "nodehealth_sim"
        out = lib_root / "fakenvml" / "build"
        try:
            built = builder.build(out)
        except builder.BuildError as exc:
            raise SetupError(str(exc)) from None
        self.announce(f"built the simulated NVIDIA driver: {len(built)} branches into {out}", level=2)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outputs = list(super().get_outputs(include_bytecode))
        base = Path(self.build_lib) / "nodehealth_sim" / "fakenvml" / "build"
        for branch in _builder().BRANCHES:
            outputs += [str(base / str(branch) / "libnvidia-ml.so.1"), str(base / str(branch) / "exports.map")]
        return outputs


setup(
    version=VERSION,
    install_requires=[f"nodehealth=={VERSION}", NVML_PY, "tomli>=1.1; python_version < '3.11'"],
    # fakenvml/: the C sources and symbols.tsv (data, no Python); the libraries are added by build_py.
    packages=["nodehealth_sim", "nodehealth_sim.fakenvml", "nodehealth_sim.validation"],
    package_data={"nodehealth_sim.fakenvml": ["*.c", "*.h", "symbols.tsv"]},
    cmdclass={"build_py": BuildPyWithDriver},
    zip_safe=False,
)
