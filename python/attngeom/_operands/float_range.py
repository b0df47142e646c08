"""The float range: inputs whose results may overflow are refused, and results beyond the
range raise ResultOverflow naming the argument with the largest entries."""
from __future__ import annotations

import dataclasses
import functools
import inspect
import math

import numpy as np

from ..errors import NonFiniteOperand, ResultOverflow
from .validation import all_finite


def max_row_norm(a: np.ndarray) -> float:
    """Largest Euclidean norm along the last axis of `a`, in float64 and overflow-safe (the
    entries are divided by the largest one before squaring); 0 for an empty array."""
    if a.size == 0:
        return 0.0
    big = float(np.max(np.abs(a)))
    if big == 0.0 or not math.isfinite(big):
        return big
    return big * float(np.max(np.linalg.norm(a / big, axis=-1)))


def check_bound(bound: float, dtype, what: str, fix: str) -> None:
    """Refuse an input for which `what`, bounded above by `bound`, may overflow `dtype`.

    The same rule as the core's check_bound (types.hpp): a quantity a kernel computes that
    the float type cannot represent is a ValueError saying what overflows and what to change,
    never a NaN or an answer as if the overflowing terms were absent."""
    limit = float(np.finfo(dtype).max)
    if not bound <= limit:
        raise ValueError(f"{what} may reach {bound:.3g}, beyond the float range ({limit:.3g}): {fix}")


def _finite_values(obj) -> bool:
    """Whether every floating value in a result (arrays, scalars, tuples, named tuples,
    dataclasses, lists, the values of dicts) is finite; other values (ints, strings, None,
    objects) count as finite."""
    if isinstance(obj, np.ndarray):
        return not np.issubdtype(obj.dtype, np.inexact) or all_finite(obj)
    if isinstance(obj, (float, complex, np.inexact)):
        return bool(np.isfinite(obj))
    if isinstance(obj, (tuple, list)):
        return all(_finite_values(o) for o in obj)
    if isinstance(obj, dict):
        return all(_finite_values(o) for o in obj.values())
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return all(_finite_values(getattr(obj, f.name)) for f in dataclasses.fields(obj))
    return True


def _largest(value) -> float:
    """Largest magnitude among the floating values of an argument (inf when one is not
    finite, 0 when it holds none)."""
    if isinstance(value, (tuple, list)):
        return max((_largest(v) for v in value), default=0.0)
    try:
        arr = np.asarray(value)
    except Exception:  # an object NumPy cannot take is not a numeric input
        return 0.0
    if not arr.size or not np.issubdtype(arr.dtype, np.number) or np.issubdtype(arr.dtype, np.bool_):
        return 0.0
    with np.errstate(invalid="ignore"):
        m = float(np.max(np.abs(arr)))
    return m if m == m else math.inf


def finite_result(func=None, *, name=None, checked=False):
    """Decorator for a public function whose result can overflow: when the inputs are finite
    and the result is not (a product or sum beyond the float range, or an operand computed on
    the way), raise ResultOverflow (a ValueError) naming the argument with the largest
    entries, instead of returning inf or NaN. Costs one pass over the result, unless
    `checked`: the function's core checks its result as it writes it and raises
    ResultOverflow, which this names the same way. `name` is the function the messages name
    (default: the decorated one's), for a private function that computes a public one's
    result."""
    if func is None:
        return functools.partial(finite_result, name=name, checked=checked)
    signature = inspect.signature(func)
    label = name or func.__name__

    def culprit(args, kwargs):
        """(name, largest entry) of the argument with the largest entries, or None when an
        argument itself is not finite (then the function's own checks apply)."""
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return None
        sizes = {name: _largest(value) for name, value in bound.arguments.items()}
        if not sizes or not all(math.isfinite(v) for v in sizes.values()):
            return None
        return max(sizes.items(), key=lambda item: item[1])

    def refuse(found, cause):
        name, big = found
        raise ResultOverflow(f"{label}: {cause} for these inputs: {name} has entries up to {big:.3g} "
                             f"(overflow, or a degenerate input); rescale it") from None

    @functools.wraps(func)
    def inner(*args, **kwargs):
        try:
            # NumPy's overflow warnings would only repeat what the refusal below says.
            with np.errstate(over="ignore", invalid="ignore"):
                out = func(*args, **kwargs)
        except (ResultOverflow, NonFiniteOperand, np.linalg.LinAlgError) as e:
            found = culprit(args, kwargs)
            if found is None:
                raise
            if isinstance(e, np.linalg.LinAlgError):
                refuse(found, f"a decomposition failed ({e})")
            refuse(found, "an intermediate result is beyond the float range" if isinstance(e, NonFiniteOperand)
                   else "the result is beyond the float range")
        if checked or _finite_values(out):
            return out
        found = culprit(args, kwargs)
        if found is None:
            return out
        refuse(found, "the result is not finite")

    return inner
