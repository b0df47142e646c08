"""Projection (Gaussian-distance) attention and the local flattening it causes.

Sanger, "Scaled Dot-Product Attention implements projection of inputs onto a common
surface": with weights z_ij proportional to exp(-``|q_i - k_j|^2`` / (2 sigma^2)), normalised
over j, the output y_i = sum_j z_ij v_j projects each query onto the surface spanned by
nearby keys (cross-attention y = z k when v = k; self-attention q = k = v).

The paper writes the distance ``|q - k|`` where the squared distance ``|q - k|^2`` is meant (its
eq. 3-14): only with the square does the identity with softmax hold. Here the square is
used. Expanding ``|q - k|^2`` = ``|q|^2`` + ``|k|^2`` - 2 q.k, the ``|q|^2`` term is constant along a row
and cancels in the normalisation, so the weights are exactly softmax weights with logits
q.k / sigma^2 and a per-key bias -``|k|^2`` / (2 sigma^2). That is how they are computed: by
the flash softmax kernel with that bias, after moving the origin to the keys' mean
(distances do not change, magnitudes and rounding do), so tiny sigma and far-away clouds
neither overflow nor lose the nearest key.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ._deprecation import renamed_arguments
from ._docstrings import fill_doc
from ._operands import (attention_kinds, broadcast_batch, check_bound, check_nonempty, compute_dtype, count,
                        finite_result, from_bhnd, max_row_norm, operand, query_key_value, real_array, reduce_to_shape,
                        scalar, to_bhnd)
from .attention import AttentionGrads, attention_backward, softmax_attention
from .spectral import effective_rank, singular_values


@renamed_arguments(return_weights="return_routing")
def projection_attention(q, k, v=None, *, sigma=1.0, causal=False, mask=None, return_routing=False, layout=None):
    """Gaussian-distance attention y_i = sum_j z_ij v_j, z_ij ~ exp(-``|q_i - k_j|^2`` / (2 sigma^2)).

    Sanger, "Scaled Dot-Product Attention implements projection of inputs onto a common
    surface", eq. (3)-(14) with the squared distance (the paper writes ``|q - k|``; see the
    module docstring). For unit-norm q and k and sigma = 1 it equals
    ``softmax_attention(q, k, v, scale=1)`` exactly.

    Parameters
    ----------
    q : array_like, shape (..., n_q, d)
        Queries.
    k : array_like, shape (..., n_k, d)
        Keys.
    v : array_like, shape (..., n_k, d_v), optional
        Values, default k (the paper's form y = z k). Leading axes broadcast.
    sigma : float, default 1.0
        The Gaussian width (> 0).
    causal : {False, True, "top_left", "bottom_right"}, default False
        As in :func:`attngeom.softmax_attention`.
    mask : array_like, optional
        As in :func:`attngeom.softmax_attention` (boolean: True = attend; additive masks are
        added to the log-weights).
    return_routing : bool, default False
        Also return the routing matrix z, shape (..., n_q, n_k) (``return_weights`` is its
        deprecated name).
    layout : {None, "bhnd", "bnhd"}, optional
        The axes of q, k, v and y, as in :func:`attngeom.softmax_attention` (z keeps
        (..., heads, n_q, n_k)).

    Returns
    -------
    y : ndarray, shape (..., n_q, d_v)
        The output (and z with `return_routing`); dtype as in softmax_attention.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> q, k = rng.standard_normal((2, 5, 3))
    >>> q, k = q / np.linalg.norm(q, axis=1, keepdims=True), k / np.linalg.norm(k, axis=1, keepdims=True)
    >>> bool(np.allclose(ag.projection_attention(q, k), ag.softmax_attention(q, k, k, scale=1.0)))
    True
    """
    layout, (q, k, v) = to_bhnd(layout, "projection_attention", [("q", q, "v"), ("k", k, "v"), ("v", v, "v")])
    qc, kc, v, bias, scale = _centered(q, k, v, sigma, mask)
    out = softmax_attention(qc, kc, v, mask=bias, causal=causal, scale=scale, return_routing=return_routing,
                            layout="bhnd")
    return from_bhnd(layout, out, attention_kinds(return_routing, False))


def _centered(q, k, v, sigma, mask):
    """Checked operands as the softmax kernel sees them: q, k moved to the keys' mean, the
    per-key bias -|k_j - mean|^2 / (2 sigma^2) (with the mask folded in), scale 1 / sigma^2."""
    sigma = scalar("sigma", sigma, positive=True)
    qa, ka, va = query_key_value(q, k, v, width="d")
    if v is None:
        v = va = ka
    broadcast_batch([("q", qa, 2), ("k", ka, 2), ("v", va, 2)])
    dt = compute_dtype(qa, ka, va)
    qa, ka = qa.astype(dt, copy=False), ka.astype(dt, copy=False)
    center = ka.mean(axis=-2, keepdims=True)
    qc, kc = qa - center, ka - center
    # The logits q.k / sigma^2 - |k|^2 / (2 sigma^2) must be representable (the core bounds
    # the first term itself).
    inv = 1.0 / (sigma * sigma) if sigma * sigma > 0 else math.inf
    kmax = max_row_norm(kc)
    check_bound(inv, dt, f"1 / sigma^2 (sigma = {sigma:.3g})", "sigma is too small")
    check_bound(0.5 * inv * kmax * kmax, dt, f"|k - mean|^2 / (2 sigma^2) (sigma = {sigma:.3g})",
                "sigma is too small for these keys")
    bias = (-0.5 * inv) * np.sum(kc * kc, axis=-1)[..., None, :]  # (..., 1, n_k)
    if mask is not None:
        m = real_array("mask", mask, allow_bool=True)
        if m.dtype.kind == "b":
            bias = np.where(m, bias, -np.inf)
        else:
            check_nonempty("mask", m, "broadcastable to (..., n_q, n_k)")
            bias = bias + m
    return qc, kc, v, bias.astype(dt, copy=False), inv


@finite_result
@fill_doc
def projection_attention_backward(q, k, v, dy, *, sigma=1.0, causal=False, mask=None,
                                  layout=None) -> AttentionGrads:
    """Cotangents (dq, dk, dv) of :func:`projection_attention` for the output cotangent dy (sigma fixed).

    With l_ij = -``|q_i - k_j|^2`` / (2 sigma^2) + mask_ij (Sanger eq. 3-14, squared distance) and
    dl_ij = z_ij (dy_i.v_j - dy_i.y_i):

        dq_i = sum_j dl_ij (k_j - q_i) / sigma^2,   dk_j = sum_i dl_ij (q_i - k_j) / sigma^2,
        dv_j = sum_i z_ij dy_i

    (sum_j dl_ij = 0, so dq_i = sum_j dl_ij k_j / sigma^2). Computed by the flash softmax
    backward on the centred operands, with the gradient of the per-key bias
    -``|k_j|^2`` / (2 sigma^2) from the same pass; no n_q x n_k buffer. With v omitted (v = k),
    dk includes the value path.

    Parameters
    ----------
    q, k : array_like, shapes (..., n_q, d) and (..., n_k, d)
        As given to :func:`projection_attention`.
    v : array_like, shape (..., n_k, d_v), or None
        As given to the forward (None: the keys are the values).
    %(dy)s
    sigma, causal, mask
        As given to :func:`projection_attention` (sigma gets no gradient).
    %(backward_layout)s

    Returns
    -------
    AttentionGrads
        (dq, dk, dv) with the shapes of q, k, v (dv is None when v was omitted, its
        gradient then being part of dk); dtype as the forward's.

    Raises
    ------
    ValueError
        Naming dy for a cotangent of the wrong shape or dtype, or containing NaN.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> x, dy = rng.standard_normal((2, 5, 3))
    >>> dq, dk, dv = ag.projection_attention_backward(x, x, None, dy, sigma=0.5)
    >>> dq.shape, dk.shape, dv is None
    ((5, 3), (5, 3), True)
    """
    layout, (q, k, v, dy) = to_bhnd(layout, "projection_attention_backward",
                                    [("q", q, "v"), ("k", k, "v"), ("v", v, "v"), ("dy", dy, "v")])
    value_is_key = v is None
    qc, kc, vv, bias, scale = _centered(q, k, v, sigma, mask)
    (gq, gk, gv), dbias = attention_backward(qc, kc, vv, dy, mask=bias, causal=causal, scale=scale,
                                             key_bias_grad=True)
    dbias = reduce_to_shape(dbias, kc.shape[:-1])
    dkc = gk - dbias[..., None] * kc * kc.dtype.type(scale)
    # q - c and k - c with c the keys' mean: c's cotangent spreads evenly over the keys.
    n_k = kc.shape[-2]
    dc = -reduce_to_shape(gq, kc.shape[:-2] + (1, kc.shape[-1])) - dkc.sum(axis=-2, keepdims=True)
    dk = dkc + dc / n_k
    if value_is_key:
        dk = dk + gv
        gv = None
    return from_bhnd(layout, AttentionGrads(reduce_to_shape(gq, np.shape(q)), reduce_to_shape(dk, np.shape(k)), gv),
                     "vvv")


@dataclass
class LocalFlatness:
    """Local dimension of a token cloud before and after a layer (Sanger s.3 "flattening").

    Attributes
    ----------
    neighbors
        (n, n_neighbors) indices of each point's nearest neighbours in x (itself included)
    before, after
        (n,) participation-ratio dimension (sum lambda)^2 / sum lambda^2 of the
        covariance of each neighbourhood in x and of the same points in y
    mean_before, mean_after
        their means
    """

    neighbors: np.ndarray
    before: np.ndarray
    after: np.ndarray
    mean_before: float
    mean_after: float

    def summary(self) -> dict:
        return {"local_dim_before": self.mean_before, "local_dim_after": self.mean_after,
                "ratio": self.mean_after / self.mean_before if self.mean_before > 0 else float("nan")}


def _local_dims(points: np.ndarray, neighbors: np.ndarray) -> np.ndarray:
    patches = points[neighbors]  # (n, m, d)
    patches = patches - patches.mean(axis=1, keepdims=True)
    return np.asarray(effective_rank(singular_values(patches), kind="participation", spectrum=True))


@finite_result
def local_flatness(x, y, *, n_neighbors=10) -> LocalFlatness:
    """Participation-ratio dimension of local neighbourhoods before (x) and after (y) a layer.

    Sanger s.3 claims self-attention projects each token onto the surface through its
    neighbours, "flattening" the cloud. For each token i take its n_neighbors nearest tokens in
    x (i included); the eigenvalues lambda of the covariance of those tokens give the local
    dimension (sum lambda)^2 / sum lambda^2; the same tokens after the layer (rows of y) give
    the dimension after. A flattening layer lowers it.

    Parameters
    ----------
    x : array_like, shape (n, d)
        Tokens before the layer.
    y : array_like, shape (n, d')
        The same tokens after it (e.g. ``ag.projection_attention(x, x)``).
    n_neighbors : int, default 10
        Neighbourhood size, 2 <= n_neighbors <= n.

    Returns
    -------
    LocalFlatness
        Neighbour indices, the local dimensions before and after, and their means.

    Examples
    --------
    >>> x = np.random.default_rng(0).standard_normal((60, 3))
    >>> lf = ag.local_flatness(x, ag.projection_attention(x, x, sigma=0.5))
    >>> bool(lf.mean_after < lf.mean_before)
    True
    """
    xa = operand("x", x, "(n, d)", dtype=None)
    ya = operand("y", y, f"(n, d') with n = {xa.shape[0]} (from x)", ndim=2, dtype=None)
    if ya.shape[0] != xa.shape[0]:
        raise ValueError(f"y must have shape (n, d') with n = {xa.shape[0]} (from x), got {ya.shape}")
    n = xa.shape[0]
    count("n_neighbors", n_neighbors, 2, n, bound=f"in [2, n = {n}]")
    xf, yf = xa.astype(np.float64), ya.astype(np.float64)
    sq = np.sum(xf * xf, axis=1)
    dist = sq[:, None] + sq[None, :] - 2 * xf @ xf.T
    np.fill_diagonal(dist, -np.inf)  # each point is its own nearest neighbour
    neighbors = np.argsort(dist, axis=1, kind="stable")[:, :n_neighbors]
    before, after = _local_dims(xf, neighbors), _local_dims(yf, neighbors)
    return LocalFlatness(neighbors, before, after, float(before.mean()), float(after.mean()))
