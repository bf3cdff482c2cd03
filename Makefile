# The README commands: `make demo`, `make test` (lint + the fast tier) and `make test-all` (lint + every test: what CI
# runs, .ci/run). The tests set up .venv (the dev extra) on first use; the demo sets up .venv-demo, with only what
# it needs (the demo extra: no torch, no CUDA wheels). The tiers: pyproject.toml's markers, tests/conftest.py.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev
DEMO_VENV := .venv-demo
DEMO_STAMP := $(DEMO_VENV)/.installed-demo

# what runs under JetPack's Python 3.8 (agent/edgedeploy_agent/sidecar/__init__.py says why)
SIDECAR_38 := agent/edgedeploy_agent/__init__.py agent/edgedeploy_agent/sidecar/ agent/edgedeploy_agent/errors.py \
	agent/edgedeploy_agent/durable.py agent/edgedeploy_agent/gpu.py tests/agent/trt_double.py

.PHONY: demo test test-all lint schema clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	# .[dev] once had the cuda12 extra; its wheels share nvidia/cuda_* with the cuda11 ones (pyproject): drop
	# them and lay the cu11 files down again, or NVRTC 11.8 compiles against CUDA 12 headers
	@if $(BIN)/python -m pip show -q nvidia-cuda-runtime-cu12 >/dev/null 2>&1; then \
	  $(BIN)/python -m pip uninstall -y -q nvidia-cuda-nvrtc-cu12 nvidia-cuda-runtime-cu12 nvidia-cuda-nvcc-cu12 \
	    nvidia-cuda-cccl-cu12 cuda-bindings && \
	  $(BIN)/python -m pip install -q --force-reinstall --no-deps nvidia-cuda-nvrtc-cu11==11.8.89 \
	    nvidia-cuda-runtime-cu11==11.8.89 nvidia-cuda-nvcc-cu11==11.8.89; fi
	touch $(STAMP)

$(DEMO_STAMP): pyproject.toml
	$(PY) -m venv $(DEMO_VENV)
	$(DEMO_VENV)/bin/python -m pip install -q --upgrade pip
	$(DEMO_VENV)/bin/python -m pip install -q -e '.[demo]'
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(DEMO_VENV)/bin/edgedeploy demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	# the agent runs on Python 3.9 (JetPack 5 devices); its sidecar worker, and all it imports, on JetPack's 3.8
	$(BIN)/vermin -t=3.9- --no-tips --eval-annotations --violations agent/
	$(BIN)/vermin -t=3.8- --no-tips --violations $(SIDECAR_38)
	$(BIN)/hadolint containers/*.Dockerfile

# pytest exits 5 when it collects nothing: that is a failure here, never a pass.
PYTEST = rc=0; $(BIN)/python -m pytest $(1) || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing" >&2; exit 1; fi; exit $$rc

# the fast tier: no test that compiles a model or needs a service, root, emulation or hardware (`slow`); the 15
# slowest are listed, so that it stays fast
test: lint
	@$(call PYTEST,-m "not slow" --durations=15)

# every test; the 30 slowest are listed at the end
test-all: lint
	@$(call PYTEST,--durations=30)

schema: $(STAMP)
	$(BIN)/python -m edgedeploy.schema

clean:
	rm -rf $(VENV) $(DEMO_VENV) .pytest_cache .mypy_cache .ruff_cache
