"""The inverse Laplace step of the Laplace-Radon picture (Laplace-Radon s.9, eqs. 34-37).

For a fixed tilt u, Z(u, tau) = sum_i exp(tau s_i) with s_i = u.k_i is an exponential sum
(eq. 36) and N(u, tau) the same sum weighted by the values v_i. Inverting the Laplace step
recovers the projected measure {(s_i, multiplicity, value)} per direction
(:func:`fit_exponential_sum`, matrix pencil; :func:`invert_laplace_density` for continuous
projected densities). The inverse Radon step of a point set (points from their
projections, and key recovery chaining both steps) lives in :mod:`attngeom.point_sets`;
image-space Radon inversion (filtered backprojection, SART) in :mod:`attngeom.radon`.

Real tau samples the Laplace transform itself and is badly conditioned (the nodes
exp(tau s) crowd together); imaginary tau = i w samples the characteristic function, whose
nodes exp(i w s) spread over the unit circle: prefer it whenever the head can be probed
there (:func:`laplace_radon_transform` accepts complex tau).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from . import _core
from ._operands import (as_array, check_finite, check_nonempty, check_size, count, finite_result, real_array, scalar,
                        uniform_grid)


@dataclass
class ExponentialSum:
    """Result of :func:`fit_exponential_sum`.

    Attributes
    ----------
    nodes
        (..., M) ascending projected coordinates s_i, M the largest order found (a single
        problem's nodes are all finite; in a batch, a problem of lower order is padded with
        NaN beyond its order, so a padded node cannot be mistaken for a found one).
    weights
        (..., M) or (..., M, C) the weights c_i (multiplicities for Z, value-weighted
        for N); 0 beyond the order.
    order
        (...) int, the number of nodes found.
    singular_values
        (..., K) of the stacked Hankel matrix (the gap decides the order).
    residual
        (...) relative misfit ``|f - model|`` / ``|f|`` of the fitted real sum.
    """

    nodes: np.ndarray
    weights: np.ndarray
    order: np.ndarray
    singular_values: np.ndarray
    residual: np.ndarray


def fit_exponential_sum(tau, values, *, order: Optional[int] = None, rtol: Optional[float] = None,
                        pencil: Optional[int] = None, vector: Optional[bool] = None) -> ExponentialSum:
    """Nodes and weights of f(tau) = sum_i c_i exp(tau s_i) from uniform samples (matrix pencil).

    The inverse Laplace step for discrete projected measures (Laplace-Radon eq. 36): with
    f = Z(u, .) the nodes are the projections s_i = u.k_i and the weights their
    multiplicities; with f = N(u, .) (vector samples) the weights are the value vectors.
    Hua-Sarkar matrix pencil in C++: Hankel matrices of the C channels stacked, SVD, the
    order from the singular values, the nodes from the shift pencil's eigenvalues, the
    weights by least squares on the exponential Vandermonde matrix. Batched over leading
    axes with OpenMP.

    Measured limits (float64, nodes uniform on [-1, 1], for real tau at least 0.1 apart;
    see tests/test_inverse.py):

    ================================================  =======  ===============
    samples                                           nodes n  max node error
    ================================================  =======  ===============
    imaginary, tau = i 2.5 k, k = 0..127 (no alias)   24       <= 1e-10
    imaginary, tau = i 2.5 k, k = 0..127 (no alias)   32       ~1e-9
    real, tau uniform on [-10, 10], N = 64            4        5e-11
    real, tau uniform on [-10, 10], N = 64            6        2e-8
    real, tau uniform on [-10, 10], N = 64            7        1e-7
    real, tau uniform on [-10, 10], N = 64            8        2e-5
    ================================================  =======  ===============

    With complex Gaussian noise of relative size eta on imaginary samples (n = 8), the
    order is never over-estimated at eta <= 1e-2 and the node error grows linearly, about
    6e-3 eta (7e-9 at 1e-6, 6e-6 at 1e-3); benchmarks/bench_inverse.py prints the curve.

    Parameters
    ----------
    tau : array_like, shape (N,)
        Uniformly spaced, real or purely imaginary (N >= 2 M + 1 for M nodes). Imaginary
        tau = i w: nodes are identifiable only for ``|s| < pi / dw`` (aliasing).
    values : array_like, shape (..., N) or (..., N, C)
        Scalar samples, or vector samples sharing nodes (e.g. Z and N stacked as channels).
        A trailing axis of length N is read as scalar samples unless ``vector=True``.
    order : int, optional
        The number of nodes when known. Otherwise decided per problem: with `rtol`, the
        number of singular values above rtol * sigma_1; without, the largest log-gap among
        the singular values above the rounding floor (so a noise tail is never read as nodes).
    rtol : float, optional
        Relative threshold of the order decision (set it to the noise level).
    pencil : int, optional
        The pencil parameter L (default N // 2; Hua-Sarkar recommend N/3 <= L <= N/2). At
        most min(L, C (N - L)) nodes can be found.
    vector : bool, optional
        Read the last axis of `values` as channels.

    Returns
    -------
    ExponentialSum
        Real nodes and weights (the projected measures are real; imaginary parts are dropped
        and ``residual`` measures the misfit of the real model), the order and the singular
        values behind it.

    Examples
    --------
    >>> tau = 1j * 0.5 * np.arange(16)
    >>> s_true = np.array([-1.0, 0.25, 0.5])
    >>> Z = np.exp(np.outer(tau, s_true)).sum(1)  # Z(u, tau) of three keys
    >>> fit = ag.fit_exponential_sum(tau, Z)
    >>> int(fit.order), np.round(fit.nodes, 8), np.round(fit.weights, 8)
    (3, array([-1.  ,  0.25,  0.5 ]), array([1., 1., 1.]))
    """
    t, step, kind = uniform_grid("tau", tau)
    N = t.size
    f = as_array("values", values, "a real or complex array")
    if f.dtype.kind not in "fiuc":
        raise TypeError(f"values must be a real or complex array, got dtype {f.dtype}")
    if vector is None:
        vector = not (f.ndim >= 1 and f.shape[-1] == N)
    if vector:
        if f.ndim < 2 or f.shape[-2] != N:
            raise ValueError(f"values must have shape (..., N) or (..., N, C) with N = len(tau) = {N}, got {f.shape}")
        batch = f.shape[:-2]
        C = f.shape[-1]
        fb = np.moveaxis(f, -1, -2).reshape((-1, C, N))
    else:
        if f.ndim < 1 or f.shape[-1] != N:
            raise ValueError(f"values must have shape (..., N) with N = len(tau) = {N}, got {f.shape}")
        batch = f.shape[:-1]
        C = 1
        fb = f.reshape((-1, 1, N))
    check_nonempty("values", fb, "(..., N)")
    if not np.all(np.isfinite(fb)):
        raise ValueError("values contains NaN or infinite values")
    L = N // 2 if pencil is None else count("pencil", pencil)
    if not 1 <= L <= N - 2:
        raise ValueError(f"pencil must lie in [1, N - 2] = [1, {N - 2}], got {L}")
    order_in = 0
    if order is not None:
        order_in = count("order", order)
        cap = min(L, C * (N - L))
        if not 1 <= order_in <= cap:
            raise ValueError(f"order must lie in [1, {cap}] for N = {N} samples and pencil {L}, got {order_in}")
    r = 0.0
    if rtol is not None:
        r = scalar("rtol", rtol)
        if not 0 < r < 1:
            raise ValueError(f"rtol must lie in (0, 1), got {r}")
    # Each thread forms a C (N - L) x (L + 1) Hankel matrix and its SVD factors (about 3 of them).
    check_size("tau, values (the Hankel matrix of N samples)", 3 * C * (N - L) * (L + 1) * _core.get_num_threads(),
               16)
    fb = np.ascontiguousarray(fb, dtype=np.complex128)
    z, orders, sv = _core.matrix_pencil(fb, L, order_in, r)
    B = fb.shape[0]
    Mmax = max(int(orders.max()) if B else 0, 1)
    zz = z[:, :Mmax]
    # a zero eigenvalue (a node at s = -inf, e.g. a lone delta sample) is no node of a measure
    keep = (np.arange(Mmax)[None, :] < orders[:, None]) & (np.abs(zz) > 1e-14)
    with np.errstate(divide="ignore", invalid="ignore"):
        s = np.where(keep, (np.log(np.where(keep, zz, 1.0)) / step).real, np.nan)
    orders = keep.sum(axis=1).astype(np.int64)
    # sort each problem's nodes ascending (NaN padding last)
    idx = np.argsort(s, axis=1)
    s = np.take_along_axis(s, idx, axis=1)
    M = int(orders.max()) if B else 0  # no padding beyond the largest order found
    s = s[:, :M]
    s_c = np.ascontiguousarray(np.nan_to_num(s), dtype=np.complex128)
    w = _core.exp_sum_weights(t, s_c, orders.astype(np.int64), fb).real
    valid = np.arange(M)[None, None, :] < orders[:, None, None]
    basis = np.exp(np.einsum("k,bm->bkm", t, s_c)) * valid  # (B, N, M)
    model = np.einsum("bkm,bmc->bck", basis, w)
    norm = np.linalg.norm(fb.reshape(B, -1), axis=1)
    residual = np.linalg.norm((fb - model).reshape(B, -1), axis=1) / np.where(norm > 0, norm, 1)
    weights = w if vector else w[..., 0]
    kept = np.where(valid[:, 0, :], s, 0.0)
    if not (np.all(np.isfinite(kept)) and np.all(np.isfinite(weights)) and np.all(np.isfinite(residual))):
        raise ValueError(f"tau and values give nodes or weights beyond the float range (tau step {step:.3g}, "
                         f"largest |value| {float(np.max(np.abs(fb))):.3g}): rescale tau or values")
    return ExponentialSum(nodes=s.reshape(batch + (M,)), weights=weights.reshape(batch + weights.shape[1:]),
                          order=orders.reshape(batch), singular_values=sv.reshape(batch + sv.shape[1:]),
                          residual=residual.reshape(batch))


@dataclass
class DensityFit:
    """Result of :func:`invert_laplace_density`.

    s : (G,) the grid; density : (G,) the recovered projected density on it (mass
    normalised to the fitted total mass); mass : the total mass (integral of the fit, Z(0));
    residual : relative misfit of the fitted transform; iterations : of the NNLS solver.
    """

    s: np.ndarray
    density: np.ndarray
    mass: float
    residual: float
    iterations: int

    def cdf(self) -> np.ndarray:
        """The cumulative distribution on the grid (trapezoid rule), ending at 1."""
        c = np.concatenate([[0.0], np.cumsum(0.5 * (self.density[1:] + self.density[:-1]) * np.diff(self.s))])
        return c / c[-1] if c[-1] > 0 else c


def _trapezoid_weights(s: np.ndarray) -> np.ndarray:
    h = np.diff(s)
    w = np.zeros_like(s)
    w[:-1] += h / 2
    w[1:] += h / 2
    return w


@finite_result
def invert_laplace_density(tau, Z, s_grid, *, regularization: float = 1e-3, nonneg: bool = True) -> DensityFit:
    """A projected density p(s) from samples of its Laplace transform Z(tau) = int e^{tau s} p(s) ds.

    The inverse Laplace step for continuous projected measures (Laplace-Radon eq. 35),
    CONTIN-style: p on the grid minimises
    ``mean_k ((A p)_k / Z_k - 1)^2 + regularization * mean_j ((D2 p)_j)^2`` with p >= 0,
    A_kj = e^{tau_k s_j} w_j (trapezoid weights w), the misfit taken relative to Z_k
    (noise on a transform that spans e^{tau s} is relative), D2 the second difference of
    the grid values. Solved as one non-negative least squares problem (Lawson-Hanson, C++),
    or by plain least squares with ``nonneg=False``.

    Parameters
    ----------
    tau : array_like, shape (K,)
        Real sample points (need not be uniform).
    Z : array_like, shape (K,)
        Positive samples of the transform.
    s_grid : array_like, shape (G,)
        Increasing grid. It must cover where e^{tau s} p(s) carries mass for every sampled
        tau, not only the support's bulk: for N(0, sigma^2) and ``|tau| <= T`` that is
        ``|s| <= sigma^2 T + 3 sigma``.
    regularization : float, default 1e-3
        Curvature penalty (>= 0). The default gives (tau = 81 points on [-10, 10], G = 201)
        Wasserstein-1 errors of 0.015 noiseless and 0.019 at relative noise 1e-3 for the
        uniform density on [-1, 1] (grid [-2, 2]); 0.0015 and 0.010 for N(0, 0.5^2).
    nonneg : bool, default True
        Enforce p >= 0 (NNLS); False solves plain least squares.

    Returns
    -------
    DensityFit
        The grid, the density (integrating to 1 on the grid), the mass Z(0), the residual
        and the solver's iterations.

    Examples
    --------
    >>> tau = np.linspace(-10, 10, 81)
    >>> Z = np.where(tau == 0, 1.0, np.sinh(tau) / np.where(tau == 0, 1.0, tau))  # uniform on [-1, 1]
    >>> s = np.linspace(-2, 2, 201)
    >>> fit = ag.invert_laplace_density(tau, Z, s)
    >>> bool(ag.wasserstein1(s, fit.density, (np.abs(s) <= 1) / 2.0) < 0.03)
    True
    """
    t = real_array("tau", tau).astype(np.float64).ravel()
    z = real_array("Z", Z).astype(np.float64).ravel()
    s = real_array("s_grid", s_grid).astype(np.float64).ravel()
    for name, a in (("tau", t), ("Z", z), ("s_grid", s)):
        check_nonempty(name, a, "(K,)")
        check_finite(name, a)
    if z.shape != t.shape:
        raise ValueError(f"Z must have the shape of tau {t.shape}, got {z.shape}")
    if np.any(z <= 0):
        raise ValueError("Z must be positive (it is the Laplace transform of a non-negative density)")
    if s.size < 3 or np.any(np.diff(s) <= 0):
        raise ValueError(f"s_grid must be increasing with at least 3 points, got shape {s.shape}")
    lam = scalar("regularization", regularization, nonnegative=True)
    w = _trapezoid_weights(s)
    with np.errstate(over="ignore"):
        A = np.exp(np.outer(t, s) - np.log(z)[:, None]) * w[None, :]  # relative rows, formed without overflow
    if not np.all(np.isfinite(A)):
        raise ValueError("exp(tau s) / Z(tau) overflows on this grid: the grid reaches far beyond where the "
                         "transform's mass lies for the largest |tau|; narrow s_grid or the tau range")
    b = np.ones_like(t)
    G = s.size
    D2 = np.zeros((G - 2, G))
    idx = np.arange(G - 2)
    D2[idx, idx], D2[idx, idx + 1], D2[idx, idx + 2] = 1.0, -2.0, 1.0
    D2 *= math.sqrt(lam * t.size / (G - 2))  # mean squared misfit vs mean squared curvature
    M = np.ascontiguousarray(np.vstack([A, D2]))
    rhs = np.concatenate([b, np.zeros(G - 2)])
    # unit columns (e^{tau s} spans orders of magnitude); norms taken after a max-scaling so
    # that squaring large entries cannot overflow
    peak = np.abs(M).max(axis=0)
    peak[peak == 0] = 1.0
    scale = peak * np.linalg.norm(M / peak, axis=0)
    M = np.ascontiguousarray(M / scale)
    if nonneg:
        p, it = _core.nnls(M, rhs, 50 * G)
        if it < 0:
            raise RuntimeError(f"the non-negative least squares did not converge in {-it} iterations; "
                               f"increase regularization (got {lam})")
    else:
        p, it = np.linalg.lstsq(M, rhs, rcond=None)[0], 0
    p = p / scale
    mass = float(p @ w)
    residual = float(np.linalg.norm(A @ p - b) / math.sqrt(t.size))
    density = p / mass if mass != 0 else p
    return DensityFit(s=s, density=density, mass=mass, residual=residual, iterations=int(abs(it)))


@finite_result
def wasserstein1(s, p, q) -> float:
    """Wasserstein-1 distance between two densities p, q on the same increasing grid s.

    The integral of ``|CDF_p - CDF_q|`` (trapezoid rule; each density normalised first): the
    error measure of the density inversion of Laplace-Radon eq. 35.

    Parameters
    ----------
    s : array_like, shape (G,)
        Increasing grid.
    p : array_like, shape (G,)
        First density on the grid.
    q : array_like, shape (G,)
        Second density on the grid.

    Returns
    -------
    float
        The distance, in units of s.

    Examples
    --------
    >>> s = np.linspace(0, 1, 101)
    >>> round(ag.wasserstein1(s, np.ones(101), np.ones(101)), 12)
    0.0
    """
    s = real_array("s", s).astype(np.float64).ravel()
    check_finite("s", s)
    with np.errstate(over="ignore"):
        if s.size < 2 or np.any(np.diff(s) <= 0):
            raise ValueError(f"s must be increasing with at least 2 points, got shape {s.shape}")
    # The grid is scaled by a power of two (exact) so that its steps neither overflow nor
    # vanish, each density by its largest entry (the CDFs are normalised anyway).
    e = int(np.frexp(np.max(np.abs(s)))[1])
    step = np.diff(np.ldexp(s, -e))
    if np.any(step <= 0):
        raise ValueError(f"s must be increasing at a resolution the float grid scaled by 2^{-e} keeps")
    cdfs = []
    for name, d in (("p", p), ("q", q)):
        d = real_array(name, d).astype(np.float64)
        if d.shape != s.shape:
            raise ValueError(f"{name} must have the grid's shape {s.shape}, got {d.shape}")
        if np.any(d < 0) or not np.all(np.isfinite(d)) or d.sum() <= 0:
            raise ValueError(f"{name} must be a finite non-negative density with positive mass")
        d = d / d.max()
        c = np.concatenate([[0.0], np.cumsum(0.5 * (d[1:] + d[:-1]) * step)])
        cdfs.append(c / c[-1])
    gap = np.abs(cdfs[0] - cdfs[1])
    with np.errstate(over="ignore"):
        return float(np.ldexp(np.sum(0.5 * (gap[1:] + gap[:-1]) * step), e))
