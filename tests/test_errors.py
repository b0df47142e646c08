"""attngeom.errors holds every exception and warning class of the package, and imports no other
module of it."""
import ast
import importlib
import inspect
import pathlib
import pkgutil

import numpy as np
import pytest

import attngeom as ag


def _modules():
    """The package's modules, less the compiled cores (attngeom._core picks one) and __main__."""
    for info in pkgutil.walk_packages(ag.__path__, "attngeom."):
        if not (info.name.endswith("__main__") or info.name.startswith("attngeom._core_")):
            yield info.name


def test_every_exception_class_is_in_errors():
    """A class a caller can meet is defined once, in attngeom.errors; private classes (a leading
    underscore) are signals caught inside the module that raises them."""
    strays = []
    for name in _modules():
        try:
            module = importlib.import_module(name)
        except ImportError:  # an optional dependency (torch) is missing
            continue
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
