"""Short summaries of arrays for the ``repr`` of result objects: a notebook prints an object
in a few lines (shape, dtype and a few numbers), never its arrays in full."""
from __future__ import annotations

import numpy as np


def array_summary(a) -> str:
    """``(2, 4, 16, 8) float64, mean 0.0123, range [-1.2, 1.3]``: the shape, the dtype, the mean
    and range of the finite entries (and how many are not finite); None as "None"."""
    if a is None:
        return "None"
    a = np.asarray(a)
    shape = "(" + ", ".join(str(n) for n in a.shape) + ("," if a.ndim == 1 else "") + ")"
    head = f"{shape} {a.dtype}"
    if a.size == 0 or a.dtype.kind not in "biuf":
        return head + (", empty" if a.size == 0 else "")
    finite = np.isfinite(a) if a.dtype.kind == "f" else np.ones(a.shape, bool)
    n_bad = int(a.size - np.count_nonzero(finite))
    if n_bad == a.size:
        return f"{head}, no finite entry"
    values = a[finite] if n_bad else a
    out = f"{head}, mean {float(values.mean()):.4g}, range [{float(values.min()):.4g}, {float(values.max()):.4g}]"
    return out + (f", {n_bad} not finite" if n_bad else "")


def leading(values, n: int = 4) -> str:
    """The first n entries of a 1-D array as "[3.2, 1.1, 0.5, ...]" (4 significant digits)."""
    values = np.ravel(np.asarray(values))
    shown = ", ".join(f"{float(v):.4g}" for v in values[:n])
    return f"[{shown}{', ...' if values.size > n else ''}]"
