#!/usr/bin/env bash
# make ansible-check (CI: .ci/run): ansible-core from PyPI into build/ansible-venv (not the project's .venv),
# then deploy/ansible/site.yml: --syntax-check, and a --check --diff run against localhost with the .deb
# built into build/ansible/. Check mode changes nothing on the machine.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=build/ansible-venv
ANSIBLE_CORE=${ANSIBLE_CORE:-ansible-core==2.15.13}
[ -x "$venv/bin/ansible-playbook" ] || { python3 -m venv "$venv" && "$venv/bin/pip" install -q "$ANSIBLE_CORE"; }
export ANSIBLE_NOCOLOR=1 ANSIBLE_RETRY_FILES_ENABLED=0 ANSIBLE_LOCALHOST_WARNING=0 ANSIBLE_INVENTORY_UNPARSED_WARNING=0
inv=$(mktemp); trap 'rm -f "$inv"' EXIT
printf '[gpu_nodes]\nlocalhost ansible_connection=local ansible_python_interpreter=/usr/bin/python3\n' > "$inv"
echo "== ansible-playbook --syntax-check =="
"$venv/bin/ansible-playbook" -i "$inv" --syntax-check deploy/ansible/site.yml
make -s deb DIST=build/ansible/dist >/dev/null
deb=$(ls "$PWD"/build/ansible/dist/nodehealth_*.deb)
echo "== ansible-playbook --check --diff against localhost ($deb) =="
"$venv/bin/ansible-playbook" -i "$inv" --check --diff deploy/ansible/site.yml \
    -e "nodehealth_package=$deb" -e nodehealth_package_from_controller=false -e nodehealth_enable=false \
    -e '{"nodehealth_settings": {"gpu": {"expected_count": 8}}, "nodehealth_top_settings": {"node_name": "gpu001"}}'
