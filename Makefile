PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt

.PHONY: demo test test-pythons test-frameworks test-long soak lint docs bench bench-quick bench-tensor compat gpu-wheels gpu-check clean

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
# Every stage runs whatever the one before did, and make test ends with the
# worst status of them (pytest's: 1 failed tests, 2 interrupted, ...).
# Deadlines stretch with the machine's load (tests/conftest.py, slowness).
# The other stage is made through a variable: make runs a recipe line that names $(MAKE) itself
# even under -n, and this line runs pytest too.
TEST_WORKERS ?= 2
SUBMAKE = $(MAKE) --no-print-directory
test: $(VENV)/.installed-test
	@status=0; \
	$(PY) -m pytest -n $(TEST_WORKERS) -m "not long" || status=$$?; \
	$(SUBMAKE) test-pythons || { s=$$?; [ $$s -gt $$status ] && status=$$s; }; \
	exit $$status

# The core suite on every other CPython the package claims (setup.cfg: 3.10+),
# each in its own .venv-3.X with the light test-core extra: torch from PyPI
# brings gigabytes of CUDA (the CPU build pinned here is the main venv's
# Python's), so the Ray, tensor and SB3 tests skip there and the rest runs
# on dummy, toy and subproc, in about a minute a version.
# A version this machine lacks is skipped with a line saying so.
PYTHONS ?= 3.10 3.11 3.12 3.13
CORE_TESTS ?= tests/test_conformance.py tests/test_gymnasium_view.py tests/test_sb3_view.py \
	tests/test_ids.py tests/test_policies.py tests/test_errors.py tests/test_lifecycle.py
PYENV_ROOT ?= $(HOME)/.pyenv
# python3.X on PATH may be a pyenv shim for a version pyenv has not selected,
# which only prints an error: take the first candidate that runs as 3.X.
python_for = $(firstword $(foreach p,$(shell command -v python$(1) 2>/dev/null) \
	$(wildcard $(PYENV_ROOT)/versions/$(1).*/bin/python$(1)),$(if $(shell $(p) -c \
	'import sys; sys.exit("%d.%d" % sys.version_info[:2] != "$(1)")' >/dev/null 2>&1 && echo ok),$(p))))
MAIN_PYTHON = $(shell $(if $(wildcard $(PY)),$(PY),$(PYTHON)) -c 'import sys; print("%d.%d" % sys.version_info[:2])')

test-pythons:
	@status=0; for v in $(PYTHONS); do \
		if [ "$$v" = "$(MAIN_PYTHON)" ]; then echo "Python $$v: make test's own suite in $(VENV), not run again"; \
		else $(MAKE) --no-print-directory test-python-$$v || { s=$$?; [ $$s -gt $$status ] && status=$$s; }; fi; \
	done; exit $$status

test-python-%:
	$(if $(call python_for,$*),@$(MAKE) --no-print-directory $(VENV)-$*/.installed-test-core \
		&& echo "Python $*: $(call python_for,$*)" \
		&& $(VENV)-$*/bin/python -m pytest -n $(TEST_WORKERS) -m "not long" -rfE $(CORE_TESTS), \
		@echo "Python $*: not found, skipped")

# Else make would delete it as an intermediate file after each run, and remake the venv.
.PRECIOUS: $(VENV)-%/bin/python
$(VENV)-%/bin/python:
	$(call python_for,$*) -m venv $(VENV)-$*

$(VENV)-%/.installed-test-core: setup.cfg setup.py constraints.txt | $(VENV)-%/bin/python
	$(VENV)-$*/bin/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e ".[test-core]"
	touch $@

# Frameworks whose pins clash with ours, each run on our entry points in a venv of its own, as
# make test-pythons runs the core suite: RLlib 2.60 pins gymnasium 1.2.2, so $(RLLIB_VENV) takes
# our pins but Gymnasium's, ray[rllib] and the CPU torch (tests/test_rllib.py: PPO with local and
# remote env runners over subproc and ray-subproc; it skips where RLlib is missing, as in $(VENV)).
RLLIB_VENV ?= $(VENV)-rllib
FRAMEWORK_TESTS ?= tests/test_rllib.py
test-frameworks: $(RLLIB_VENV)/.installed-rllib
	$(RLLIB_VENV)/bin/python -m pytest -rfE -p no:cacheprovider $(FRAMEWORK_TESTS)

$(RLLIB_VENV)/.installed-rllib: setup.cfg setup.py constraints.txt
	$(call python_for,$(MAIN_PYTHON)) -m venv $(RLLIB_VENV)
	grep -v '^gymnasium==' constraints.txt > $(RLLIB_VENV)/constraints.txt
	$(RLLIB_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -c $(RLLIB_VENV)/constraints.txt \
		-e ".[test-core]" "ray[rllib]" torch
	touch $@

test-long: $(VENV)/.installed-test
	$(PY) -m pytest -n $(TEST_WORKERS) -m long

# Every CPU backend (dummy, subproc, ray, ray-subproc) in turn for SOAK_MINUTES each
# (about 40 minutes in all), under faults with healing and recycling on: a table per
# backend of what was injected, what was logged, and the parent's and workers' memory,
# fds, threads, children and /dev/shm from start to end, PASS or FAIL on each.
# make test runs the same soak for seconds per backend (tests/test_soak.py).
SOAK_MINUTES ?= 10
soak: $(VENV)/.installed-test
	$(PY) -m soak --minutes $(SOAK_MINUTES) $(SOAK_ARGS)

lint: $(VENV)/.installed-test
	$(PY) -m ruff check parallelenv tests benchmarks soak

# The site in build/docs: the user guide (README.rst's sections, each on the
# page of docs/guide that goes on about its subject) and the API reference
# from the docstrings. -W: a warning fails the build; -E: every page
# is read again, so that a warning of an unchanged page is not skipped.
# tests/test_docs.py builds it the same way in `make test`.
docs: $(VENV)/.installed-docs
	$(PY) -m sphinx -W --keep-going -E -q -b html docs build/docs
	@echo "The site is in build/docs/index.html"

bench: $(VENV)/.installed-bench
	$(PY) -m benchmarks

bench-quick: $(VENV)/.installed-bench
	$(PY) -m benchmarks --quick

# The tensor backend, eager and compile=True, beside Gymnasium's NumPy CartPole, gymnax and the memory
# bound, interleaved in one run (benchmarks/tensor_peers.py). gymnax's JAX pins another Gymnasium than
# ours: it runs in $(GYMNAX_VENV), a venv of its own (benchmarks/gymnax_peer.py imports nothing of ours).
GYMNAX_VENV ?= $(VENV)-gymnax
bench-tensor: $(VENV)/.installed-bench $(GYMNAX_VENV)/.installed
	$(PY) -m benchmarks.tensor_peers --gymnax-python $(GYMNAX_VENV)/bin/python $(BENCH_TENSOR_ARGS)

$(GYMNAX_VENV)/.installed:
	$(call python_for,$(MAIN_PYTHON)) -m venv $(GYMNAX_VENV)
	$(GYMNAX_VENV)/bin/python -m pip install --quiet --disable-pip-version-check gymnax six
	touch $@

# Gymnasium's and SB3's own vector-env suites against our views (compat/run.py).
# Their tests are fetched outside the repository; where GitHub is out of
# reach, point GYMNASIUM_GIT at a local clone or mirror of Gymnasium.
GYMNASIUM_GIT ?= https://github.com/Farama-Foundation/Gymnasium.git
compat: $(VENV)/.installed-test
	GYMNASIUM_GIT=$(GYMNASIUM_GIT) $(PY) -m compat $(COMPAT_ARGS)

# The tensor backend on a CUDA device, for a machine with Python 3.12 and a CUDA torch but no
# Gymnasium and no network. Here, where the network is: make gpu-wheels fetches the wheels such a
# machine may lack into $(GPU_WHEELS) (ignored by git, about 20 MiB); carry that folder with the
# working tree. There: make gpu-check installs them offline into $(GPU_VENV), a venv that also sees
# every package of $(GPU_PYTHON) (a venv of its own, as such machines have, included: a .pth file,
# since --system-site-packages alone reaches only the base interpreter's), then runs the tensor
# tests and the gpu tests, checks the shipped tensor envs on cuda against the CPU and times CartPole
# at 65,536 / 1M / 16M envs eager and with compile=True, checking the compiled step against the eager
# one over 1,000 steps (benchmarks/gpu_check.py), writing $(GPU_REPORT). The compiled step needs the
# machine's CUDA torch to bring triton (its wheels do); nothing more is fetched for it.
GPU_WHEELS ?= .gpu-wheels
GPU_PYTHON ?= python3
GPU_PYTHON_VERSION ?= 3.12
GPU_VENV ?= .venv-gpu
GPU_REPORT ?= build/gpu-check/gpu-check.md
GPU_PACKAGES ?= gymnasium cloudpickle pytest pytest-timeout hypothesis psutil
GPU_PLATFORMS := $(foreach p,manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64,--platform $(p))

gpu-wheels: | $(VENV)/bin/python
	$(PY) -m pip download --quiet --disable-pip-version-check --only-binary=:all: --implementation cp \
		--python-version $(GPU_PYTHON_VERSION) $(GPU_PLATFORMS) -c constraints.txt -d $(GPU_WHEELS) $(GPU_PACKAGES)
	@du -sh $(GPU_WHEELS)

gpu-check:
	@test -d $(GPU_WHEELS) || { echo "no $(GPU_WHEELS): run make gpu-wheels where the network is, and carry it"; exit 1; }
	@# Where the interpreter has no ensurepip, the venv gets no pip: the machine's own pip installs into it.
	$(GPU_PYTHON) -m venv --system-site-packages $(GPU_VENV) \
		|| $(GPU_PYTHON) -m venv --system-site-packages --without-pip $(GPU_VENV)
	$(GPU_PYTHON) -c 'import site; print("\n".join(site.getsitepackages()))' \
		> $$($(GPU_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/gpu-check-host.pth
	if [ -x $(GPU_VENV)/bin/pip ]; then pip="$(GPU_VENV)/bin/python -m pip"; \
		else pip="$(GPU_PYTHON) -m pip --python $(GPU_VENV)/bin/python"; fi; \
		$$pip install --quiet --disable-pip-version-check --no-index --find-links $(GPU_WHEELS) $(GPU_PACKAGES)
	$(GPU_VENV)/bin/python -m benchmarks.gpu_check --out $(GPU_REPORT) $(GPU_CHECK_ARGS)

clean:
	rm -rf $(VENV) $(VENV)-3.* build *.egg-info
