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

Stabilising shifts: :func:`random_features` divides query features by exp(max_f (w_f.q -
``|q|^2``/2)) per query and key features by the maximum over the whole block. The fused
kernels of :func:`random_feature_attention` and its backward shift each feature by its own
running maximum over the keys summed so far, so the estimate is the log-domain one to rounding
however far the logits spread. The factors cancel in y = N / Z and are added back to log Z.

The forward estimate and its backward each run in one fused core kernel that never forms the
(n, m) feature matrices.
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple, Optional

import numpy as np

from . import _core
from ._docstrings import fill_doc
from ._operands import (AttentionOperands, causal_code, check_bound, check_size, count, finite_result, flag,
                        from_bhnd, generator, logit_scale, max_row_norm, operand, to_bhnd)
from .attention import AttentionGrads


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
        Orthogonalise blocks of up to `dim` rows (norms redrawn from the chi distribution);
        at most MAX_ORTHOGONAL_BLOCKS (2^20) blocks, i.e. num_features <= 2^20 dim.
    seed : int, default 0
        Seed of the NumPy generator (also None, a SeedSequence or a Generator). An integer seed
        fixes W, which is then drawn once per process and cached.

    Returns
    -------
    ndarray, shape (num_features, dim)
        The projection W, float64 (a fresh, writable array on every call).

    Examples
    --------
    >>> W = ag.feature_matrix(4, 8, seed=1)
    >>> W.shape, bool(abs(W[0] @ W[1]) < 1e-12)  # rows of one block are orthogonal
    ((8, 4), True)
    """
    return _feature_matrix(dim, num_features, orthogonal, seed, np.float64).copy()


#: The most orthogonal blocks (one QR factorisation each) a feature matrix is drawn in.
MAX_ORTHOGONAL_BLOCKS = 2 ** 20


def _feature_matrix(dim, num_features, orthogonal, seed, dtype) -> np.ndarray:
    """W (num_features, dim), C-contiguous in `dtype`; read-only and cached when `seed` is an
    integer."""
    dim, m = count("dim", dim), count("num_features", num_features)
    orthogonal = flag("orthogonal", orthogonal)
    check_size("dim, num_features", dim * max(m, dim) * 2)
    if orthogonal and -(-m // dim) > MAX_ORTHOGONAL_BLOCKS:
        raise ValueError(f"num_features = {m} in orthogonal blocks of dim = {dim} rows ask for {-(-m // dim)} QR "
                         f"factorisations, beyond the limit of MAX_ORTHOGONAL_BLOCKS = 2^20 (about half a minute): "
                         "use fewer features or orthogonal=False")
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, (bool, np.bool_)) and seed >= 0:
        return _cached_feature_matrix(dim, m, bool(orthogonal), int(seed), np.dtype(dtype).str)
    return np.ascontiguousarray(_draw_feature_matrix(dim, m, orthogonal, generator(seed)), dtype=dtype)


@functools.lru_cache(maxsize=64)
def _cached_feature_matrix(dim: int, m: int, orthogonal: bool, seed: int, dtype: str) -> np.ndarray:
    W = np.ascontiguousarray(_draw_feature_matrix(dim, m, orthogonal, generator(seed)), dtype=dtype)
    W.setflags(write=False)
    return W


def _draw_feature_matrix(dim: int, m: int, orthogonal: bool, rng: np.random.Generator) -> np.ndarray:
    if not orthogonal:
        return rng.standard_normal((m, dim))
    blocks = []
    for b in range(-(-m // dim)):
        # The first `need` columns of a Haar-distributed orthogonal matrix: Householder QR
        # builds them from the first `need` columns alone, so a partial last block (m < dim
        # included) costs dim x need, not dim x dim, and draws the same stream.
        need = min(dim, m - b * dim)
        q, r = np.linalg.qr(rng.standard_normal((dim, dim))[:, :need])
        q = q * np.sign(np.diag(r))
        norms = np.sqrt(rng.chisquare(dim, size=dim))
        blocks.append(q.T * norms[:need, None])
    return np.concatenate(blocks)


class RandomFeatures(NamedTuple):
    """phi (..., n, m) and log_shift: the features are phi * exp(log_shift[..., None])."""

    phi: np.ndarray
    log_shift: np.ndarray


def _features(x, W, root, per_row):
    """phi (..., n, m) and shift (..., n) of x (..., n, d) scaled by root, in the core."""
    lead, (n, d) = x.shape[:-2], x.shape[-2:]
    flat = np.ascontiguousarray(x.reshape((-1, n, d)))
    phi, shift = _core.positive_features(flat, np.ascontiguousarray(W, dtype=x.dtype), float(root), bool(per_row))
    return phi.reshape(lead + (n, W.shape[0])), shift.reshape(lead + (n,))


@finite_result
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
    num_features = count("num_features", num_features)
    check_size("num_features", a.size // max(a.shape[-1], 1) * num_features)
    per_row = flag("per_row", per_row)
    W = _feature_matrix(a.shape[-1], num_features, orthogonal, seed, a.dtype)
    return RandomFeatures(*_features(a, W, 1.0, per_row))


@fill_doc
def random_feature_attention(q, k, v, *, num_features: int = 256, orthogonal: bool = True, seed=0, causal=False,
                             scale: Optional[float] = None, return_log_partition: bool = False, layout=None):
    """FAVOR+ estimate of softmax attention, linear in the sequence length.

    Laplace-Radon s.7.3 (item 3): exp(q.k) = E_w[phi_w(q) phi_w(k)] with positive features,
    so Z and N are estimated by m features in O(n m d): S = sum_j phi(k_j) v_j^T and
    z = sum_j phi(k_j), then y_i = phi(q_i) S / phi(q_i) z. One fused core kernel computes
    the features block by block and never forms the (n, m) feature matrices; each feature's
    key sums carry their own running-maximum shift (rescaled when it grows) and each query a
    shift by its largest term, so exp never overflows and no term that matters underflows.
    Causal: chunks of 64 queries, each with the prefix state of the keys before it and one
    masked diagonal block; a query whose hidden keys lie far beyond the exponent range above
    the ones it sees is summed term by term there. Results do not depend on the thread count.

    Parameters
    ----------
    %(q_k_v)s
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
    layout : {None, "bhnd", "bnhd"}, optional
        The axes of q, k, v, y and log Z, as in :func:`attngeom.softmax_attention`.

    Returns
    -------
    y : ndarray, shape (..., n_q, d_v)
        N_hat / Z_hat (and log Z_hat). A query whose estimated Z underflows to 0 gets y = 0,
        log Z = -inf.

    Notes
    -----
    y and log Z equal the log-domain estimate (every term exp(l_q,f + l_k,f) summed by
    logsumexp) to rounding for logits of any size that the dtype holds, from ordinary ones to
    feature logits of 1e50 and beyond (where one term dominates).

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = 0.3 * rng.standard_normal((3, 8, 4))
    >>> y = ag.random_feature_attention(q, k, v, num_features=4096)
    >>> bool(np.abs(y - ag.softmax_attention(q, k, v)).max() < 0.05)
    True
    """
    layout, (q, k, v) = to_bhnd(layout, "random_feature_attention", [("q", q, "v"), ("k", k, "v"), ("v", v, "v")])
    y, log_z, empty = _favor_outputs(q, k, v, num_features, orthogonal, seed, causal, scale)
    if not return_log_partition:
        return from_bhnd(layout, y, "v")
    log_z[empty] = -np.inf
    return from_bhnd(layout, (y, log_z), "vs")


@finite_result(name="random_feature_attention")
def _favor_outputs(q, k, v, num_features, orthogonal, seed, causal, scale):
    """y, log Z with 0 where Z = 0, and where Z = 0: the -inf of an empty row is a value, not an
    overflow, so it is set after the finiteness check."""
    m = count("num_features", num_features)
    causal_code(causal)
    p = AttentionOperands(q, k, v, causal=causal)
    root = _feature_root(p, scale)
    W = _feature_matrix(p.d_k, m, orthogonal, seed, p.dtype)
    y, log_z = _core.favor_attention(p.core_args(), W, root, _CAUSAL_CHUNK)
    empty = np.isneginf(log_z)
    log_z[empty] = 0
    return p.shaped(y, p.n_q, p.d_v), p.shaped(log_z, p.n_q), p.shaped(empty, p.n_q)


def _feature_root(p: AttentionOperands, scale) -> float:
    """sqrt(scale), the factor of x' = sqrt(scale) x in the features phi(x') = exp(W x' -
    |x'|^2 / 2): refused (ValueError) when |x'|^2, which the kernel forms before halving it, may
    overflow its dtype; every logit of that row would be -inf, and the row read as if it saw no
    key."""
    scale = logit_scale(scale, p.d_k, positive=True)
    largest = max(max_row_norm(p.q.array), max_row_norm(p.k.array))
    check_bound(scale * largest * largest, p.dtype, "the squared feature norm scale |x|^2", "rescale q, k or scale")
    return math.sqrt(scale)


_CAUSAL_CHUNK = 64  # queries per chunk of the causal forward (one masked diagonal block each)


@finite_result
@fill_doc
def random_feature_attention_backward(q, k, v, dy, *, num_features: int = 256, orthogonal: bool = True, seed=0,
                                      causal=False, scale: Optional[float] = None, layout=None) -> AttentionGrads:
    """Cotangents (dq, dk, dv) of :func:`random_feature_attention` for dy, the features W fixed.

    y_i = N_i / Z_i with N_i = sum_j a_ij v_j, Z_i = sum_j a_ij, a_ij = phi(q_i).phi(k_j) over the
    keys query i sees, phi(x) = exp(W x' - ``|x'|^2`` / 2) / sqrt(m), x' = sqrt(scale) x
    (Laplace-Radon s.7.3), D_i = dy_i.y_i:

        dv_j = sum_i (a_ij / Z_i) dy_i,
        dl(k_j) = phi(k_j) o sum_i phi(q_i) (dy_i.v_j - D_i) / Z_i,
        dl(q_i) = phi(q_i) o sum_j phi(k_j) (dy_i.v_j - D_i) / Z_i,
        dx' = dl W - x' rowsum(dl),  dx = sqrt(scale) dx'.

    One C++ kernel, like the forward: the (n, m) feature matrices are never formed; queries are
    walked in the forward's order (dq), keys in reverse against the summed later queries (dk,
    dv), every term at the per-feature shifts its forward used, so the gradients hold wherever
    the forward's estimate does. The stabilising shifts cancel in y and get no gradient. The same
    W as the forward (same num_features, orthogonal, seed); rows with Z = 0 (y = 0) pass no
    gradient. Parallel over the batch (one thread per sequence).

    Parameters
    ----------
    q, k, v : array_like, shapes (..., n_q, d_k), (..., n_k, d_k), (..., n_k, d_v)
        As given to :func:`random_feature_attention`.
    %(dy)s
    num_features, orthogonal, seed, causal, scale
        As given to the forward: they fix the same feature matrix W.
    %(backward_layout)s

    %(grads_returns)s

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> q, k, v, dy = 0.5 * rng.standard_normal((4, 6, 3))
    >>> dq, dk, dv = ag.random_feature_attention_backward(q, k, v, dy, num_features=16)
    >>> dq.shape, dv.dtype
    ((6, 3), dtype('float64'))
    """
    layout, (q, k, v, dy) = to_bhnd(layout, "random_feature_attention_backward",
                                    [("q", q, "v"), ("k", k, "v"), ("v", v, "v"), ("dy", dy, "v")])
    m = count("num_features", num_features)
    causal_code(causal)
    shapes = [np.shape(a) for a in (q, k, v)]
    p = AttentionOperands(q, k, v, causal=causal)
    root = _feature_root(p, scale)
    W = _feature_matrix(p.d_k, m, orthogonal, seed, p.dtype)
    dq, dk, dv = _core.favor_attention_backward(p.core_args(), W, root, _CAUSAL_CHUNK, p.cotangent(dy))
    grads = AttentionGrads(*p.gradients(dq, dk, dv, shapes))
    return from_bhnd(layout, grads, "vvv")
