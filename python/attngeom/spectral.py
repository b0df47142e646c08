"""Spectral diagnostics: the three null spaces of a head, factored SVDs, effective ranks.

Laplace-Radon s.5-6, s.12 and app. B name three bottlenecks of one head:

* hard parameter nulls, independent of data: ker(W_Q^T), ker(W_K^T), and the logit nulls
  ker(B), ker(B^T) of the bilinear form B = W_Q W_K^T (eq. 17-19), from
  :func:`parameter_nulls`;
* limited-angle nulls of a dataset: span(U)^perp of the observed tilts in key space and
  span(N)^perp of the normals n = W_K u in token space (eq. 20-23, 58), from
  :func:`tilt_coverage` / :class:`TiltCoverage`;
* routing nulls of one forward pass: ker(P) of the attention matrix (eq. 24-25), from
  :func:`routing_nulls`.

Every rank decision takes ``rtol``: singular values <= rtol * sigma_max count as zero, with
NumPy's matrix_rank default rtol = max(m, n) * eps for an m x n matrix; the singular values
are always returned too, so the gap is visible. Weights use the row convention of the
library: ``W_Q`` (d_model, d_k), q = x W_Q; stacked heads (..., d_model, d_head) are
accepted as they are (TransformerLens layout).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional, Union

import numpy as np

from . import _core
from ._deprecation import renamed_arguments
from ._operands import (batch_operands, broadcast_batch, check_finite, choice, check_size, compute_dtype, count,
                        finite_result, flag, logit_scale, operand, rtol_arg, scalar)
from .errors import ResultOverflow
from .subspace import Subspace

_KINDS = ("entropy", "energy", "participation")


# -- rank decisions ------------------------------------------------------------------------
def spectrum_rank(s: np.ndarray, rtol: Optional[float], m: int, n: int) -> np.ndarray:
    """Numerical ranks of the descending spectra s (..., k) of m x n matrices: the count of
    singular values > rtol * s_max, rtol = max(m, n) * eps by default (NumPy's matrix_rank
    rule). Returns int64 (...)."""
    if rtol is None:
        rtol = max(m, n) * np.finfo(s.dtype).eps
    if s.shape[-1] == 0:
        return np.zeros(s.shape[:-1], dtype=np.int64)
    return np.count_nonzero(s > rtol * s[..., :1], axis=-1).astype(np.int64)


def _objects(shape: tuple, make) -> Union[Subspace, np.ndarray]:
    """make(index) for every batch index: one object for shape (), else an object array."""
    if shape == ():
        return make(())
    out = np.empty(shape, dtype=object)
    for idx in np.ndindex(*shape):
        out[idx] = make(idx)
    return out


# -- SVDs ----------------------------------------------------------------------------------
def _svd(a: np.ndarray, vectors: bool):
    """Batched thin SVD through the core: (S, U, Vh) with batch axes restored. A matrix whose
    largest entry lies beyond 2^(+-max_exponent / 4) is scaled by a power of two first (exact),
    so the factorisation neither overflows nor loses digits to subnormals; S is scaled back."""
    batch = a.shape[:-2]
    limit = np.finfo(a.dtype).maxexp // 4
    e = np.zeros(batch + (1, 1), dtype=np.int64)
    if a.size:
        big = np.max(np.abs(a), axis=(-2, -1), keepdims=True)
        e = np.frexp(big)[1].astype(np.int64)
        e = np.where((big > 0) & (np.abs(e) > limit), e, 0)
        if np.any(e):
            a = np.ldexp(a, -e).astype(a.dtype, copy=False)
    (op,) = batch_operands(batch, [a], [2], [a.dtype])
    total = int(np.prod(batch, dtype=np.int64))
    s, u, vh = _core.batched_svd(total, op.array, op.index, vectors)
    k = s.shape[-1]
    s = s.reshape(batch + (k,))
    if np.any(e):
        with np.errstate(over="ignore", under="ignore"):
            s = np.ldexp(s, e[..., 0]).astype(s.dtype, copy=False)
    if vectors:
        u = u.reshape(batch + (a.shape[-2], k))
        vh = vh.reshape(batch + (k, a.shape[-1]))
    return s, u, vh


@finite_result
def singular_values(x) -> np.ndarray:
    """Singular values (descending) of x (..., m, n), batched.

    Computed by the core's batched SVD (OpenMP over the batch); used for every spectrum of
    Laplace-Radon s.5.3 (B = W_Q W_K^T) and s.12.

    Parameters
    ----------
    x : array_like, shape (..., m, n)
        Matrices; leading axes are a batch. float32 stays float32, other input is float64.

    Returns
    -------
    ndarray, shape (..., min(m, n))
        The singular values, descending.

    Examples
    --------
    >>> ag.singular_values(np.diag([1.0, 3.0]))
    array([3., 1.])
    """
    a = operand("x", x, "(..., m, n)")
    return _svd(a, vectors=False)[0]


class SVD(NamedTuple):
    """U (..., m, k), S (..., k) descending, Vh (..., k, n): M = U diag(S) Vh (NumPy's order)."""

    U: np.ndarray
    S: np.ndarray
    Vh: np.ndarray

    def __repr__(self) -> str:
        """Three lines: the shapes and dtypes, and the leading singular values."""
        from ._summary import array_summary, leading

        s = np.asarray(self.S)
        first = leading(s) if s.ndim == 1 else f"largest {float(s.max()):.4g}" if s.size else "none"
        return (f"SVD(U {array_summary(self.U)}\n    S {array_summary(self.S)}; singular values {first}\n"
                f"    Vh {array_summary(self.Vh)})")


@finite_result
def factored_svd(A, B) -> SVD:
    """SVD of the product A @ B without forming it.

    Thin QR factorizations A = Qa Ra and B^T = Qb Rb reduce the product to the small core
    Ra Rb^T, whose SVD Uc S Vc^T gives U = Qa Uc, Vh = (Qb Vc)^T. This is how the spectra of
    B = W_Q W_K^T (Laplace-Radon eq. 17) and of the OV circuit W_V W_O are computed: cost
    O((m + p) r^2) instead of O(m p min(m, p)) for the d_model x d_model product.

    Parameters
    ----------
    A : array_like, shape (..., m, r)
        Left factor.
    B : array_like, shape (..., r, p)
        Right factor; leading axes broadcast with A's (e.g. all heads).

    Returns
    -------
    SVD
        The named tuple (U, S, Vh): U (..., m, k), S (..., k), Vh (..., k, p) with
        k = min(m, r, p); float32 when both inputs are float32, else float64.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> W_Q, W_K = rng.standard_normal((2, 16, 4))
    >>> U, S, Vh = ag.factored_svd(W_Q, W_K.T)  # the spectrum of B = W_Q W_K^T
    >>> U.shape, S.shape, Vh.shape
    ((16, 4), (4,), (4, 16))
    >>> bool(np.allclose((U * S) @ Vh, W_Q @ W_K.T))
    True
    """
    a = operand("A", A, "(..., m, r)")
    b = operand("B", B, "(..., r, p)")
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"A (..., m, r) and B (..., r, p) must share r: got A {a.shape}, B {b.shape}")
    broadcast_batch([("A", a, 2), ("B", b, 2)])
    return product_svd(a, b)


def product_svd(a: np.ndarray, b: np.ndarray) -> SVD:
    """:func:`factored_svd` of checked operands a (..., m, r) and b (..., r, p) whose batch axes
    broadcast, without the checks; ResultOverflow where the singular values pass the float range."""
    batch = tuple(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
    dt = compute_dtype(a, b)
    # Each factor whose largest entry lies beyond 2^(+-max_exponent / 4) is scaled by a power
    # of two (exact), so the QR / SVD steps neither overflow nor lose digits to subnormals;
    # the singular values are scaled back (and refused where they pass the float range).
    limit, shift = np.finfo(dt).maxexp // 4, 0
    scaled = []
    for x in (a, b):
        big = float(np.max(np.abs(x))) if x.size else 0.0
        e = int(np.frexp(big)[1]) if big > 0 else 0
        e = e if abs(e) > limit else 0
        scaled.append(np.ldexp(x.astype(dt, copy=False), -e).astype(dt, copy=False) if e else x)
        shift += e
    oa, ob = batch_operands(batch, scaled, [2, 2], [dt, dt])
    total = int(np.prod(batch, dtype=np.int64))
    s, u, vh = _core.factored_svd(total, oa.array, oa.index, ob.array, ob.index, True)
    if shift:
        with np.errstate(over="ignore", under="ignore"):
            s = np.ldexp(s, shift).astype(s.dtype, copy=False)
        if not np.all(np.isfinite(s)):
            raise ResultOverflow("factored_svd: the singular values are beyond the float range")
    k = s.shape[-1]
    return SVD(u.reshape(batch + (a.shape[-2], k)), s.reshape(batch + (k,)), vh.reshape(batch + (k, b.shape[-1])))


# -- null spaces ---------------------------------------------------------------------------
def _null_from_svd(s, vh, n, rank) -> Subspace:
    """ker(M) in R^n from one thin SVD: the complement of the row space Vh[:rank]."""
    if vh.shape[0] == n and n - rank < rank:  # the full V is at hand: keep the smaller side directly
        return Subspace(vh[rank:].T)
    return Subspace(vh[:rank].T, complement=True)


@finite_result
def null_space(M, *, rtol=None):
    """Orthonormal basis of ker(M) = {z : M z = 0} by SVD, batched over leading axes.

    Laplace-Radon s.5-6 (the parameter and tilt nulls are kernels of this kind).

    Parameters
    ----------
    M : array_like, shape (..., m, n)
        Matrices.
    rtol : float, optional
        Singular values <= rtol * sigma_max count as zero; default max(m, n) * eps
        (NumPy's matrix_rank rule). Must be >= 0.

    Returns
    -------
    null : Subspace or ndarray of Subspace
        ker(M) in R^n for a single matrix, or an object ndarray of Subspaces with M's batch
        shape (batches may have different nullities); ``null.basis()`` is the (n, nullity)
        orthonormal basis, as ``scipy.linalg.null_space`` returns.
    singular_values : ndarray, shape (..., min(m, n))
        Descending, so the gap behind the rank decision is visible.

    Examples
    --------
    >>> null, s = ag.null_space(np.array([[1.0, 1.0, 0.0]]))
    >>> null.dim, s
    (2, array([1.4142]))
    >>> bool(np.allclose(np.array([[1.0, 1.0, 0.0]]) @ null.basis(), 0))
    True
    """
    a = operand("M", M, "(..., m, n)")
    rtol = rtol_arg(rtol)
    m, n = a.shape[-2:]
    s, _, vh = _svd(a, vectors=True)
    rank = spectrum_rank(s, rtol, m, n)
    return _objects(a.shape[:-2], lambda i: _null_from_svd(s[i], vh[i], n, int(rank[i]))), s


@dataclass
class ParameterNulls:
    """Hard parameter nulls of one head or a stack of heads (Laplace-Radon s.6.1, eq. 17-19).

    Each null is a :class:`Subspace` of R^d_model (an object array of them for stacked heads):

    ker_WQ_T : query-side invisible directions ker(W_Q^T)
    ker_WK_T : key-side invisible directions ker(W_K^T)
    ker_B    : key-side logit nulls ker(B), B = W_Q W_K^T: x_j^T B (x_i + a z) = x_j^T B x_i
    ker_BT   : query-side logit nulls ker(B^T)
    singular_values : (..., min(d_model, d_k)) singular values of B, descending
    rank : rank of B (int, or int array for stacked heads); ker_B.dim = d_model - rank
    rank_WQ, rank_WK : ranks of W_Q and W_K
    """

    ker_WQ_T: Union[Subspace, np.ndarray]
    ker_WK_T: Union[Subspace, np.ndarray]
    ker_B: Union[Subspace, np.ndarray]
    ker_BT: Union[Subspace, np.ndarray]
    singular_values: np.ndarray
    rank: Union[int, np.ndarray]
    rank_WQ: Union[int, np.ndarray]
    rank_WK: Union[int, np.ndarray]


def _head_weights(name: str, w, d_model: Optional[int] = None) -> np.ndarray:
    a = operand(name, w, "(..., d_model, d_head)")
    if d_model is None and a.ndim >= 2 and a.shape[-2] < a.shape[-1]:
        raise ValueError(f"{name} must be oriented (..., d_model, d_head) (queries are x {name}, d_head <= d_model); "
                         f"got {a.shape}, which reads as d_model {a.shape[-2]} < d_head {a.shape[-1]} (a torch "
                         f"Linear's weight is (d_head, d_model): pass its transpose)")
    if d_model is not None and a.shape[-2] != d_model:
        raise ValueError(f"{name} must have shape (..., {d_model}, d_head), got {a.shape}")
    return a


def _int(x):
    return int(x) if np.ndim(x) == 0 else x


@finite_result
def parameter_nulls(W_Q, W_K, *, rtol=None) -> ParameterNulls:
    """The hard parameter nulls of a head: ker(W_Q^T), ker(W_K^T), ker(B), ker(B^T).

    Laplace-Radon s.5.3-5.4, eq. 17-20. B = W_Q W_K^T (d_model x d_model) is never formed: its
    SVD comes from :func:`factored_svd`, so the cost is O(d_model d_k^2) per head. Ranks use
    the matrix_rank rule with B's dimensions (rtol default d_model * eps) and W_Q's, W_K's own.

    Parameters
    ----------
    W_Q, W_K : array_like, shape (d_model, d_k) or (..., d_model, d_k)
        One head, or stacked heads (e.g. (n_heads, d_model, d_head)); leading axes broadcast.
    rtol : float, optional
        Relative tolerance of every rank decision: singular values <= rtol * sigma_max count
        as zero. Default max(m, n) * eps for an m x n matrix (NumPy's matrix_rank rule), i.e.
        d_model * eps for B. Must be >= 0.

    Returns
    -------
    ParameterNulls
        The four nulls as Subspaces (object arrays of them for stacked heads), the singular
        values of B and the ranks of B, W_Q and W_K.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> W_Q, W_K = rng.standard_normal((2, 16, 4))
    >>> nulls = ag.parameter_nulls(W_Q, W_K)
    >>> nulls.rank, nulls.ker_B.dim, nulls.ker_WK_T.dim
    (4, 12, 12)
    """
    wq = _head_weights("W_Q", W_Q)
    wk = _head_weights("W_K", W_K, wq.shape[-2])
    if wk.shape[-1] != wq.shape[-1]:
        raise ValueError(f"W_Q and W_K must share d_k: got W_Q {wq.shape}, W_K {wk.shape}")
    rtol = rtol_arg(rtol)
    batch = broadcast_batch([("W_Q", wq, 2), ("W_K", wk, 2)])
    dt = compute_dtype(wq, wk)
    wq = np.broadcast_to(wq, batch + wq.shape[-2:]).astype(dt, copy=False)
    wk = np.broadcast_to(wk, batch + wk.shape[-2:]).astype(dt, copy=False)
    d_model, d_k = wq.shape[-2:]

    def range_complement(w):  # ker(W^T) = range(W)^perp
        s, u, _ = _svd(w, vectors=True)
        rank = spectrum_rank(s, rtol, d_model, d_k)
        return _objects(batch, lambda i: Subspace(u[i][:, : rank[i]], complement=True)), rank

    ker_q, rank_q = range_complement(wq)
    ker_k, rank_k = range_complement(wk)
    U, S, Vh = product_svd(wq, np.swapaxes(wk, -1, -2))
    rank = spectrum_rank(S, rtol, d_model, d_model)
    ker_b = _objects(batch, lambda i: Subspace(Vh[i][: rank[i]].T, complement=True))
    ker_bt = _objects(batch, lambda i: Subspace(U[i][:, : rank[i]], complement=True))
    return ParameterNulls(ker_q, ker_k, ker_b, ker_bt, S, _int(rank), _int(rank_q), _int(rank_k))


# -- effective ranks -----------------------------------------------------------------------
def _spectrum(x, spectrum: Optional[bool]) -> np.ndarray:
    a = operand("x", x, "(..., k) singular values or (..., m, n) matrices", min_ndim=1, dtype=None)
    spectrum = a.ndim == 1 if spectrum is None else flag("spectrum", spectrum)
    if spectrum:
        s = a.astype(compute_dtype(a), copy=False)
        if np.any(s < 0):
            raise ValueError("x: singular values must be >= 0")
        return s
    return singular_values(a)


def effective_rank(x, *, kind: str = "entropy", spectrum: Optional[bool] = None):
    """Effective rank of a matrix, or of given singular values, batched.

    kinds (sigma the singular values):

    * ``"entropy"``: exp(H(p)), p = sigma / sum sigma (Roy & Vetterli 2007). The
      Laplace-Radon paper's rank_eff(P) of the routing matrix (s.13.7, Fig. 7 and 10).
    * ``"energy"``: exp(H(p)), p = sigma^2 / sum sigma^2. The notes' r_eff of W_OV spectra
      ("spectral diagnostics"): the entropy of the variance fractions.
    * ``"participation"``: (sum sigma^2)^2 / sum sigma^4, the participation ratio; with
      sigma^2 read as eigenvalues it is the Laplace-Radon paper's dim_eff span(U) (s.13.6).

    A flat spectrum of k equal values gives k for every kind; all-zero gives 0.

    Parameters
    ----------
    x : array_like, shape (k,) or (..., m, n)
        A 1-D spectrum, or matrices. Pass ``spectrum=True`` for a batch of spectra (..., k).
    kind : {"entropy", "energy", "participation"}, default "entropy"
        Which effective rank.
    spectrum : bool, optional
        Whether x holds singular values; default: only a 1-D x does.

    Returns
    -------
    float or ndarray
        A float for a single spectrum or matrix, else an array of the batch shape.

    Examples
    --------
    >>> round(ag.effective_rank(np.ones(5)), 12)
    5.0
    >>> round(ag.effective_rank(np.array([1.0, 0.0, 0.0])), 6)
    1.0
    """
    choice("kind", kind, _KINDS)
    s = _scaled(_spectrum(x, spectrum).astype(np.float64))
    if kind == "participation":
        e = s * s
        num, den = e.sum(-1) ** 2, (e * e).sum(-1)
        out = np.divide(num, den, out=np.zeros_like(num), where=den > 0)
    else:
        w = s if kind == "entropy" else s * s
        total = w.sum(-1, keepdims=True)
        p = np.divide(w, total, out=np.zeros_like(w), where=total > 0)
        h = -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0), axis=-1)
        out = np.where(total[..., 0] > 0, np.exp(h), 0.0)
    return float(out) if out.ndim == 0 else out


def cumulative_energy(x, *, spectrum: Optional[bool] = None) -> np.ndarray:
    """E_k = sum_{i <= k} sigma_i^2 / sum_i sigma_i^2 for k = 1..K (the notes' E_k).

    The fraction of variance captured by the first k singular directions (notes, "spectral
    diagnostics"). Spectra are sorted descending first.

    Parameters
    ----------
    x : array_like, shape (k,) or (..., m, n)
        A 1-D spectrum or matrices, as in :func:`effective_rank`.
    spectrum : bool, optional
        Whether x holds singular values; default: only a 1-D x does.

    Returns
    -------
    ndarray, shape (..., K)
        E_1 .. E_K, ending at 1 (all zeros for an all-zero spectrum).

    Examples
    --------
    >>> ag.cumulative_energy([2.0, 1.0])
    array([0.8, 1. ])
    """
    s = np.sort(_scaled(_spectrum(x, spectrum).astype(np.float64)), axis=-1)[..., ::-1]
    e = np.cumsum(s * s, axis=-1)
    total = e[..., -1:]
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0)


# -- tilt coverage (limited-angle nulls) ---------------------------------------------------
@dataclass
class TiltCoverageResult:
    """Angular coverage of a head on a dataset (Laplace-Radon s.6.2, s.12.1, eq. 20-23, 58).

    Attributes
    ----------
    count
        number of (nonzero) tilts seen
    eigenvalues
        (d_k,) eigenvalues of C_u = E[u u^T] (or Cov(u) if centered), descending
    effective_dim
        (sum lambda)^2 / sum lambda^2, the paper's dim_eff span(U)
    rank
        dim span(U) (rank decision on the singular values of the stacked tilts)
    null
        span(U)^perp in R^d_k, the key-space limited-angle null (eq. 21), a Subspace
    token_eigenvalues
        (min(d_k, d_model),) eigenvalues of E[n n^T], n = W_K u (the rest of
        the d_model eigenvalues are exactly zero), or None without W_K
    effective_dim_token
        dim_eff span(N) (or None)
    token_rank
        dim span(N) (or None)
    token_null
        span(N)^perp in R^d_model (eq. 23) (or None)
    centered
        whether eigenvalues are of Cov(u) = E[u u^T] - E[u] E[u]^T
    """

    count: int
    eigenvalues: np.ndarray
    effective_dim: float
    rank: int
    null: Subspace
    token_eigenvalues: Optional[np.ndarray] = None
    effective_dim_token: Optional[float] = None
    token_rank: Optional[int] = None
    token_null: Optional[Subspace] = None
    centered: bool = False


def _scaled(s: np.ndarray) -> np.ndarray:
    """Spectra divided by their largest magnitude (zero spectra stay zero): the effective
    ranks and energy fractions are scale-free, and squares of large values cannot overflow."""
    big = np.max(np.abs(s), axis=-1, keepdims=True) if s.shape[-1] else np.ones(s.shape[:-1] + (1,))
    return s / np.where(big > 0, big, 1.0)


def _participation(lam: np.ndarray) -> float:
    return float(effective_rank(np.sqrt(np.clip(lam, 0, None)), kind="participation", spectrum=True))


class TiltCoverage:
    """Streaming accumulator of tilts u = q / ``|q|`` for :func:`tilt_coverage`.

    Holds the triangular factor R of the stacked tilts (U = Q R, so U^T U = R^T R exactly
    up to rounding), their count and their sum: O(d_k^2) memory whatever the number of
    tokens, and the rank decision is made on the singular values of R, which are those of
    U itself (no squaring of the condition number as a Gram matrix would do).

    ``update(u)`` adds rows u (..., d_k) (any nonzero vectors: they are normalised, zero
    rows are skipped, as a zero query has no tilt); ``merge(other)`` adds another
    accumulator's tilts (partial results from other processes combine exactly);
    ``result(W_K=None, rtol=None, centered=False)`` gives a :class:`TiltCoverageResult`.

    Example::

        acc = ag.TiltCoverage(d_k)
        for q in batches: acc.update(q)
        cov = acc.result(W_K=W_K)
    """

    def __init__(self, dim: int):
        self.dim = count("dim", dim)
        check_size("dim", 2 * self.dim * self.dim)  # the factor R and the stack it is refreshed from
        self.count = 0
        self._r = np.zeros((0, self.dim))
        self._sum = np.zeros(self.dim)
        self._float32 = None  # True while every input was float32

    def _note_dtype(self, is32: bool):
        self._float32 = is32 if self._float32 is None else (self._float32 and is32)

    def update(self, u) -> "TiltCoverage":
        """Add the tilts of the rows of u (..., d_k); returns self."""
        a = operand("u", u, f"(..., {self.dim})", dtype=None, nonempty=False, finite=False)
        if a.shape[-1] != self.dim:
            raise ValueError(f"u must have shape (..., {self.dim}), got {a.shape}")
        check_finite("u", a)
        self._note_dtype(a.dtype == np.float32)
        rows, nonzero = _unit_rows(a.reshape(-1, self.dim))
        rows = rows[nonzero]
        if rows.shape[0]:
            self._r = np.linalg.qr(np.vstack([self._r, rows]), mode="r")
            self.count += rows.shape[0]
            self._sum += rows.sum(axis=0)
        return self

    def merge(self, other: "TiltCoverage") -> "TiltCoverage":
        """Add another accumulator's tilts to this one; returns self."""
        if not isinstance(other, TiltCoverage):
            raise TypeError(f"other must be a TiltCoverage, got {type(other).__name__}")
        if other.dim != self.dim:
            raise ValueError(f"other has dim {other.dim}, this accumulator {self.dim}")
        if other.count:
            self._r = np.linalg.qr(np.vstack([self._r, other._r]), mode="r")
            self.count += other.count
            self._sum += other._sum
            self._note_dtype(bool(other._float32))
        return self

    @property
    def gram(self) -> np.ndarray:
        """sum_j u_j u_j^T (d_k, d_k), from the factor."""
        return self._r.T @ self._r

    @finite_result
    def result(self, *, W_K=None, rtol=None, centered: bool = False) -> TiltCoverageResult:
        """Spectra, effective dimensions and limited-angle nulls of the tilts seen so far.

        Parameters
        ----------
        W_K : array_like, shape (d_model, d_k), optional
            Adds the token-space normals n = W_K u (eq. 22).
        rtol : float, optional
            Rank threshold on singular values of the stacked tilts, relative to the
            largest; default max(count, d) * eps, eps of float32 when every input was float32.
        centered : bool, default False
            Eigenvalues of Cov(u) instead of E[u u^T] (the null is span(U)^perp either way).

        Returns
        -------
        TiltCoverageResult
            As :func:`tilt_coverage` returns.
        """
        if self.count == 0:
            raise ValueError("no tilts: update() the accumulator with nonzero vectors first")
        rtol = rtol_arg(rtol)
        wk = None
        if W_K is not None:
            wk = _key_weights(W_K, self.dim)
            if wk.ndim != 2:
                raise ValueError(f"W_K must have shape (d_model, {self.dim}), got {wk.shape}")
            wk = wk[None]
        eps = np.finfo(np.float32 if self._float32 else np.float64).eps
        return _coverage_results(self._r[None], np.array([self.count]), self._sum[None], wk, rtol, eps, centered)[0]


def _unit_rows(a: np.ndarray) -> tuple:
    """(rows of a (..., d) divided by their norms in float64, mask of the nonzero rows); zero
    rows stay zero. Each row is scaled by its largest entry first, so the norm neither
    overflows nor underflows (a row of 1e-160 still has a tilt)."""
    rows = a.astype(np.float64)
    big = np.max(np.abs(rows), axis=-1, keepdims=True) if rows.shape[-1] else np.zeros(rows.shape[:-1] + (1,))
    nonzero = big[..., 0] > 0
    rows = np.divide(rows, big, out=np.zeros_like(rows), where=big > 0)
    norm = np.linalg.norm(rows, axis=-1, keepdims=True)
    return np.divide(rows, norm, out=np.zeros_like(rows), where=norm > 0), nonzero


def _key_weights(W_K, d: int) -> np.ndarray:
    wk = operand("W_K", W_K, f"(..., d_model, {d})").astype(np.float64)
    if wk.shape[-1] != d:
        raise ValueError(f"W_K must have shape (..., d_model, {d}), got {wk.shape}")
    return wk


def _coverage_results(R, count, total, wk, rtol, eps, centered) -> list:
    """TiltCoverageResult per head from stacked factors R (h, r, d), counts (h,), sums (h, d)
    and key weights wk (h, d_model, d) or None: every SVD batched over the heads."""
    h, d = R.shape[0], R.shape[-1]

    def decide(s, cols, n):
        tol = (max(n, cols) * eps if rtol is None else rtol) * (s[0] if s.size else 0.0)
        return int(np.count_nonzero(s > tol))

    _, S, VH = np.linalg.svd(R, full_matrices=False)
    n = count.astype(np.float64)
    if centered:
        mean = total / n[:, None]
        gram = np.swapaxes(R, -1, -2) @ R
        cov = gram / n[:, None, None] - mean[:, :, None] * mean[:, None, :]
        lam, vec = np.linalg.eigh((cov + np.swapaxes(cov, -1, -2)) / 2)
        lam, vec = np.clip(lam[:, ::-1], 0, None), vec[:, :, ::-1]
        factor = vec * np.sqrt(lam)[:, None, :]  # Cov(u) = factor factor^T
    else:
        lam = np.zeros((h, d))
        lam[:, : S.shape[-1]] = S * S / n[:, None]
        factor = (np.swapaxes(VH, -1, -2) * S[:, None, :]) / np.sqrt(n)[:, None, None]  # E[uu^T]
    out = []
    for i in range(h):
        rank = decide(S[i], d, count[i])
        out.append(TiltCoverageResult(int(count[i]), lam[i], _participation(lam[i]), rank,
                                      Subspace(VH[i, :rank].T, complement=True), centered=centered))
    if wk is not None:
        wk = np.broadcast_to(wk, (h,) + wk.shape[-2:])
        # n = W_K u: E[n n^T] = (W_K factor)(W_K factor)^T; span(N) = W_K span(U).
        # (A non-finite matrix can send LAPACK's SVD into an endless loop: refused first.)
        with np.errstate(over="ignore", invalid="ignore"):
            token_factor, token_rows = wk @ factor, R @ np.swapaxes(wk, -1, -2)
        if not (np.all(np.isfinite(token_factor)) and np.all(np.isfinite(token_rows))):
            raise ResultOverflow("tilt coverage: W_K u is beyond the float range; rescale W_K")
        ST = np.linalg.svd(token_factor, compute_uv=False)
        # span(N)^perp from the tilts' own factor: the row space of R W_K^T.
        _, SN, VHN = np.linalg.svd(token_rows, full_matrices=False)
        for i, res in enumerate(out):
            res.token_eigenvalues = ST[i] * ST[i]
            res.effective_dim_token = _participation(res.token_eigenvalues)
            res.token_rank = decide(SN[i], wk.shape[-2], count[i])
            res.token_null = Subspace(VHN[i, : res.token_rank].T, complement=True)
    return out


@finite_result
def tilt_coverage(u, *, W_K=None, rtol=None, centered: bool = False, batch_ndim: int = 0):
    """Angular coverage of the tilts u (..., d_k) of a head on a dataset.

    Laplace-Radon s.6.2 and s.12.1: the eigenvalues of C_u = E[u u^T] (eq. 58), the
    effective angular dimension dim_eff span(U) (participation ratio of the eigenvalues),
    and the key-space limited-angle null span(U)^perp (eq. 21); with W_K (d_model, d_k) the
    same for the token-space normals n = W_K u (eq. 22-23). For data that does not fit in
    memory use :class:`TiltCoverage`.

    Parameters
    ----------
    u : array_like, shape (..., d_k)
        Tilts, or queries: rows are normalised first and zero rows are skipped.
    W_K : array_like, shape (d_model, d_k), optional
        The head's key weights, for the token-space coverage.
    rtol : float, optional
        Relative tolerance of the rank decisions, as in :func:`null_space`.
    centered : bool, default False
        Use Cov(u) = E[u u^T] - E[u] E[u]^T instead of E[u u^T].
    batch_ndim : int, default 0
        The first ``batch_ndim`` axes of u index heads, the rest are samples: one result
        per head, with every factorization batched over the heads. W_K may then be
        stacked, shape (..., d_model, d_k), broadcasting over the same heads.

    Returns
    -------
    TiltCoverageResult or ndarray of TiltCoverageResult
        Count, eigenvalues, effective dimension, rank and null of the tilts (and of the
        normals with W_K); with ``batch_ndim > 0`` an object array of the heads' shape.

    Examples
    --------
    >>> u = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    >>> cov = ag.tilt_coverage(u)
    >>> cov.rank, cov.null.dim, round(cov.effective_dim, 6)
    (2, 1, 2.0)
    >>> heads = ag.tilt_coverage(np.stack([u, u[::-1]]), batch_ndim=1)
    >>> heads.shape, heads[1].rank
    ((2,), 2)
    """
    a = operand("u", u, "(..., d_k)", dtype=None, finite=False)
    count("batch_ndim", batch_ndim, 0, a.ndim - 1, bound=f"in [0, {a.ndim - 1}] for u of shape {a.shape}")
    if batch_ndim == 0:
        acc = TiltCoverage(a.shape[-1]).update(a)
        if acc.count == 0:
            raise ValueError("u has no nonzero rows: its tilts are undefined")
        return acc.result(W_K=W_K, rtol=rtol, centered=centered)
    check_finite("u", a)
    rtol = rtol_arg(rtol)
    batch, d = a.shape[:batch_ndim], a.shape[-1]
    rows, nonzero = _unit_rows(a.reshape((-1, int(np.prod(a.shape[batch_ndim:-1], dtype=np.int64)), d)))
    counts = np.count_nonzero(nonzero, axis=-1)  # zero rows add nothing to R^T R
    if np.any(counts == 0):
        raise ValueError("u has a head with no nonzero rows: its tilts are undefined")
    wk = None
    if W_K is not None:
        wk = _key_weights(W_K, d)
        try:
            wk = np.broadcast_to(wk, batch + wk.shape[-2:]).reshape((-1,) + wk.shape[-2:])
        except ValueError:
            raise ValueError(f"W_K must have shape {batch} + (d_model, {d}) or broadcast to it, got {wk.shape}") \
                from None
    eps = np.finfo(np.float32 if a.dtype == np.float32 else np.float64).eps
    R = np.linalg.qr(rows, mode="r")
    results = _coverage_results(R, counts, rows.sum(axis=1), wk, rtol, eps, centered)
    out = np.empty(len(results), dtype=object)
    out[:] = results
    return out.reshape(batch)


# -- routing nulls -------------------------------------------------------------------------
@dataclass
class RoutingNulls:
    """Routing (forward-pass) nulls of attention matrices P (Laplace-Radon s.6.3, eq. 24-25).

    Attributes
    ----------
    rank
        rank(P) (int or int array of the batch shape)
    nullity
        dim ker(P) = n_k - rank
    null
        ker(P) in R^n_k (value perturbations P dV = 0 cannot reach the output), Subspace
        or object array of Subspaces
    singular_values
        (..., min(n_q, n_k)) descending
    effective_rank
        entropy effective rank of P (rank_eff(P) of s.13.7)
    """

    rank: Union[int, np.ndarray]
    nullity: Union[int, np.ndarray]
    null: Union[Subspace, np.ndarray]
    singular_values: np.ndarray
    effective_rank: Union[float, np.ndarray]


@renamed_arguments(P="routing")
@finite_result
def routing_nulls(routing, *, rtol=None) -> RoutingNulls:
    """Rank, nullity, null space and spectrum of attention (routing) matrices P.

    Laplace-Radon app. B.3: dim ker(P) = n_k - rank(P). Near one-hot routing lowers the rank
    and widens the set of value perturbations the head cannot see. The old keyword ``P`` is
    deprecated (use ``routing``).

    Parameters
    ----------
    routing : array_like, shape (..., n_q, n_k)
        Attention matrices (rows sum to 1 for softmax routing; any matrix is accepted).
    rtol : float, optional
        Relative tolerance of the rank decision, as in :func:`null_space`.

    Returns
    -------
    RoutingNulls
        Rank, nullity, ker(P) as Subspace(s), singular values and entropy effective rank.

    Examples
    --------
    >>> r = ag.routing_nulls(np.array([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]))
    >>> r.rank, r.nullity
    (1, 2)
    """
    P = operand("routing", routing, "(..., n_q, n_k)")
    null, s = null_space(P, rtol=rtol)
    n_k = P.shape[-1]
    if isinstance(null, Subspace):
        nullity = null.dim
    else:
        nullity = np.vectorize(lambda z: z.dim, otypes=[np.int64])(null)
    rank = n_k - nullity
    return RoutingNulls(_int(rank), _int(nullity), null, s, effective_rank(s, kind="entropy", spectrum=True))


# -- gauge symmetry ------------------------------------------------------------------------
@finite_result
def gauge_transform(W_Q, W_K, A):
    """The gauge map (W_Q, W_K) -> (W_Q A, W_K A^{-T}) that leaves B = W_Q W_K^T unchanged.

    Laplace-Radon s.9.4 / s.13.3: only B is identifiable from logits. W_K A^{-T} is computed by
    a solve, not an inverse.

    Parameters
    ----------
    W_Q, W_K : array_like, shape (..., d_model, d_k)
        Query and key weights; leading axes broadcast.
    A : array_like, shape (..., d_k, d_k)
        Invertible gauge matrix (ValueError otherwise).

    Returns
    -------
    W_Q2, W_K2 : ndarray, shape (..., d_model, d_k)
        The transformed weights.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> W_Q, W_K = rng.standard_normal((2, 8, 3))
    >>> wq, wk = ag.gauge_transform(W_Q, W_K, np.diag([1.0, 2.0, 4.0]))
    >>> bool(np.allclose(wq @ wk.T, W_Q @ W_K.T))
    True
    """
    wq = _head_weights("W_Q", W_Q)
    wk = _head_weights("W_K", W_K, wq.shape[-2])
    d_k = wq.shape[-1]
    if wk.shape[-1] != d_k:
        raise ValueError(f"W_Q and W_K must share d_k: got W_Q {wq.shape}, W_K {wk.shape}")
    a = operand("A", A, f"(..., {d_k}, {d_k})")
    if a.shape[-2:] != (d_k, d_k):
        raise ValueError(f"A must have shape (..., {d_k}, {d_k}), got {a.shape}")
    broadcast_batch([("W_Q", wq, 2), ("W_K", wk, 2), ("A", a, 2)])
    dt = compute_dtype(wq, wk, a)
    wq, wk, a = (x.astype(dt, copy=False) for x in (wq, wk, a))
    s = singular_values(a)
    if np.any(s[..., -1] <= s[..., 0] * d_k * np.finfo(dt).eps):
        raise ValueError("A must be invertible: its smallest singular value is zero to working precision")
    # W_K A^{-T} = (A^{-1} W_K^T)^T
    wk_new = np.swapaxes(np.linalg.solve(a, np.swapaxes(wk, -1, -2)), -1, -2)
    return wq @ a, wk_new


class GaugeErrors(NamedTuple):
    """Relative changes under a gauge transform (all ~ eps when the gauge holds)."""

    bilinear: float  # |B' - B|_F / |B|_F
    logits: float  # max |l' - l| / max |l|
    outputs: float  # max |y' - y| / max |y|


@finite_result
def gauge_invariance_error(W_Q, W_K, A, x, *, W_V=None, scale=None) -> GaugeErrors:
    """How much B, the logits and the attention outputs change under the gauge by A.

    Laplace-Radon s.9.4, s.13.3, Table 1 (gauge errors about 1e-15). B = W_Q W_K^T is compared
    in Frobenius norm without forming it (the SVD of the difference
    [W_Q, -W_Q A] [W_K, W_K A^{-T}]^T via :func:`factored_svd`), logits
    scale (x W_Q)(x W_K)^T and outputs softmax attention with values x W_V.

    Parameters
    ----------
    W_Q, W_K : array_like, shape (d_model, d_k)
        One head's query and key weights.
    A : array_like, shape (d_k, d_k)
        Invertible gauge matrix.
    x : array_like, shape (..., n, d_model)
        Tokens.
    W_V : array_like, shape (d_model, d_v), optional
        Value weights; default: the values are x itself.
    scale : float, optional
        Logit scale, default 1 / sqrt(d_k).

    Returns
    -------
    GaugeErrors
        Relative errors (bilinear, logits, outputs).

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> W_Q, W_K = rng.standard_normal((2, 8, 3))
    >>> x, A = rng.standard_normal((5, 8)), rng.standard_normal((3, 3))
    >>> err = ag.gauge_invariance_error(W_Q, W_K, A, x)
    >>> max(err) < 1e-12
    True
    """
    from .attention import softmax_attention

    wq = _head_weights("W_Q", W_Q)
    wk = _head_weights("W_K", W_K, wq.shape[-2])
    if wq.ndim != 2:
        raise ValueError(f"W_Q must be one head (d_model, d_k), got {wq.shape}")
    wq2, wk2 = gauge_transform(wq, wk, A)
    d_model, d_k = wq.shape
    xs = operand("x", x, f"(..., n, {d_model})")
    if xs.shape[-1] != d_model:
        raise ValueError(f"x must have shape (..., n, {d_model}), got {xs.shape}")
    scale = logit_scale(scale, d_k)
    dt = wq2.dtype
    diff = product_svd(np.concatenate([wq, -wq2], axis=1).astype(dt), np.concatenate([wk, wk2], axis=1).T.astype(dt)).S
    base = product_svd(wq.astype(dt), wk.T.astype(dt)).S
    bilinear = float(np.linalg.norm(diff) / max(np.linalg.norm(base), np.finfo(dt).tiny))
    xs = xs.astype(dt, copy=False)
    q1, k1, q2, k2 = xs @ wq.astype(dt), xs @ wk.astype(dt), xs @ wq2, xs @ wk2
    l1 = scale * q1 @ np.swapaxes(k1, -1, -2)
    l2 = scale * q2 @ np.swapaxes(k2, -1, -2)
    v = xs if W_V is None else xs @ _head_weights("W_V", W_V, d_model).astype(dt)
    y1 = softmax_attention(q1, k1, v, scale=scale, layout="bhnd")
    y2 = softmax_attention(q2, k2, v, scale=scale, layout="bhnd")

    def rel(a, b):
        return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), np.finfo(dt).tiny))

    return GaugeErrors(bilinear, rel(l2, l1), rel(y2, y1))
