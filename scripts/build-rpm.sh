#!/usr/bin/env bash
# make rpm: the tracked tree and the vendored modules (packaging/vendor.sh --tomli) as the spec's two
# sources, rpmbuild -bb into WORK, the binary RPM into DIST. Byte-compiles with a Python 3.9 when this
# machine has one (RHEL 9's), else with python3 (then the .pyc are for that Python; RHEL's rpmbuild
# always uses its own 3.9). Changes nothing outside WORK and DIST.
#   scripts/build-rpm.sh WORK DIST VERSION
set -euo pipefail
work=${1:?WORK}; dist=${2:?DIST}; version=${3:?VERSION}
cd "$(dirname "$0")/.."
command -v rpmbuild >/dev/null || { echo "make rpm needs rpmbuild (Debian: apt-get install rpm; make system-deps)" >&2; exit 1; }
work=$(mkdir -p "$work" && cd "$work" && pwd)
rm -rf "$work" && mkdir -p "$work"/{SOURCES,BUILD,RPMS,SRPMS,SPECS,stage} "$dist"
stage="$work/stage/nodehealth-$version"
mkdir -p "$stage"
git ls-files -z --cached --others --exclude-standard | tar -c --null -T - | tar -x -C "$stage"
# The commit --version names, written now: an installed nodehealth never runs git.
python3 scripts/stamp-commit.py "$stage" | sed 's/^/  /'
tar -C "$work/stage" -czf "$work/SOURCES/nodehealth-$version.tar.gz" "nodehealth-$version"
PYTHON=${PYTHON:-python3} bash packaging/vendor.sh "$work/stage/vendor" --tomli | sed 's/^/  /'
tar -C "$work/stage" -czf "$work/SOURCES/nodehealth-vendor-$version.tar.gz" vendor
py=$(bash scripts/find-python39.sh)
py=${py:-$(command -v python3)}
# On Debian the build dependencies are dpkg packages, which rpm's database does not know.
nodeps=(); [ -f /etc/debian_version ] && nodeps=(--nodeps)
rpmbuild -bb "${nodeps[@]}" --define "_topdir $work" --define "nodehealth_python $py" --define "_build_id_links none" \
    packaging/rpm/nodehealth.spec > "$work/build.log" 2>&1 || {
    tail -40 "$work/build.log" >&2; echo "rpmbuild failed; the whole log: $work/build.log" >&2; exit 1; }
find "$work/RPMS" -name 'nodehealth-*.rpm' -exec mv {} "$dist"/ \;
ls -1 "$dist"/nodehealth-*.rpm
