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

.PHONY: setup triton demo test bench clean gpu-validate

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

test: setup triton
	$(BIN)/python -m pytest

# On an NVIDIA GPU machine: the GPU tests and the GPU benchmark (docs/gpu-validation.md),
# in a virtualenv of its own with the GPU builds of onnxruntime and TensorRT.
gpu-validate:
	$(MAKE) setup VENV=.venv-gpu REQUIREMENTS=requirements-gpu.txt
	PYTHON=.venv-gpu/bin/python scripts/gpu_validate.sh

clean:
	rm -rf $(VENV) .venv-gpu $(TRITON_HOME) checkpoints exports/*/ reports
