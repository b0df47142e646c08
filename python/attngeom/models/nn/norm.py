"""The normalisations of the decoders: LayerNorm and RMSNorm over the last axis, in NumPy.

    LayerNorm(x) = (x - mean(x)) / sqrt(var(x) + eps) * w + b
    RMSNorm(x)   = w * x / sqrt(mean(x^2) + eps)

as transformers computes them (RMSNorm: the weight multiplies after the normalisation).
Used by the decoder (:mod:`.decoder`) for its residual-stream norms and by multi-head latent
attention (:mod:`.mla`) for the norms of its compressed latents.
"""
from __future__ import annotations

import numpy as np

from ... import _core


def normalize(x: np.ndarray, w, b, eps: float, kind: str, fused: bool = False, out=None,
              parallel: bool = False) -> np.ndarray:
    """LayerNorm or RMSNorm of x over its last axis (module docstring), in x's dtype.

    Parameters
    ----------
    x : ndarray, shape (..., d)
        The vectors to normalise (float32 or float64).
    w : ndarray, shape (d,)
        The weight (gain), x's dtype.
    b : ndarray, shape (d,) or None
        The LayerNorm bias (unused by RMSNorm).
    eps : float
        Added to the variance (mean square) before the square root.
    kind : {"layernorm", "rmsnorm"}
        Which normalisation.
    fused : bool
        An RMSNorm of float32 x in one pass of the core (the bfloat16 mode's): the same
        formula, float32 sums in another order (a few units in the last place from NumPy's).
    out : ndarray, optional
        x's shape and dtype, C-contiguous: where the result is written (the fused RMSNorm
        writes there directly), and returned.
    parallel : bool
        The fused RMSNorm's rows on the core's threads (the same bits); for a caller that is
        not itself one of the thread budget's workers.

    Returns
    -------
    ndarray
        LayerNorm(x) or RMSNorm(x), x's shape and dtype (no argument checks: the decoder's
        operands are checked when the checkpoint is read).

    Examples
    --------
    >>> from attngeom.models.nn.norm import normalize
    >>> normalize(np.array([[3.0, 4.0]]), np.ones(2), None, 0.0, "rmsnorm").round(4)
    array([[0.8485, 1.1314]])
    """
    if kind == "rmsnorm":
        if fused and x.dtype == np.float32:
            return _core.rms_norm(np.ascontiguousarray(x), np.ascontiguousarray(w, dtype=np.float32), eps, out,
                                  parallel)
        y = w * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))
    else:
        c = x - x.mean(axis=-1, keepdims=True)
        y = c / np.sqrt(np.mean(c * c, axis=-1, keepdims=True) + eps) * w + b
    if out is None:
        return y
    out[...] = y
    return out
