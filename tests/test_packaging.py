"""What `pip install .` asks for: extras with lower bounds only (a torch or transformers a user
already has is kept), and the versions make pins for its own environments kept apart."""
import os
import re
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
