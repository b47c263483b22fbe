# taugrid — two commands on a fresh machine: `make run` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export TAU_DATA_DIR ?= $(HOME)/.tau

.PHONY: run test bench down install lint clean

$(STAMP): pyproject.toml
	@echo "==> creating $(VENV) and installing taugrid (with test tools)"
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	@touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/tau up
	$(BIN)/tau run examples/quickstart --follow
	@echo "==> the stack stays up: try '$(BIN)/tau list', '$(BIN)/tau events --run <RUN>', 'make down'"

down: $(STAMP)
	$(BIN)/tau down

test: $(STAMP)
	$(BIN)/python -m pytest -q
	$(BIN)/lint-imports

bench: $(STAMP)
	$(BIN)/python bench/engine_cycle.py
	$(BIN)/python bench/kueue_scenario.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
