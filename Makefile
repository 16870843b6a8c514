# The README's two commands: `make demo` and `make test`. Each installs what is missing first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev
RUN_DIR ?= runs/demo
# the flagship recipe at a small size (~2 min on 2 cores): an 8-slot needle task, a 2-layer MDLM, mask-agnostic
# fine-tuning from step 700; prints accuracy vs the number of appended masks at the end
DEMO_ARGS ?= recipe=mdlm_mask_agnostic data.context_len=8 data.n_symbols=8 model.depth=2 trainer.max_steps=900 \
	module.extra_loss_after=700 scheduler.warmup_steps=100 trainer.val_check_interval=300

.PHONY: install demo test test-slow bench bench-quick lint clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m framework.train $(DEMO_ARGS) threads=2 hydra.run.dir=$(RUN_DIR)
	@echo "demo results: $(RUN_DIR)/results.json, table + plot: $(RUN_DIR)/mask_sweep.{json,png}"

test: $(STAMP)
	$(BIN)/python -m pytest -m "not slow" -q -n 2 --dist worksteal

test-slow: $(STAMP)
	$(BIN)/python -m pytest -m slow -q

bench: $(STAMP)
	$(BIN)/python tools/bench/run_all.py

bench-quick: $(STAMP)
	$(BIN)/python tools/bench/run_all.py --quick --out runs/BENCHMARKS.quick.md

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf runs outputs multirun
