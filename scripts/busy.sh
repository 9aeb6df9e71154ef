#!/usr/bin/env bash
# busy.sh CMD...: run CMD on a machine whose every core is busy. One CPU hog per core (a plain
# Python loop at normal priority, as a compiler or another job would be) runs while CMD runs; the
# hogs are killed on every way out. Exits with CMD's status. HOGS=N sets the count (default: nproc).
# `make test-busy` runs the time-sensitive tests (marker `timing`) this way.
set -euo pipefail
if [ "$#" -eq 0 ]; then
    echo "usage: $0 CMD..." >&2
    exit 2
fi
hogs="${HOGS:-$(nproc)}"
pids=()
stop() {
    local pid
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${pids[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
}
trap stop EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
for _ in $(seq "$hogs"); do
    python3 -c 'while True: pass' &
    pids+=("$!")
done
export BUSY_HOG_PIDS="${pids[*]}"  # for CMD: the hogs it runs beside
echo "busy.sh: $hogs CPU hogs (pids ${pids[*]}), load before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
status=0
"$@" || status=$?
echo "busy.sh: load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
exit "$status"
