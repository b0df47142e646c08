"""What `pip install .` asks for: extras with lower bounds only (a torch or transformers a user
already has is kept), and the versions make pins for its own environments kept apart."""
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..")

tomllib = pytest.importorskip("tomllib") if sys.version_info >= (3, 11) else pytest.importorskip("tomli")


def _project():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]


def test_requirements_give_lower_bounds_not_exact_versions():
    project = _project()
    requirements = list(project["dependencies"]) + [r for extra in project["optional-dependencies"].values()
                                                     for r in extra]
    pinned = [r for r in requirements if re.search(r"===?|~=", r)]
    assert not pinned, f"exact pins replace what a user has installed: {pinned}"
    torch = [r for r in requirements if re.match(r"torch\b", r)]
    assert torch and all(">=" in r for r in torch), torch


def test_make_pins_torch_through_its_constraints_file_only():
    # make's environments install the tested torch from the constraints file; the extras do not.
    lines = [line.split("#")[0].strip() for line in open(os.path.join(ROOT, "constraints.txt"))]
    assert "torch==2.13.0" in lines
    makefile = open(os.path.join(ROOT, "Makefile")).read()
    assert "CONSTRAINTS := -c constraints.txt" in makefile
    assert makefile.count("$(CONSTRAINTS)") >= 3  # base tools, the dev install, the benchmark install


def test_make_and_pip_install_use_separate_build_folders():
    makefile = open(os.path.join(ROOT, "Makefile")).read()
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        pip_dir = tomllib.load(f)["tool"]["scikit-build"]["build-dir"]
    assert re.search(r"^MAKE_BUILD := (\S+)", makefile, re.M).group(1) != pip_dir.split("/{")[0]
    assert "-Cbuild-dir=$(MAKE_BUILD)" in makefile


def _make_dry_run(*args):
    """The commands `make -n -B args` would run in the source tree (nothing is built)."""
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not on PATH (the wheel's test environment holds no build tools)")
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    out = subprocess.run([make, "-n", "-B", "-C", ROOT, *args], capture_output=True, text=True, check=True,
                         env=env).stdout
    return out.replace("\\\n", " ")  # a command continued over lines is one line


@pytest.mark.parametrize("target,build", [(".venv/.installed-OFF-test", "build/make"),
                                          (".venv-sanitize/.installed", "build/sanitize"), ("wheel", "build/make")])
def test_make_builds_compile_through_ccache_when_one_is_given(target, build):
    commands = [line for line in _make_dry_run(target, "CCACHE=/usr/bin/ccache").splitlines()
                if f"-Cbuild-dir={build} " in line]
    assert commands, f"no build command of {target} in the dry run"
    for line in commands:
        assert "-Ccmake.define.CMAKE_CXX_COMPILER_LAUNCHER=/usr/bin/ccache " in line, line
        env = dict(re.findall(r"\b(CCACHE_\w+)=(\S*)", line))
        # the precompiled headers are cached only with both pch sloppiness values
        assert set(env.pop("CCACHE_SLOPPINESS").split(",")) == {"pch_defines", "time_macros", "include_file_mtime",
                                                                "include_file_ctime"}, line
        assert os.path.realpath(env.pop("CCACHE_BASEDIR")) == os.path.realpath(ROOT)
        assert env == {"CCACHE_NOHASHDIR": "1"}
    # CCACHE= builds without it, and clears a launcher an earlier build left in the CMake cache
    for line in _make_dry_run(target, "CCACHE=").splitlines():
        if f"-Cbuild-dir={build} " in line:
            assert "-Ccmake.define.CMAKE_CXX_COMPILER_LAUNCHER= " in line and "CCACHE_" not in line, line
