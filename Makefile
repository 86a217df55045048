# The two commands of the README:
#   make demo   set up (virtual environment) and run the main job on the embedded default
#   make test   set up and run the quality gates and the whole test suite
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint typecheck pytest setup clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# One pip command for everything, so nothing resolves a CUDA torch on its own.
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/mgrpo demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy shared_store services mgrpo planner_trainer subagent_trainer

pytest: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test: lint typecheck pytest

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
