# The README's two commands: `make demo` and `make test`. Each installs what is missing first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev
RUN_DIR ?= runs/demo
# the flagship method at a small size (about 1 min on 2 quiet cores): a 2-layer MDLM pretrained on an 8-slot needle task
# (700 steps), then fine-tuned 200 steps with and without the mask-agnostic TV term from the same checkpoint;
# prints both side by side by the number of appended masks, the training-length boundary marked

.PHONY: install demo test test-slow bench bench-quick kvpress-env lint docs clean

# a venv's own pip may be old (Python 3.11's 23.2 resolves this project's ~140 packages in about 60 s, pip 25+ in about
# 35 s): it is upgraded first, and the install goes on with the old one where that cannot be done (offline, say).
# --no-compile: the install skips byte-compiling every package (a minute on 2 cores); the test run compiles what it
# imports once and keeps it (PYTHONDONTWRITEBYTECODE is unset for it), so later processes read the cached bytecode
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	-$(BIN)/python -m pip install --quiet --disable-pip-version-check --upgrade 'pip>=25'
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-compile -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python tools/experiments/mask_agnostic.py --size demo --out $(RUN_DIR)
	@echo "demo table: $(RUN_DIR)/table.md, sweeps: $(RUN_DIR)/summary.json, plot: $(RUN_DIR)/map.png, runs: $(RUN_DIR)/runs"

test: $(STAMP)
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest -m "not slow" -q -n 2 --dist worksteal --durations=15

test-slow: $(STAMP)
	$(BIN)/python -m pytest -m slow -q --durations=15

KVPRESS_VENV ?= .venv-kvpress

$(KVPRESS_VENV)/bin/python: tools/bench/kvpress_env.sh
	tools/bench/kvpress_env.sh $(VENV) $(KVPRESS_VENV)

kvpress-env: $(KVPRESS_VENV)/bin/python

bench: $(STAMP) $(KVPRESS_VENV)/bin/python
	$(BIN)/python tools/bench/run_all.py

bench-quick: $(STAMP)
	$(BIN)/python tools/bench/run_all.py --quick --out runs/BENCHMARKS.quick.md

lint: $(STAMP)
	$(BIN)/ruff check .

# the docs site into site/ (`$(BIN)/mkdocs serve` previews it live); NO_MKDOCS_2_WARNING quiets the material theme's
# banner about MkDocs 2.0
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

clean:
	rm -rf runs outputs multirun site
