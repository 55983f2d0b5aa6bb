# agentsafe developer commands. `make demo` and `make test` work on a fresh clone:
# each creates .venv and installs what it needs first.
#
# Never run `python -m ...` from this directory: `operator/` here would shadow the standard
# library's `operator` module for that interpreter. Use the .venv's console scripts instead.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | sha256sum | cut -c1-16)

.PHONY: help venv demo test lint format typecheck unit e2e e2e-build e2e-kind bench clean

help:
	@echo "make demo       run the executor lifecycle demo on embedded defaults"
	@echo "make test       lint, type-check (mypy --strict) and run the whole test suite"
	@echo "make lint       ruff check, ruff format --check and the layer contracts (lint-imports)"
	@echo "make format     ruff format and ruff check --fix"
	@echo "make typecheck  mypy --strict on executor/ and operator/"
	@echo "make unit       the test suite only (tests/)"
	@echo "make e2e        the end-to-end suite against a real kube-apiserver (builds it once)"
	@echo "make e2e-kind   the same scenarios on kind (needs docker, kind, kubectl, helm)"
	@echo "make bench      benchmarks/ (prints ratios to a raw aiohttp baseline)"

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "installing agentsafe and its development dependencies into $(VENV) ..."
	@$(BIN)/pip install --quiet --upgrade pip
	@$(BIN)/pip install --quiet -e '.[dev,plans,signing,operator]'
	@rm -f $(VENV)/.installed-* && touch $@

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/agentsafe demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# mypy must see executor/ and operator/ under their import names (agentsafe.executor, ...), so
# it checks them through a tree of symlinks in build/ (ignored by git).
typecheck: $(STAMP)
	@mkdir -p build/typecheck/agentsafe
	@ln -sfn ../../../executor build/typecheck/agentsafe/executor
	@ln -sfn ../../../operator build/typecheck/agentsafe/operator
	MYPYPATH=build/typecheck $(BIN)/mypy -p agentsafe.executor -p agentsafe.operator

unit: $(STAMP)
	$(BIN)/pytest -q

# The end-to-end suite builds kube-apiserver, etcd, kubectl, kube-controller-manager and helm
# from the Go module proxy on first use (cached under ~/.cache/agentsafe); without Go it skips
# with one line, unless AGENTSAFE_E2E=require (set by .ci/run) makes that a failure.
e2e: $(STAMP)
	$(BIN)/pytest -q e2e

e2e-build: $(STAMP)
	$(BIN)/python e2e/cluster/build.py

e2e-kind: $(STAMP)
	bash e2e/kind/run.sh

test: lint typecheck unit e2e

bench: $(STAMP)
	$(BIN)/python benchmarks/lifecycle.py
	$(BIN)/python benchmarks/shared_store.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis .demo
