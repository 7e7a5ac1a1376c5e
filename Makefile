# Quick start: `make doctor` (ARGS=its arguments), `make test` (TESTS=paths, PYTEST_ARGS=arguments, below). Both create .venv/ on first use.
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.hostsync-installed
SGLANG_PIN := sglang==0.5.23
# Triton kernels run on the CPU through the interpreter; it must be set before import.
export TRITON_INTERPRET := 1

.PHONY: venv doctor test gpu clean

venv: $(STAMP)

$(STAMP): requirements/ci-lock.txt setup.py
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --no-deps -r requirements/ci-lock.txt
	$(VPY) -m pip install -q --no-deps $(SGLANG_PIN)
	$(VPY) -m pip install -q --no-deps -e .
	touch $(STAMP)

# ARGS: the doctor's arguments (make doctor ARGS="--speculative-algorithm EAGLE --attention-backend flashinfer").
ARGS ?=
doctor: $(STAMP)
	$(VPY) -m sglang_hostsync_plugin doctor $(ARGS)

# Unset, both give the CI command (.ci/run). PYTEST_ARGS adds pytest arguments
# (make test PYTEST_ARGS="-k doctor --durations=20"); TESTS replaces the paths, since a path in
# PYTEST_ARGS runs beside the whole of tests/ (make test TESTS=tests/test_config.py).
# JOBS: pytest-xdist workers (2: the suite's CPU work and its e2e tests' waits on fake servers overlap
# on CI's 2 cores); JOBS=0 runs in this one process (-s, --pdb).
TESTS ?= tests
PYTEST_ARGS ?=
JOBS ?= 2
test: $(STAMP)
	$(VPY) -m pytest -q -n $(JOBS) --dist worksteal $(TESTS) $(PYTEST_ARGS)

# On a CUDA machine (see scripts/gpu_run.sh for the device run).
gpu:
	bash scripts/gpu_run.sh

clean:
	rm -rf $(VENV) *.egg-info
