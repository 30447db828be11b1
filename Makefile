# Two entry points for a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

$(VENV)/.installed-%: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[$*]"
	touch $@

.PHONY: demo test
demo: $(VENV)/.installed-models
	$(VENV)/bin/remat demo

test: $(VENV)/.installed-test
	$(VENV)/bin/lint-imports  # the layers of docs/architecture.md: no circle, no upward import, no private name of another module
	$(PY) -m pytest -q -n 2 --dist loadfile  # two workers; a test file stays on one worker (its fixtures are built once)
