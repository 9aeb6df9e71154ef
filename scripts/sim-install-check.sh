#!/usr/bin/env bash
# make sim-install-check: the simulator installs on a fresh machine, the product runs without it.
# A clean clone of HEAD and a fresh venv, both in a temp dir (nothing else on this machine changes):
#   1. pip install .        the product alone: no nodehealth_sim, no libnvidia-ml in the venv, and
#                           `nodehealth check --simulate` is a usage error (exit 2) saying what to install;
#   2. pip install ./sim    (no -e) compiles the fake driver; the same check exits 1 with a FAIL, and the
#                           report's header says "simulated"; nodehealth-sim runs.
# Needs python3 -m venv, a C compiler and PyPI (or pip's cache, or PIP_INDEX_URL/PIP_FIND_LINKS).
set -euo pipefail
cd "$(dirname "$0")/.."
checkout=$PWD
python=${PYTHON:-python3}
tmp=$(mktemp -d /tmp/nodehealth-sim-install.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
step() { printf '== sim-install-check: %s ==\n' "$*"; }
fail() { echo "sim-install-check FAILED: $*" >&2; exit 1; }
start=$(date +%s)

step "a clean clone of HEAD ($(git rev-parse --short HEAD)) and a fresh venv in $tmp"
git clone -q --no-local "$checkout" "$tmp/src"
"$python" -m venv "$tmp/venv"
pip=("$tmp/venv/bin/python" -m pip --disable-pip-version-check -q)
scenario=$tmp/src/examples/scenarios/row-remap-pending.toml
cd "$tmp"  # out of the tree: nothing is imported from the clone's directories

step "pip install . (the product alone)"
"${pip[@]}" install "$tmp/src"
"$tmp/venv/bin/python" -c 'import nodehealth_sim' 2>/dev/null && fail "pip install . installed nodehealth_sim"
found=$(find "$tmp/venv" -name 'libnvidia-ml*' | head -3)
[ -z "$found" ] || fail "pip install . installed a libnvidia-ml: $found"
rc=0; out=$("$tmp/venv/bin/nodehealth" check --simulate "$scenario" 2>&1) || rc=$?
echo "$out" | sed 's/^/  /'
[ "$rc" = 2 ] || fail "--simulate without the simulator: exit $rc, expected 2"
case "$out" in *"pip install nodehealth-sim"*) ;; *) fail "--simulate without the simulator does not say what to install";; esac

step "pip install ./sim (no -e: its build step compiles the fake libnvidia-ml.so.1 of every branch)"
"${pip[@]}" install "$tmp/src/sim"
libs=$(find "$tmp/venv" -path '*nodehealth_sim/fakenvml/build/*/libnvidia-ml.so.1' | wc -l)
[ "$libs" = 6 ] || fail "pip install ./sim gave $libs libnvidia-ml.so.1, expected 6 (one per branch)"
rc=0; out=$("$tmp/venv/bin/nodehealth" check --simulate "$scenario" 2>&1) || rc=$?
echo "$out" | sed 's/^/  /'
[ "$rc" = 1 ] || fail "row-remap-pending: exit $rc, expected 1"
grep -q '^FAIL' <<<"$out" || fail "row-remap-pending: no FAIL line"
grep -qi 'simulated' <<<"$(head -3 <<<"$out")" || fail "row-remap-pending: the header does not say simulated"
"$tmp/venv/bin/nodehealth-sim" replay --help >/dev/null || fail "nodehealth-sim replay --help"

echo "sim-install-check: OK in $(( $(date +%s) - start )) s"
