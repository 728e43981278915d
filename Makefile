# Quickstart targets: `make train` runs the main job, `make test` runs the test suite.
# Both create a virtual environment in $(VENV) with a Python >= 3.12 and install the project.
PYTHON ?= $(shell scripts/find_python.sh)
VENV ?= .venv
PYTEST_ARGS ?= -q -n 2

.PHONY: setup train test lint
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -n "$(PYTHON)"
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	$(VENV)/bin/python -m pip install -q -e ".[test,examples]"
	touch $@

train: setup
	$(VENV)/bin/python examples/train_lm.py

test: setup
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check .
