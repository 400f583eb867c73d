# Set-up and the two jobs. Every target installs what it needs into .venv first, so
# `make demo` and `make test` are all a fresh machine needs.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup demo test bench clean

$(STAMP): requirements.txt pyproject.toml backends/*/pyproject.toml plugins/*/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements.txt
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(BIN)/zoo demo

test: setup
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) checkpoints exports/*/ reports
