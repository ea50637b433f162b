# make run   : install what is needed and start ringlet's main job
# make test  : install what is needed and run lint plus the whole test suite
# make lint  : ruff, pyright and import-linter
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/python -m ringlet.demo

lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/lint-imports
	$(BIN)/pyright

test: lint
	$(BIN)/pytest

bench: $(STAMP)
	$(BIN)/python bench/loop_overhead.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
