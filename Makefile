# Two commands for a newcomer:
#   make demo   create .venv, install capstack, run the demo pipeline on the shapes data
#   make test   create .venv, install capstack with its test extra, run the test suite
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# pip on this kind of machine warns about every local index folder it skips: keep the output readable.
QUIET_PIP := sed -u "/is ignored: it is neither a file nor a directory/d"

.PHONY: demo test test-slow install bench clean-demo

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	@echo "Installing capstack and its dependencies into $(VENV) (torch is large: a few minutes the first time)..."
	$(BIN)/python -m pip install -q -e '.[test]' 2>&1 | $(QUIET_PIP)
	touch $@

install: $(VENV)/.installed

demo: install
	$(BIN)/capstack demo

test: install
	$(BIN)/python -m pytest -q

test-slow: install  # the tests marked slow: torchrun jobs, killed runs, whole pipelines
	$(BIN)/python -m pytest -q -m slow

bench: install
	$(BIN)/python benchmarks/stage_engine.py

clean-demo:
	rm -rf data .capstack stages.lock
