# durable-agents: every target installs what it needs (venv from PyPI, control plane from Go modules).
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)
PYTEST_ARGS ?=
KIND_CLUSTER ?= durable-agents

.PHONY: help
help: ## list targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@test -n "$(PYTHON)" || { echo "Python 3.11+ is required" >&2; exit 1; }
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11+ is required")'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@# The test kit (testkit/) never ships: it is only put on this venv's path, for make demo/test.
	echo "$(CURDIR)/testkit" > "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/durable-agents-testkit.pth"
	rm -f $(VENV)/.installed-* && touch $@

.PHONY: venv
venv: $(STAMP) ## create .venv with the pinned dependencies

.PHONY: binaries
binaries: ## build etcd, kube-apiserver, kube-controller-manager, kubectl, helm (cached by version)
	bash hack/build.sh

.PHONY: hack-gomod
hack-gomod: ## regenerate hack/*/go.mod after changing hack/versions.env
	bash hack/gen-gomod.sh

.PHONY: crds
crds: $(STAMP) ## generate crds/*.yaml and docs/reference/crds.md from the pydantic API types, and the chart's webhook configurations
	$(PY) -m durable_agents.api.crdgen crds charts/durable-agents/crds --policy charts/durable-agents/files
	$(PY) -m durable_agents.api.crdref docs/reference/crds.md
	$(PY) -m durable_agents.shell.admission.manifests charts/durable-agents/files

.PHONY: lint
lint: $(STAMP) ## ruff, mypy, the import-linter contracts (layers, no cycles), the size limits and the chart scan
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(PY) hack/check_sizes.py
	bash hack/chart-scan/scan.sh

.PHONY: chart-scan
chart-scan: ## checkov's Kubernetes checks on the rendered chart (defaults and every option on), offline; part of lint
	bash hack/chart-scan/scan.sh

# Material for MkDocs prints an end-of-life banner on every build; the site does not depend on it.
export NO_MKDOCS_2_WARNING := 1

.PHONY: docs
docs: $(STAMP) ## the documentation site from docs/ (mkdocs.yml) -> site/, --strict: a broken link or a page not in the nav fails
	$(VENV)/bin/mkdocs build --strict -d site

.PHONY: test-unit
test-unit: $(STAMP) ## pure-core tests, no cluster
	$(VENV)/bin/pytest -m unit $(PYTEST_ARGS)

.PHONY: test
test: $(STAMP) lint binaries prometheus chromium ## lint, then every test: unit, integration, node (root: the in-cluster suite), e2e
	DURABLE_AGENTS_BIN_DIR=$$(WITH_NODE=1 bash hack/build.sh | tail -n1) $(VENV)/bin/pytest $(PYTEST_ARGS)

.PHONY: prometheus
prometheus: ## Debian's prometheus package (prometheus and promtool: the alert rule tests and the e2e Prometheus), when missing
	@test -x /usr/bin/promtool -a -x /usr/bin/prometheus || { $(SUDO) apt-get update && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus; }

.PHONY: chromium
chromium: ## Debian's chromium and chromium-driver (the console's browser tests, -m browser, drive it with Playwright), when missing
	@test -x /usr/bin/chromium || { $(SUDO) apt-get update && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium chromium-driver; }

.PHONY: console-screenshots
console-screenshots: $(STAMP) binaries chromium ## the console's pages as the browser tests see them -> docs/approving/img/
	DURABLE_AGENTS_BIN_DIR=$$(bash hack/build.sh | tail -n1) CONSOLE_SCREENSHOTS=$(CURDIR)/docs/approving/img \
		$(VENV)/bin/pytest -m browser e2e/test_console.py $(PYTEST_ARGS)

.PHONY: test-node
test-node: $(STAMP) binaries ## the node tests (root): Pods on a real kubelet + containerd; the machine checked after
	DURABLE_AGENTS_BIN_DIR=$$(WITH_NODE=1 bash hack/build.sh | tail -n1) $(VENV)/bin/pytest -m node tests/node $(PYTEST_ARGS)

# make cluster-up NODE=1: the plane with a real node (kubelet, containerd, kube-proxy; root), see
# testkit/durable_agents_testkit/localcluster/node.py; make cluster-down removes it and checks the machine.
NODE ?= 0
WITH_NODE := $(if $(filter 1,$(NODE)),1,0)

.PHONY: cluster-up
cluster-up: $(STAMP) binaries ## start the local control plane in the background (NODE=1: with a node); prints the kubeconfig path
	@DURABLE_AGENTS_BIN_DIR=$$(WITH_NODE=$(WITH_NODE) bash hack/build.sh | tail -n1) \
		$(PY) -m durable_agents_testkit.localcluster.cli up$(if $(filter 1,$(WITH_NODE)), --node)

.PHONY: cluster-down
cluster-down: $(STAMP) ## stop the local control plane started by cluster-up
	@$(PY) -m durable_agents_testkit.localcluster.cli down

.PHONY: demo
demo: $(STAMP) binaries ## the main job on the embedded local control plane (or KUBECONFIG's cluster)
	@DURABLE_AGENTS_BIN_DIR=$$(bash hack/build.sh | tail -n1) $(PY) -m durable_agents_testkit.demo

.PHONY: demo-cluster
demo-cluster: $(STAMP) binaries ## the demo with the operator installed by its chart on a real node (root; make image, helm install)
	@DURABLE_AGENTS_BIN_DIR=$$(WITH_NODE=1 bash hack/build.sh | tail -n1) $(PY) -m durable_agents_testkit.demo_cluster

.PHONY: image
image: $(STAMP) ## build the operator image with no registry (localhost/durable-agents:<version>; IMAGE_SAVE=x.tar saves it)
	bash hack/image.sh

.PHONY: image-reproducible
image-reproducible: $(STAMP) ## make image twice, the second with no cache, and compare the image IDs and SBOMs (~6 min here)
	bash hack/image-reproducible.sh

BENCH_STAMP := $(VENV)/.bench-$(shell cksum pyproject.toml | cut -d' ' -f1)
BENCH_SCALE ?= full
BENCH_REPEAT ?= 3

$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	touch $@

.PHONY: bench
bench: $(BENCH_STAMP) binaries ## benchmarks vs same-run baselines -> bench/results/core.json + figure.png (BENCH_SCALE=small|full)
	DURABLE_AGENTS_BIN_DIR=$$(bash hack/build.sh | tail -n1) $(PY) -m bench.core --scale $(BENCH_SCALE) \
		--repeat $(BENCH_REPEAT) --out bench/results/core.json
	$(PY) -m bench.figure

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
BENCH_ARGS ?=

.PHONY: bench-peers
bench-peers: $(BENCH_STAMP) binaries ## the peer workload on durable-agents, DBOS+PostgreSQL, LangGraph (SQLite, PostgreSQL)
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { $(SUDO) apt-get update && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends postgresql; }
	DURABLE_AGENTS_BIN_DIR=$$(bash hack/build.sh | tail -n1) $(PY) -m bench.peers.run \
		--out bench/results/peers.json $(BENCH_ARGS)
	$(PY) -m bench.figure

.PHONY: profile
profile: $(BENCH_STAMP) binaries ## flame graphs of the operator (py-spy) and kube-apiserver's CPU profile (pprof, broken down by request and work) under the peer workload's durable-agents rows -> bench/results/profile/<row>.svg, <row>.apiserver.{pb.gz,txt}
	DURABLE_AGENTS_BIN_DIR=$$(bash hack/build.sh | tail -n1) $(PY) -m bench.peers.run \
		--systems durable-agents-boundaries,durable-agents-model --repeat 1 --unloaded-runs 0 \
		--profile bench/results/profile --out bench/results/profile/peers.json $(BENCH_ARGS)

.PHONY: bench-resources
bench-resources: $(BENCH_STAMP) binaries ## the operator container's memory and CPU with 10,000 parked runs and under the peer workload, against the chart's requests/limits -> bench/results/resources.json
	DURABLE_AGENTS_BIN_DIR=$$(bash hack/build.sh | tail -n1) $(PY) -m bench.resources --out bench/results/resources.json $(BENCH_ARGS)

.PHONY: bench-scale
bench-scale: $(BENCH_STAMP) binaries ## one replica over 100,000 parked runs (RSS, cold start, idle writes, API server and etcd memory) and 10,000 runs finished under retention (etcd bytes per run) -> bench/results/scale.json (hours; PARKED=, FINISHED=)
	DURABLE_AGENTS_BIN_DIR=$$(bash hack/build.sh | tail -n1) $(PY) -m bench.scale --parked $(or $(PARKED),100000) \
		--finished $(or $(FINISHED),10000) --out bench/results/scale.json $(BENCH_ARGS)

.PHONY: bench-idle-cpu
bench-idle-cpu: $(BENCH_STAMP) binaries ## the idle operator's CPU over parked runs, the previous commit's tree against this one's, with py-spy flame graphs (OLD=<commit>, PARKED=5000) -> bench/results/idle_cpu.json
	rm -rf $(VENV)/idle-cpu-old && mkdir -p $(VENV)/idle-cpu-old && git archive $(or $(OLD),HEAD~1) operator controllers | tar -x -C $(VENV)/idle-cpu-old
	DURABLE_AGENTS_BIN_DIR=$$(bash hack/build.sh | tail -n1) $(PY) -m bench.idle_cpu --parked $(or $(PARKED),5000) \
		--rounds old1,new1,old2,new2 --flame-cold --old-tree $(VENV)/idle-cpu-old --out bench/results/idle_cpu.json $(BENCH_ARGS)

.PHONY: bench-status-shapes
bench-status-shapes: $(BENCH_STAMP) binaries ## status writes/s by status and CRD shape (issue 14) -> bench/results/status_shapes.json (~10 min)
	DURABLE_AGENTS_BIN_DIR=$$(bash hack/build.sh | tail -n1) $(PY) -m bench.status_shapes --repeat $(BENCH_REPEAT) \
		--out bench/results/status_shapes.json

# A git revision measured beside the working tree by bench-admission (interleaved rounds), e.g. the
# commit before a change to the webhook; empty: the working tree only.
ADMISSION_BASE ?=

.PHONY: bench-admission
bench-admission: $(BENCH_STAMP) binaries ## admission latency beside a run of the largest admitted size (issue 30) -> bench/results/admission.json (ADMISSION_BASE=REV: A/B)
	DURABLE_AGENTS_BIN_DIR=$$(bash hack/build.sh | tail -n1) $(PY) -m bench.admission --rounds $(BENCH_REPEAT) \
		$(if $(ADMISSION_BASE),--base $(ADMISSION_BASE)) --out bench/results/admission.json $(BENCH_ARGS)

# Documents the admission fuzzing test generates in e2e-chaos (make test: 100, its default).
FUZZ_EXAMPLES ?= 1000

.PHONY: e2e-chaos
e2e-chaos: $(STAMP) binaries ## the recovery proof suite (e2e/test_chaos.py) at full size (>= 500 kill points, ~25 min) and the admission fuzzing at FUZZ_EXAMPLES documents; bench/results/chaos.json, fuzz.json
	@mkdir -p bench/results
	DURABLE_AGENTS_BIN_DIR=$$(bash hack/build.sh | tail -n1) DURABLE_AGENTS_CHAOS_SIZE=full \
		DURABLE_AGENTS_CHAOS_OUT=$(CURDIR)/bench/results/chaos.json \
		DURABLE_AGENTS_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) DURABLE_AGENTS_FUZZ_OUT=$(CURDIR)/bench/results/fuzz.json \
		$(VENV)/bin/pytest e2e/test_chaos.py e2e/test_fuzz_admission.py $(PYTEST_ARGS)

.PHONY: kind-up
kind-up: ## laptops with Docker: a kind cluster for the same suites
	kind create cluster --name $(KIND_CLUSTER) --config e2e/kind-config.yaml --kubeconfig .kind-kubeconfig

.PHONY: test-kind
test-kind: $(STAMP) ## run integration and e2e suites against the kind cluster, but the tests marked local_plane (docs/operate/kind-suites.md)
	DURABLE_AGENTS_TEST_KUBECONFIG=$(CURDIR)/.kind-kubeconfig $(VENV)/bin/pytest -m '(integration or e2e) and not local_plane' $(PYTEST_ARGS)

.PHONY: kind-down
kind-down:
	kind delete cluster --name $(KIND_CLUSTER)

.PHONY: clean
clean: ## remove the venv and caches (the control-plane binaries stay cached by version)
	rm -rf $(VENV) .venv-scan .mypy_cache .ruff_cache .pytest_cache .hypothesis
