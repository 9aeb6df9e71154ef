#!/usr/bin/env bash
# make deb: stage the tracked tree with packaging/debian as debian/, vendor, dpkg-buildpackage -b,
# and put the .debs (nodehealth, nodehealth-sim) in DIST. Changes nothing outside WORK and DIST.
#   scripts/build-deb.sh WORK DIST [DEB_VERSION]
set -euo pipefail
work=${1:?WORK}; dist=${2:?DIST}; version=${3:-}
cd "$(dirname "$0")/.."
for tool in dpkg-buildpackage dh pybuild; do
    command -v "$tool" >/dev/null || { echo "make deb needs $tool: run make system-deps as root" >&2; exit 1; }
done
rm -rf "$work" && mkdir -p "$work/src" "$dist"
git ls-files -z --cached --others --exclude-standard | tar -c --null -T - | tar -x -C "$work/src"
rm -rf "$work/src/debian" && cp -a packaging/debian "$work/src/debian"
# The commit --version names, written now: an installed nodehealth never runs git.
python3 scripts/stamp-commit.py "$work/src" | sed 's/^/  /'
PYTHON=${PYTHON:-python3} bash packaging/vendor.sh "$work/src/debian/vendor" | sed 's/^/  /'
if [ -n "$version" ]; then
    (cd "$work/src" && DEBEMAIL=nodehealth@lists.nodehealth.dev DEBFULLNAME="nodehealth developers" \
        dch --newversion "$version" --distribution unstable --force-distribution "Rebuild at $version.")
fi
# The distribution's tools and Python only (a pyenv or venv first on PATH would build for the wrong Python).
(cd "$work/src" && env PATH=/usr/sbin:/usr/bin:/sbin:/bin dpkg-buildpackage -us -uc -b --no-sign) > "$work/build.log" 2>&1 || {
    tail -60 "$work/build.log" >&2; echo "dpkg-buildpackage failed; the whole log: $work/build.log" >&2; exit 1; }
# Two binary packages: nodehealth (the product, no simulator code) and nodehealth-sim (the simulated GPUs).
mv "$work"/nodehealth_*.deb "$work"/nodehealth-sim_*.deb "$dist"/
ls -1 "$dist"/nodehealth_*.deb "$dist"/nodehealth-sim_*.deb
