PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt

.PHONY: demo test lint bench bench-quick clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

# A stamp per extra set: reinstall only when the metadata or the pins change.
$(VENV)/.installed-%: setup.cfg setup.py constraints.txt | $(VENV)/bin/python
	$(PIP) -e ".[$*]"
	touch $@

demo: $(VENV)/.installed-demo
	$(PY) -m parallelenv.demo

test: $(VENV)/.installed-test
	$(PY) -m pytest

lint: $(VENV)/.installed-test
	$(PY) -m ruff check parallelenv tests benchmarks

bench: $(VENV)/.installed-bench
	$(PY) -m benchmarks

bench-quick: $(VENV)/.installed-bench
	$(PY) -m benchmarks --quick

clean:
	rm -rf $(VENV) build *.egg-info
