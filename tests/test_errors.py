"""attngeom.errors holds every exception and warning class of the package, and imports no other
module of it."""
import ast
import importlib
import importlib.util
import inspect
import pathlib
import pkgutil
import sys

import numpy as np
import pytest

import attngeom as ag


# The one subpackage that may not import: attngeom.torch needs PyTorch, which is the [torch]
# extra and not a test dependency. Importing every other module with each optional dependency
# blocked (scipy, matplotlib, tqdm, dask, zarr, safetensors, tokenizers, transformers, skimage,
# threadpoolctl) succeeds: they import those lazily.
OPTIONAL = {"attngeom.torch": "torch"}


def _missing(dependency):
    return importlib.util.find_spec(dependency) is None


def _modules():
    """The package's modules, imported, less the compiled cores (attngeom._core picks one) and
    __main__. A module that fails to import fails the test, unless it is in OPTIONAL (or below
    an entry there) and that entry's dependency is not installed."""
    def allowed(name):
        return any((name == top or name.startswith(top + ".")) and _missing(dep) for top, dep in OPTIONAL.items())

    failed = []

    def on_error(name):  # walk_packages could not import a subpackage to list its modules
        if not allowed(name):
            failed.append(f"{name}: {sys.exc_info()[1]!r}")

    modules = []
    for info in pkgutil.walk_packages(ag.__path__, "attngeom.", onerror=on_error):
        if info.name.endswith("__main__") or info.name.startswith("attngeom._core_"):
            continue
        try:
            modules.append(importlib.import_module(info.name))
        except ImportError as exc:
            if not allowed(info.name):
                failed.append(f"{info.name}: {exc!r}")
    assert not failed, f"modules that do not import: {failed}"
    return modules


def test_every_module_imports():
    """Nothing is skipped silently: each module imports, or is an OPTIONAL one without its
    dependency installed."""
    names = {m.__name__ for m in _modules()}
    assert "attngeom.errors" in names and "attngeom.radon" in names
    for top, dep in OPTIONAL.items():
        assert (top in names) != _missing(dep), (top, dep)


def test_every_exception_class_is_in_errors():
    """A class a caller can meet is defined once, in attngeom.errors; private classes (a leading
    underscore) are signals caught inside the module that raises them."""
    strays = []
    for module in _modules():
        name = module.__name__
        for attr, obj in vars(module).items():
            if (inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__.startswith("attngeom")
                    and not obj.__name__.startswith("_") and getattr(ag.errors, obj.__name__, None) is not obj):
                strays.append(f"{name}.{attr}")
    assert not strays, f"exception classes outside attngeom.errors: {strays}"
    assert all(getattr(ag.errors, n).__module__ == "attngeom.errors" for n in ag.errors.__all__)


def test_errors_imports_no_other_module_of_the_package():
    tree = ast.parse(pathlib.Path(ag.errors.__file__).read_text())
    imports = [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert all(isinstance(node, ast.ImportFrom) and node.module == "__future__" for node in imports)


def test_the_errors_users_meet_are_the_public_classes():
    x = np.ones((3, 2))
    with pytest.raises(ag.errors.NonFiniteOperand, match="^q contains NaN"):  # the core's check
        ag.softmax_attention(np.full((3, 2), np.nan), x, x)
    with pytest.raises(ag.errors.ResultOverflow, match="beyond the float range"):  # the core's check
        ag.softmax_attention(np.zeros((3, 2)), np.zeros((8, 2)), np.full((8, 4), np.finfo(float).max / 2))
    assert ag.LayoutWarning is ag.errors.LayoutWarning
    assert issubclass(ag.errors.DamagedFile, ValueError)
