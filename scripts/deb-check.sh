#!/usr/bin/env bash
# make deb-check, CI only (.ci/run: root on a throwaway Debian 12 machine). It CHANGES THIS MACHINE:
# builds the .deb from a clean clone of HEAD, installs it, runs the installed programs against a
# shipped scenario, rebuilds at a higher version, edits the conffile, upgrades and shows the edit
# kept, then purges and shows nothing is left. Refuses to run outside CI.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${CI:-}" in ""|0|false|no) echo "deb-check installs and purges a package on this machine: CI only (set CI=true on a throwaway machine)" >&2; exit 2;; esac
[ "$(id -u)" -eq 0 ] || { echo "deb-check: needs root" >&2; exit 2; }
checkout=$PWD
tmp=$(mktemp -d /tmp/nodehealth-deb-check.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
step() { printf '\n== deb-check: %s ==\n' "$*"; }
fail() { echo "deb-check FAILED: $*" >&2; exit 1; }
export DEBIAN_FRONTEND=noninteractive
site=/usr/lib/python3/dist-packages
scenarios=/usr/share/nodehealth/scenarios
conf=/etc/nodehealth/nodehealth.toml
v1=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' nodehealth/__init__.py)
v2="$v1+ci1"

step "build from a clean clone of HEAD ($(git rev-parse --short HEAD))"
git clone -q --no-local "$checkout" "$tmp/src"
make -s -C "$tmp/src" deb DIST="$tmp/dist1"
deb1=$(ls "$tmp"/dist1/nodehealth_*.deb)
sim1=$(ls "$tmp"/dist1/nodehealth-sim_*.deb)
lintian --fail-on error,warning --suppress-tags-from-file packaging/debian/lintian-explained "$deb1" "$sim1"

step "install $deb1"
dpkg-query -W nodehealth >/dev/null 2>&1 && fail "nodehealth is already installed here"
dpkg-query -W nodehealth-sim >/dev/null 2>&1 && fail "nodehealth-sim is already installed here"
apt-get install -y -qq "$deb1" >/dev/null
dpkg-query -W -f='${Package} ${Version} ${Status}\n' nodehealth
/usr/bin/nodehealth --version | tee "$tmp/version"
grep -q "(commit $(git rev-parse --short=12 HEAD))" "$tmp/version" || fail "--version does not name the commit the package was built from"
# The listing goes to a file, then grep reads it: `dpkg -L | grep -q` under pipefail fails whenever grep
# finds its line and exits before dpkg has written the rest (dpkg dies of SIGPIPE, the pipeline is 141).
dpkg -L nodehealth > "$tmp/files"
for cmd in nodehealth nodehealth-prolog nodehealth-epilog nodehealth-healthcheck; do
    for f in /usr/share/bash-completion/completions/$cmd /usr/share/zsh/vendor-completions/_$cmd \
             /usr/share/fish/vendor_completions.d/$cmd.fish; do
        grep -qx "$f" "$tmp/files" || fail "the package does not install $f"
    done
done
grep -qx /usr/share/man/man5/nodehealth.toml.5.gz "$tmp/files" || fail "the package does not install nodehealth.toml(5)"
bash -c 'source /usr/share/bash-completion/completions/nodehealth; COMP_WORDS=(nodehealth check --only gpu_e); COMP_CWORD=3; _nodehealth; [ "${COMPREPLY[*]}" = gpu_ecc ]' \
    || fail "the installed bash completion does not complete check names"
bash -c 'source /usr/share/bash-completion/completions/nodehealth-prolog; COMP_WORDS=(nodehealth-prolog --d); COMP_CWORD=1; _nodehealth_prolog; [ "${COMPREPLY[*]}" = --dry-run ]' \
    || fail "the installed bash completion of nodehealth-prolog does not complete its options"
grep -q " $conf " <<<"$(dpkg-query -W -f='${Conffiles}\n' nodehealth)" || fail "$conf is not a conffile"
stat -c '%n %U:%G %a' /run/nodehealth /var/lib/nodehealth "$conf"
[ "$(stat -c %a /run/nodehealth)" = 700 ] || fail "/run/nodehealth mode"
[ "$(stat -c '%a %U:%G' /var/lib/nodehealth)" = "700 root:root" ] || fail "/var/lib/nodehealth mode or owner"
state=$(systemctl is-enabled nodehealth.service 2>&1 || true)
echo "nodehealth.service: $state"
[ "$state" = disabled ] || fail "the unit should be installed but not enabled (got $state)"
pyc=$(find "$site/nodehealth" -name '*.pyc' | wc -l)
py=$(find "$site/nodehealth" -name '*.py' | wc -l)
echo "bytecode: $pyc .pyc for $py .py under $site/nodehealth (dh_python3's postinst, py3compile)"
[ "$pyc" -ge "$py" ] || fail "not every module is byte-compiled"
/usr/bin/python3 -c 'import pynvml, hostlist; print("vendored:", pynvml.__file__, hostlist.__file__)'
dpkg -L nodehealth | grep -E 'libnvidia-ml|nodehealth_sim' && fail "the product package carries simulator files"
echo "dpkg -L nodehealth: no libnvidia-ml, no nodehealth_sim"

step "without nodehealth-sim, --simulate says what to install"
rc=0; out=$(/usr/bin/nodehealth check --simulate "$scenarios/healthy-8x-h100.toml" -q 2>&1) || rc=$?
echo "$out"
[ "$rc" = 2 ] || fail "--simulate without the simulator should be a usage error (exit 2), got $rc"
case "$out" in *"apt install nodehealth-sim"*) ;; *) fail "--simulate without the simulator does not name the nodehealth-sim package (apt install)";; esac

step "install $sim1"
apt-get install -y -qq "$sim1" >/dev/null
dpkg-query -W -f='${Package} ${Version} ${Status}\n' nodehealth-sim
[ "$(dpkg -L nodehealth-sim | grep -c '/libnvidia-ml.so.1$')" = 6 ] || fail "nodehealth-sim lacks a branch's libnvidia-ml.so.1"
/usr/bin/nodehealth-sim replay --help >/dev/null || fail "nodehealth-sim"

step "the installed nodehealth check --simulate"
/usr/bin/nodehealth check --simulate "$scenarios/healthy-8x-h100.toml" -q || fail "healthy scenario"
rc=0; /usr/bin/nodehealth check --simulate "$scenarios/row-remap-pending.toml" -q || rc=$?
[ "$rc" = 1 ] || fail "row-remap-pending should fail the check (exit 1), got $rc"

step "edit $conf locally: the node's GPUs are a shipped scenario"
sed -i "s|^\[nvml\]\$|[nvml]\n# local edit (deb-check)\nsimulate = \"$scenarios/healthy-8x-h100.toml\"|" "$conf"
grep -n -A2 '^\[nvml\]' "$conf"
/usr/bin/nodehealth config check "$conf" >/dev/null || fail "the edited config does not validate"

step "the installed nodehealth-prolog --dry-run against the scenario"
SLURM_JOB_ID=1 /usr/bin/nodehealth-prolog --dry-run | tail -3 || fail "prolog --dry-run"

step "bytecode: nodehealth-prolog --dry-run, installed package beside the checkout's venv (20 runs each, median)"
median_ms() {
    local t=() i s e
    for i in $(seq 20); do
        s=$(date +%s%N); "$@" >/dev/null 2>&1 || true; e=$(date +%s%N); t+=($(( (e - s) / 1000000 )))
    done
    printf '%s\n' "${t[@]}" | sort -n | sed -n 10p
}
echo "installed /usr/bin/nodehealth-prolog --dry-run:          $(median_ms env SLURM_JOB_ID=1 /usr/bin/nodehealth-prolog --dry-run) ms"
echo "installed /usr/bin/nodehealth --version:                 $(median_ms /usr/bin/nodehealth --version) ms"
if [ -x "$checkout/.venv/bin/nodehealth-prolog" ]; then
    echo "venv (editable) nodehealth-prolog --dry-run --config $conf: $(median_ms env SLURM_JOB_ID=1 "$checkout/.venv/bin/nodehealth-prolog" --dry-run --config "$conf") ms"
    echo "venv (editable) nodehealth --version:                    $(median_ms "$checkout/.venv/bin/nodehealth" --version) ms"
fi
echo "python3 -c pass (the interpreter alone):                 $(median_ms /usr/bin/python3 -c pass) ms"

step "rebuild at $v2 and upgrade"
(cd "$tmp/src" && make -s deb DIST="$tmp/dist2" DEB_VERSION="$v2")
deb2=$(ls "$tmp"/dist2/nodehealth_*.deb)
sim2=$(ls "$tmp"/dist2/nodehealth-sim_*.deb)
apt-get install -y -qq "$deb2" "$sim2" >/dev/null
[ "$(dpkg-query -W -f='${Version}' nodehealth)" = "$v2" ] || fail "not upgraded to $v2"
dpkg-query -W -f='${Package} ${Version}\n' nodehealth
grep -q '^# local edit (deb-check)$' "$conf" || fail "the upgrade overwrote the edited $conf"
echo "the local edit of $conf survived the upgrade:"; grep -n -A2 '^\[nvml\]' "$conf"
ls "$conf".dpkg-* 2>/dev/null && fail "the upgrade left a .dpkg-* beside the conffile"
SLURM_JOB_ID=1 /usr/bin/nodehealth-prolog --dry-run | tail -1

step "purge"
apt-get purge -y -qq nodehealth nodehealth-sim >/dev/null
left=0
dpkg -L nodehealth >/dev/null 2>&1 && { echo "dpkg still lists nodehealth"; left=1; }
dpkg -L nodehealth-sim >/dev/null 2>&1 && { echo "dpkg still lists nodehealth-sim"; left=1; }
[ -e "$site/nodehealth_sim" ] && { echo "left behind: $site/nodehealth_sim"; left=1; }
[ -e /usr/bin/nodehealth-sim ] && { echo "left behind: /usr/bin/nodehealth-sim"; left=1; }
for p in /etc/nodehealth /run/nodehealth /var/lib/nodehealth "$site/nodehealth" "$site/nodehealth-vendor.pth" /usr/bin/nodehealth \
         /usr/bin/nodehealth-prolog /lib/systemd/system/nodehealth.service /usr/lib/tmpfiles.d/nodehealth.conf \
         /usr/share/nodehealth /usr/share/doc/nodehealth; do
    [ -e "$p" ] && { echo "left behind: $p"; left=1; }
done
ls -d "$site"/nodehealth-* 2>/dev/null && left=1
[ "$left" = 0 ] || fail "the purge left files behind"
echo "purged: dpkg -L nodehealth empty; /etc/nodehealth, /run/nodehealth, /var/lib/nodehealth and $site/nodehealth gone"
echo; echo "deb-check: OK"
