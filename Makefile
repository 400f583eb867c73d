# Set-up and the two jobs. Every target installs what it needs into .venv first, so
# `make demo` and `make test` are all a fresh machine needs.
PYTHON ?= python3
VENV   ?= .venv
REQUIREMENTS ?= requirements.txt
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# a real Triton server (nvidia-pytriton's tritonserver 2.51, CPU) for tests/test_triton_server.py
TRITON_HOME ?= .triton
TRITON_STAMP := $(TRITON_HOME)/.installed

.PHONY: setup triton demo test quality bench clean gpu-validate

$(STAMP): $(REQUIREMENTS) pyproject.toml libs/*/pyproject.toml backends/*/pyproject.toml plugins/*/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r $(REQUIREMENTS)
	touch $(STAMP)

setup: $(STAMP)

$(TRITON_STAMP): scripts/triton_setup.sh $(STAMP)
	scripts/triton_setup.sh $(VENV) $(TRITON_HOME)
	touch $(TRITON_STAMP)

triton: $(TRITON_STAMP)

demo: setup
	$(BIN)/zoo demo

# Test files run in parallel worker processes (pytest-xdist), one file per worker at a time
# so that a file's module fixtures (exports, servers) are built once: on a fresh clone, 12 min
# (11:54, 2545 tests) on the 2-core AMD EPYC and 21-22 min on the 2-core Intel Xeon (both
# 2026-11-29; 1398 and 2495 worker-seconds, both workers busy 97-98% of it), 13-20
# on earlier, smaller suites by CPU, against 29 in one process; each worker's
# torch runs one thread, and the workers share one ONNX cache (tests/conftest.py). Files go out
# in collection order, the slowest first (tests/conftest.py: SLOWEST_FIRST), not xdist's
# own by number of tests. One worker per core: 3 workers on 2 cores took 23 min (the Ray
# sweep test alone 639 s instead of 97). TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= auto
test: setup triton
	$(BIN)/python -m pytest -m "not slow" -n $(TEST_WORKERS) --maxprocesses 4 --dist loadfile --no-loadscope-reorder

# The quality tier: every trainable model at full size over its seeds, held to its recipe's
# target (writes docs/reports/quality.json and the table in docs/models.md), then the tests
# that need a model trained at full size (marked `slow`). CI runs it after `make test`.
quality: setup
	$(BIN)/python tools/quality.py --docs docs/models.md
	$(BIN)/python -m pytest -m slow

# On an NVIDIA GPU machine: the GPU tests and the GPU benchmark (docs/gpu-validation.md),
# in a virtualenv of its own with the GPU builds of onnxruntime and TensorRT.
gpu-validate:
	$(MAKE) setup VENV=.venv-gpu REQUIREMENTS=requirements-gpu.txt
	PYTHON=.venv-gpu/bin/python scripts/gpu_validate.sh

clean:
	rm -rf $(VENV) .venv-gpu $(TRITON_HOME) checkpoints exports/*/ reports
