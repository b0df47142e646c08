"""Arguments renamed in this release, accepted under their old names for one release."""
from __future__ import annotations

import functools
import warnings


def renamed_arguments(**renames):
    """Decorator: keyword arguments renamed in this release are still accepted under their
    old names for one release, with a DeprecationWarning naming the new one.

    ``@renamed_arguments(P="routing")`` lets ``f(P=x)`` mean ``f(routing=x)``."""

    def wrap(func):
        @functools.wraps(func)
        def inner(*args, **kwargs):
            for old, new in renames.items():
                if old in kwargs:
                    if new in kwargs:
                        raise TypeError(f"{func.__name__}() got both {old!r} (deprecated) and {new!r}")
                    warnings.warn(f"{func.__name__}(): the argument {old!r} is deprecated, use {new!r}",
                                  DeprecationWarning, stacklevel=2)
                    kwargs[new] = kwargs.pop(old)
            return func(*args, **kwargs)

        return inner

    return wrap
