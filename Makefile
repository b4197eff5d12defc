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
# torchtitan 0.3.0: the slow tests read the torchtitan exports with its own ConfigManager. It is not in the
# dev extras because two of its dependencies, torchdata and torch_checkpointing, ask for torch >= 2.11,
# and pip would install that over TORCH_SPEC's torch (torch==2.7.1, say). So these go in with
# --no-deps, after the main install and after TORCHTITAN_DEPS: what its config loader imports that
# needs no torch, installed as usual, with triton and torchao, which it imports without declaring them
# (torchtitan.models.common imports triton kernels; its float8 converters need torchao). torchtitan
# needs Python 3.11: on 3.10 it is not installed and its tests skip.
TORCHTITAN_NO_DEPS := torchtitan==0.3.0 torchdata==0.11.0 torch_checkpointing==0.1.1 spmd_types==0.2.3 torchao==0.18.0 \
	datasets==4.7.0
# datasets (torchtitan asks for < 4.8) goes in without its dependencies too: it asks for huggingface_hub < 2,
# and pip would downgrade the hub that transformers 5 needs (>= 2.4), so the next `make test` could not
# import transformers; its other dependencies are here, and its torchtitan imports run with hub 2.4
TORCHTITAN_DEPS := tyro==1.0.17 tensorboard protobuf==7.36.2 einops triton==3.9.0 "pyarrow>=21.0.0" "dill>=0.3.0,<0.4.1" pandas \
	"httpx<1.0.0" "requests>=2.32.2" xxhash "multiprocess<0.70.19" "fsspec[http]>=2023.1.0,<=2026.2.0"
# Megatron-Bridge 0.3.1: the slow tests load the Bridge exports with its own recipes and checks. It pins
# transformers<5 (the main environment has 5) and CUDA-only packages (transformer-engine, mamba-ssm),
# so it goes, without its dependencies, into a folder of its own that only those tests put first on
# PYTHONPATH (tests/support/bridge_loader.py; it lists what it stands in for), with the pure-Python
# packages its config code imports.
BRIDGE_DIR := $(VENV)/bridge
BRIDGE_PKGS := megatron-bridge==0.3.1 transformers==4.57.6 tokenizers==0.22.2 huggingface_hub==0.36.2 \
	six==1.17.0 hydra-core==1.3.2 antlr4-python3-runtime==4.9.3 accelerate==1.16.0
# megatron-core 0.19.2: the slow tests read the Megatron-LM exports with Megatron-LM's own parse_args and
# validate_args, which the wheel ships (megatron/training) from 0.19; the main environment keeps 0.16. The
# wheel asks for Python >= 3.12, but its code imports on 3.11 with one shim (tests/support/megatron_loader.py
# lists it and what it patches), and the CPU torch here is for 3.11 only, so it goes, without its
# dependencies, into a folder of its own that only those tests put first on PYTHONPATH. What it imports
# beyond the main environment is triton, which TORCHTITAN_DEPS installs; like torchtitan, it needs Python
# 3.11 (on 3.10 it is not installed and its tests skip).
MEGATRON_DIR := $(VENV)/megatron
MEGATRON_PKGS := megatron-core==0.19.2

# nemo-toolkit 2.7.3, the last release with nemo.collections.llm (3.0 moved LLM training to Megatron-Bridge):
# the slow tests run the NeMo 2 exports' recipes with NeMo's own code (tests/support/nemo_loader.py says
# what it builds and the one kernel choice it turns off). It pins transformers 4.57 (the main environment
# has 5) and asks for CUDA packages, so it goes, without its dependencies, into a folder of its own that only
# those tests put first on PYTHONPATH, with what `from nemo.collections import llm` and its recipes import
# (nemo_run and its launchers' clients, lightning 2.4, fiddle, modelopt, ...); megatron-core comes from the
# main environment. About 40 s and 770 MB here. protobuf is pinned to the main environment's (TORCHTITAN_DEPS):
# tensorboard there, which lightning imports, refuses a runtime older than its generated code.
NEMO_DIR := $(VENV)/nemo
NEMO_PKGS := nemo-toolkit==2.7.3 nemo-run==0.11.1 lightning==2.4.0 pytorch-lightning==2.4.0 \
	lightning-utilities==0.15.3 torchmetrics==1.9.0 fiddle==0.3.1 absl-py==2.5.1 graphviz==0.21 \
	libcst==1.9.0 hydra-core==1.3.2 antlr4-python3-runtime==4.9.3 omegaconf==2.3.0 cloudpickle==3.1.3 \
	transformers==4.57.6 tokenizers==0.22.2 huggingface-hub==0.36.2 requests==2.34.2 urllib3==2.8.0 \
	idna==3.21 certifi==2026.10.19.post1 charset-normalizer==3.5.3 wrapt==2.5.2 ruamel.yaml==0.19.1 \
	text-unidecode==1.3 python-dateutil==4.0.0 six==1.17.0 wget==3.2 onnx==1.17.0 protobuf==7.36.2 \
	ml-dtypes==0.7.0 nv-one-logger-core==2.3.1 nv-one-logger-training-telemetry==2.3.1 \
	nv-one-logger-pytorch-lightning-integration==2.3.1 strenum==0.5.0 overrides==7.7.0 toml==0.10.2 \
	einops==0.8.2 sentencepiece==0.2.3 webdataset==1.0.2 braceexpand==0.1.7 pandas==3.1.1 pytz==2026.6 \
	tzdata==2026.6 datasets==3.6.0 dill==0.4.1 multiprocess==0.70.19 xxhash==4.1.0 pyarrow==26.0.1 \
	fsspec==2024.12.0 aiohttp==3.14.5 catalogue==2.0.10 inquirerpy==0.3.4 pfzy==0.3.4 \
	prompt-toolkit==3.0.53 wcwidth==0.9.5 fabric==3.2.3 invoke==3.0.3 paramiko==5.1.0 \
	cryptography==51.0.1 cffi==2.1.1 pycparser==3.12 bcrypt==5.0.0 pynacl==1.6.2 decorator==5.3.2 \
	deprecated==1.3.1 torchx==0.7.0 docker==7.2.0 typing-inspect==0.9.0 mypy-extensions==1.2.0 \
	pyre-extensions==0.0.32 docstring-parser==0.18.0 tabulate==0.10.0 importlib-metadata==8.7.1 \
	zipp==4.1.2 leptonai==0.26.6 fastapi==0.115.12 starlette==0.46.2 httpx==0.29.0 httpcore==1.0.9 \
	anyio==4.16.0 sniffio==1.3.1 h11==0.16.0 annotated-doc==0.0.7 loguru==0.7.3 contextlib2==21.6.0 \
	prometheus-fastapi-instrumentator==8.1.0 prometheus-client==0.26.0 uvicorn==0.55.0 \
	exceptiongroup==1.3.2 ledoc-ui==0.1.0 tiktoken==0.14.0 tensorstore==0.1.86 nvidia-modelopt==0.47.0 \
	pulp==3.3.2

.PHONY: demo test test-slow venv lint bench clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet -e ".[dev,plot]"
	touch $@

# torchtitan for the tests that read its exports (`make test-slow`); `make test` goes without it
$(VENV)/.torchtitan: $(VENV)/.installed
	if $(BIN)/python -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then \
		$(BIN)/python -m pip install --quiet $(TORCHTITAN_DEPS) && \
		$(BIN)/python -m pip install --quiet --no-deps $(TORCHTITAN_NO_DEPS); fi
	touch $@

# huggingface_hub 0.36 in Bridge's folder imports requests, which the main environment must hold
$(VENV)/.bridge: $(VENV)/.installed
	$(BIN)/python -m pip install --quiet "requests>=2.32.2"
	$(BIN)/python -m pip install --quiet --no-deps --target $(BRIDGE_DIR) $(BRIDGE_PKGS)
	touch $@

$(VENV)/.megatron: $(VENV)/.torchtitan
	if $(BIN)/python -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then \
		$(BIN)/python -m pip install --quiet --no-deps --target $(MEGATRON_DIR) --python-version 3.12 \
			--implementation cp --only-binary=:all: --ignore-requires-python $(MEGATRON_PKGS); fi
	touch $@

$(VENV)/.nemo: $(VENV)/.installed
	$(BIN)/python -m pip install --quiet --no-deps --target $(NEMO_DIR) $(NEMO_PKGS)
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
test-slow: venv $(VENV)/.torchtitan $(VENV)/.bridge $(VENV)/.megatron $(VENV)/.nemo
	NTP_BRIDGE_PATH=$(BRIDGE_DIR) NTP_MEGATRON_PATH=$(MEGATRON_DIR) NTP_NEMO_PATH=$(NEMO_DIR) \
		$(BIN)/python -m pytest -m slow

lint: venv
	$(BIN)/ruff check topologies cost_models ntp_planner tests benchmarks

bench: venv
	$(BIN)/python benchmarks/calibration.py
	$(BIN)/python benchmarks/speed.py

clean:
	rm -rf $(VENV) $(DEMO_DIR) .pytest_cache
