# Two entry points: `make demo` and `make test`. Both create .venv on first use.
# torch comes from TORCH_SPEC: the default pin is a local CPU wheel here; on a GPU machine use
# e.g. `make test TORCH_SPEC='torch==2.7.1'`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_SPEC ?= torch==2.13.0
DEMO_DIR ?= demo-output
# `make test` runs its files on this many pytest-xdist workers (a file's tests stay on one worker,
# so module fixtures are built once); the executor's ranks fork from a server with torch imported
TEST_WORKERS ?= 2

.PHONY: demo test test-slow venv lint bench clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet -e ".[dev,plot]"
	touch $@

demo: venv
	mkdir -p $(DEMO_DIR)
	$(BIN)/ntp plan --model llama3-70b --cluster dgx-h100 --gpus 1024 --seq-len 8192 --global-batch 1024 \
		-o $(DEMO_DIR)/plan.json
	$(BIN)/ntp explain $(DEMO_DIR)/plan.json --json > $(DEMO_DIR)/explain.json
	@echo "demo outputs: $(DEMO_DIR)/plan.json $(DEMO_DIR)/explain.json"

test: venv
	$(BIN)/python -m pytest -m "not slow" -n $(TEST_WORKERS) --dist loadfile

# the slowest multi-process cases (a rank killed, hung or raising; torchrun; cases another fast test
# already covers in part): CI runs them after `make test`
test-slow: venv
	$(BIN)/python -m pytest -m slow

lint: venv
	$(BIN)/ruff check topologies cost_models ntp_planner tests benchmarks

bench: venv
	$(BIN)/python benchmarks/calibration.py
	$(BIN)/python benchmarks/speed.py

clean:
	rm -rf $(VENV) $(DEMO_DIR) .pytest_cache
