# nodehealth: two commands on a fresh machine.
#   make demo   venv + install, then `nodehealth check` on a faulty and on a healthy simulated 8-GPU node
#   make test   venv + test tools, then every gate: ruff, mypy, Python 3.9 compatibility (vermin), pytest
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: all demo test lint types compat pytest system-deps bench clean

all: test

system-deps:
	@bash scripts/system-deps.sh

$(STAMP): pyproject.toml
	@bash scripts/system-deps.sh
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	@touch $@

demo: $(STAMP)
	@echo "== a node with a pending row remap on GPU 3 (expect FAIL, exit 1) =="
	-@$(BIN)/nodehealth check --simulate examples/scenarios/row-remap-pending.toml
	@echo
	@echo "== a healthy 8x H100 node (expect HEALTHY, exit 0) =="
	@$(BIN)/nodehealth check --simulate examples/scenarios/healthy-8x-h100.toml

lint: $(STAMP)
	$(BIN)/ruff check nodehealth tests bench

types: $(STAMP)
	$(BIN)/mypy

compat: $(STAMP)
	$(BIN)/vermin --target=3.9- --violations --eval-annotations --no-tips --backport dataclasses nodehealth

pytest: $(STAMP)
	$(BIN)/pytest -q

test: lint types compat pytest

bench: $(STAMP)
	$(BIN)/python bench/check_latency.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
