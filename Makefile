# Developer entry points (CONTRIBUTING.md). Every Python tool runs from the project's venv, which
# scripts/venv.sh creates once and prints (outside the repo, keyed by the pins). Another venv:
# `make check VENV=/path/to/venv` or KIMIK3_VENV=... (a second worktree should not re-point the
# shared venv's editable install: scripts/venv.sh). PYTHONPATH puts this checkout's code first
# whichever venv runs it.
#
#   make check      lint, types, import contracts, the router's fmt and clippy, unit and golden tests:
#                   the fast loop (under a minute warm; clippy's first run compiles the router's
#                   crates, about a minute)
#   make test       every suite under tests/ (also contract, security, fuzz, mutation, images,
#                   simulator, e2e_infra): what scripts/test.sh runs before its cluster (~9 min)
#   make generate   regenerate everything generated: CRD + chart copy, chart README values,
#                   Grafana dashboards, manifests/install.yaml, golden manifests
#   make verify     generate, then fail if that changed anything tracked
#   make contract   vLLM and vllm-router contract tests only
#   make e2e        scripts/test.sh: everything, then the e2e suite on a local real cluster
#                   (ARGS='-k NAME' is passed to both pytest runs; KIMIK3_KEEP_CLUSTER=1 keeps it)

SHELL := bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := check
ROOT := $(abspath $(dir $(lastword $(MAKEFILE_LIST))))

# Created and printed on first use only (not for `make e2e` or `make help`).
ifeq ($(origin VENV),undefined)
VENV = $(eval VENV := $$(shell "$(ROOT)/scripts/venv.sh"))$(VENV)
endif
RUN = PATH="$(VENV)/bin:$$PATH" PYTHONPATH="$(ROOT)/operator:$(ROOT)/simulator$${PYTHONPATH:+:$$PYTHONPATH}"

# helm for manifests/install.yaml: on PATH, else the one e2e/cluster/build.sh builds.
KIMIK3_CACHE ?= $(HOME)/.cache/kimik3-e2e
HELM_VERSION := $(shell . "$(ROOT)/e2e/cluster/versions.env" && echo "$$HELM_VERSION")
HELM_DIR := $(KIMIK3_CACHE)/bin/helm-v$(HELM_VERSION)

# What `generate` writes (and `verify` holds to the committed copies).
GENERATED := crds charts/kimik3-operator manifests/install.yaml tests/golden

.PHONY: help venv check lint unit test generate crd chart-readme dashboards install-yaml goldens verify contract e2e

help:
	@sed -n '1,/^$$/s/^# \{0,1\}//p' "$(ROOT)/Makefile"

venv:
	@test -x "$(VENV)/bin/python" || { echo "no venv at '$(VENV)' (scripts/venv.sh failed?)" >&2; exit 1; }

check: lint unit

lint: venv
	cd "$(ROOT)" && $(RUN) ruff check .
	cd "$(ROOT)" && $(RUN) mypy
	cd "$(ROOT)" && $(RUN) lint-imports
	cd "$(ROOT)/router" && cargo fmt --check
	cd "$(ROOT)/router" && cargo clippy --quiet --locked --all-targets --target-dir "$(KIMIK3_CACHE)/router-target" -- -D warnings

unit: venv
	cd "$(ROOT)" && $(RUN) python -m pytest tests/unit tests/golden -q $(ARGS)

# NONE_OK (scripts/test.sh, when it passes a -k): no collected test is not a failure (pytest's exit 5).
test: venv
	cd "$(ROOT)" && { $(RUN) python -m pytest tests -q $(ARGS) || { rc=$$?; [[ $$rc == 5 && "$(NONE_OK)" =~ ^[1-9] ]] || exit $$rc; }; }

generate: crd chart-readme dashboards install-yaml goldens

crd: venv
	cd "$(ROOT)" && $(RUN) kimik3 crd --out crds --chart charts/kimik3-operator

chart-readme: venv
	cd "$(ROOT)" && $(RUN) python scripts/chart-readme.py

dashboards: venv
	cd "$(ROOT)" && $(RUN) python scripts/dashboards.py

install-yaml: crd
	@cd "$(ROOT)" && export PATH="$(HELM_DIR):$$PATH" && command -v helm >/dev/null || \
	  { echo "helm not found: on PATH or in $(HELM_DIR) (e2e/cluster/build.sh builds it)" >&2; exit 1; }; \
	  echo scripts/render-install.sh; scripts/render-install.sh

goldens: venv
	cd "$(ROOT)" && $(RUN) KIMIK3_UPDATE_GOLDEN=1 python -m pytest tests/golden -q -p no:cacheprovider

verify: generate
	cd "$(ROOT)" && git diff --exit-code -- $(GENERATED) && \
	  untracked="$$(git ls-files --others --exclude-standard -- $(GENERATED))" && \
	  { [[ -z "$$untracked" ]] || { echo "untracked after generate:" >&2; echo "$$untracked" >&2; exit 1; }; }

contract: venv
	cd "$(ROOT)" && $(RUN) python -m pytest tests/contract -q $(ARGS)

e2e:
	cd "$(ROOT)" && scripts/test.sh $(ARGS)
