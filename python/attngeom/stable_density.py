"""The symmetric alpha-stable density, the kernel of Laplace-Radon eq. (57)."""
from __future__ import annotations

import numpy as np

from . import _core
from ._operands import real_array, scalar


#: The smallest supported stability index: below it the table loses accuracy (2e-10 at
#: alpha = 0.07, NaN at 0.03) and the peak Gamma(1 + 1 / alpha) / pi overflows near 0.006.
ALPHA_MIN = 0.1


def stable_density(x, alpha, c=1.0, *, log=False):
    """Density of the symmetric alpha-stable law with characteristic function exp(-c ``|w|^alpha``).

    f(x) = (1/pi) int_0^inf exp(-c w^alpha) cos(w x) dw, 0 < alpha <= 2, c > 0
    (Lawrence, Laplace-Radon eq. 57: the Fourier multiplier of the alpha-stable kernel).
    alpha = 2 is the Gaussian exp(-x^2 / (4c)) / (2 sqrt(pi c)) (variance 2c); alpha = 1 the
    Cauchy density c / (pi (c^2 + x^2)); smaller alpha, heavier power-law tails
    f(x) ~ c Gamma(alpha + 1) sin(pi alpha / 2) / (pi ``|x|^(alpha + 1)``).

    Evaluation: a table of log f built once per (alpha, c) (about 20-250 ms, 1 s at
    alpha = 0.1; cached for the process), piecewise Chebyshev in asinh(``|x| / h``) from values
    given by the convergent / asymptotic series where they reach full precision and by
    Zolotarev's integral otherwise, and the power-law tail series beyond the table (the
    exact Gaussian for alpha = 2). Measured relative error against independent numerical
    integration and series, over x in [1e-6, 1e4]:

    ============  ==================
    alpha         max relative error
    ============  ==================
    2, 1.95, 1.5  < 1e-12
    1.2 .. 0.8    < 5e-12
    0.5, 0.3      < 1e-13
    0.1           2.5e-11 (at x = 0)
    ============  ==================

    Parameters
    ----------
    x : array_like
        Points, any shape (real); NaN gives NaN.
    alpha : float in [0.1, 2]
        Stability index.
    c : float, default 1.0
        Scale (> 0).
    log : bool, default False
        Return log f(x), accurate where f underflows. Where log f(x) itself lies below the
        float range (only the Gaussian alpha = 2 falls that fast: x^2 / (4c) > 1.8e308, i.e.
        ``|x|`` beyond about 2.7e154 sqrt(c)) the result is -inf, the representation IEEE
        arithmetic gives a negative number too large to hold (as log of the density's 0).

    Returns
    -------
    ndarray
        float64, x's shape.

    Examples
    --------
    >>> x = np.array([0.0, 1.0])
    >>> bool(np.allclose(ag.stable_density(x, alpha=1.0), 1 / (np.pi * (1 + x ** 2))))  # Cauchy
    True
    """
    x = real_array("x", x)
    alpha = scalar("alpha", alpha)
    c = scalar("c", c)
    if not ALPHA_MIN <= alpha <= 2.0:
        raise ValueError(f"alpha must lie in [{ALPHA_MIN}, 2], got {alpha}")
    if c <= 0:
        raise ValueError(f"c must be > 0, got {c}")
    flat = np.ascontiguousarray(x, dtype=np.float64)
    out = _core.stable_density(flat, alpha, c, bool(log)).reshape(x.shape)
    if not log and np.isinf(out).any():
        raise ValueError(f"the density with alpha = {alpha}, c = {c} exceeds the float64 range (its peak is "
                         f"about c^(-1/alpha)); use log=True")
    return out
