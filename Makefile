# The two commands of the README, and the steps they are made of. Every target installs what
# it needs on a fresh Debian machine (the Debian packages through apt-get, the Python packages
# pinned in requirements.txt into .venv), so `make deploy` and `make test` work on a new clone.
# `make test` also runs the collection on its second ansible-core line, 2.21 (meta/runtime.yml),
# from .venv-2.21 (requirements-2.21.txt), made with a Python 3.12 or later found here.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
VENV := .venv
BIN := $(VENV)/bin
VENV_2_21 := .venv-2.21
# molecule, ansible-runner and ansible-lint start ansible-playbook by name: make it the venv's.
export PATH := $(CURDIR)/$(BIN):$(PATH)
LAB_HOSTS ?= 4
# The inventory whose fleet `make report` draws (its ledger is ledger/<fleet>).
REPORT_INVENTORY ?= inventory/lab
# git: ansible-test lists the collection's files with it. dash and shellcheck: the submission
# bundle's patch_ops.sh is run under the platform's sh and must pass shellcheck. debootstrap and
# patchelf: the lab's real engine runs in a Debian 13 root with a Python of its own
# (tests/lab/real_engine).
DEBIAN_PACKAGES := openssh-server openssh-client iproute2 python3-venv git dash shellcheck \
	debootstrap patchelf
# ansible-test sanity compiles and imports the host-side code on each of these that is installed
# (the hosts run Python 3.8 and later; ansible-core 2.21's own host-side code needs 3.9), each
# line's ansible-test as far as it goes; the controller's own Python runs every other test.
SANITY_PYTHONS := 3.8 3.9 3.10 3.11 3.12 3.13
SANITY_PYTHONS_2_21 := 3.9 3.10 3.11 3.12 3.13 3.14
# The Pythons ansible-core 2.21 runs on, the first found here makes .venv-2.21.
CONTROLLER_PYTHONS_2_21 := 3.13 3.12
# Where pyenv keeps the other Pythons, when the machine has them (their shims may not work).
PYENV_VERSIONS := $(or $(PYENV_ROOT),$(HOME)/.pyenv)/versions
# A shell function for recipes: `python_of 3.13` prints the first python3.13 on PATH or in
# pyenv's versions folder that runs, or nothing.
PYTHON_OF := python_of() { for candidate in $$(command -v python$$1) $(PYENV_VERSIONS)/$$1.*/bin/python$$1; do \
  if [ -x "$$candidate" ] && "$$candidate" -c '' 2>/dev/null; then echo "$$candidate"; return; fi; done; }
# For recipes: sets `python` to the first of CONTROLLER_PYTHONS_2_21 found, or stops saying why.
PYTHON_2_21 := $(PYTHON_OF); python=""; for version in $(CONTROLLER_PYTHONS_2_21); do \
  python=$$(python_of $$version); [ -z "$$python" ] || break; done; \
  if [ -z "$$python" ]; then echo "ansible-core 2.21 needs Python 3.12 or later, and no working" \
    "python3.13 or python3.12 is on PATH or in $(PYENV_VERSIONS) (pyenv install 3.13 makes one)" >&2; exit 1; fi

.PHONY: deploy test setup debian-packages lab-up lab-down facts verify report unit lint integration molecule lock bench \
	setup-2.21 unit-2.21 sanity-2.21 integration-2.21 lock-2.21

## Main job: build the lab (if it is not up) and deploy onto it, with its verification.
deploy: setup lab-up
	$(BIN)/ansible-playbook deploy.yml -i inventory/lab

## Every test: unit (with the host-Python 3.8 check), lint, lab integration, molecule, and on
## ansible-core 2.21 the unit tests, sanity and one lab cycle. The unit tests and the linters of
## both lines run beside the lab's integration tests, at a lower priority: the integration tests
## are the longest part and keep the CPU first when they need it. Their output is
## kept in build/test/checks.log and shown once both sides ended; either side failing fails the
## target, and each side runs all its steps whatever one of them found. The 2.21 lab cycle
## follows the integration tests (one lab at a time); molecule, which builds a lab too, runs after.
test: setup setup-2.21
	@mkdir -p build/test; \
	( nice -n 10 $(MAKE) --no-print-directory -k unit lint unit-2.21 sanity-2.21 > build/test/checks.log 2>&1 ) & checks=$$!; \
	integration=0; $(MAKE) --no-print-directory -k integration integration-2.21 || integration=$$?; \
	checked=0; wait $$checks || checked=$$?; \
	echo "--- unit tests and linters (build/test/checks.log) ---"; cat build/test/checks.log; \
	if [ $$checked -ne 0 ] || [ $$integration -ne 0 ]; then \
	  echo "make test: unit and linters exit $$checked, integration exit $$integration" >&2; exit 1; fi
	$(MAKE) --no-print-directory molecule

setup: debian-packages $(VENV)/.installed

debian-packages:
	@missing=$$(for p in $(DEBIAN_PACKAGES); do \
	  dpkg-query -W -f='$${db:Status-Abbrev}' $$p 2>/dev/null | grep -q '^ii' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; fi

$(VENV)/.installed: requirements.txt
	python3 -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -r requirements.txt
	touch $@

setup-2.21: debian-packages $(VENV_2_21)/.installed

$(VENV_2_21)/.installed: requirements-2.21.txt
	@$(PYTHON_2_21); set -x; "$$python" -m venv --clear $(VENV_2_21)
	$(VENV_2_21)/bin/pip install -q --disable-pip-version-check -r requirements-2.21.txt
	touch $@

lab-up: setup
	$(BIN)/python tests/lab/lab.py up --hosts $(LAB_HOSTS)

lab-down:
	$(BIN)/python tests/lab/lab.py down

facts: setup lab-up
	$(BIN)/ansible-playbook playbooks/facts.yml -i inventory/lab

verify: setup lab-up
	$(BIN)/ansible-playbook verify.yml -i inventory/lab

## Plots of every release's figures (score with its gate, TTFT/TPOT, quality deviation) and a page
## with the releases' table, from the fleet's ledger into build/report/<fleet>/index.html; runs on
## the controller only, lab up or not (REPORT_INVENTORY=inventory/biv100 for the team's fleet).
report: setup
	ANSIBLE_LOCALHOST_WARNING=false $(BIN)/ansible-playbook report.yml -i $(REPORT_INVENTORY)

unit: setup
	$(BIN)/pytest tests/unit -q

## The unit tests on ansible-core 2.21, its tools first on PATH.
unit-2.21: setup-2.21
	PATH=$(CURDIR)/$(VENV_2_21)/bin:$$PATH $(VENV_2_21)/bin/pytest tests/unit -q

## ansible-lint, then ansible-test sanity. ansible-test finds the collection through the committed
## link collections/ansible_collections/biv100/serving (ANSIBLE_TEST_CONTENT_ROOT: the working
## folder it would otherwise need is the checkout itself, which has no ansible_collections parent)
## and, offline but for the package index, bootstraps pip into its venvs with ensurepip
## (tests/sanity/pip_bootstrap.py) instead of downloading get-pip.py. SANITY_VENV's ansible-test
## runs on its own Python, with the host-side code compiled and imported on SANITY_PYTHONS.
define run_sanity
$(SANITY_VENV)/bin/python tests/sanity/pip_bootstrap.py --seed
@controller=$$($(SANITY_VENV)/bin/python -c 'import sys; print("%d.%d" % sys.version_info[:2])'); \
$(PYTHON_OF); found=$$(mktemp -d); trap 'rm -rf "$$found"' EXIT; \
targets=""; for version in $(SANITY_PYTHONS); do \
  candidate=$$(python_of $$version); \
  if [ -n "$$candidate" ]; then \
    ln -sf "$$candidate" "$$found/python$$version"; targets="$$targets --target-python $$version"; \
  else echo "sanity: no working python$$version here, its compile and import tests are skipped"; fi; \
done; \
set -x; PATH="$$found:$(CURDIR)/$(SANITY_VENV)/bin:$$PATH" \
  ANSIBLE_TEST_CONTENT_ROOT=$(CURDIR)/collections/ansible_collections/biv100/serving \
  $(SANITY_VENV)/bin/ansible-test sanity --controller origin:python=$$controller $$targets
endef

lint: SANITY_VENV := $(VENV)
lint: setup
	$(BIN)/ansible-lint
	$(run_sanity)

## ansible-test sanity of ansible-core 2.21, on the Pythons it supports.
sanity-2.21: SANITY_VENV := $(VENV_2_21)
sanity-2.21: SANITY_PYTHONS := $(SANITY_PYTHONS_2_21)
sanity-2.21: setup-2.21
	$(run_sanity)

## The lab's integration tests, two labs at once: each pytest-xdist worker builds its own labs (its
## lab ids, tests/integration/lab_guard.py) and is given whole test modules (--dist loadfile), so
## that a module's lab and the deploys its fixtures make are built once, on one worker. The 20
## slowest steps are listed: the suite's length is the test run's, and this is where it goes.
INTEGRATION_WORKERS ?= 2
integration: setup
	$(BIN)/pytest tests/integration -q -n $(INTEGRATION_WORKERS) --dist loadfile --no-loadscope-reorder --durations=20

## One release's whole cycle on the lab (deploy with every gate, verify, rollback) with
## ansible-core 2.21 as the controller.
integration-2.21: setup-2.21
	PATH=$(CURDIR)/$(VENV_2_21)/bin:$$PATH $(VENV_2_21)/bin/pytest tests/integration/test_release_cycle.py -q

molecule: setup
	$(BIN)/molecule test --all

## Re-pin requirements.txt from requirements.in (needs the package index).
lock:
	python3 -m venv .lock-venv && .lock-venv/bin/pip install -q -r requirements.in
	.lock-venv/bin/pip freeze --exclude-editable > requirements.txt && rm -rf .lock-venv

## Re-pin requirements-2.21.txt from requirements-2.21.in, with the versions requirements.txt pins
## wherever it pins the same package, on the Python .venv-2.21 is made with.
lock-2.21:
	@$(PYTHON_2_21); set -x; "$$python" -m venv --clear .lock-venv-2.21
	grep -v '^ansible-core==' requirements.txt > .lock-venv-2.21/constraints.txt
	.lock-venv-2.21/bin/pip install -q -r requirements-2.21.in -c .lock-venv-2.21/constraints.txt
	.lock-venv-2.21/bin/pip freeze --exclude-editable > requirements-2.21.txt && rm -rf .lock-venv-2.21

## The collection against a naive per-file copy loop and the floors of Ansible and ssh, on 4, 8
## and 16 lab hosts; then what guarding the whole model layer costs a no-change deploy against
## the revision that guarded twelve files; then engine_bench against vLLM's own benchmark client
## on the lab's real engine.
bench: setup
	$(BIN)/python benchmarks/stage_vs_naive.py --hosts 4 8 16
	$(BIN)/python benchmarks/guard_cost.py --hosts 4
	$(BIN)/python benchmarks/bench_vs_vllm.py
