# Furnace developer commands. `make test` is what CI runs (.ci/run).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test lint bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[all,test]"
	touch $(STAMP)

demo: install
	$(BIN)/furnace reproduce --quick --out results

lint: install
	$(BIN)/ruff check src tests benchmarks

test: lint
	$(BIN)/python -m pytest -q

bench: install
	$(BIN)/python benchmarks/run.py

clean:
	rm -rf $(VENV) results build src/*.egg-info .pytest_cache
