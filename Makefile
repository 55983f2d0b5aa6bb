# agentsafe developer commands. `make demo` and `make test` work on a fresh clone:
# each creates .venv and installs what it needs first.
#
# Never run `python -m ...` from this directory: `operator/` here would shadow the standard
# library's `operator` module for that interpreter. Use the .venv's console scripts instead.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | sha256sum | cut -c1-16)

.PHONY: help venv demo test lint format typecheck unit browser e2e e2e-build e2e-kind bench clean \
        image node-build cluster-up cluster-down cluster-status e2e-node \
        policy-test fuzz-smoke fuzz mutation api-test lock chaos faketime model release release-test

help:
	@echo "make demo       run the executor lifecycle demo on embedded defaults"
	@echo "make test       $(TEST_STAGES), in this order, each timed"
	@echo "make lint       ruff check, ruff format --check and the layer contracts (lint-imports)"
	@echo "make format     ruff format and ruff check --fix"
	@echo "make typecheck  mypy --strict on executor/ and operator/"
	@echo "make unit       the test suite only (tests/), in parallel (UNIT_WORKERS=$(UNIT_WORKERS))"
	@echo "make browser    install Debian's chromium (as root) for the approval page's browser tests"
	@echo "make model      check the protocol's Promela model with spin (docs/protocol.md)"
	@echo "make policy-test  lint the example policy and run its tests (agentsafe policy)"
	@echo "make fuzz-smoke   a few seconds of every atheris fuzz target (tests/fuzz/)"
	@echo "make api-test     schemathesis against a real agentsafe serve (docs/openapi.md)"
	@echo "make fuzz       FUZZ_TARGET=name FUZZ_RUNS=1000000: one target at length (docs/fuzzing.md)"
	@echo "make mutation   nightly: mutmut over the core, scores per module (docs/mutation.md)"
	@echo "make e2e-build  build (or find, cached by version) every binary the e2e suite needs"
	@echo "make e2e        e2e-build, then the end-to-end suite against a real kube-apiserver"
	@echo "make e2e-kind   the same scenarios on kind (needs docker, kind, kubectl, helm)"
	@echo "make chaos      the nemesis harness, short run (SEED=n replays a seed; CHAOS_SECONDS=s: long run)"
	@echo "make bench      benchmarks/ (prints ratios to a raw aiohttp baseline)"
	@echo "make cluster-up    a real one-node cluster here, no Docker (kubeconfig: .cluster/kubeconfig)"
	@echo "make cluster-down  stop it and restore the host (idempotent)"
	@echo "make cluster-status  is a node running (-o json: make cluster-status OUTPUT=json)"
	@echo "make e2e-node   the scenario on that node (brings it up first, down after)"
	@echo "make image      build agentsafe:dev with buildah (no Docker)"
	@echo "make release    build, push to RELEASE_REGISTRY, sign and attest (SBOM, SLSA) with cosign"
	@echo "make release-test  make release against a TLS registry on loopback, verified by cosign"
	@echo "make lock       regenerate image-requirements.txt, the image's hashed lock (uv)"

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "installing agentsafe and its development dependencies into $(VENV) ..."
	@$(BIN)/pip install --quiet --upgrade pip
	@$(BIN)/pip install --quiet -e '.[dev,plans,signing,operator]'
	@rm -f $(VENV)/.installed-* && touch $@

venv: $(STAMP)
	@:

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
	@ln -sfn ../../../executor/client build/typecheck/agentsafe/client
	MYPYPATH=build/typecheck $(BIN)/mypy -p agentsafe.executor -p agentsafe.operator -p agentsafe.client

# pytest-xdist workers for tests/. Most tests wait on sockets and subprocesses, so more workers
# than cores still pays off; tests that cannot share the machine carry an xdist_group mark.
UNIT_WORKERS ?= 4

unit: $(STAMP) browser
	$(BIN)/pytest -q -n $(UNIT_WORKERS) --dist loadgroup --durations=10 --ignore=tests/api

# schemathesis (every standard check, every phase, the refusal contract) against a real
# `agentsafe serve` with every optional route on, through the document it serves (docs/openapi.md).
API_TEST_EXAMPLES ?= 25

api-test: $(STAMP)
	API_TEST_EXAMPLES=$(API_TEST_EXAMPLES) $(BIN)/pytest -q -p no:cacheprovider tests/api

# issue 21: the approval page is tested in a real browser, Debian's chromium driven by Playwright
# (tests/support/browser.py); no browser is ever downloaded. As root on a machine without it, this
# installs it with apt-get, as `cluster.node packages` does for the node; otherwise the browser
# tests skip with one line (and fail under CI=true).
CHROMIUM ?= /usr/bin/chromium
browser:
	@if [ ! -x $(CHROMIUM) ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing chromium from Debian (apt-get) for the approval page tests ..."; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	  else \
	    echo "no $(CHROMIUM): the approval page's browser tests will skip (make browser as root)"; \
	  fi; \
	fi

# issue 29: the exactly-once protocol as a Promela model (tests/model/protocol.pml), checked by
# Debian's spin: each configuration of tests/model/check.py is built (spin -a, cc), searched
# exhaustively (pan, MODEL_MEMLIM MB at most) and must report 0 errors (docs/protocol.md). As root
# on a machine without spin this installs it with apt-get; otherwise it stops with one line.
model:
	@if ! command -v spin >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing spin from Debian (apt-get) for the protocol model ..."; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq spin; \
	  else \
	    echo "no spin: install Debian's spin (apt-get install spin), or run make model as root"; \
	    exit 1; \
	  fi; \
	fi
	$(PYTHON) tests/model/check.py

# Every binary the suites need (kube-apiserver, kubectl, kube-controller-manager, etcd, helm,
# and toxiproxy for `make chaos`),
# built from the Go module proxy with progress lines, or found in the cache (~/.cache/agentsafe,
# by version). A new binary is a new step in e2e/cluster/build.py, which stays the one entry point.
# Without Go it builds nothing and the suite skips with one line, unless AGENTSAFE_E2E=require
# (set by .ci/run) makes that a failure. The suite's fixtures never build: no test timeout ever
# covers a build. The node's Debian packages (containerd, runc, CNI plugins, buildah, ...) are
# installed here too, as root with apt-get, so a fresh machine has them before any test starts.
# Jaeger, cosign and the registry are needed only late (the tracing test at the end of `make e2e`,
# `make release-test`): their builds start first, as ONE background job at nice 19 (log and state
# under ~/.cache/agentsafe/background/), and the stages that need them wait for it.
e2e-build: $(STAMP)
	$(BIN)/python e2e/cluster/build.py --background-start
	$(NODE_CLI) packages
	$(BIN)/python e2e/cluster/build.py
	$(BIN)/python e2e/cluster/node_build.py

# Three parts: the loopback control plane (chart, CRDs, tokens; no kubelet), then the scenario on
# the real one-node cluster (`cluster.node run`: up, pytest, down even on failure; a node that
# cannot start skips with one line, or fails under AGENTSAFE_E2E=require as in CI), then
# docs/cluster.md's block as written, on a fresh node of its own (72-101 s warm). Not in the
# scenario's session: the page installs the chart that node has already and ends with its own
# cluster-down, and returning that node to a fresh one took longer (82 s) than a new node.
# Last, the tracing test against a real Jaeger, once e2e-build's background job has built it.
e2e: e2e-build
	$(BIN)/pytest -q e2e --ignore=e2e/release --ignore=e2e/tracing
	$(NODE_CLI) run -- $(abspath $(BIN))/pytest -q test_scenario.py --backend=node -p no:cacheprovider
	$(NODE_CLI) run -- $(abspath $(BIN))/pytest -q test_cluster_doc.py --backend=node -p no:cacheprovider
	$(BIN)/python e2e/cluster/build.py --only-jaeger
	$(BIN)/pytest -q -p no:cacheprovider e2e/tracing

e2e-kind: $(STAMP)
	bash e2e/kind/run.sh

# issue 29: the nemesis harness (e2e/chaos/, docs/chaos.md): 3 replicas, a PostgreSQL primary with a
# streaming standby, toxiproxy (built by e2e-build), the synthetic provider; a seeded fault schedule
# and an independent checker. The short run (fixed seeds, every fault class once) is a stage of
# `make test`; SEED=n replays one seed, CHAOS_SECONDS=s makes a long run of about s s per seed.
# toxiproxy comes from e2e/cluster/build.py (found in the cache, or built once, before any test).
# Run from e2e/ so that the repository root never reaches sys.path. The clock step needs Debian's
# libfaketime (installed here as root, as `make browser` installs chromium).
FAKETIME_LIB ?= /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1
faketime:
	@if [ ! -e $(FAKETIME_LIB) ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing faketime from Debian (apt-get) for the chaos clock step ..."; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq faketime; \
	  else \
	    echo "no $(FAKETIME_LIB): the chaos run has no clock step (make faketime as root)"; \
	  fi; \
	fi

chaos: $(STAMP) faketime
	$(BIN)/python e2e/cluster/build.py --only-toxiproxy
	$(BIN)/pytest -q -p no:cacheprovider e2e/test_chaos_checker.py
	cd e2e && CHAOS_SECONDS=$(CHAOS_SECONDS) $(abspath $(BIN))/python -m chaos run $(if $(SEED),--seed $(SEED))

# issue 23: the policies under examples/ ship with <policy>.test.yaml files (docs/policy-testing.md).
policy-test: $(STAMP)
	$(BIN)/agentsafe policy lint examples/policy.yaml examples/handlers/policy.yaml
	$(BIN)/agentsafe policy test examples

# issue 23: one atheris target per parser of untrusted input (docs/fuzzing.md). The corpus in
# tests/fuzz/corpus/ is replayed by `make unit`; fuzz-smoke fuzzes each target briefly.
FUZZ_SECONDS ?= 3
FUZZ_TARGET  ?= body
FUZZ_RUNS    ?= 1000000
fuzz-smoke: $(STAMP)
	$(BIN)/python tests/fuzz/run.py --smoke $(FUZZ_SECONDS)

fuzz: $(STAMP)
	nice $(BIN)/python tests/fuzz/run.py $(FUZZ_TARGET) -runs=$(FUZZ_RUNS) -print_final_stats=1

# issue 23, nightly-style and CPU-heavy, never part of `make test`: MUTATION_MODULES=executor/x.py
mutation: $(STAMP)
	nice $(BIN)/python tests/mutation/run.py $(MUTATION_MODULES)

# The one-node cluster (e2e/cluster/node.py): control plane, containerd, kubelet, kube-proxy,
# kube-router, CoreDNS and storage as host processes and pods; root and Debian packages needed
# (docs/cluster.md). Run from e2e/ so that the repository root never reaches sys.path.
NODE_CLI = cd e2e && $(abspath $(BIN))/python -m cluster.node
OUTPUT ?= text

image: $(STAMP)
	$(BIN)/python e2e/cluster/images.py --verify $(if $(IMAGE_TAG),--tag $(IMAGE_TAG))

# issue 33: a release a bank can verify (docs/release.md). `make release` builds the image from the
# Dockerfile (as `make image`), pushes it to $(RELEASE_REGISTRY)/$(RELEASE_REPOSITORY):$(RELEASE_TAG),
# signs the pushed digest with cosign and the key RELEASE_KEY (a cosign.key file, its password in
# COSIGN_PASSWORD, or a KMS URI: awskms://, gcpkms://, azurekms://, hashivault://), attaches the
# image's own CycloneDX SBOM and an SLSA v1 provenance statement as signed attestations, and prints
# the digest reference (repo@sha256:...) as its last line. RELEASE_REGISTRY_CA: a PEM CA for a
# registry with a private CA. RELEASE_TLOG=0: no upload to the Rekor transparency log (offline).
# cosign (and the test's registry) are built once from the Go module proxy by e2e-build's background
# job, cached by version; `build.py --only-release-tools` waits for that job (printing its progress)
# and builds only what is still missing. `make release-test` is the real test: a TLS registry on
# loopback, a generated key pair.
RELEASE_REGISTRY   ?=
RELEASE_REPOSITORY ?= agentsafe
RELEASE_TAG        ?=
RELEASE_KEY        ?=
RELEASE_REGISTRY_CA ?=
RELEASE_TLOG       ?= 1

release: $(STAMP)
	$(BIN)/python e2e/cluster/build.py --only-release-tools
	RELEASE_REGISTRY='$(RELEASE_REGISTRY)' RELEASE_REPOSITORY='$(RELEASE_REPOSITORY)' \
	  RELEASE_TAG='$(RELEASE_TAG)' RELEASE_KEY='$(RELEASE_KEY)' \
	  RELEASE_REGISTRY_CA='$(RELEASE_REGISTRY_CA)' RELEASE_TLOG='$(RELEASE_TLOG)' \
	  $(BIN)/python e2e/cluster/release.py

release-test: $(STAMP)
	$(BIN)/python e2e/cluster/build.py --only-release-tools
	$(BIN)/pytest -q -p no:cacheprovider e2e/release

node-build: $(STAMP)
	$(BIN)/python e2e/cluster/node_build.py

cluster-up: $(STAMP)
	$(NODE_CLI) up

cluster-down: $(STAMP)
	$(NODE_CLI) down

cluster-status: $(STAMP)
	$(NODE_CLI) status -o $(OUTPUT)

e2e-node: e2e-build
	$(NODE_CLI) run -- $(abspath $(BIN))/pytest -q test_scenario.py --backend=node -p no:cacheprovider

# `make test` runs these targets in this order, each timed by .ci/stage (.ci/run prints the
# summary). e2e-build comes before any pytest starts.
TEST_STAGES := venv lint model typecheck e2e-build chaos unit api-test policy-test fuzz-smoke e2e \
               release-test

test:
	@for stage in $(TEST_STAGES); do \
	  bash .ci/stage $$stage $(MAKE) --no-print-directory $$stage || exit $$?; \
	done

bench: $(STAMP)
	$(BIN)/python benchmarks/lifecycle.py
	$(BIN)/python benchmarks/shared_store.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis .demo

# issue 22: the image installs exactly image-requirements.txt (pip --require-hashes --no-deps):
# the runtime and operator dependencies of pyproject.toml and its build-system requirements,
# for the image's Python (3.11, x86_64 Linux). Run after changing a dependency; a test fails when
# the lock is stale. The CEL binding's REPL (typer, prompt-toolkit) stays: cel/__init__.py
# imports cel.cli, so `import cel` fails without them (`make image` showed it:
# ModuleNotFoundError: typer, in `agentsafe policy lint`).
lock: $(STAMP)
	$(BIN)/python -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"]))' \
	  | $(BIN)/uv pip compile --quiet pyproject.toml - --extra operator --generate-hashes \
	      --python-version 3.11 --python-platform x86_64-unknown-linux-gnu \
	      --no-header --annotation-style line \
	      --output-file image-requirements.txt
