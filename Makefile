VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin

.PHONY: test demo bench-tables clean

$(BIN)/checkmate: pyproject.toml constraints-dev.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints-dev.txt -e ".[dev]"
	touch $@

test: $(BIN)/checkmate
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/mypy
	$(BIN)/pytest -q -n 2 --dist worksteal -m "not serial"  # two workers; an idle one takes queued tests from the other
	$(BIN)/pytest -q -m serial  # wall-clock bounds, alone on the machine

demo: $(BIN)/checkmate
	$(BIN)/python -m checkmate.demo

bench-tables: $(BIN)/checkmate  # every marked table of README.md, BENCHMARKS.md and docs/ from its stored rows
	$(BIN)/python benchmarks/doc_tables.py

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
