# nodehealth: two commands on a fresh machine.
#   make demo   venv + install (no system package: needs python3-venv and a C compiler for the simulated
#               driver), then `nodehealth check` on a faulty and on a healthy simulated 8-GPU node
#   make test   the Debian packages the tests use (scripts/system-deps.sh: as root it apt-installs Slurm,
#               munge, Prometheus, systemd, gcc), venv + test tools, then every gate: ruff, mypy, Python 3.9
#               compatibility (vermin), pytest, the NVML version matrix, pytest under Python 3.9 if present
PYTHON ?= python3
VENV   ?= .venv
# A Python 3.9 (RHEL 9's) to run the whole suite under, when this machine has one; the
# vermin gate covers machines that do not.
PY39   ?= $(shell bash scripts/find-python39.sh)
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: man all demo test lint types compat pytest pytest39 system-deps bench clean fakenvml nvml-matrix nvml-wheels \
	sim-install-check

all: test

system-deps:
	@bash scripts/system-deps.sh

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	@touch $@

demo: $(STAMP) fakenvml
	@echo "== a node with a pending row remap on GPU 1 (expect FAIL, exit 1) =="
	@$(BIN)/nodehealth check --simulate examples/scenarios/row-remap-pending.toml; echo "(exit $$?, as expected)"
	@echo
	@echo "== a healthy 8x H100 node (expect OK, exit 0) =="
	@$(BIN)/nodehealth check --simulate examples/scenarios/healthy-8x-h100.toml

lint: $(STAMP)
	$(BIN)/ruff check nodehealth sim tests bench
	$(BIN)/ruff format --check nodehealth sim tests bench scripts packaging

types: $(STAMP)
	$(BIN)/mypy
	$(BIN)/mypy sim/nodehealth_sim sim/setup.py

compat: $(STAMP)
	$(BIN)/vermin --target=3.9- --violations --eval-annotations --no-tips --backport dataclasses nodehealth sim

pytest: $(STAMP) fakenvml nvml-wheels
	$(BIN)/pytest -q

pytest39: $(STAMP) fakenvml
	@if [ -n "$(PY39)" ]; then \
		echo "== the suite under $$($(PY39) --version) =="; \
		[ -x .venv39/bin/python ] || "$(PY39)" -m venv .venv39; \
		.venv39/bin/python -m pip install -q -e '.[test]' && .venv39/bin/python -m pip install -q --no-deps -e ./sim && \
			.venv39/bin/python -m pytest -q -p no:cacheprovider; \
	else echo "pytest39: no Python 3.9 here; the vermin gate (make compat) stands in"; fi

test: system-deps lint types compat pytest nvml-matrix pytest39

# The time-sensitive tests (marker `timing`: deadlines, margins, waits on other processes) with a
# CPU hog on every core (scripts/busy.sh), as on a loaded CI machine or a shared build host.
.PHONY: test-busy
test-busy: $(STAMP) fakenvml
	bash scripts/busy.sh $(BIN)/pytest -q -p no:cacheprovider -m timing

# The NVML tests again under the oldest nvidia-ml-py pyproject allows and under 12.570.86 (the
# first with the recovery-action field); `make pytest` ran them under the newest. Each wheel is
# installed on its own into .matrix/ (scripts/nvml-matrix.sh) and put first on the path.
NVML_WHEELS := 12.535.77 12.570.86
NVML_TESTS  := tests/test_nvml_matrix.py tests/test_nvml_contract.py tests/test_scenarios.py tests/test_simnvml.py

# The wheels come first: tests/test_nvml_wheel_floor.py reads the real 11.450.51 from .matrix/ in `make pytest`.
nvml-wheels: $(STAMP)
	@PYTHON=$(BIN)/python bash scripts/nvml-matrix.sh

nvml-matrix: $(STAMP) fakenvml nvml-wheels
	@for v in $(NVML_WHEELS); do \
		echo "== the NVML tests under nvidia-ml-py $$v =="; \
		PYTHONPATH=.matrix/pynvml-$$v $(BIN)/python -m pytest -q -p no:cacheprovider $(NVML_TESTS) || exit 1; \
	done

# Man pages from the argument parsers (argparse-manpage): build/man/nodehealth.8 and the faces'.
man: $(STAMP)
	$(BIN)/python scripts/gen-man.py build/man

bench: $(STAMP) fakenvml
	$(BIN)/python bench/check_latency.py
	$(BIN)/python bench/nvml_calls.py

# The simulator is its own distribution (sim/, nodehealth-sim): `pip install -e ./sim` compiles the fake NVIDIA
# driver library, one libnvidia-ml.so.1 per driver branch, each exporting exactly its branch's column of
# sim/nodehealth_sim/fakenvml/symbols.tsv (sim/setup.py). Once installed, the same build runs again (it compiles
# only what its sources made stale), without pip.
SIM_STAMP := $(VENV)/.sim-installed

# No dependency on the venv's own stamp: the tests run `make fakenvml`, which must never reinstall the venv
# (the targets that need both list $(STAMP) first).
$(SIM_STAMP): sim/setup.py sim/pyproject.toml
	@test -x $(BIN)/python || { echo "no venv at $(VENV): make demo or make test first" >&2; exit 1; }
	$(BIN)/python -m pip install -q --no-deps -e ./sim
	@touch $@

fakenvml: $(SIM_STAMP)
	@$(BIN)/python -m nodehealth_sim.fakenvml_build >/dev/null

# A fresh venv in a temp dir: `pip install .` then `pip install ./sim` (no -e), a simulated check; and a venv with
# only the product, where --simulate says what to install (scripts/sim-install-check.sh).
sim-install-check:
	@bash scripts/sim-install-check.sh

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .matrix sim/nodehealth_sim/fakenvml/build sim/build \
		sim/*.egg-info

# Distribution packages (docs/install.md). The tree git tracks (uncommitted edits included) is staged
# into build/pkg/; packaging/vendor.sh fetches the pinned nvidia-ml-py and python-hostlist (and, for
# RHEL 9, tomli) from PyPI at build time, or copies them from NODEHEALTH_VENDOR_FROM=DIR.
# DEB_VERSION=0.2.0+1 adds a changelog entry (a rebuild at a higher version, as CI's upgrade check does).
PKG_BUILD   := build/pkg
PKG_VERSION := $(shell sed -n 's/^__version__ = "\(.*\)"/\1/p' nodehealth/__init__.py)
DEB_VERSION ?=
DIST        ?= dist

.PHONY: deb rpm deb-check lintian

deb:
	@bash scripts/build-deb.sh "$(PKG_BUILD)/deb" "$(DIST)" "$(DEB_VERSION)"

lintian: deb
	lintian --fail-on error,warning --suppress-tags-from-file packaging/debian/lintian-explained $(DIST)/nodehealth_*.deb

rpm:
	@bash scripts/build-rpm.sh "$(PKG_BUILD)/rpm" "$(DIST)" "$(PKG_VERSION)"

# CI only (.ci/run, as root on a throwaway machine): builds from a clean clone of HEAD, installs,
# runs, upgrades and purges the .deb on this machine. Never part of `make test`.
deb-check:
	@bash scripts/deb-check.sh

# CI only (.ci/run): the Ansible role (deploy/ansible/), --syntax-check and a check-mode run against localhost;
# ansible-core goes into build/ansible-venv, not the project's .venv.
.PHONY: ansible-check
ansible-check:
	@bash scripts/ansible-check.sh
