# Quick start: `make demo` and `make test` on a fresh machine.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q
# torch is pinned here (not in pyproject) to the CPU wheel this machine has locally;
# the package itself accepts any torch>=2.4,<3.
TORCH  ?= torch==2.13.0
# the suite runs in parallel workers, a file to a worker (module fixtures load once); each worker takes an
# equal share of the cores (tests/conftest.py). TEST_WORKERS=1 runs it in one process.
TEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile
# the suite starts many interpreters (the CLI's and the server's tests): sources byte-compiled once spare
# each of them compiling lmforge again where PYTHONDONTWRITEBYTECODE is set (~0.5 s a process here)
COMPILE := $(PY) -m compileall -q src

.PHONY: demo test test-slow test-all bench docs clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install $(TORCH)

$(VENV)/.installed: pyproject.toml | $(PY)
	$(PIP) install -e .
	touch $@

$(VENV)/.dev-installed: pyproject.toml | $(PY)
	$(PIP) install -e '.[dev]'
	touch $@ $(VENV)/.installed

# an earlier run is moved aside (named by its time), so a second `make demo` runs instead of refusing
demo: $(VENV)/.installed
	@if [ -e runs/demo ]; then kept=runs/demo-$$(date -r runs/demo +%Y%m%d-%H%M%S); \
		mv runs/demo $$kept && echo "the earlier demo run is now in $$kept"; fi
	$(VENV)/bin/lmforge demo --out runs/demo

# the default suite (minutes): every contract, parity and refusal test; long end-to-end runs are
# marked slow and left to `make test-slow` (CI runs both: .ci/run)
test: $(VENV)/.dev-installed
	$(COMPILE)
	$(PYTEST)

test-slow: $(VENV)/.dev-installed
	$(COMPILE)
	$(PYTEST) -m slow

test-all: $(VENV)/.dev-installed
	$(COMPILE)
	$(PYTEST) -m ''

# side-by-side benchmarks against the reference library; rewrites bench/RESULTS.md (long: see bench/run.py)
bench: $(VENV)/.dev-installed
	$(PY) -m bench.run

# the documentation as a static site in site/ (mkdocs-material; every link checked)
docs: $(VENV)/.dev-installed
	$(VENV)/bin/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) runs
