"""Renamed public names: an old name keeps working for one release, with a DeprecationWarning
that names the new one (docs/architecture.md, "Glossary").

* :func:`renamed_arguments`: keyword arguments (``@renamed_arguments(P="routing")``);
* :func:`renamed_values`: values of an option (``@renamed_values(activation={"gelu": "gelu_tanh"})``);
* :func:`renamed_attributes`: functions, classes and constants of a module, as its ``__getattr__``;
* :class:`renamed_field`: a field of a result class, as a property under the old name.

Every warning reads ``<where>: <the kind> '<old>' is deprecated, use '<new>'`` and points at
the line that used the old name (the caller of the public function), so old names used inside
the package stay hidden under Python's default warning filters.
"""
from __future__ import annotations

import functools
import inspect
import sys
import warnings


def deprecated(where: str, kind: str, old: str, new: str, stacklevel: int = 2) -> None:
    """Warn that `old` (`kind`: "the argument", "the name", ...) of `where` is now `new`;
    `stacklevel` counts from the function calling this one (2: its caller)."""
    warnings.warn(f"{where}: {kind} {old!r} is deprecated, use {new!r}", DeprecationWarning,
                  stacklevel=stacklevel + 1)


def renamed_arguments(**renames):
    """Decorator: keyword arguments renamed in this release are still accepted under their old
    names for one release. ``@renamed_arguments(P="routing")`` lets ``f(P=x)`` mean
    ``f(routing=x)``; passing both names is a TypeError."""

    def wrap(func):
        @functools.wraps(func)
        def inner(*args, **kwargs):
            for old, new in renames.items():
                if old in kwargs:
                    if new in kwargs:
                        raise TypeError(f"{func.__name__}() got both {old!r} (deprecated) and {new!r}")
                    deprecated(f"{func.__name__}()", "the argument", old, new)
                    kwargs[new] = kwargs.pop(old)
            return func(*args, **kwargs)

        return inner

    return wrap


def renamed_values(**renames):
    """Decorator: option values renamed in this release are still accepted for one release,
    whether the option is passed by position or by keyword.
    ``@renamed_values(activation={"gelu": "gelu_tanh"})`` lets ``f(activation="gelu")`` mean
    ``f(activation="gelu_tanh")``. Only string values are looked up."""

    def wrap(func):
        positions = {name: list(inspect.signature(func).parameters).index(name) for name in renames}

        @functools.wraps(func)
        def inner(*args, **kwargs):
            args = list(args)
            for name, values in renames.items():
                if positions[name] < len(args):
                    args[positions[name]] = _new_value(func, name, args[positions[name]], values)
                elif name in kwargs:
                    kwargs[name] = _new_value(func, name, kwargs[name], values)
            return func(*args, **kwargs)

        return inner

    return wrap


def _new_value(func, name: str, value, values: dict):
    """`value`, or the new value of a renamed one (warning at the public function's caller)."""
    if isinstance(value, str) and value in values:
        deprecated(f"{func.__name__}()", name, value, values[value], stacklevel=3)
        return values[value]
    return value


def renamed_attributes(module: str, **renames):
    """The ``__getattr__`` of the module named `module` under which each old name answers
    with the object of its new name: ``__getattr__ = renamed_attributes(__name__, Old="New")``
    in the module's body (``from module import Old`` warns too). A module ``__getattr__`` of
    its own that hands other names on to this one calls it with ``stacklevel=3``."""

    def __getattr__(name, stacklevel=2):
        if name not in renames:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        deprecated(module, "the name", name, renames[name], stacklevel=stacklevel)
        return getattr(sys.modules[module], renames[name])

    return __getattr__


class renamed_field:  # noqa: N801 (used like a function in class bodies)
    """A result's old field name, as a property reading and writing the field `new`:
    ``attentions = renamed_field("routing")`` in the class body (not a dataclass field: it has
    no annotation, so the constructor and ``dataclasses.fields`` know the new name only)."""

    def __init__(self, new: str):
        self.new = new

    def __set_name__(self, owner, name):
        self.old, self.owner = name, owner.__name__

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        deprecated(self.owner, "the field", self.old, self.new)
        return getattr(obj, self.new)

    def __set__(self, obj, value):
        deprecated(self.owner, "the field", self.old, self.new)
        setattr(obj, self.new, value)
