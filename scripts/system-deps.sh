#!/usr/bin/env bash
# Debian packages the build and the tests need. Installs what is missing when run as root
# (CI, a fresh Debian 12 machine); otherwise names what to install and stops.
set -euo pipefail
packages=(python3 python3-venv python3-pip make gcc libc6-dev slurmctld slurmd slurm-client munge prometheus systemd)
# The shells whose completion files the tests run (tests/test_completion.py).
packages+=(zsh fish)
# The private systemd the unit is started under (tests/private_systemd.py): unshare and nsenter, and ip
# for the loopback of its network namespace.
packages+=(util-linux iproute2)
# The distribution packages (make deb, make rpm, lintian; docs/install.md) and the journald tests:
# the systemd bindings from Debian, libsystemd headers for the venv's `systemd` extra, journal-remote to
# write the journal file the xid scan --journal test reads.
packages+=(debhelper dh-python pybuild-plugin-pyproject python3-all python3-setuptools python3-wheel
           python3-psutil python3-systemd libsystemd-dev pkg-config
           devscripts lintian rpm fakeroot git systemd-journal-remote)
missing=()
for p in "${packages[@]}"; do
    [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = "install ok installed" ] || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if ! command -v apt-get >/dev/null 2>&1; then
    echo "system-deps: not a Debian system; make sure Python >= 3.9 with venv is installed" >&2
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "system-deps: missing Debian packages: ${missing[*]} (run: sudo apt-get install ${missing[*]})" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
