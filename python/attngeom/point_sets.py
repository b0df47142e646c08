"""Point sets from their projections: the inverse Radon step of a point cloud (Laplace-Radon s.9).

An inverse Laplace step (:func:`attngeom.fit_exponential_sum`) gives, per direction u_j,
the projections s = u_j.k_i of the keys with their multiplicities and values.
:func:`reconstruct_points` recovers the points from those 1-D projections (matching by
value, or by candidate intersection); :func:`recover_keys` chains both steps on a head
seen only through its unnormalised transforms Z and N (probed, e.g., by
:func:`attngeom.head_probe`).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from ._operands import check_finite, finite_result, operand, scalar, uniform_grid
from .inverse import ExponentialSum, fit_exponential_sum


@dataclass
class PointSet:
    """Result of :func:`reconstruct_points`.

    Attributes
    ----------
    points
        (n, d) recovered points (their projection onto span(directions) when the
        directions do not span R^d: the rest is the limited-angle null, Laplace-Radon s.6.2).
    weights
        (n,) multiplicities (1 without `weights`).
    values
        (n, C) value vectors, or None.
    residual
        (n,) largest ``|u_j.x - s_j|`` over the directions.
    rank
        dimension of span(directions).
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
        if not isinstance(nodes, (list, tuple)):
            raise TypeError(f"{name} must be an (m, n) array or a list of m arrays, got {type(nodes).__name__}")
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


@finite_result
def reconstruct_points(directions, nodes, weights=None, values=None, *, tol: Optional[float] = None) -> PointSet:
    """Points in R^d from their 1D projections along m directions (inverse Radon of a point set).

    Laplace-Radon s.9.1. nodes[j] holds the projections s = u_j.x of every point along
    direction u_j, in any order (the output of an inverse Laplace step per direction). Two
    methods:

    - ``values`` given (the value vector a key carries is the same in every direction): the
      nodes are matched across directions by their values, then each point is the least
      squares solution of u_j.x = s_j over all m directions. Needs the directions to span
      the space and the value vectors to be distinct.
    - otherwise, candidate intersection: r = rank(directions) base directions generate
      candidates, the others confirm them (meet in the middle on the first confirming
      direction, so the cost is about n^{ceil((r + 1) / 2)}, not n^r); candidates are kept
      greedily by residual while each node has multiplicity left (nodes closer than `tol`
      are merged first, their multiplicities added). Exact for generic point sets with
      m >= r + 1 directions; use more confirming directions as n grows or when the nodes are
      noisy (a false candidate must fit every direction within `tol`).

    When the directions span only an r-dimensional subspace U, the points are recovered in U
    (x = P_U k): the components along U^perp are invisible, the limited-angle null of
    Laplace-Radon s.6.2.

    Parameters
    ----------
    directions : array_like, shape (m, d)
        The directions u_j.
    nodes : array_like, shape (m, n), or list of m arrays
        Projections per direction (NaN padding allowed: the fields of
        :func:`fit_exponential_sum`'s result can be passed as they are).
    weights : array_like or list, optional
        Multiplicities, shaped like nodes (rounded to integers by candidate intersection;
        kept as given by value matching).
    values : array_like, shape (m, n, C), or list of m (n_j, C) arrays, optional
        The value-weighted node weights (N's weights); with `weights` they are divided by
        the multiplicities to give each key's value vector.
    tol : float, optional
        The matching tolerance on projections (default 1e-8 times the largest ``|s|``); set
        it to a few times the noise level for noisy nodes.

    Returns
    -------
    PointSet
        Points (n, d), multiplicities, values, residuals and the rank of the directions.

    Examples
    --------
    >>> keys = np.array([[1.0, 2.0], [-1.0, 0.5], [0.3, -0.7]])
    >>> U = np.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
    >>> ps = ag.reconstruct_points(U, [U[j] @ keys.T for j in range(3)])
    >>> np.round(ps.points[np.argsort(ps.points[:, 0])], 8)
    array([[-1. ,  0.5],
           [ 0.3, -0.7],
           [ 1. ,  2. ]])
    """
    D = operand("directions", directions, "(m, d)", dtype=np.float64)
    m, d = D.shape
    zero = np.flatnonzero(~np.any(D != 0, axis=1))
    if zero.size:
        raise ValueError(f"directions[{zero[0]}] is zero: every projection needs a nonzero direction")
    # D x = s is solved for x' = 2^e x with D' = D / 2^e (exact), so that the SVD of the
    # directions neither overflows nor underflows; the points are scaled back at the end.
    e = int(np.frexp(np.max(np.abs(D)))[1])
    D = np.ldexp(D, -e)
    S, masks = _node_lists("nodes", nodes, m)
    if any(len(x) == 0 for x in S):
        raise ValueError("nodes must hold at least one projection per direction")
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
    with np.errstate(over="ignore", under="ignore"):
        points = np.ldexp(y @ basis.T, -e)
    return PointSet(points=points, weights=w, values=vals, residual=residual, rank=r)


def _solve_points(Dr, rows):
    """Least squares u_j.x = s_j for each point: rows (n, m) of matched projections."""
    return np.linalg.lstsq(Dr, rows.T, rcond=None)[0].T


def _nearest_gap(nodes, values):
    """``|value - nearest node|`` for each value (inf when there are no nodes)."""
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


@finite_result
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
    probe : callable
        ``probe(u, tau) -> (Z, N)`` with u (m, d), tau (T,), Z (m, T), N (m, T, d_v); see
        :func:`head_probe`.
    directions : array_like, shape (m, d)
        m >= d directions spanning R^d (more directions average noise).
    tau_grid : array_like, shape (T,)
        Uniform; imaginary (tau = i w) is well conditioned and needs step dw < pi / max
        ``|u.k|`` (no aliasing) and T >= 2 n + 2.
    order : int, optional
        Number of keys, passed to :func:`fit_exponential_sum`.
    rtol : float, optional
        Order threshold, passed to :func:`fit_exponential_sum`.

    Returns
    -------
    RecoveredHead
        Keys (n, d) in the order of the first direction's nodes, values, multiplicities, the
        per-direction fits and residuals.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> k, v = rng.uniform(-1, 1, (3, 2)), rng.standard_normal((3, 2))
    >>> U = np.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
    >>> head = ag.recover_keys(ag.head_probe(k, v), U, 1j * 0.5 * np.arange(32))
    >>> order = np.argsort(head.keys[:, 0])
    >>> bool(np.allclose(head.keys[order], k[np.argsort(k[:, 0])], atol=1e-8))
    True
    """
    D = operand("directions", directions, "(m, d)", dtype=np.float64)
    t, _, _ = uniform_grid("tau_grid", tau_grid)
    if not callable(probe):
        raise TypeError(f"probe must be a callable probe(directions, tau) -> (Z, N), got {type(probe).__name__}")
    try:
        Z, N = probe(D, t if np.any(t.imag != 0) else t.real)
    except ValueError as e:
        raise ValueError(f"probe refused these directions and tau_grid: {e}") from e
    Z, N = np.asarray(Z), np.asarray(N)
    if Z.shape != (D.shape[0], t.size) or N.ndim != 3 or N.shape[:2] != Z.shape:
        raise ValueError(f"probe must return Z (m, T) = {(D.shape[0], t.size)} and N (m, T, d_v), "
                         f"got {Z.shape} and {N.shape}")
    if not (np.all(np.isfinite(Z)) and np.all(np.isfinite(N))):
        raise ValueError("probe returned NaN or inf in Z or N for these directions and tau_grid")
    stacked = np.concatenate([Z[..., None], N], axis=-1)  # (m, T, 1 + d_v)
    try:
        fits = fit_exponential_sum(t, stacked, order=order, rtol=rtol, vector=True)
    except ValueError as e:  # the fit's arguments are this call's tau_grid and the probe's values
        raise ValueError(f"recover_keys: the probe's transforms on tau_grid cannot be fitted: {e}") from e
    nodes = [fits.nodes[j, : fits.order[j]] for j in range(D.shape[0])]
    mult = [fits.weights[j, : fits.order[j], 0] for j in range(D.shape[0])]
    vals = [fits.weights[j, : fits.order[j], 1:] for j in range(D.shape[0])]
    ps = reconstruct_points(D, nodes, weights=mult, values=vals)
    return RecoveredHead(keys=ps.points, values=ps.values, multiplicities=ps.weights, fits=fits, residual=ps.residual)
