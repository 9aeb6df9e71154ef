#!/usr/bin/env bash
# Fetch what the distribution packages vendor (docs/install.md, "Vendored modules"), at package build
# time only, from the pinned PyPI releases below (or from a directory of already fetched files:
# NODEHEALTH_VENDOR_FROM=DIR holding the same wheels/sdists), and lay it out in OUT:
#   OUT/lib/            the modules the installed package imports (pynvml, hostlist; tomli with --tomli),
#                       each with its licence and dist-info/PKG-INFO metadata
#   OUT/build-tools/    build-time only, never installed: argparse-manpage for the man pages
# Debian 12 lacks python-hostlist and ships only an old pynvml in contrib; RHEL 9 has no tomli in EPEL.
#   packaging/vendor.sh OUT [--tomli]
set -euo pipefail
out=${1:?usage: vendor.sh OUT [--tomli]}
tomli=${2:-}
PYTHON=${PYTHON:-python3}
NVML_PIN=nvidia-ml-py==13.615.71
HOSTLIST_PIN=python-hostlist==2.3.0
TOMLI_PIN=tomli==2.0.1
MANPAGE_PIN=argparse-manpage==4.8
rm -rf "$out" && mkdir -p "$out/lib" "$out/build-tools" "$out/dl"
pins=("$NVML_PIN" "$HOSTLIST_PIN" "$MANPAGE_PIN")
[ "$tomli" = --tomli ] && pins+=("$TOMLI_PIN")
if [ -n "${NODEHEALTH_VENDOR_FROM:-}" ]; then
    cp "$NODEHEALTH_VENDOR_FROM"/* "$out/dl/"
else
    for pin in "${pins[@]}"; do
        "$PYTHON" -m pip download -q --no-deps --no-binary python-hostlist,argparse-manpage -d "$out/dl" "$pin" 2>&1 \
            | { grep -v "^WARNING: Location .* is ignored" || true; } >&2
    done
fi
"$PYTHON" - "$out" "$tomli" <<'PY'
import glob, os, shutil, sys, tarfile, zipfile
out, tomli = sys.argv[1], sys.argv[2] == "--tomli"
dl, lib, tools = (os.path.join(out, d) for d in ("dl", "lib", "build-tools"))
def one(pattern):
    found = sorted(glob.glob(os.path.join(dl, pattern)))
    if len(found) != 1:
        sys.exit(f"vendor.sh: expected one {pattern} in {dl}, found {found}")
    return found[0]
def wheel(pattern, dest, keep):
    with zipfile.ZipFile(one(pattern)) as z:
        for name in z.namelist():
            if name.split("/")[0] in keep or ".dist-info/" in name and "RECORD" not in name:
                z.extract(name, dest)
# nvidia-ml-py: the one module pynvml.py (BSD-3-Clause, the licence is in its header) and its metadata,
# so `nodehealth version` names the release.
wheel("nvidia_ml_py-*.whl", lib, {"pynvml.py"})
# python-hostlist (GPL-2.0-or-later): the module and its licence from the sdist; its command-line tools are not shipped.
with tarfile.open(one("python[-_]hostlist-*.tar.gz")) as t:
    top = t.getnames()[0].split("/")[0]
    for member in ("hostlist.py", "COPYING", "PKG-INFO"):
        src = t.extractfile(f"{top}/{member}")
        target = {"hostlist.py": "hostlist.py", "COPYING": "hostlist.COPYING",
                  "PKG-INFO": f"{top}.dist-info/METADATA"}[member]
        os.makedirs(os.path.dirname(os.path.join(lib, target)) or lib, exist_ok=True)
        with open(os.path.join(lib, target), "wb") as f:
            shutil.copyfileobj(src, f)
if tomli:
    wheel("tomli-*.whl", lib, {"tomli"})
# argparse-manpage (Apache-2.0), build time only: the module from its sdist (Debian 12's is 1.2).
with tarfile.open(one("argparse_manpage-*.tar.gz")) as t:
    for m in t.getmembers():
        parts = m.name.split("/")
        if len(parts) > 2 and parts[1] == "argparse_manpage" and m.isfile():
            m.name = "/".join(parts[1:])
            t.extract(m, tools)
shutil.rmtree(dl)
for d, _, files in os.walk(lib):
    for f in files:
        print("vendored:", os.path.relpath(os.path.join(d, f), lib))
PY
