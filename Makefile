# The two README commands: `make demo` and `make test`. Both set up .venv on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev

.PHONY: demo test lint schema clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/edgedeploy demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	# the agent runs on Python 3.9 (JetPack 5 devices)
	$(BIN)/vermin -t=3.9- --no-tips --eval-annotations --violations agent/
	$(BIN)/hadolint containers/*.Dockerfile

# pytest exits 5 when it collects nothing: that is a failure here, never a pass.
test: lint
	@$(BIN)/python -m pytest; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing" >&2; exit 1; fi; exit $$rc

schema: $(STAMP)
	$(BIN)/python -m edgedeploy.schema

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
