"""How NumPy arrays become operands of the C++ core.

Conventions (see the package docstring): tokens are rows, the last one or two axes are
the core axes, every leading axis is a batch axis that broadcasts like NumPy. The core
works on contiguous (blocks, rows, cols) stacks; broadcasting reaches it as an index array
mapping each flat batch position to the operand's own block, so no operand is copied to
broadcast it. An operand is copied once only when it is not C-contiguous or not of the
computation dtype.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

_FLOAT_KINDS = "fiu"


def real_array(name: str, x, *, allow_bool: bool = False) -> np.ndarray:
    """x as a real ndarray (no dtype change yet); TypeError for complex, object, string input."""
    try:
        a = np.asarray(x)
    except Exception as exc:  # ragged lists and the like
        raise TypeError(f"{name} must be a real array, got {type(x).__name__}: {exc}") from None
    if a.dtype.kind == "b" and allow_bool:
        return a
    if a.dtype.kind not in _FLOAT_KINDS:
        raise TypeError(f"{name} must be a real floating or integer array, got dtype {a.dtype}")
    return a


def compute_dtype(*arrays: np.ndarray) -> np.dtype:
    """float32 if every operand is float32 (or float16), else float64 (integers become float64)."""
    if arrays and all(a.dtype in (np.float32, np.float16) for a in arrays):
        return np.dtype(np.float32)
    return np.dtype(np.float64)


def check_finite(name: str, a: np.ndarray) -> None:
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} contains NaN or infinite values")


def check_nonempty(name: str, a: np.ndarray, expected: str) -> None:
    if a.size == 0:
        raise ValueError(f"{name} must be non-empty with shape {expected}, got {a.shape}")


def check_min_ndim(name: str, a: np.ndarray, ndim: int, expected: str) -> None:
    if a.ndim < ndim:
        raise ValueError(f"{name} must have shape {expected} (at least {ndim} dimensions), got {a.shape}")


def scalar(name: str, x, *, positive: bool = False, allow_none: bool = False) -> Optional[float]:
    """A finite real scalar (strictly positive when asked)."""
    if x is None and allow_none:
        return None
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (numbers.Real, np.floating, np.integer)):
        if isinstance(x, np.ndarray) and x.ndim == 0 and x.dtype.kind in _FLOAT_KINDS:
            x = x.item()
        else:
            raise TypeError(f"{name} must be a real number, got {type(x).__name__}")
    x = float(x)
    if not math.isfinite(x):
        raise ValueError(f"{name} must be finite, got {x}")
    if positive and x <= 0:
        raise ValueError(f"{name} must be > 0, got {x}")
    return x


@dataclass
class Operand:
    """A (blocks, *core) contiguous array and the index of its block for each batch position."""

    array: np.ndarray
    index: Optional[np.ndarray]


def batch_operands(batch_shape: tuple, arrays: Sequence[np.ndarray], core_ndims: Sequence[int], dtypes) -> list:
    """Flatten each array's batch axes and build its broadcast index over `batch_shape`."""
    total = int(np.prod(batch_shape, dtype=np.int64))
    out = []
    for a, core, dt in zip(arrays, core_ndims, dtypes):
        lead = a.shape[: a.ndim - core]
        flat = np.ascontiguousarray(a.reshape((int(np.prod(lead, dtype=np.int64)),) + a.shape[a.ndim - core:]), dtype=dt)
        if core == 1:
            flat = flat.reshape(flat.shape[0], 1, flat.shape[1])
        if tuple(lead) == tuple(batch_shape):
            index = None
        else:
            pad = (1,) * (len(batch_shape) - len(lead)) + tuple(lead)
            ids = np.arange(flat.shape[0], dtype=np.int64).reshape(pad)
            index = np.ascontiguousarray(np.broadcast_to(ids, batch_shape).reshape(total))
        out.append(Operand(flat, index))
    return out


def broadcast_batch(named: Sequence[tuple]) -> tuple:
    """Broadcast the leading (batch) shapes of (name, array, core_ndim) triples."""
    shapes = [a.shape[: a.ndim - core] for _, a, core in named]
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        desc = ", ".join(f"{n} {s}" for (n, _, _), s in zip(named, shapes))
        raise ValueError(f"batch dimensions do not broadcast: {desc}") from None


def cotangent(name: str, x, shape: tuple, dtype, *, allow_neg_inf: bool = False) -> np.ndarray:
    """A cotangent or saved forward output of a backward pass, as a C-contiguous array of `dtype`.

    ValueError names the argument for a non-real dtype, a shape other than `shape`, or NaN / inf
    values (-inf allowed with allow_neg_inf: the log-partition of a fully masked row).
    """
    try:
        a = np.asarray(x)
    except Exception as exc:
        raise ValueError(f"{name} must be a real array of shape {shape}, got {type(x).__name__}: {exc}") from None
    if a.dtype.kind not in _FLOAT_KINDS:
        raise ValueError(f"{name} must be a real floating array of shape {shape}, got dtype {a.dtype}")
    if a.shape != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {a.shape}")
    bad = np.isnan(a) | (a == np.inf) if allow_neg_inf else ~np.isfinite(a)
    if np.any(bad):
        raise ValueError(f"{name} contains NaN or infinite values")
    return np.ascontiguousarray(a, dtype=dtype)


def reduce_to_shape(g: np.ndarray, shape: tuple) -> np.ndarray:
    """Sum a gradient of a broadcast shape back to an operand's `shape` (NumPy broadcasting rules)."""
    lead = g.ndim - len(shape)
    if lead:
        g = g.sum(axis=tuple(range(lead)))
    axes = tuple(i for i, (s, t) in enumerate(zip(shape, g.shape)) if s == 1 and t != 1)
    if axes:
        g = g.sum(axis=axes, keepdims=True)
    return g.reshape(shape)
