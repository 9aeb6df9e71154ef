#!/usr/bin/env bash
# The pynvml (nvidia-ml-py) versions tests/test_fakenvml.py runs over the fake driver, each installed on its own
# into .matrix/pynvml-<version> (pip --target, no dependencies: pynvml is one module). Idempotent: a version
# already there is left alone. Needs PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
# 11.450.51: below the floor, only to show that the probe refuses it (tests/test_nvml_wheel_floor.py).
VERSIONS=(11.450.51 12.535.77 12.560.30 12.570.86 13.615.71)
for v in "${VERSIONS[@]}"; do
    dir=".matrix/pynvml-$v"
    if [ -f "$dir/pynvml.py" ]; then
        continue
    fi
    rm -rf "$dir.tmp"
    "$PYTHON" -m pip install -q --disable-pip-version-check --no-deps --target "$dir.tmp" "nvidia-ml-py==$v"
    rm -rf "$dir"
    mv "$dir.tmp" "$dir"
done
