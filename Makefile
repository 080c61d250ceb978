# Two entry points (see README): `make demo` runs the main job, `make test` runs the tests.
# Each creates .venv with everything the project needs if it is missing.
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint install clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	PATH="$(abspath $(VENV))/bin:$$PATH" bash recipes/an4/run.sh --quick

test: $(STAMP)
	$(PY) -m pytest --durations=15

lint: $(STAMP)
	$(VENV)/bin/ruff check asr tests bench recipes
	$(VENV)/bin/ruff format --check asr tests

clean:
	rm -rf $(VENV) exp data
