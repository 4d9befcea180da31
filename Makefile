# Two entry points (see README): `make demo` and `make test`. Both set up .venv first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup system demo test lint js bench

setup: $(VENV)/.installed

# torch==2.13.0 first: it is the CPU build on disk; a bare `torch` would fetch a CUDA build.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e ".[test]"
	touch $@

demo: setup
	$(BIN)/fsdpviz demo -o fsdpviz-demo.html

# Python (ruff, mypy) and the TypeScript in js/ (biome: lint and format; `npm run format`
# in js/ rewrites it).
lint: setup js/node_modules/.package-lock.json
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	cd js && npm run --silent lint

# js/'s tools, installed from the lock file.
js/node_modules/.package-lock.json: js/package-lock.json
	cd js && npm ci --no-audit --no-fund

# The widget front end: install from the lock file, type-check and unit-test (vitest),
# then bundle into fsdpviz/static/ (what the Python widget tests load).
js:
	cd js && npm ci --no-audit --no-fund && npm test && npm run build

# Chromium for static image export (kaleido) and the browser tests (Playwright drives the
# system Chromium; no browser download). Installed with apt-get when missing (needs root).
system:
	@command -v chromium >/dev/null 2>&1 || { \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; }

test: system lint js
	$(BIN)/pytest

bench: setup
	$(BIN)/python benchmarks/bench_analyze_70b.py
