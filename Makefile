# The README's commands. Everything lives in the clone: .venv/, data/, .dagster_home/.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The instance: DAGSTER_HOME from the command line or the environment (as Dagster's own
# commands read it, and as SCRAPE_DATA_DIR below); unset or empty: the clone's .dagster_home.
ifeq ($(strip $(DAGSTER_HOME)),)
override DAGSTER_HOME := $(CURDIR)/.dagster_home
endif
override DAGSTER_HOME := $(abspath $(DAGSTER_HOME))
export DAGSTER_HOME
export SCRAPE_DATA_DIR ?= $(CURDIR)/data

.PHONY: demo test ui serve-demo clean bench bench-quick

# Python 3.11 or newer (pandas 3 needs it), checked before .venv exists: a .venv made by an
# older one would stay, and every later make would fail in pip.
$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || { \
	  echo "make: $(PYTHON) is not Python 3.11 or newer ($$($(PYTHON) --version 2>/dev/null || echo 'not found')):" \
	       "give one, e.g. make $(or $(MAKECMDGOALS),demo) PYTHON=python3.12" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# The project alone for the demo, the UI and the demo server; with its test extra (moto,
# pgserver's PostgreSQL, ...) for the tests.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e .
	touch $@

$(VENV)/.test-installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e ".[test]"
	touch $@

# The clone's own instance follows the shipped settings; another one (make demo
# DAGSTER_HOME=..., or exported) gets them only when it has none: its own are never replaced.
$(DAGSTER_HOME)/dagster.yaml: $(if $(filter $(CURDIR)/.dagster_home,$(DAGSTER_HOME)),dagster.yaml)
	mkdir -p $(DAGSTER_HOME)
	cp dagster.yaml $@

## make demo: set up, then scrape the built-in demo catalogue through Dagster and print a summary
demo: $(VENV)/.installed $(DAGSTER_HOME)/dagster.yaml
	$(BIN)/scrape-assets demo

## make test: set up with test dependencies, then run the whole test suite
# The tests get the clone's instance, never one of the shell's (they make their own anyway).
test: override DAGSTER_HOME := $(CURDIR)/.dagster_home
test: $(VENV)/.test-installed
	$(BIN)/python -m pytest

# What is left of $(1) without its digits: empty for a port number (checked before a
# goal that serves on it runs, so no other text reaches the shell).
non_digits = $(subst 0,,$(subst 1,,$(subst 2,,$(subst 3,,$(subst 4,,$(subst 5,,$(subst 6,,$(subst 7,,$(subst 8,,$(subst 9,,$(1)))))))))))

## make ui: the Dagster UI on the same instance as `make demo` (http://127.0.0.1:3000; UI_PORT=3001 for another port).
## It refuses while a daemon runs on the instance (another make ui, a dagster-daemon service): UI_FORCE=1 starts anyway;
## and when the port is taken (UI_FORCE does not change that).
ui_port := $(or $(strip $(UI_PORT)),3000)
ifneq ($(filter ui,$(MAKECMDGOALS)),)
ifneq ($(call non_digits,$(ui_port)),)
$(error UI_PORT=$(UI_PORT) is not a port number: give digits, e.g. make ui UI_PORT=3001 (unset: 3000))
endif
endif
ui: $(VENV)/.installed $(DAGSTER_HOME)/dagster.yaml
	$(if $(filter-out 0,$(strip $(UI_FORCE))),,$(BIN)/scrape-assets daemon-check)
	$(BIN)/scrape-assets port-check $(ui_port)
	$(BIN)/dagster dev -w workspace.yaml -p $(ui_port)

## make serve-demo: the demo catalogue over real sockets on 127.0.0.1:8000 (DEMO_PORT=8001 for another port)
demo_port := $(or $(strip $(DEMO_PORT)),8000)
ifneq ($(filter serve-demo,$(MAKECMDGOALS)),)
ifneq ($(call non_digits,$(demo_port)),)
$(error DEMO_PORT=$(DEMO_PORT) is not a port number: give digits, e.g. make serve-demo DEMO_PORT=8001 (unset: 8000))
endif
endif
serve-demo: $(VENV)/.installed
	$(BIN)/scrape-assets serve-demo --port $(demo_port)

## make bench: set up with the bench extra (Scrapy, psutil, py-spy), run every benchmark, write BENCHMARKS.md
## (1,000 and 10,000 pages, concurrency 8/16/64, 3 pipeline runs each, profiles; 12-40 min on 2 cores). make bench-quick: 1,000 pages, c=16.
$(VENV)/.bench-installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e ".[test,bench]"
	touch $@

bench: $(VENV)/.bench-installed
	$(BIN)/python -m benchmarks.run

bench-quick: $(VENV)/.bench-installed
	$(BIN)/python -m benchmarks.run --quick

clean:
	rm -rf data .dagster_home
