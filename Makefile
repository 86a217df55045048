# The two commands of the README:
#   make demo   set up (virtual environment) and run the main job on the embedded default
#   make test   set up and run the quality gates and the whole test suite
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test tools lint typecheck pytest setup clean compose-test warmstart

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# One pip command for everything, so nothing resolves a CUDA torch on its own. Byte-compiled at
	# install (40 s of the 77 s): with PYTHONDONTWRITEBYTECODE set, as on our machines, nothing is
	# compiled later and every process would compile torch again (a test run took 24.5 min, not 14).
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/mgrpo demo

# rebuild the shipped default warm starts (mgrpo/shipped/) from scratch: after a change to their recipe
warmstart: $(STAMP)
	$(BIN)/mgrpo warmstart --rebuild

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

# `docker compose up` for real on a machine without an image registry (root; Debian's packages):
# a Docker engine, a base image from debootstrap, a wheelhouse, then the compose test.
compose-test: $(STAMP) tools
	@(command -v dockerd && command -v debootstrap) >/dev/null 2>&1 || apt-get install -y -qq --no-install-recommends docker.io debootstrap >/dev/null 2>&1 \
	  || (apt-get update -qq && apt-get install -y -qq --no-install-recommends docker.io debootstrap >/dev/null)
	@docker info >/dev/null 2>&1 || { (dockerd >/tmp/mgrpo-dockerd.log 2>&1 &); for i in $$(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done; }
	PYTHON=$(BIN)/python tests/deploy/offline_images.sh mgrpo-base:bookworm
	MGRPO_BASE_IMAGE=mgrpo-base:bookworm MGRPO_REDIS_IMAGE=mgrpo-base:bookworm \
	  $(BIN)/python -m pytest -m docker -s tests/deploy/test_compose_up.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
