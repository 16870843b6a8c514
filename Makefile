# The README's two commands: `make demo` and `make test`. Each installs what is missing first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev
RUN_DIR ?= runs/demo

.PHONY: install demo test test-slow bench lint clean

$(STAMP): pyproject.toml setup.py
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m framework.train recipe=char_lm threads=2 hydra.run.dir=$(RUN_DIR)
	@echo "demo results: $(RUN_DIR)/results.json (logs in $(RUN_DIR)/csv, checkpoints in $(RUN_DIR)/checkpoints)"

test: $(STAMP)
	$(BIN)/python -m pytest -m "not slow" -q

test-slow: $(STAMP)
	$(BIN)/python -m pytest -m slow -q

bench: $(STAMP)
	$(BIN)/python tools/bench/run_all.py

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf runs outputs multirun
