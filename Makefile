PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test check demo lint format bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Every compiled module's source: an edited one is built again by the next make test or demo.
$(STAMP): pyproject.toml setup.py $(wildcard proxy/*/*.c proxy/core/native/* proxy/handler/hitpath/*) | $(BIN)/python
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/pytest -n auto --maxprocesses=2

# The inner loop: every unit and live test but those marked slow or perf (CI runs them all).
check: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/pytest -n auto --maxprocesses=2 -m "not slow and not perf"

demo: $(STAMP)
	$(BIN)/onehit-loadgen demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: $(STAMP)
	$(BIN)/pip install --quiet -e '.[test,bench]'
	$(BIN)/python benchmarks/bench_filter.py
	$(BIN)/python benchmarks/bench_simulate.py
	$(BIN)/python benchmarks/bench_proxy.py
	$(BIN)/python benchmarks/bench_miss.py
	$(BIN)/python benchmarks/bench_hostile.py
	$(BIN)/python benchmarks/bench_collector.py

clean:
	rm -rf $(VENV) reports .pytest_cache .ruff_cache .hypothesis
