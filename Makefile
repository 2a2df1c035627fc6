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

# mypy checks src/furnace: furnace.runtime strictly, the rest with mypy's default checks
# (pyproject.toml, [tool.mypy])
lint: install
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/mypy

# The suite runs twice, with 2 and with 1 torch/OpenMP threads: kernels round differently
# with the thread count (SDPA's backward, BLAS blocking), so a tolerance that only holds
# at one count must fail here, not on a user's machine. Tests marked thread_independent
# (argument parsing, process launch, planners, simulators) compute nothing whose rounding
# depends on threads, so the second pass skips them to keep CI inside its time limit.
test: lint
	OMP_NUM_THREADS=2 $(BIN)/python -m pytest -q
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -m "not thread_independent"

bench: install
	$(BIN)/python benchmarks/run.py

clean:
	rm -rf $(VENV) results build src/*.egg-info .pytest_cache
