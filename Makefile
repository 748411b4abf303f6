# quorum: `make demo` and `make test` are the two commands; see README.md.
SHELL := /bin/bash
.DEFAULT_GOAL := help
NAME ?= default
SIZE ?=
SLURM ?=
PYTEST_ARGS ?=
DIST ?= dist
# `make bench-scale NODES="200 1000" MODE="quorum was" K8S=1.37`: sizes (GPU nodes), ways and Kubernetes
# minor of the scale benchmark (1.36 by default there; delegated and was need 1.37).
NODES ?= 5000
MODE ?= quorum
# `make up K8S=1.36`: another Kubernetes minor for the local control plane (default 1.37).
ifdef K8S
export QUORUM_K8S := $(K8S)
endif
# The venv lives outside the repo (~/.cache/quorum/venv/<hash>), shared by clones.
PY = PYTHONPATH="$(CURDIR)" "$$(hack/ensure-venv)/bin/python"
VENV_BIN = "$$(hack/ensure-venv)/bin"

.PHONY: help venv build up down status demo jobset-demo integrations-demo test test-integrations lint typecheck hadolint unit integration soak bench bench-planner bench-webhooks bench-control-plane bench-e2e bench-poison bench-peers bench-admission bench-fuzz bench-preemption bench-sunk bench-scale bench-memory release-manifests clean

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-11s %s\n", $$1, $$2}'

venv: ## create the Python venv (outside the repo, reused)
	@hack/ensure-venv >/dev/null

build: ## build and cache etcd, Kubernetes (1.37 and 1.36), kwok and Helm from Go modules (make demo builds only what it uses)
	@$(PY) -m devcluster build --all

up: ## start the local control plane NAME (default `default`) in the background; K8S=1.36 runs 1.36; SLURM=1 adds Slurm
	@$(PY) -m devcluster up --name $(NAME) $(if $(SIZE),--size $(SIZE)) $(if $(SLURM),--slurm)

down: ## stop the processes of instance NAME
	@$(PY) -m devcluster down --name $(NAME)

status: ## show local instances
	@$(PY) -m devcluster status

demo: ## bring up the control plane and show what quorum sees
	@$(PY) -m devcluster demo

jobset-demo: ## seed 004's JobSet example: build JobSet, run it on instance `jobset` (not in `make test`)
	@$(PY) -m devcluster jobset-demo

integrations-demo: ## KubeRay and LeaderWorkerSet, built from their Go modules, admitted whole by quorum on instance `integrations`
	@$(PY) -m devcluster integrations-demo

lint: ## ruff
	@$(VENV_BIN)/ruff check . && $(VENV_BIN)/ruff format --check .

typecheck: ## mypy --strict
	@PYTHONPATH="$(CURDIR)" $(VENV_BIN)/mypy

hadolint: ## lint the Dockerfile
	@$(VENV_BIN)/hadolint Dockerfile

unit: ## unit tests only (no cluster)
	@$(PY) -m pytest tests/unit $(PYTEST_ARGS)

soak: ## the disruption model test, long: 20,000 random examples (~20 min; make test runs 400 with a fixed seed)
	@QUORUM_SOAK=1 $(PY) -m pytest tests/unit/test_disruption_model.py -p no:cacheprovider --hypothesis-show-statistics --timeout 3600

integration: ## tests on the real local control plane
	@$(PY) -m pytest -m cluster $(PYTEST_ARGS)

test: lint typecheck hadolint ## everything: lint, types, Dockerfile, unit, packaging, cluster tests on Kubernetes 1.37; then the WAS, webhook and gang tests on 1.36
	@$(PY) -m devcluster build --all
	@$(PY) -m pytest --durations=10 $(PYTEST_ARGS)
	@QUORUM_K8S=1.36 QUORUM_TEST_INSTANCE=k8s-1-36 $(PY) -m pytest -m kubernetes_1_36 --durations=5 $(PYTEST_ARGS)

test-integrations: ## the ML controllers (KubeRay, LeaderWorkerSet, ...) built from their Go modules and run with quorum (docs/integrations.md; .ci/run runs it after `make test`)
	@QUORUM_INTEGRATIONS=1 $(PY) -m pytest tests/integrations -p no:cacheprovider --durations=5 $(PYTEST_ARGS)

bench: bench-planner bench-webhooks bench-control-plane bench-e2e bench-poison bench-peers bench-admission bench-fuzz bench-preemption bench-sunk bench-memory ## all benchmarks (results in bench/results/)

bench-planner: ## the planner alone: full and incremental passes, 1,000-10,000 nodes, 100-5,000 gangs; then on 5,000 DRA nodes x 8 devices; then fairness between tenants in simulated time
	@$(PY) -m tests.bench.planner
	@$(PY) -m tests.bench.planner_dra
	@$(PY) -m tests.bench.fairness

bench-webhooks: ## quorum-webhooks alone under wrk (needs: apt-get install wrk)
	@command -v wrk >/dev/null || { echo "installing wrk (Debian package)"; apt-get install -y wrk >/dev/null; }
	@$(PY) -m tests.bench.webhooks

bench-e2e: ## end to end on the local control plane: 200 GPU nodes, 200 gangs x 8 pods
	@$(PY) -m tests.bench.end_to_end

bench-poison: ## one pathological gang (1 launcher + 1,270 workers, 6 GPUs short) before 30 small gangs, 200 nodes
	@$(PY) -m tests.bench.poison

bench-peers: ## quorum vs scheduler-plugins coscheduling vs Kueue (plain, topology-aware) vs kube-scheduler: throughput, contention, large gang; on DRA devices, vs kube-scheduler alone and its own gang scheduling
	@$(PY) -m tests.bench.peers

bench-admission: ## pod creation through the apiserver with quorum's webhooks and policies and without: admission latency (~3 min)
	@$(PY) -m tests.bench.admission_load

bench-fuzz: ## 100,000 hostile AdmissionReviews, then 48 slow 3 MiB uploads, at the running quorum-webhooks: no 5xx, no crash, RSS flat, reviews answered, memory under its limit (~3 min)
	@$(PY) -m tests.bench.fuzz_webhooks

bench-preemption: ## 6 high-priority gangs preempting low-priority ones in a full 8-node pool: latency, victims, lost GPU-seconds (~1 min)
	@$(PY) -m tests.bench.preemption

bench-sunk: ## pods through a real Slurm (quorum-sunk-scheduler) beside quorum's gang path: pods/s, create->bind p50/p99 for 1- and 16-pod gangs (~5 min)
	@$(PY) -m tests.bench.sunk

bench-scale: ## 2,000 gangs (one of 4,096 pods) arriving over 5 min on 5,000 kwok GPU nodes, to all bound; NODES="200 1000" other sizes, MODE="coscheduling kueue delegated was" other ways, K8S=1.37 (not in `make bench`)
	@$(PY) -m tests.bench.scale $(foreach n,$(NODES),--nodes $(n)) $(foreach m,$(MODE),--mode $(m)) $(if $(K8S),--kubernetes $(K8S))

bench-memory: ## what quorum-operator holds per gang pod and per node, and a relisting's peak, on its own indexes (no cluster); PODS=23631 NODES=5000 bench-scale's largest
	@$(PY) -m tests.bench.operator_memory $(if $(PODS),--pods $(PODS)) $(if $(NODES),--nodes $(NODES))

bench-control-plane: ## local control plane start-up time and memory, 22 and 1,000 nodes
	@$(PY) -m tests.bench.control_plane

release-manifests: ## dist/quorum.yaml, dist/quorum-sunk.yaml (kubectl apply --server-side -f; cert-manager makes the certificate) and dist/podgroups.scheduling.x-k8s.io.yaml (kubectl create -f): docs/install.md
	@mkdir -p $(DIST)
	@$(PY) -m quorum manifests --values hack/release/quorum-values.yaml > $(DIST)/quorum.yaml
	@$(PY) -m quorum manifests --values hack/release/quorum-values.yaml --values hack/release/sunk-values.yaml > $(DIST)/quorum-sunk.yaml
	@cp crds/scheduler-plugins/scheduling.x-k8s.io_podgroups.yaml $(DIST)/podgroups.scheduling.x-k8s.io.yaml
	@cp crds/volcano/scheduling.volcano.sh_podgroups.yaml $(DIST)/podgroups.scheduling.volcano.sh.yaml
	@echo "$(DIST)/quorum.yaml $(DIST)/quorum-sunk.yaml $(DIST)/podgroups.scheduling.x-k8s.io.yaml $(DIST)/podgroups.scheduling.volcano.sh.yaml"

clean: ## stop every instance and remove .quorum/ (the binary cache stays)
	-@$(PY) -m devcluster down --all
	rm -rf .quorum
