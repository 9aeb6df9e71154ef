#!/usr/bin/env bash
# record-systemctl-show.sh ROOT: how tests/fixtures/host/services/systemctl-show-systemd252.txt was made.
#
# ROOT is a throwaway Debian 12 tree with systemd installed (debootstrap --variant=minbase bookworm ROOT,
# then chroot ROOT apt-get install systemd). The stand-in units of systemd252-units/ go into it, its
# systemd boots as PID 1 in private PID, mount, cgroup, UTS and IPC namespaces (nothing of the host's
# systemd is touched; none runs here as PID 1), and after the units have failed, run, restarted and hit
# their start limit, the probe's own `systemctl show` is asked and printed. Root only; a developer's
# recording tool, not run by the tests or CI. The namespace's processes are killed on every way out.
set -euo pipefail
root="${1:?usage: $0 DEBIAN12_ROOT}"
[ "$(id -u)" = 0 ] || { echo "$0: needs root (it boots a systemd in namespaces)" >&2; exit 2; }
[ -x "$root/lib/systemd/systemd" ] || { echo "$0: no systemd in $root (chroot it: apt-get install systemd)" >&2; exit 2; }
here="$(cd "$(dirname "$0")/.." && pwd)/tests/fixtures/host/services/systemd252-units"
install -m 0644 "$here"/*.service "$root/etc/systemd/system/"
install -m 0755 "$here/nv-fabricmanager" "$root/usr/bin/nv-fabricmanager"
chroot "$root" systemctl enable nvidia-fabricmanager.service >/dev/null 2>&1
mountpoint -q "$root/sys" || mount -t sysfs sysfs "$root/sys"
unshare --fork --pid --mount --cgroup --uts --ipc --mount-proc="$root/proc" \
    /usr/bin/env -i container=unshare TERM=dumb PATH=/usr/sbin:/usr/bin:/sbin:/bin \
    /usr/sbin/chroot "$root" /lib/systemd/systemd --system --unit=multi-user.target >/dev/null 2>&1 &
outer=$!
pid=""
cleanup() {
    [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null || true
    kill "$outer" 2>/dev/null || true
    wait "$outer" 2>/dev/null || true
}
trap cleanup EXIT
for _ in $(seq 150); do  # up to 30 s for the boot to settle: running, or degraded (a unit failed)
    pid="$(pgrep -P "$outer" || true)"  # unshare's child: the namespace's PID 1, systemd
    state="$( [ -n "$pid" ] && nsenter -t "$pid" -a -r -w systemctl is-system-running 2>/dev/null || true)"
    case "$state" in running | degraded) break ;; esac
    sleep 0.2
done
[ -n "$pid" ] || { echo "$0: systemd did not start in the namespaces" >&2; exit 1; }
inside() { nsenter -t "$pid" -a -r -w "$@"; }
inside systemctl start nvidia-persistenced.service nvidia-imex.service nvidia-dcgm.service || true
sleep 7  # imex restarts every 2 s (auto-restart); dcgm hits the default start limit (5 in 10 s)
inside systemctl --version | head -1 >&2
inside systemctl show --no-pager --property=Id,LoadState,ActiveState,SubState,UnitFileState,Result,NRestarts -- \
    nvidia-fabricmanager.service nvidia-persistenced.service nvidia-imex.service nvidia-dcgm.service \
    nvidia-peermem.service
