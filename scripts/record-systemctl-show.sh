#!/usr/bin/env bash
# record-systemctl-show.sh ROOT: how tests/fixtures/host/services/systemctl-show-systemd252.txt was made.
#
# ROOT is a throwaway Debian 12 tree with systemd installed (debootstrap --variant=minbase bookworm ROOT,
# then chroot ROOT apt-get install systemd). Its systemd boots as PID 1 of private PID, mount, cgroup,
# network, UTS and IPC namespaces, chrooted into ROOT, the stand-in units of systemd252-units/ are started
# (failed, running, restarting, start-limited), and the probe's own `systemctl show` is asked and printed.
# A developer's recording tool: root only, never run by the tests or CI.
#
# What keeps it off the machine it runs on (a systemd that boots normally runs sysinit.target, whose
# systemd-tmpfiles --boot --remove empties /tmp, whose systemd-sysctl and systemd-modules-load write to
# the running kernel): it boots a target of its own that pulls in nothing; every unit file ROOT ships is
# masked; the stand-ins have DefaultDependencies=no, so no sysinit.target either; the network namespace
# is empty; the cgroups systemd made are removed after its PID 1 is killed (with every process it ran).
set -euo pipefail
root="${1:?usage: $0 DEBIAN12_ROOT}"
[ "$(id -u)" = 0 ] || { echo "$0: needs root (it boots a systemd in namespaces)" >&2; exit 2; }
[ -x "$root/lib/systemd/systemd" ] || { echo "$0: no systemd in $root (chroot it: apt-get install systemd)" >&2; exit 2; }
here="$(cd "$(dirname "$0")/.." && pwd)/tests/fixtures/host/services/systemd252-units"
units=/etc/systemd/system
for f in "$root"/lib/systemd/system/*.{service,socket,mount,automount,swap,path,timer}; do
    [ -e "$f" ] && ln -sfn /dev/null "$root$units/$(basename "$f")"
done
install -m 0644 "$here"/*.service "$root$units/"  # after the masks: the stand-ins replace their /dev/null
install -m 0755 "$here/nv-fabricmanager" "$root/usr/bin/nv-fabricmanager"
printf '[Unit]\nDescription=record systemctl show (pulls in no other unit)\nDefaultDependencies=no\n' \
    >"$root$units/nh-record.target"
chroot "$root" systemctl enable nvidia-fabricmanager.service >/dev/null 2>&1  # UnitFileState=enabled
mountpoint -q "$root/sys" || mount -t sysfs sysfs "$root/sys"
unshare --fork --pid --mount --cgroup --net --uts --ipc --mount-proc="$root/proc" \
    /usr/bin/env -i container=record TERM=dumb PATH=/usr/sbin:/usr/bin:/sbin:/bin \
    /usr/sbin/chroot "$root" /lib/systemd/systemd --system --unit=nh-record.target >/dev/null 2>&1 &
outer=$!
cgroup="$(sed -n 's/^0:://p' /proc/self/cgroup)"  # the namespace's cgroup root is this one
pid=""
cleanup() {
    [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null || true
    wait "$outer" 2>/dev/null || true
    umount "$root/sys" 2>/dev/null || true
    local h d
    for h in /sys/fs/cgroup /sys/fs/cgroup/*; do
        for d in "$h${cgroup%/}"/{init.scope,system.slice,user.slice,-.slice}; do
            [ -d "$d" ] && find "$d" -depth -type d -exec rmdir {} + 2>/dev/null || true
        done
    done
}
trap cleanup EXIT
for _ in $(seq 150); do  # up to 30 s for the boot to settle
    pid="$(pgrep -P "$outer" || true)"  # unshare's child: the namespace's PID 1, systemd
    state="$([ -n "$pid" ] && nsenter -t "$pid" -a -r -w systemctl is-system-running 2>/dev/null || true)"
    case "$state" in running | degraded) break ;; esac
    sleep 0.2
done
[ -n "$pid" ] || { echo "$0: systemd did not start in the namespaces" >&2; exit 1; }
inside() { nsenter -t "$pid" -a -r -w "$@"; }
inside systemctl start nvidia-fabricmanager.service nvidia-persistenced.service nvidia-imex.service \
    nvidia-dcgm.service 2>/dev/null || true
sleep 7  # imex restarts every 2 s (auto-restart); dcgm hits the default start limit (5 in 10 s)
inside systemctl --version | head -1 >&2
inside systemctl show --no-pager --property=Id,LoadState,ActiveState,SubState,UnitFileState,Result,NRestarts -- \
    nvidia-fabricmanager.service nvidia-persistenced.service nvidia-imex.service nvidia-dcgm.service \
    nvidia-peermem.service
