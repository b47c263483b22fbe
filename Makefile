# taugrid — two commands on a fresh machine: `make run` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
# setuptools warns on every editable install of a package-dir mapping (taugrid = libs/taugrid) that folders named
# like the package may shadow it, and pip prints the build backend's warnings: nothing to act on, so not shown.
QUIET_PIP := PYTHONWARNINGS=ignore $(BIN)/pip install --quiet
# The data dir is the CLI's default (taugrid.settings: /var/lib/taugrid for root, else ~/.tau) unless
# TAU_DATA_DIR is set, so `make run`, `make down` and a later `tau` agree on it.

.PHONY: run test test-slow bench down install lint clean image bytecode

# `make run` installs only what running needs; `make test` adds the test extra (pytest, kmock, and the
# helm/kubectl layer the chart tests use) on top of the same venv.
$(STAMP): pyproject.toml
	@echo "==> creating $(VENV) and installing taugrid"
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(QUIET_PIP) -e .
	@touch $(STAMP)

$(TEST_STAMP): $(STAMP)
	@echo "==> installing the test tools"
	$(QUIET_PIP) -e '.[test]'
	@touch $(TEST_STAMP)

install: $(STAMP)

# taugrid's own modules compiled once (the editable install leaves them as source): every service process and
# every `tau` call would otherwise compile them again where PYTHONDONTWRITEBYTECODE is set, about 0.2 s of CPU
# each. Only changed files are compiled again; a stale .pyc is never used (Python checks the source's mtime).
bytecode: $(STAMP)
	@$(BIN)/python -m compileall -q -j 0 libs services tests bench >/dev/null

run: $(STAMP) bytecode
	$(BIN)/tau up
	$(BIN)/tau run examples/quickstart --follow
	@echo "==> the stack stays up: open the web portal link 'tau up' printed above ('$(BIN)/tau portal' prints a new one), try '$(BIN)/tau top', '$(BIN)/tau list', 'make down'"

down: $(STAMP)
	$(BIN)/tau down

# The non-Python client of tests/e2e/test_node_client.py (the `nats` npm package, pinned by package-lock.json).
NODE_CLIENT := tests/contract/node
$(NODE_CLIENT)/node_modules/.package-lock.json: $(NODE_CLIENT)/package-lock.json
	@echo "==> installing the Node.js contract client (npm ci)"
	cd $(NODE_CLIENT) && npm ci --no-audit --no-fund --silent

# The suite on TEST_WORKERS pytest-xdist workers. Most of its time is spent waiting on servers, subprocesses and
# runs rather than computing, so three workers pay on two cores. A module's tests stay on one worker, in file order
# (--dist loadfile), the e2e modules on two `tau up` stacks, each one worker's, handed out first (tests/conftest.py:
# scope_of). TEST_WORKERS=0 runs it all in one process, as plain `pytest` does.
TEST_WORKERS ?= 3
test: lint bytecode $(NODE_CLIENT)/node_modules/.package-lock.json
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# The slow suite (pytest -m slow; `make test` leaves it out): tests/e2e/test_elastic_torch.py runs an elastic torchrun
# run with real PyTorch on the CPU. Its runs use .venv-torch, built from the system's Python 3.11 (an interpreter a
# workspace's run user may run, unlike one under root's home) with torch==2.13.0: on this kind of machine pip takes
# PyTorch's CPU build of that version from a wheel on disk (192 MB; about 900 MB installed, 30 s with an idle CPU),
# where PyPI's default build is CUDA's (a 555 MB wheel and about 3 GB of nvidia-* and cuda-* wheels, which it needs
# even to import).
TORCH_VENV := .venv-torch
TORCH_PY ?= $(firstword $(wildcard /usr/bin/python3.11) $(PY))
$(TORCH_VENV)/.installed:
	@echo "==> creating $(TORCH_VENV) with PyTorch's CPU build"
	test -x $(TORCH_VENV)/bin/python || $(TORCH_PY) -m venv $(TORCH_VENV)
	PYTHONWARNINGS=ignore $(TORCH_VENV)/bin/pip install --quiet torch==2.13.0
	@touch $@

# tests/e2e/test_elastic_ray.py runs an elastic Ray run on a real Ray cluster (a head pod and worker pods): its runs
# use .venv-ray, the same system Python with plain ray from PyPI (an 80 MB manylinux wheel; no dashboard extras).
RAY_VENV := .venv-ray
$(RAY_VENV)/.installed:
	@echo "==> creating $(RAY_VENV) with Ray"
	test -x $(RAY_VENV)/bin/python || $(TORCH_PY) -m venv $(RAY_VENV)
	PYTHONWARNINGS=ignore $(RAY_VENV)/bin/pip install --quiet ray==2.60.0
	@touch $@

test-slow: $(TEST_STAMP) bytecode $(TORCH_VENV)/.installed $(RAY_VENV)/.installed
	TAU_TEST_TORCH_PYTHON=$(abspath $(TORCH_VENV))/bin/python TAU_TEST_RAY_PYTHON=$(abspath $(RAY_VENV))/bin/python \
		$(BIN)/python -m pytest -q -m slow tests/e2e

# Static checks, first and cheap: ruff's lint rules (no reformatting), the import-linter contracts
# (docs/architecture.md §14) and mypy (its cache in .mypy_cache makes a second run take seconds).
# mypy finds the services package by its import name through a link (see [tool.mypy] in pyproject.toml).
TYPECHECK_LINK := build/typecheck/taugrid_services
$(TYPECHECK_LINK):
	mkdir -p $(dir $@) && ln -sfn ../../services $@

lint: $(TEST_STAMP) $(TYPECHECK_LINK)
	$(BIN)/ruff check libs services tests bench
	$(BIN)/lint-imports
	$(BIN)/mypy

# Each bench exits 1 when it misses a target; all of them run, and `make bench` fails if any did. slurm_peer.py
# installs Debian's slurm-wlm when it is absent and this runs as root with apt-get (as .ci/run installs chromium).
bench: $(TEST_STAMP) bytecode
	@status=0; \
	$(BIN)/python bench/engine_cycle.py || status=1; \
	$(BIN)/python bench/fuzz_config.py || status=1; \
	$(BIN)/python bench/pipeline.py || status=1; \
	$(BIN)/python bench/kueue_scenario.py || status=1; \
	$(BIN)/python bench/kueue_tas_engine.py || status=1; \
	$(BIN)/python bench/kueue_tas_scenario.py || status=1; \
	$(BIN)/python bench/kueue_large_scenario.py || status=1; \
	$(BIN)/python bench/health_chain.py || status=1; \
	$(BIN)/python bench/bus_chaos.py || status=1; \
	$(BIN)/python bench/priority_lanes.py || status=1; \
	$(BIN)/python bench/rss_flat.py || status=1; \
	$(BIN)/python bench/replay.py || status=1; \
	$(BIN)/python bench/slurm_peer.py --install || status=1; \
	exit $$status

# The one image (deploy/Dockerfile) with whichever container builder this machine has.
VERSION := $(shell sed -n 's/^__version__ = "\(.*\)"/\1/p' libs/taugrid/__init__.py)
IMAGE ?= ghcr.io/taugrid/taugrid:$(VERSION)
BUILDER ?= $(firstword $(foreach b,docker podman buildah,$(if $(shell command -v $(b) 2>/dev/null),$(b))))

image:
	@if [ -z "$(BUILDER)" ]; then \
	  echo "make image: no container builder found (looked for docker, podman, buildah); install one," \
	       "or build deploy/Dockerfile elsewhere (e.g. in CI) and push it as $(IMAGE)" >&2; exit 1; fi
	@echo "==> building $(IMAGE) with $(BUILDER)"
	@if [ "$(notdir $(BUILDER))" = buildah ]; then \
	  $(BUILDER) bud -f deploy/Dockerfile -t $(IMAGE) . ; \
	else \
	  $(BUILDER) build -f deploy/Dockerfile -t $(IMAGE) . ; \
	fi

clean:
	rm -rf $(VENV) $(TORCH_VENV) $(RAY_VENV) .pytest_cache .hypothesis .mypy_cache .ruff_cache build/typecheck
