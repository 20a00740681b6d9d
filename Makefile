# Two commands for a newcomer:
#   make demo   create .venv, install capstack, run the demo pipeline on the shapes data
#   make test   create .venv, install capstack with its test extra, run the test suite
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Exact versions of everything pip installs (`make lock` refreshes it); pyproject.toml keeps the
# ranges that library users install against.
LOCK := requirements.lock
# pip on this kind of machine warns about every local index folder it skips: keep the output readable.
QUIET_PIP := sed -u "/is ignored: it is neither a file nor a directory/d"

.PHONY: demo demo-full test test-slow install bench figures demo-check lock clean-demo

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml $(LOCK) Makefile | $(BIN)/python
	@echo "Installing capstack and its dependencies into $(VENV) (torch is large: a few minutes the first time)..."
	$(BIN)/python -m pip install -q -c $(LOCK) -e '.[test,tensorboard]' 2>&1 | $(QUIET_PIP)
	touch $@

install: $(VENV)/.installed

demo: install  # the demo's table: shapes, features, XE then RL for top_down and show_tell
	$(BIN)/capstack demo

demo-full: install  # every approach of the papers: XE, RL, adversarial (reports/metrics.md)
	$(BIN)/capstack run tables --with-deps

test: install  # the linter and the type checker (pyproject's [tool.ruff], [tool.mypy]), the suite
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -q

test-slow: install  # the tests marked slow: torchrun jobs, killed runs, whole pipelines
	$(BIN)/python -m pytest -q -m slow

figures: install  # rerun what README.md and docs/ show, rewrite their generated blocks
	$(BIN)/python docs/figures.py

# CI: the demo in this folder (a fresh clone), its stores in a fresh root, then README's demo
# blocks compared with what it printed (times apart).
DEMO_CHECK := build/demo-check
demo-check: install
	rm -rf $(DEMO_CHECK) && mkdir -p $(DEMO_CHECK)
	CAPSTACK_FEATURES=$(CURDIR)/$(DEMO_CHECK)/features $(MAKE) --no-print-directory demo | tee $(DEMO_CHECK)/transcript.txt
	$(BIN)/python docs/figures.py --check --workdir . --transcript $(DEMO_CHECK)/transcript.txt --features $(DEMO_CHECK)/features

bench: install
	$(BIN)/python benchmarks/stage_engine.py

lock:  # resolve pyproject's ranges afresh in a scratch venv, write the exact versions
	rm -rf build/lock-venv && $(PYTHON) -m venv build/lock-venv
	build/lock-venv/bin/python -m pip install -q '.[test,tensorboard]' 2>&1 | $(QUIET_PIP)
	{ echo "# make lock: exact versions for 'pip install -c $(LOCK)' ($$($(PYTHON) --version), $$(uname -m))"; \
	  build/lock-venv/bin/python -m pip freeze --exclude-editable | grep -iv '^capstack'; } > $(LOCK)
	rm -rf build/lock-venv build/lib build/bdist*
	@echo "-> $(LOCK): commit it, then 'make install' reinstalls from it"

clean-demo:
	rm -rf data .capstack stages.lock runs evals reports
