# make test: a fresh .venv, torch==2.13.0 first (a CPU build; a bare `torch` could fetch a CUDA
# one), then the package with its test extras, then ruff and the test suite.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin

.PHONY: test lint install demo bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/pip install --quiet torch==2.13.0

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

install: $(VENV)/.installed

lint: install
	$(BIN)/ruff check attn_zoo ablations tests
	$(BIN)/ruff format --check attn_zoo ablations tests

test: lint
	$(BIN)/python -m pytest

# The main job: train the demo grid (resumable: run it again to finish or skip), write its report.
demo: install
	$(BIN)/attn-zoo ablate run ablations/grids/demo.toml
	$(BIN)/attn-zoo report ablations/grids/demo.toml --out reports/demo --target 0.9

bench: install
	$(BIN)/attn-zoo bench

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis results
