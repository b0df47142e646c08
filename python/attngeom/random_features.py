"""Positive random features (FAVOR+) and the linear-time estimator of softmax attention.

Laplace-Radon s.7.3 (item 3): exp(q.k) = E_w[exp(w.q - ``|q|^2``/2) exp(w.k - ``|k|^2``/2)] for
w ~ N(0, I), so with m features phi(x) = exp(W x - ``|x|^2``/2) / sqrt(m) the partition
Z_i = sum_j exp(scale q_i.k_j) and numerator N_i = sum_j exp(scale q_i.k_j) v_j have the
unbiased estimates phi(q_i).sum_j phi(k_j) and phi(q_i).sum_j phi(k_j) v_j^T, computed in
O(n m d) by lightning attention (Choromanski et al., Performer). q and k are scaled by
sqrt(scale) each so that q.k scale is the softmax logit.

Orthogonal features: W in blocks of d_k rows, each block the Q of a Gaussian matrix's QR
with rows rescaled to chi(d_k)-distributed norms: every row is still N(0, I) (so Z stays
unbiased) but rows within a block are exactly orthogonal, which lowers the variance.

Stabilising shifts: query features are divided by exp(max_f (w_f.q - ``|q|^2``/2)) per query,
key features by the maximum over all keys and features of the head; both factors cancel in
y = N / Z and are added back to log Z.
"""
from __future__ import annotations

import math
from typing import NamedTuple, Optional

import numpy as np

from ._operands import causal_code, compute_dtype, count, operand, query_key_value, scalar
from .lightning import lightning_attention


def feature_matrix(dim: int, num_features: int, *, orthogonal: bool = True, seed=0) -> np.ndarray:
    """Random projection W (num_features, dim) with N(0, I) rows (orthogonal blocks optional).

    The w ~ N(0, I) draws of the positive random features of Laplace-Radon s.7.3 (FAVOR+).
    Orthogonal blocks keep each row's N(0, I) marginal and lower the estimator's variance.

    Parameters
    ----------
    dim : int
        Dimension d_k of the vectors the features act on.
    num_features : int
        Number m of features (rows).
    orthogonal : bool, default True
        Orthogonalise blocks of up to `dim` rows (norms redrawn from the chi distribution).
    seed : int, default 0
        Seed of the NumPy generator.

    Returns
    -------
    ndarray, shape (num_features, dim)
        The projection W.

    Examples
    --------
    >>> W = ag.feature_matrix(4, 8, seed=1)
    >>> W.shape, bool(abs(W[0] @ W[1]) < 1e-12)  # rows of one block are orthogonal
    ((8, 4), True)
    """
    dim, m = count("dim", dim), count("num_features", num_features)
    rng = np.random.default_rng(seed)
    if not orthogonal:
        return rng.standard_normal((m, dim))
    blocks = []
    for _ in range(-(-m // dim)):
        q, r = np.linalg.qr(rng.standard_normal((dim, dim)))
        q = q * np.sign(np.diag(r))  # Haar-distributed orthogonal matrix
        norms = np.sqrt(rng.chisquare(dim, size=dim))
        blocks.append(q.T * norms[:, None])
    return np.concatenate(blocks)[:m]


class RandomFeatures(NamedTuple):
    """phi (..., n, m) and log_shift: the features are phi * exp(log_shift[..., None])."""

    phi: np.ndarray
    log_shift: np.ndarray


def _features(x, W, shift_axes):
    logits = x @ W.T - 0.5 * np.sum(x * x, axis=-1, keepdims=True)
    shift = np.max(logits, axis=shift_axes, keepdims=True)
    phi = np.exp(logits - shift) / math.sqrt(W.shape[0])
    return phi, shift


def random_features(x, num_features: int, *, orthogonal: bool = True, seed=0, per_row: bool = True) -> RandomFeatures:
    """Positive random features phi(x) = exp(W x - ``|x|^2`` / 2) / sqrt(m) of the rows of x.

    Laplace-Radon s.7.3 (FAVOR+): exp(q.k) = E_w[phi_w(q) phi_w(k)]. Each row (per_row) or the
    whole block is shifted by its maximum so exp never overflows; the unshifted features are
    ``phi * exp(log_shift)[..., None]``.

    Parameters
    ----------
    x : array_like, shape (..., n, d)
        Vectors, one per row.
    num_features : int
        Number m of features.
    orthogonal : bool, default True
        Orthogonal blocks in W (see :func:`feature_matrix`).
    seed : int, default 0
        The draw of W.
    per_row : bool, default True
        Shift each row by its own maximum (queries) or, if False, the whole (n, m) block by
        one maximum (keys).

    Returns
    -------
    RandomFeatures
        The shifted features phi (..., n, m), log_shift (..., n) and W.

    Examples
    --------
    >>> x = np.random.default_rng(0).standard_normal((5, 3))
    >>> f = ag.random_features(x, 16)
    >>> f.phi.shape
    (5, 16)
    """
    a = operand("x", x, "(..., n, d)")
    W = feature_matrix(a.shape[-1], num_features, orthogonal=orthogonal, seed=seed).astype(a.dtype)
    phi, shift = _features(a, W, -1 if per_row else (-2, -1))
    return RandomFeatures(phi, np.broadcast_to(shift[..., 0], a.shape[:-1]).copy())


def random_feature_attention(q, k, v, *, num_features: int = 256, orthogonal: bool = True, seed=0, causal=False,
                             scale: Optional[float] = None, return_log_partition: bool = False):
    """FAVOR+ estimate of softmax attention, linear in the sequence length.

    Laplace-Radon s.7.3 (item 3): exp(q.k) = E_w[phi_w(q) phi_w(k)] with positive features,
    so Z and N are estimated by m features in O(n m d). Causal prefix sums use the chunked
    lightning kernel.

    Parameters
    ----------
    q : array_like, shape (..., n_q, d_k)
        Queries.
    k : array_like, shape (..., n_k, d_k)
        Keys.
    v : array_like, shape (..., n_k, d_v)
        Values; leading axes broadcast.
    num_features : int, default 256
        Number m >= 1 of features.
    orthogonal : bool, default True
        Orthogonal blocks (lower variance) or iid rows.
    seed : int, default 0
        The draw of W (the same W for every batch element).
    causal : {False, True, "top_left", "bottom_right"}, default False
        As in :func:`attngeom.softmax_attention`.
    scale : float, optional
        Logit scale, default 1 / sqrt(d_k).
    return_log_partition : bool, default False
        Also return the estimate of log Z, shape (..., n_q).

    Returns
    -------
    y : ndarray, shape (..., n_q, d_v)
        N_hat / Z_hat (and log Z_hat). A query whose estimated Z underflows to 0 gets y = 0,
        log Z = -inf.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = 0.3 * rng.standard_normal((3, 8, 4))
    >>> y = ag.random_feature_attention(q, k, v, num_features=4096)
    >>> bool(np.abs(y - ag.softmax_attention(q, k, v)).max() < 0.05)
    True
    """
    m = count("num_features", num_features)
    causal_code(causal)
    qa, ka, va = query_key_value(q, k, v)
    d_k = qa.shape[-1]
    dt = compute_dtype(qa, ka, va)
    scale = 1.0 / math.sqrt(d_k) if scale is None else scalar("scale", scale, positive=True)
    root = dt.type(math.sqrt(scale))
    W = feature_matrix(d_k, m, orthogonal=orthogonal, seed=seed).astype(dt)
    phi_q, shift_q = _features(qa.astype(dt) * root, W, -1)
    phi_k, shift_k = _features(ka.astype(dt) * root, W, (-2, -1))
    ones = np.ones(va.shape[:-1] + (1,), dt)
    out = lightning_attention(phi_q, phi_k, np.concatenate([va.astype(dt), ones], axis=-1), causal=causal)
    num, den = out[..., :-1], out[..., -1]
    y = np.divide(num, den[..., None], out=np.zeros_like(num), where=den[..., None] > 0)
    if not return_log_partition:
        return y
    with np.errstate(divide="ignore"):
        log_z = np.log(den) + shift_q[..., 0] + shift_k[..., 0, 0][..., None]
    return y, log_z
