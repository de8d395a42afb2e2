# The two commands of the README, and the steps they are made of. Every target installs what
# it needs on a fresh Debian machine (the Debian packages through apt-get, the Python packages
# pinned in requirements.txt into .venv), so `make deploy` and `make test` work on a new clone.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
VENV := .venv
BIN := $(VENV)/bin
# molecule, ansible-runner and ansible-lint start ansible-playbook by name: make it the venv's.
export PATH := $(CURDIR)/$(BIN):$(PATH)
LAB_HOSTS ?= 4
# The inventory whose fleet `make report` draws (its ledger is ledger/<fleet>).
REPORT_INVENTORY ?= inventory/lab
# git: ansible-test lists the collection's files with it. dash and shellcheck: the submission
# bundle's patch_ops.sh is run under the platform's sh and must pass shellcheck.
DEBIAN_PACKAGES := openssh-server openssh-client iproute2 python3-venv git dash shellcheck
# ansible-test sanity compiles and imports the host-side code on each of these that is installed
# (the hosts run Python 3.8 and later); the controller's own Python runs every other test.
SANITY_PYTHONS := 3.8 3.9 3.10 3.11 3.12 3.13
# Where pyenv keeps the other Pythons, when the machine has them (their shims may not work).
PYENV_VERSIONS := $(or $(PYENV_ROOT),$(HOME)/.pyenv)/versions

.PHONY: deploy test setup debian-packages lab-up lab-down facts verify report unit lint integration molecule lock bench

## Main job: build the lab (if it is not up) and deploy onto it, with its verification.
deploy: setup lab-up
	$(BIN)/ansible-playbook deploy.yml -i inventory/lab

## Every test: unit (with the host-Python 3.8 check), lint, lab integration, molecule. The unit
## tests and the linters run beside the lab's integration tests, at a lower priority: the
## integration tests mostly wait on ssh and on engines, and keep the CPU first when they need it.
## Their output is kept in build/test/checks.log and shown once both sides ended; either side
## failing fails the target. Molecule, which builds a lab too, runs after.
test: setup
	@mkdir -p build/test; \
	( nice -n 10 $(MAKE) --no-print-directory unit lint > build/test/checks.log 2>&1 ) & checks=$$!; \
	integration=0; $(MAKE) --no-print-directory integration || integration=$$?; \
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

## ansible-lint, then ansible-test sanity. ansible-test finds the collection through the committed
## link collections/ansible_collections/biv100/serving (ANSIBLE_TEST_CONTENT_ROOT: the working
## folder it would otherwise need is the checkout itself, which has no ansible_collections parent)
## and, offline but for the package index, bootstraps pip into its venvs with ensurepip
## (tests/sanity/pip_bootstrap.py) instead of downloading get-pip.py.
lint: setup
	$(BIN)/ansible-lint
	$(BIN)/python tests/sanity/pip_bootstrap.py --seed
	@controller=$$($(BIN)/python -c 'import sys; print("%d.%d" % sys.version_info[:2])'); \
	found=$$(mktemp -d); trap 'rm -rf "$$found"' EXIT; \
	targets=""; for version in $(SANITY_PYTHONS); do \
	  for candidate in $$(command -v python$$version) $(PYENV_VERSIONS)/$$version.*/bin/python$$version; do \
	    if [ -x "$$candidate" ] && "$$candidate" -c '' 2>/dev/null; then \
	      ln -sf "$$candidate" "$$found/python$$version"; targets="$$targets --target-python $$version"; break; fi; \
	  done; \
	  case "$$targets" in *"python $$version"*) ;; \
	    *) echo "sanity: no working python$$version here, its compile and import tests are skipped";; esac; \
	done; \
	set -x; PATH="$$found:$$PATH" ANSIBLE_TEST_CONTENT_ROOT=$(CURDIR)/collections/ansible_collections/biv100/serving \
	  $(BIN)/ansible-test sanity --controller origin:python=$$controller $$targets

## The lab's integration tests, two labs at once: each pytest-xdist worker builds its own labs (its
## lab ids, tests/integration/lab_guard.py) and is given whole test modules (--dist loadfile), so
## that a module's lab and the deploys its fixtures make are built once, on one worker.
INTEGRATION_WORKERS ?= 2
integration: setup
	$(BIN)/pytest tests/integration -q -n $(INTEGRATION_WORKERS) --dist loadfile

molecule: setup
	$(BIN)/molecule test --all

## Re-pin requirements.txt from requirements.in (needs the package index).
lock:
	python3 -m venv .lock-venv && .lock-venv/bin/pip install -q -r requirements.in
	.lock-venv/bin/pip freeze --exclude-editable > requirements.txt && rm -rf .lock-venv

## The collection against a naive per-file copy loop and the floors of Ansible and ssh, on 4, 8
## and 16 lab hosts; then what guarding the whole model layer costs a no-change deploy against
## the revision that guarded twelve files.
bench: setup
	$(BIN)/python benchmarks/stage_vs_naive.py --hosts 4 8 16
	$(BIN)/python benchmarks/guard_cost.py --hosts 4
