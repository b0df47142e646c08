"""The inverse pipeline of the Laplace-Radon picture (Laplace-Radon s.9, eqs. 34-37).

For a fixed tilt u, Z(u, tau) = sum_i exp(tau s_i) with s_i = u.k_i is an exponential sum
(eq. 36) and N(u, tau) the same sum weighted by the values v_i. Inverting the Laplace step
recovers the projected measure {(s_i, multiplicity, value)} per direction
(:func:`fit_exponential_sum`, matrix pencil; :func:`invert_laplace_density` for continuous
projected densities); inverting the Radon step recovers the points from their projections
(:func:`reconstruct_points`); :func:`recover_keys` chains both on a head seen only through
its unnormalised transforms. Image-space Radon inversion (filtered backprojection, SART)
lives in :mod:`attngeom.radon`.

Real tau samples the Laplace transform itself and is badly conditioned (the nodes
exp(tau s) crowd together); imaginary tau = i w samples the characteristic function, whose
nodes exp(i w s) spread over the unit circle: prefer it whenever the head can be probed
there (:func:`laplace_radon_transform` accepts complex tau).
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from . import _core
from ._arrays import check_finite, check_nonempty, real_array, scalar


@dataclass
class ExponentialSum:
    """Result of :func:`fit_exponential_sum`.

    nodes : (..., M) ascending projected coordinates s_i; NaN beyond each problem's order.
    weights : (..., M) or (..., M, C) the weights c_i (multiplicities for Z, value-weighted
        for N); 0 beyond the order.
    order : (...) int, the number of nodes found.
    singular_values : (..., K) of the stacked Hankel matrix (the gap decides the order).
    residual : (...) relative misfit |f - model| / |f| of the fitted real sum.
    """

    nodes: np.ndarray
    weights: np.ndarray
    order: np.ndarray
    singular_values: np.ndarray
    residual: np.ndarray


def _tau_grid(tau) -> tuple:
    t = np.asarray(tau)
    if t.dtype.kind not in "fiuc":
        raise TypeError(f"tau must be a real or complex array, got dtype {t.dtype}")
    if t.ndim != 1 or t.size < 3:
        raise ValueError(f"tau must have shape (N,) with N >= 3 samples, got {t.shape}")
    if not np.all(np.isfinite(t)):
        raise ValueError("tau contains NaN or infinite values")
    t = t.astype(np.complex128)
    step = t[1] - t[0]
    if step == 0 or np.max(np.abs(np.diff(t) - step)) > 1e-9 * max(abs(step), np.max(np.abs(t))):
        raise ValueError("tau must be uniformly spaced")
    if np.all(t.imag == 0):
        kind = "real"
    elif np.all(t.real == 0):
        kind = "imaginary"
    else:
        raise ValueError("tau must be real or purely imaginary (uniformly spaced on a line through 0)")
    return t, step, kind


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

    Parameters
    ----------
    tau : array_like (N,), uniformly spaced, real or purely imaginary (N >= 2 M + 1).
        Imaginary tau = i w: nodes are identifiable only for |s| < pi / dw (aliasing).
    values : array_like (..., N) scalar samples, or (..., N, C) vector samples sharing nodes
        (e.g. Z and N stacked as channels). A trailing axis of length N is read as scalar
        samples unless ``vector=True``.
    order : int, optional; the number of nodes when known. Otherwise decided per problem:
        with `rtol`, the number of singular values above rtol * sigma_1 (set rtol to the noise
        level); without, the largest log-gap among the singular values above the rounding
        floor (so a noise tail is never read as nodes).
    pencil : int, optional; the pencil parameter L (default N // 2; Hua-Sarkar recommend
        N/3 <= L <= N/2). At most min(L, C (N - L)) nodes can be found.

    Returns
    -------
    ExponentialSum with real nodes and weights (the projected measures are real; imaginary
    parts are dropped and `residual` measures the misfit of the real model).

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

    Example: ``fit = ag.fit_exponential_sum(1j * w, Z)``; ``fit.nodes``, ``fit.weights``
    """
    t, step, kind = _tau_grid(tau)
    N = t.size
    f = np.asarray(values)
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
    L = N // 2 if pencil is None else int(pencil)
    if not 1 <= L <= N - 2:
        raise ValueError(f"pencil must lie in [1, N - 2] = [1, {N - 2}], got {L}")
    order_in = 0
    if order is not None:
        order_in = int(order)
        cap = min(L, C * (N - L))
        if not 1 <= order_in <= cap:
            raise ValueError(f"order must lie in [1, {cap}] for N = {N} samples and pencil {L}, got {order_in}")
    r = 0.0
    if rtol is not None:
        r = scalar("rtol", rtol)
        if not 0 < r < 1:
            raise ValueError(f"rtol must lie in (0, 1), got {r}")
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
    s_c = np.ascontiguousarray(np.nan_to_num(s), dtype=np.complex128)
    w = _core.exp_sum_weights(t, s_c, orders.astype(np.int64), fb).real
    valid = np.arange(Mmax)[None, None, :] < orders[:, None, None]
    basis = np.exp(np.einsum("k,bm->bkm", t, s_c)) * valid  # (B, N, M)
    model = np.einsum("bkm,bmc->bck", basis, w)
    norm = np.linalg.norm(fb.reshape(B, -1), axis=1)
    residual = np.linalg.norm((fb - model).reshape(B, -1), axis=1) / np.where(norm > 0, norm, 1)
    weights = w if vector else w[..., 0]
    return ExponentialSum(nodes=s.reshape(batch + (Mmax,)), weights=weights.reshape(batch + weights.shape[1:]),
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


def invert_laplace_density(tau, Z, s_grid, *, regularization: float = 1e-3, nonneg: bool = True) -> DensityFit:
    """A projected density p(s) from samples of its Laplace transform Z(tau) = int e^{tau s} p(s) ds.

    The inverse Laplace step for continuous projected measures (Laplace-Radon eq. 35),
    CONTIN-style: p on the grid minimises
        mean_k ((A p)_k / Z_k - 1)^2 + regularization * mean_j ((D2 p)_j)^2,   p >= 0,
    with A_kj = e^{tau_k s_j} w_j (trapezoid weights w), the misfit taken relative to Z_k
    (noise on a transform that spans e^{tau s} is relative), D2 the second difference of
    the grid values. Solved as one non-negative least
    squares problem (Lawson-Hanson, C++), or by plain least squares with ``nonneg=False``.

    Parameters
    ----------
    tau : array_like (K,), real (need not be uniform).
    Z : array_like (K,), positive samples of the transform.
    s_grid : array_like (G,), increasing. It must cover where e^{tau s} p(s) carries mass for
        every sampled tau, not only the support's bulk: for N(0, sigma^2) and |tau| <= T
        that is |s| <= sigma^2 T + 3 sigma.
    regularization : float >= 0; the default 1e-3 gives (tau = 81 points on [-10, 10],
        G = 201, tests/test_inverse.py) Wasserstein-1 errors of 0.015 noiseless and 0.019 at
        relative noise 1e-3 for the uniform density on [-1, 1] (grid [-2, 2]); 0.0015 and
        0.010 for N(0, 0.5^2) (grid [-4, 4]).

    Returns DensityFit; ``fit.density`` integrates to 1 on the grid, ``fit.mass`` is Z(0).

    Example: ``fit = ag.invert_laplace_density(tau, np.sinh(tau) / tau, np.linspace(-2, 2, 201))``
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
    lam = scalar("regularization", regularization)
    if lam < 0:
        raise ValueError(f"regularization must be >= 0, got {lam}")
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


def wasserstein1(s, p, q) -> float:
    """Wasserstein-1 distance between two densities p, q on the same increasing grid s
    (the integral of |CDF_p - CDF_q|, trapezoid rule; each density normalised first)."""
    s = real_array("s", s).astype(np.float64).ravel()
    if s.size < 2 or np.any(np.diff(s) <= 0):
        raise ValueError(f"s must be increasing with at least 2 points, got shape {s.shape}")
    cdfs = []
    for name, d in (("p", p), ("q", q)):
        d = real_array(name, d).astype(np.float64)
        if d.shape != s.shape:
            raise ValueError(f"{name} must have the grid's shape {s.shape}, got {d.shape}")
        if np.any(d < 0) or not np.all(np.isfinite(d)) or d.sum() <= 0:
            raise ValueError(f"{name} must be a finite non-negative density with positive mass")
        c = np.concatenate([[0.0], np.cumsum(0.5 * (d[1:] + d[:-1]) * np.diff(s))])
        cdfs.append(c / c[-1])
    gap = np.abs(cdfs[0] - cdfs[1])
    return float(np.sum(0.5 * (gap[1:] + gap[:-1]) * np.diff(s)))


@dataclass
class PointSet:
    """Result of :func:`reconstruct_points`.

    points : (n, d) recovered points (their projection onto span(directions) when the
        directions do not span R^d: the rest is the limited-angle null, Laplace-Radon s.6.2).
    weights : (n,) multiplicities (1 without `weights`).
    values : (n, C) value vectors, or None.
    residual : (n,) largest |u_j.x - s_j| over the directions.
    rank : dimension of span(directions).
    """

    points: np.ndarray
    weights: np.ndarray
    values: Optional[np.ndarray]
    residual: np.ndarray
    rank: int


def _node_lists(name, nodes, m, masks=None):
    """nodes as m 1-D arrays: a list of arrays, or an (m, n, ...) array NaN-padded along n
    (as fit_exponential_sum returns). `masks` (from the nodes) select the valid entries of a
    padded weights or values array. Returns (lists, masks)."""
    if isinstance(nodes, np.ndarray) or (isinstance(nodes, (list, tuple)) and nodes and np.ndim(nodes[0]) == 0):
        arr = np.asarray(nodes, dtype=np.float64)
        if arr.ndim < 2 or arr.shape[0] != m:
            raise ValueError(f"{name} must have shape (m, n, ...) (NaN padded) or be a list of m arrays, m = {m}, "
                             f"got {arr.shape}")
        if masks is None:
            if arr.ndim != 2:
                raise ValueError(f"{name} must have shape (m, n), got {arr.shape}")
            masks = [~np.isnan(row) for row in arr]
        elif arr.shape[1] != len(masks[0]):
            raise ValueError(f"{name} must be padded like the nodes ({len(masks[0])} per direction), got {arr.shape}")
        lists = [row[mk] for row, mk in zip(arr, masks)]
    else:
        if len(nodes) != m:
            raise ValueError(f"{name} must hold one array per direction (m = {m}), got {len(nodes)}")
        lists = [np.asarray(x, dtype=np.float64) for x in nodes]
        if masks is None:
            lists = [x.ravel() for x in lists]
            masks = [np.ones(len(x), bool) for x in lists]
    for j, x in enumerate(lists):
        check_finite(f"{name}[{j}]", x)
    return lists, masks


def _merge_nodes(s, w, tol):
    """Nodes closer than tol become one node (weight-averaged) carrying the summed weight."""
    order = np.argsort(s)
    s, w = s[order], w[order]
    if s.size == 0:
        return s, w
    group = np.concatenate([[0], np.cumsum(np.diff(s) > tol)])
    total = np.bincount(group, weights=w)
    mean = np.bincount(group, weights=w * s) / total
    return mean, total


def reconstruct_points(directions, nodes, weights=None, values=None, *, tol: Optional[float] = None) -> PointSet:
    """Points in R^d from their 1D projections along m directions (inverse Radon of a point set).

    nodes[j] holds the projections s = u_j.x of every point along direction u_j, in any
    order (the output of an inverse Laplace step per direction). Two methods:

    - ``values`` given (the value vector a key carries is the same in every direction): the
      nodes are matched across directions by their values, then each point is the least
      squares solution of u_j.x = s_j over all m directions. O(m n log n)-ish; needs the
      directions to span the space and the value vectors to be distinct.
    - otherwise, candidate intersection: r = rank(directions) base directions generate
      candidates, the others confirm them (meet in the middle on the first confirming
      direction, so the cost is about n^{ceil((r + 1) / 2)}, not n^r); candidates are kept
      greedily by residual while each node has multiplicity left (nodes closer than `tol`
      are merged first, their multiplicities added). Exact for generic point
      sets with m >= r + 1 directions; use more confirming directions as n grows or when
      the nodes are noisy (a false candidate must fit every direction within `tol`).

    Parameters
    ----------
    directions : array_like (m, d)
    nodes : (m, n) array (NaN padding allowed) or a list of m arrays.
    weights : like nodes, optional: multiplicities (rounded to integers by candidate
        intersection; kept as given by value matching).
    values : (m, n, C) array or a list of m (n_j, C) arrays, optional: the value-weighted
        node weights (N's weights, as fit_exponential_sum returns them); with `weights` they
        are divided by the multiplicities to give each key's value vector.
    Padded arrays (nodes NaN beyond each direction's order) are read with the nodes' mask, so
    the fields of fit_exponential_sum's result can be passed as they are.
    tol : float, optional: the matching tolerance on projections (default 1e-8 times the
        largest |s|); set it to a few times the noise level for noisy nodes.

    Returns PointSet. When the directions span only an r-dimensional subspace U, the
    points are recovered in U (x = P_U k): the components along U^perp are invisible,
    the limited-angle null of Laplace-Radon s.6.2.

    Example: ``ps = ag.reconstruct_points(U, [U[j] @ keys.T for j in range(len(U))])``
    """
    D = real_array("directions", directions).astype(np.float64)
    if D.ndim != 2:
        raise ValueError(f"directions must have shape (m, d), got {D.shape}")
    check_nonempty("directions", D, "(m, d)")
    check_finite("directions", D)
    m, d = D.shape
    S, masks = _node_lists("nodes", nodes, m)
    W = None if weights is None else [w.ravel() for w in _node_lists("weights", weights, m, masks)[0]]
    V = None
    if values is not None:
        V, _ = _node_lists("values", values, m, masks)
        for j in range(m):
            if V[j].ndim != 2 or V[j].shape[0] != len(S[j]):
                raise ValueError(f"values[{j}] must have shape (n_j, C) = ({len(S[j])}, C), got {V[j].shape}")
    for j in range(m):
        if W is not None and W[j].shape != S[j].shape:
            raise ValueError(f"weights[{j}] must match nodes[{j}] {S[j].shape}, got {W[j].shape}")
    # orthonormal coordinates of span(directions)
    _, sv, vt = np.linalg.svd(D, full_matrices=False)
    r = int(np.sum(sv > max(m, d) * np.finfo(float).eps * sv[0]))
    basis = vt[:r].T  # (d, r)
    Dr = D @ basis  # (m, r)
    scale = max(1.0, max((np.abs(x).max() if x.size else 0.0) for x in S))
    tol = 1e-8 * scale if tol is None else scalar("tol", tol, positive=True)
    if V is not None:
        y, w, vals = _match_by_values(Dr, S, W, V)
    else:
        merged = [_merge_nodes(S[j], np.ones(len(S[j])) if W is None else W[j], tol) for j in range(m)]
        S, W = [a for a, _ in merged], [b for _, b in merged]
        y, w = _candidate_intersection(Dr, S, W, r, tol)
        vals = None
        if len(y) == 0:
            warnings.warn("reconstruct_points found no point consistent with every direction within tol; "
                          "for noisy nodes set tol to a few times the noise level", RuntimeWarning, stacklevel=2)
    pred = y @ Dr.T  # (n, m)
    residual = np.max(np.stack([_nearest_gap(S[j], pred[:, j]) for j in range(m)], axis=1), axis=1) \
        if len(y) else np.zeros(0)
    return PointSet(points=y @ basis.T, weights=w, values=vals, residual=residual, rank=r)


def _solve_points(Dr, rows):
    """Least squares u_j.x = s_j for each point: rows (n, m) of matched projections."""
    return np.linalg.lstsq(Dr, rows.T, rcond=None)[0].T


def _nearest_gap(nodes, values):
    """|value - nearest node| for each value (inf when there are no nodes)."""
    if nodes.size == 0:
        return np.full(values.shape, np.inf)
    sorted_nodes = np.sort(nodes)
    pos = np.clip(np.searchsorted(sorted_nodes, values), 1, max(sorted_nodes.size - 1, 1))
    below = sorted_nodes[np.minimum(pos - 1, sorted_nodes.size - 1)]
    above = sorted_nodes[np.minimum(pos, sorted_nodes.size - 1)]
    return np.minimum(np.abs(values - below), np.abs(values - above))


def _separation(x):
    """For each entry of x, the distance to its nearest other entry (inf when alone)."""
    if x.size < 2:
        return np.full(x.shape, np.inf)
    order = np.argsort(x)
    gaps = np.diff(x[order])
    sep = np.minimum(np.concatenate([[np.inf], gaps]), np.concatenate([gaps, [np.inf]]))
    out = np.empty_like(sep)
    out[order] = sep
    return out


def _match_by_values(Dr, S, W, V):
    """Match nodes across directions by their value vectors. Directions with fewer nodes than
    the most (two keys merged by a near-collision there) are left out of the matching; the
    others must still span the space."""
    counts = np.array([len(x) for x in S])
    n = int(counts.max())
    use = [j for j in range(len(S)) if counts[j] == n]
    if np.linalg.matrix_rank(Dr[use]) < Dr.shape[1]:
        raise ValueError(f"only directions {use} resolve all {n} nodes and they do not span the space: nodes "
                         "collide in the others (add directions)")
    Dr, S = Dr[use], [S[j] for j in use]
    W = None if W is None else [W[j] for j in use]
    V = [V[j] for j in use]
    m = len(use)
    per_key = [V[j] / (W[j][:, None] if W is not None else 1.0) for j in range(m)]
    ref = per_key[0]
    rows = np.empty((n, m))
    vals = np.empty((n, m, ref.shape[1]))
    seps = np.empty((n, m))
    rows[:, 0], vals[:, 0], seps[:, 0] = S[0], ref, _separation(S[0])
    for j in range(1, m):
        dist = np.linalg.norm(ref[:, None, :] - per_key[j][None, :, :], axis=2)
        match = np.argmin(dist, axis=1)
        if len(np.unique(match)) != n:
            raise ValueError(f"value vectors do not match one-to-one between directions {use[0]} and {use[j]} "
                             "(repeated values: use candidate intersection, values=None)")
        rows[:, j], vals[:, j], seps[:, j] = S[j][match], per_key[j][match], _separation(S[j])[match]
    # each key's least squares down-weights the directions where its node nearly collides
    # with another (those nodes are the least accurate)
    wts = np.minimum(1.0, seps / np.median(seps[np.isfinite(seps)])) if np.any(np.isfinite(seps)) else np.ones_like(seps)
    y = np.stack([np.linalg.lstsq(Dr * wts[i][:, None], rows[i] * wts[i], rcond=None)[0] for i in range(n)]) \
        if n else np.zeros((0, Dr.shape[1]))
    # a key's value is read where its node is best separated from the others (best conditioned)
    values = vals[np.arange(n), np.argmax(seps, axis=1)]
    w = np.ones(n) if W is None else W[0].copy()
    return y, w, values


def _candidate_intersection(Dr, S, W, r, tol):
    m = Dr.shape[0]
    # base: r directions by pivoted Gram-Schmidt (the best-conditioned choice, so noise on
    # the base nodes is not amplified), the rest confirm
    base, R = [], Dr.copy()
    for _ in range(r):
        j = int(np.argmax(np.linalg.norm(R, axis=1)))
        base.append(j)
        e = R[j] / np.linalg.norm(R[j])
        R = R - np.outer(R @ e, e)
        R[base] = 0.0
    confirm = [j for j in range(m) if j not in base]
    if not confirm:
        raise ValueError(f"candidate intersection needs at least rank + 1 = {r + 1} directions, got {m}")
    C = Dr[confirm] @ np.linalg.inv(Dr[base])  # s_confirm = C @ s_base
    full = np.all(np.abs(C) > 1e-8 * np.abs(C).max(axis=1, keepdims=True), axis=1)
    if not np.any(full):
        raise ValueError("directions are degenerate for candidate intersection: every confirming direction lies "
                         f"in the span of fewer than {r} of the others; add a direction in general position")
    first = int(np.argmax(full))  # the meet-in-the-middle direction involves every base node
    confirm = [confirm[first]] + confirm[:first] + confirm[first + 1:]
    C = np.concatenate([C[first:first + 1], C[:first], C[first + 1:]])
    c0 = C[0]
    half = (r + 1) // 2
    left_dirs, right_dirs = base[:half], base[half:]

    def grid(dirs):
        if not dirs:
            return np.zeros((1, 0), dtype=np.int64)
        return np.stack(np.meshgrid(*[np.arange(len(S[j])) for j in dirs], indexing="ij"), -1).reshape(-1, len(dirs))

    L = grid(left_dirs)
    R = grid(right_dirs)
    lsum = sum(c0[i] * S[base[i]][L[:, i]] for i in range(len(left_dirs))) if left_dirs else np.zeros(len(L))
    rsum_base = sum(c0[half + i] * S[base[half + i]][R[:, i]] for i in range(len(right_dirs))) if right_dirs else np.zeros(len(R))
    s_c0 = S[confirm[0]]
    # right side: target s_c0 - rsum over (right combos x nodes of confirm[0])
    rvals = (s_c0[None, :] - rsum_base[:, None]).ravel()
    order = np.argsort(rvals)
    rsorted = rvals[order]
    lo = np.searchsorted(rsorted, lsum - tol, side="left")
    hi = np.searchsorted(rsorted, lsum + tol, side="right")
    counts = hi - lo
    li = np.repeat(np.arange(len(L)), counts)
    # every position in [lo, hi) of every left combination, without a Python loop
    starts = np.repeat(lo - (np.cumsum(counts) - counts), counts)
    ri = order[starts + np.arange(counts.sum())]
    idx = np.concatenate([L[li], R[ri // len(s_c0)]], axis=1)  # node index per base direction
    sb = np.stack([S[base[i]][idx[:, i]] for i in range(r)], axis=1) if len(idx) else np.zeros((0, r))
    pred = sb @ C.T  # (cand, n_confirm)
    best = np.zeros((len(sb), len(confirm)), dtype=np.int64)
    err = np.zeros(len(sb))
    for t, j in enumerate(confirm):
        sj = np.sort(S[j])
        perm = np.argsort(S[j])
        pos = np.clip(np.searchsorted(sj, pred[:, t]), 1, max(len(sj) - 1, 1))
        cand_idx = np.stack([pos - 1, np.minimum(pos, len(sj) - 1)], 1)
        dist = np.abs(sj[cand_idx] - pred[:, [t]])
        pick = cand_idx[np.arange(len(sb)), np.argmin(dist, 1)]
        best[:, t] = perm[pick]
        err = np.maximum(err, np.abs(sj[pick] - pred[:, t]))
    keep = err <= tol
    idx, best, err = idx[keep], best[keep], err[keep]
    # greedy selection by residual, respecting multiplicities
    cap = [np.ones(len(S[j]), dtype=np.int64) if W is None else np.rint(W[j]).astype(np.int64) for j in range(m)]
    chosen, mult = [], []
    for c in np.argsort(err, kind="stable"):
        nodes_used = [(base[i], idx[c, i]) for i in range(r)] + [(confirm[t], best[c, t]) for t in range(len(confirm))]
        k = min(cap[j][i] for j, i in nodes_used)
        if k <= 0:
            continue
        for j, i in nodes_used:
            cap[j][i] -= k
        chosen.append(c)
        mult.append(k)
    if not chosen:
        return np.zeros((0, r)), np.zeros(0)
    rows = np.empty((len(chosen), m))
    for a, c in enumerate(chosen):
        for i in range(r):
            rows[a, base[i]] = S[base[i]][idx[c, i]]
        for t, j in enumerate(confirm):
            rows[a, j] = S[j][best[c, t]]
    return _solve_points(Dr, rows), np.asarray(mult, dtype=np.float64)


@dataclass
class RecoveredHead:
    """Result of :func:`recover_keys`: keys (n, d), values (n, d_v), multiplicities (n,),
    the per-direction fits (ExponentialSum over the stacked [Z, N] channels) and the
    points' residuals."""

    keys: np.ndarray
    values: np.ndarray
    multiplicities: np.ndarray
    fits: ExponentialSum
    residual: np.ndarray


def head_probe(k, v) -> Callable:
    """A probe of a head's unnormalised transforms for :func:`recover_keys`: the callable
    ``probe(u, tau) -> (Z, N)`` with u (m, d_k), tau (T,) (real or complex) returning
    Z (m, T) and N (m, T, d_v) through :func:`laplace_radon_transform` (Laplace-Radon eq. 34)."""
    from .laplace_radon import laplace_radon_transform

    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)

    def probe(u, tau):
        u = np.asarray(u, dtype=np.float64)
        tau = np.asarray(tau)
        m, T = u.shape[0], tau.size
        uu = np.broadcast_to(u[:, None, :], (m, T, u.shape[1]))
        tt = np.broadcast_to(tau[None, :], (m, T))
        Z, N = laplace_radon_transform(uu, tt, k, v)
        return Z, N

    return probe


def recover_keys(probe: Callable, directions, tau_grid, *, order: Optional[int] = None,
                 rtol: Optional[float] = None) -> RecoveredHead:
    """Recover a head's keys and values from its unnormalised transforms only (Laplace-Radon s.9.1).

    For each direction u_j the probe returns Z(u_j, tau) and N(u_j, tau) on `tau_grid`;
    the inverse Laplace step (:func:`fit_exponential_sum` on Z and N stacked as channels,
    so the nodes are shared) gives the projections s = u_j.k_i with multiplicities and the
    value vectors v_i (N's weights over Z's); the inverse Radon step
    (:func:`reconstruct_points` matching by value) gives the keys.

    Parameters
    ----------
    probe : callable (u (m, d), tau (T,)) -> (Z (m, T), N (m, T, d_v)); see :func:`head_probe`.
    directions : array_like (m, d), m >= d spanning R^d (more directions average noise).
    tau_grid : array_like (T,), uniform; imaginary (tau = i w) is well conditioned and needs
        step dw < pi / max |u.k| (no aliasing) and T >= 2 n + 2.
    order, rtol : passed to fit_exponential_sum.

    Returns RecoveredHead; keys are in the order of the first direction's nodes.

    Example: ``head = ag.recover_keys(ag.head_probe(k, v), U, 1j * 0.5 * np.arange(64))``
    """
    D = real_array("directions", directions).astype(np.float64)
    if D.ndim != 2:
        raise ValueError(f"directions must have shape (m, d), got {D.shape}")
    t, _, _ = _tau_grid(tau_grid)
    Z, N = probe(D, t if np.any(t.imag != 0) else t.real)
    Z, N = np.asarray(Z), np.asarray(N)
    if Z.shape != (D.shape[0], t.size) or N.ndim != 3 or N.shape[:2] != Z.shape:
        raise ValueError(f"probe must return Z (m, T) = {(D.shape[0], t.size)} and N (m, T, d_v), "
                         f"got {Z.shape} and {N.shape}")
    stacked = np.concatenate([Z[..., None], N], axis=-1)  # (m, T, 1 + d_v)
    fits = fit_exponential_sum(t, stacked, order=order, rtol=rtol, vector=True)
    nodes = [fits.nodes[j, : fits.order[j]] for j in range(D.shape[0])]
    mult = [fits.weights[j, : fits.order[j], 0] for j in range(D.shape[0])]
    vals = [fits.weights[j, : fits.order[j], 1:] for j in range(D.shape[0])]
    ps = reconstruct_points(D, nodes, weights=mult, values=vals)
    return RecoveredHead(keys=ps.points, values=ps.values, multiplicities=ps.weights, fits=fits, residual=ps.residual)
