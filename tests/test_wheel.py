"""The package as a wheel installs it: one version from the metadata, `attngeom --version`, and,
under `make test-wheel` (ATTNGEOM_TEST_WHEEL=1), the wheel's and the sdist's contents, the
installed copy being the one imported, and no compiler within reach."""
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from importlib import metadata

import pytest

import attngeom as ag
from attngeom import _core

WHEEL = os.environ.get("ATTNGEOM_WHEEL")
SDIST = os.environ.get("ATTNGEOM_SDIST")
wheel_only = pytest.mark.skipif(os.environ.get("ATTNGEOM_TEST_WHEEL") != "1",
                                reason="checks the installed wheel: make test-wheel")
LEVELS = ("baseline", "avx2", "avx512") if platform.machine() in ("x86_64", "AMD64") else ("baseline",)
LEFTOVERS = re.compile(r"(^|/)(__pycache__|CMakeFiles|build|\.venv[^/]*|dist|runs|\.pytest_cache|\.hypothesis)/"
                       r"|\.(pyc|o|a|obj|ninja|log)$|CMakeCache\.txt$")


def test_one_version_from_the_metadata():
    assert ag.__version__ == metadata.version("attngeom")
    assert _core.build_config()["version"] == ag.__version__, "the core was built from another version"


def test_version_option_names_the_level_threads_and_blas():
    out = subprocess.run([sys.executable, "-m", "attngeom", "--version"], capture_output=True, text=True, check=True)
    cfg = ag.show_config(file=open(os.devnull, "w"))
    line = out.stdout.strip()
    compiled = re.escape(" ".join(_core.COMPILED))
    threads = r"\d+ OpenMP threads" if cfg["openmp"] else r"no OpenMP \(1 thread\)"
    pattern = rf"attngeom {re.escape(ag.__version__)}: level {_core.LEVEL} \(compiled: {compiled}\), {threads}, " \
              rf"BLAS (\w+ [\w.]+.* \(\d+ threads\)|unknown)"
    assert re.fullmatch(pattern, line), (pattern, line)


@wheel_only
def test_the_installed_copy_is_imported():
    site = {os.path.realpath(sysconfig.get_paths()[k]) for k in ("purelib", "platlib")}
    package = os.path.realpath(os.path.dirname(ag.__file__))
    assert os.path.dirname(package) in site, f"attngeom imported from {package}, not from {site}"
    assert set(LEVELS) <= set(_core.COMPILED), _core.COMPILED


@wheel_only
def test_no_compiler_is_reachable():
    found = {name: shutil.which(name) for name in ("cc", "c++", "gcc", "g++", "clang", "clang++", "cmake", "ninja")}
    assert not any(found.values()), found
    assert os.environ.get("CC") == "false" and os.environ.get("CXX") == "false"


@wheel_only
def test_the_wheel_holds_every_level_and_no_leftovers():
    assert WHEEL and re.search(r"-manylinux_\d+_\d+_\w+\.whl$", WHEEL), WHEEL
    names = zipfile.ZipFile(WHEEL).namelist()
    for level in LEVELS:
        assert any(re.fullmatch(rf"attngeom/_core_{level}\..*\.so", n) for n in names), level
    assert "attngeom/_core.py" in names and "attngeom/cli.py" in names
    modules = [n for n in names if n.startswith("attngeom/") and n.endswith(".so")]
    assert all(re.fullmatch(r"attngeom/_core_\w+\..*\.so", n) for n in modules), modules  # not the tests' modules
    assert not [n for n in names if LEFTOVERS.search(n)]
    outside = {n.split("/")[0] for n in names} - {"attngeom", "attngeom.libs", f"attngeom-{ag.__version__}.dist-info"}
    assert not outside, outside
    vendored = [n for n in names if n.startswith("attngeom.libs/") and not n.endswith("/")]
    assert all(re.match(r"attngeom\.libs/libgomp", n) for n in vendored), vendored  # OpenMP alone


@wheel_only
def test_the_sdist_holds_the_sources_and_no_build():
    names = [n.split("/", 1)[1] for n in tarfile.open(SDIST).getnames() if "/" in n]
    for needed in ("pyproject.toml", "CMakeLists.txt", "LICENSE", "CITATION.cff", "README.md",
                   "cpp/bindings/module.cpp", "cpp/include/attngeom/attention.hpp", "cpp/src/isa.cpp",
                   "python/attngeom/_core.py", "tests/conftest.py", "tests/test_wheel.py", "tools/test_wheel.py"):
        assert needed in names, needed
    assert any(re.fullmatch(r"notebooks/\d+.*\.ipynb", n) for n in names)
    assert not [n for n in names if LEFTOVERS.search(n) or n.endswith(".so")]
