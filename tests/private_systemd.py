"""A real systemd as PID 1 of private namespaces, for the tests of the shipped unit on a machine whose own
init is not systemd (a container, this CI runner).

``PrivateSystemd`` boots the machine's ``/lib/systemd/systemd`` in new PID, mount, cgroup, network, UTS and
IPC namespaces over the machine's own root file system. What keeps it off the machine (a systemd that boots
as usual runs sysinit.target, whose ``systemd-tmpfiles --boot --remove`` empties /tmp and whose
systemd-sysctl and systemd-modules-load write to the running kernel; its units write /var/lib and /run):

- fresh tmpfs on /run, /tmp, /var/tmp and /var/lib inside the mount namespace: RuntimeDirectory=,
  StateDirectory=, PrivateTmp= and systemd's own files land there;
- every unit file and every generator the machine ships is masked (``/dev/null`` links in the private /run),
  so sysinit.target and every target pull in nothing that runs; the boot target is one of its own;
- an empty network namespace (its loopback up): a daemon's port cannot meet the machine's;
- on the way out its PID 1 is killed (and with it every process it started) and the cgroups it made below
  ours are removed.

Read-only bind mounts put a checkout where a unit can see it: each lands in the private /run (a mount point
anywhere else would be made on the machine's own file system), bound before /tmp, /var/tmp and /var/lib are
covered, so a checkout there is seen; a source under /run, covered first, is refused. Commands run inside
through ``nsenter``; files are written through ``/proc/<pid>/root``. Needs root, util-linux (unshare,
nsenter), iproute2 and the systemd package; ``why_not()`` says what is missing.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Optional

SYSTEMD = "/lib/systemd/systemd"
TARGET = "nodehealth-test-boot.target"
UNIT_KINDS = ("service", "socket", "mount", "automount", "swap", "path", "timer")

_BOOT = """set -eu
mount --make-rprivate /
mount -t tmpfs -o mode=0755 tmpfs /run
{binds}
mount -t tmpfs -o mode=0755 tmpfs /var/lib
for d in /tmp /var/tmp; do mount -t tmpfs -o mode=1777 tmpfs "$d"; done
mkdir -p /run/systemd/system /run/systemd/system-generators
for f in /lib/systemd/system/* /etc/systemd/system/*; do
    case "$f" in *.service|*.socket|*.mount|*.automount|*.swap|*.path|*.timer)
        ln -sfn /dev/null "/run/systemd/system/${{f##*/}}";;
    esac
done
for g in /lib/systemd/system-generators/* /usr/lib/systemd/system-generators/* /etc/systemd/system-generators/*; do
    [ -e "$g" ] && ln -sfn /dev/null "/run/systemd/system-generators/${{g##*/}}"
done
printf '[Unit]\\nDescription=nodehealth test boot (pulls in no other unit)\\nDefaultDependencies=no\\n' \\
    > /run/systemd/system/{target}
ip link set lo up
exec /usr/bin/env -i container=nodehealth-test TERM=dumb PATH=/usr/sbin:/usr/bin:/sbin:/bin \\
    {systemd} --system --unit={target}
"""


def why_not() -> str:
    """Why a private systemd cannot be booted here ('' when it can)."""
    if os.geteuid() != 0:
        return "booting systemd in namespaces needs root"
    missing = [p for p in ("unshare", "nsenter", "ip") if shutil.which(p) is None]
    missing += [] if os.access(SYSTEMD, os.X_OK) else [SYSTEMD]
    return f"missing: {', '.join(missing)}" if missing else ""


def bind_refused(inside: str, host: str) -> str:
    """Why a read-only bind of ``host`` at ``inside`` is refused ('' when it is taken)."""
    for what, path in (("the mount point", inside), ("the source", host)):
        if not os.path.isabs(path) or os.path.normpath(path) != path or "\n" in path or " " in path:
            return f"{what} {path!r} is not a plain absolute path"
    if not inside.startswith("/run/"):
        return f"the mount point {inside!r} is not under /run (the private tmpfs): it would be made on this machine"
    if host == "/run" or host.startswith("/run/"):
        return f"the source {host!r} is under /run, which the private /run covers before the binds"
    return ""


def our_cgroups() -> list[Path]:
    """The directory of this process's cgroup in every hierarchy mounted under /sys/fs/cgroup."""
    out = []
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        names = [c[5:] if c.startswith("name=") else c for c in controllers.split(",") if c]
        for mount in (Path("/sys/fs/cgroup"), *Path("/sys/fs/cgroup").iterdir()):
            if not mount.is_dir():
                continue
            fits = (not names and (mount / "cgroup.controllers").exists()) or mount.name in names
            if fits and (mount / path.lstrip("/")).is_dir():
                out.append(mount / path.lstrip("/"))
    return sorted(set(out))


class PrivateSystemd:
    def __init__(self, binds: Optional[dict[str, str]] = None, boot_s: float = 60.0) -> None:
        self.binds = binds or {}  # inside path -> host path, read only
        for inside, host in self.binds.items():
            refused = bind_refused(inside, host)
            if refused:
                raise ValueError(refused)
        self.boot_s = boot_s
        self.pid = 0
        self._outer: Optional[subprocess.Popen[bytes]] = None
        self._script = ""
        self._started = 0.0
        self._cgroups_before: set[Path] = set()

    def __enter__(self) -> PrivateSystemd:
        binds = "\n".join(
            f"mkdir -p {inside}\nmount --bind {host} {inside}\nmount -o remount,bind,ro {inside}"
            for inside, host in self.binds.items()
        )
        fd, self._script = tempfile.mkstemp(prefix="nodehealth-boot-", suffix=".sh")
        with os.fdopen(fd, "w") as f:
            f.write(_BOOT.format(target=TARGET, binds=binds, systemd=SYSTEMD))
        self._cgroups_before = {c for base in our_cgroups() for c in base.iterdir() if c.is_dir()}
        self._started = time.time()
        argv = ["unshare", "--fork", "--pid", "--mount", "--cgroup", "--net", "--uts", "--ipc", "--mount-proc"]
        self._outer = subprocess.Popen([*argv, "bash", self._script], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        end = time.monotonic() + self.boot_s
        state = ""
        while time.monotonic() < end and self._outer.poll() is None:
            self.pid = self.pid or _child(self._outer.pid)
            if self.pid:
                state = self.run(["systemctl", "is-system-running"], timeout=10).stdout.strip()
                if state in ("running", "degraded"):
                    return self
            time.sleep(0.1)
        err = self._outer.stderr.read() if self._outer.poll() is not None and self._outer.stderr else b""
        self.__exit__(None, None, None)
        raise RuntimeError(f"private systemd did not boot within {self.boot_s:g} s (state {state!r}): {err!r}")

    def run(self, argv: list[str], timeout: float = 90) -> subprocess.CompletedProcess[str]:
        """``argv`` inside every namespace of the private systemd (its root, its /run, its network)."""
        return subprocess.run(
            ["nsenter", "-t", str(self.pid), "-a", *argv], capture_output=True, text=True, timeout=timeout, check=False
        )

    def path(self, inside: str) -> Path:
        """Where ``inside`` (a path as the namespaces see it) is from here."""
        return Path(f"/proc/{self.pid}/root") / inside.lstrip("/")

    def __exit__(self, *exc: object) -> None:
        if self.pid:
            try:
                os.kill(self.pid, signal.SIGKILL)  # PID 1 of the namespace: every process in it goes too
            except ProcessLookupError:
                pass
        if self._outer is not None:
            try:
                self._outer.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._outer.kill()
                self._outer.wait()
            if self._outer.stderr:
                self._outer.stderr.close()
        self._remove_cgroups()
        if self._script:
            os.unlink(self._script)
            self._script = ""

    def _remove_cgroups(self) -> None:
        """The cgroups systemd made below ours (init.scope, system.slice, ...): new since the boot, empty."""
        for base in our_cgroups():
            for made in base.iterdir():
                if made in self._cgroups_before or not made.is_dir() or made.stat().st_mtime < self._started - 1:
                    continue
                for d in sorted((p for p in made.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                    _rmdir(d)
                _rmdir(made)


def _rmdir(d: Path) -> None:
    deadline = time.monotonic() + 10  # a killed process leaves its cgroup a moment after it is reaped
    while True:
        try:
            d.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                return
            time.sleep(0.05)


def _child(pid: int) -> int:
    """unshare's child: the namespace's PID 1 (bash, then systemd by exec)."""
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return 0
    return int(kids[0]) if kids else 0
