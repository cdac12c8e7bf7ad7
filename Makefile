PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt

.PHONY: demo test test-long lint docs bench bench-quick compat clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

# A stamp per extra set: reinstall only when the metadata or the pins change.
$(VENV)/.installed-%: setup.cfg setup.py constraints.txt | $(VENV)/bin/python
	$(PIP) -e ".[$*]"
	touch $@

demo: $(VENV)/.installed-demo
	$(PY) -m parallelenv.demo

# Two pytest workers: most tests wait on processes and Ray actors starting, so
# the suite takes about half as long on CI's two cores. The long runs of what
# the suite also runs short (the 20,000-step soak, PPO learning) are left to
# make test-long.
TEST_WORKERS ?= 2
test: $(VENV)/.installed-test
	$(PY) -m pytest -n $(TEST_WORKERS) -m "not long"

test-long: $(VENV)/.installed-test
	$(PY) -m pytest -n $(TEST_WORKERS) -m long

lint: $(VENV)/.installed-test
	$(PY) -m ruff check parallelenv tests benchmarks

# The site in build/docs: the user guide (README.rst's sections) and the API
# reference from the docstrings. -W: a warning fails the build; -E: every page
# is read again, so that a warning of an unchanged page is not skipped.
# tests/test_docs.py builds it the same way in `make test`.
docs: $(VENV)/.installed-docs
	$(PY) -m sphinx -W --keep-going -E -q -b html docs build/docs
	@echo "The site is in build/docs/index.html"

bench: $(VENV)/.installed-bench
	$(PY) -m benchmarks

bench-quick: $(VENV)/.installed-bench
	$(PY) -m benchmarks --quick

# Gymnasium's and SB3's own vector-env suites against our views (compat/run.py).
# Their tests are fetched outside the repository; where GitHub is out of
# reach, point GYMNASIUM_GIT at a local clone or mirror of Gymnasium.
GYMNASIUM_GIT ?= https://github.com/Farama-Foundation/Gymnasium.git
compat: $(VENV)/.installed-test
	GYMNASIUM_GIT=$(GYMNASIUM_GIT) $(PY) -m compat $(COMPAT_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
