"""The activation functions of transformer MLPs, elementwise, in NumPy, one implementation each:

    gelu(x)      = x Phi(x) = x (1 + erf(x / sqrt 2)) / 2                  exact (BERT's "gelu")
    gelu_tanh(x) = x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) / 2       GPT-2's "gelu_new"
    silu(x)      = x sigmoid(x) = x (1 + tanh(x / 2)) / 2                  no exp to overflow
    relu(x)      = max(x, 0)

Used by the MLP key-value view (:func:`attngeom.mlp_key_value`) and the forward passes of
:mod:`attngeom.models`. No argument checks: the callers' operands are checked already.
"""
from __future__ import annotations

import math

import numpy as np


def _erf(x: np.ndarray) -> np.ndarray:
    try:
        from scipy.special import erf
    except ImportError:  # exact but slower
        return np.vectorize(math.erf, otypes=[x.dtype])(x)
    return erf(x)


def gelu(x) -> np.ndarray:
    """GELU(x) = x Phi(x) = x (1 + erf(x / sqrt 2)) / 2 (BERT's "gelu"), elementwise.

    Parameters
    ----------
    x : array_like
        Any shape; a float dtype is kept (others become float64).

    Returns
    -------
    ndarray
        GELU(x), same shape and dtype.

    Examples
    --------
    >>> from attngeom.activation_functions import gelu
    >>> gelu(np.array([0.0, 1.0]))
    array([0.    , 0.8413])
    """
    x = np.asarray(x, dtype=np.result_type(x, np.float32))
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """The tanh form of GELU (module docstring), computed in place on one temporary (x * x * x:
    NumPy's x ** 3 on float32 takes the general power routine, some 60 ns an element)."""
    t = x * x
    t *= x
    t *= 0.044715
    t += x
    t *= math.sqrt(2.0 / math.pi)
    np.tanh(t, out=t)
    t += 1.0
    t *= x
    t *= 0.5
    return t


def silu(x: np.ndarray) -> np.ndarray:
    """SiLU(x) = x sigmoid(x), written with tanh so that no exponential overflows."""
    return x * (0.5 * (1.0 + np.tanh(0.5 * x)))


def relu(x: np.ndarray) -> np.ndarray:
    """ReLU(x) = max(x, 0)."""
    return np.maximum(x, 0)
