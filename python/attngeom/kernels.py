"""Kernels psi(tau, s) on the projected coordinate s = u.k (Laplace-Radon s.10.5-10.6).

Replacing the exponential kernel of softmax by another positive kernel swaps the 1-D
transform applied to each Radon projection (Lawrence, Laplace-Radon eq. 44):

========== ============================================== ============== ========
name       psi(tau, s)                                    parameters     equation
========== ============================================== ============== ========
"exp"      exp(tau s)                                     none           (53)
"gaussian" exp(-(tau - s)^2 / (2 sigma^2))                sigma > 0      (54)
"cauchy"   1 / (1 + ((tau - s) / gamma)^2)                gamma > 0      (56)
"stable"   f_alpha(tau - s), the symmetric alpha-stable   0.1<=alpha<=2  (57)
           density with Fourier multiplier                c > 0
           exp(-c ``|w|^alpha``)
========== ============================================== ============== ========

All four are positive, so the attention weights they induce are probability vectors.
"""
from __future__ import annotations

import numpy as np

from ._operands import broadcast_batch, check_finite, choice, compute_dtype, finite_result, real_array, scalar
from .stable_density import ALPHA_MIN, stable_density

KERNELS = ("exp", "gaussian", "cauchy", "stable")
_DEFAULTS = {"exp": {}, "gaussian": {"sigma": 1.0}, "cauchy": {"gamma": 1.0}, "stable": {"alpha": 1.5, "c": 1.0}}


def kernel_params(kernel, params: dict) -> tuple:
    """Validate a kernel name and its parameters; returns (name, dict of floats).

    Raises TypeError for a non-string name, ValueError for an unknown name, an unknown
    parameter, or a parameter outside its range (alpha must lie in [0.1, 2]).
    """
    if not isinstance(kernel, str):
        raise TypeError(f"kernel must be a string, one of {KERNELS}, got {type(kernel).__name__}")
    choice("kernel", kernel, KERNELS)
    allowed = _DEFAULTS[kernel]
    unknown = set(params) - set(allowed)
    if unknown:
        expected = ", ".join(allowed) if allowed else "none"
        raise ValueError(f"kernel {kernel!r} takes parameters ({expected}), got unexpected {sorted(unknown)}")
    out = {}
    for key, default in allowed.items():
        out[key] = scalar(key, params.get(key, default), positive=True)
    if kernel == "stable" and not ALPHA_MIN <= out["alpha"] <= 2.0:
        raise ValueError(f"alpha must lie in [{ALPHA_MIN}, 2], got {out['alpha']}")
    return kernel, out


@finite_result
def psi(tau, s, kernel: str = "exp", **params) -> np.ndarray:
    """Evaluate the kernel psi(tau, s) elementwise (NumPy broadcasting of tau and s).

    Laplace-Radon s.10.5-10.6, eq. 40-44: the weight of a key at projected coordinate s for a
    query of radius tau; "exp" gives softmax attention.

    Parameters
    ----------
    tau : array_like
        Radius; any shape broadcastable with s.
    s : array_like
        Projected coordinate.
    kernel : {"exp", "gaussian", "cauchy", "stable"}, default "exp"
        The kernel.
    **params
        sigma (gaussian), gamma (cauchy), alpha and c (stable).

    Returns
    -------
    ndarray
        The broadcast shape; float32 when both inputs are float32, else float64.

    Examples
    --------
    >>> ag.psi(1.0, np.array([0.0, 1.0]))
    array([1.    , 2.7183])
    >>> ag.psi(1.0, np.array([1.0, 1.5]), "cauchy", gamma=0.5)
    array([1. , 0.5])
    """
    name, p = kernel_params(kernel, params)
    tau, s = real_array("tau", tau), real_array("s", s)
    check_finite("tau", tau)
    check_finite("s", s)
    broadcast_batch([("tau", tau, 0), ("s", s, 0)])
    dt = compute_dtype(tau, s)
    t, x = tau.astype(np.float64), s.astype(np.float64)
    if name == "exp":
        out = np.exp(t * x)
    elif name == "gaussian":
        two_var = 2 * p["sigma"] ** 2 if 1e-150 < p["sigma"] < 1e150 else 0.0
        # (t - x)^2 / (2 sigma^2) as written where 2 sigma^2 is a normal number; scaled first
        # where it would overflow or underflow.
        out = np.exp(-((t - x) ** 2) / two_var) if two_var else np.exp(-0.5 * ((t - x) / p["sigma"]) ** 2)
    elif name == "cauchy":
        out = 1.0 / (1.0 + ((t - x) / p["gamma"]) ** 2)
    else:
        out = stable_density(t - x, p["alpha"], p["c"])
    return np.asarray(out, dtype=dt)
