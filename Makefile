# Furnace developer commands. `make test` is what CI runs (.ci/run).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install install-recsys-baselines demo test lint bench clean

install: $(STAMP)

# The TorchRec baseline is installed too, so that CI and `make demo` run it; the package
# works without it (its benchmark and tests then say it is skipped and why).
$(STAMP): pyproject.toml requirements/recsys-baselines.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[all,test]"
	$(MAKE) install-recsys-baselines
	touch $(STAMP)

# --no-deps: torchrec's wheel declares the CUDA fbgemm-gpu (requirements/recsys-baselines.txt)
install-recsys-baselines:
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -e ".[recsys-baselines]"
	$(BIN)/python -m pip install --quiet --no-deps -r requirements/recsys-baselines.txt

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
