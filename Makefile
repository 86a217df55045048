# The two commands of the README:
#   make demo   set up (virtual environment) and run the main job on the embedded default
#   make test   set up and run the quality gates and the whole test suite
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test tools lint typecheck pytest setup clean

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

# docker-compose validates docker-compose.yml offline (Debian's package; no Docker engine needed).
tools:
	@command -v docker-compose >/dev/null 2>&1 || apt-get install -y -qq --no-install-recommends docker-compose >/dev/null 2>&1 \
	  || (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq --no-install-recommends docker-compose >/dev/null 2>&1) \
	  || echo "docker-compose could not be installed: the compose check will be skipped"

test: tools lint typecheck pytest

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
