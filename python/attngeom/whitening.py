"""Whitened self-attention: the whitening recursion, covariance models, whiteness measures.

"Whitened Self-Attention" s.3-6. A batch of sequences x (B, T, D) (vectors x_i as rows) with
covariance Lambda_X (TD x TD) is whitened by W = Lambda_X^{-1/2} X (eq. 3). Under wide-sense
stationarity with lag-1 support, Lambda_X is block-tridiagonal block-Toeplitz with blocks
Lambda_0 = Cov(x_i, x_i) and Lambda_1 = Cov(x_i, x_{i-1}) (eq. 6); its block Cholesky factor
is block bidiagonal with diagonal blocks L_i and subdiagonal blocks M_i,

    L_i L_i^T = Lambda_0 - M_i M_i^T,   M_i = Lambda_1 L_{i-1}^{-T},

and with the steady-state blocks (L, M) the whitening filter W = L_full^{-1} X is the
recursion (eq. 9)

    w_0 = L^{-1} x_0,   w_i = L^{-1} (x_i - M w_{i-1}).

Whitened self-attention (eq. 4) is softmax attention over the w_i with no value matrix.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from . import _core
from ._deprecation import renamed_arguments
from ._docstrings import filler
from ._operands import check_finite, check_size, cotangent, count, finite_result, generator, operand, real_array, scalar
from .attention import softmax_attention

# Docstring sections shared in this module: the batch of sequences the statistics take, the
# arguments and the result of the generators.
_fill_doc = filler(batch_parameters="""\
    Parameters
    ----------
    x : array_like, shape (B, T, D)
        B sequences of T vectors.""", process_sizes="""\
    B : int
        Number of sequences.
    T : int
        Sequence length.
    seed : int, default 0
        Seed of the NumPy generator.""", sequences_returns="""\
    Returns
    -------
    ndarray, shape (B, T, D)
        The sequences.""")


def _filter(x, L, M, lname="L"):
    """Checked operands: L, M either (D, D) (steady state) or (T, D, D) (one pair per step)."""
    x = operand("x", x, "(..., T, D)")
    T, D = x.shape[-2:]
    La, Ma = real_array(lname, L), real_array("M", M)
    shapes = ((D, D), (T, D, D))
    if La.shape not in shapes:
        raise ValueError(f"{lname} must have shape ({D}, {D}) or ({T}, {D}, {D}), got {La.shape}")
    if Ma.shape != La.shape:
        raise ValueError(f"M must have {lname}'s shape {La.shape}, got {Ma.shape}")
    check_finite(lname, La)
    check_finite("M", Ma)
    lower = bool(np.all(np.triu(La, 1) == 0))
    L = np.ascontiguousarray(La, dtype=x.dtype)
    cond = _core.condition_bound(L, lower)
    if not np.isfinite(cond) or cond * np.finfo(x.dtype).eps > 0.1:
        raise ValueError(f"{lname} is singular to working precision (condition number at least {cond:.3g})")
    flat = np.ascontiguousarray(x.reshape((-1,) + x.shape[-2:]))
    M = np.ascontiguousarray(Ma, dtype=x.dtype)
    return x.shape, flat, L, M, lower, La.ndim == 3


def _finite(w: np.ndarray, L: np.ndarray, M: np.ndarray) -> np.ndarray:
    """The recursion's output, or a ValueError when it overflowed (x, L and M are finite, so
    only growth can make it non-finite: an unstable filter, spectral radius of L^{-1} M >= 1,
    or an L tiny in absolute terms, which the relative condition check cannot see)."""
    if np.all(np.isfinite(w)):
        return w
    L64, M64 = L.astype(np.float64), M.astype(np.float64)
    with np.errstate(all="ignore"):
        try:
            radius = float(np.max(np.abs(np.linalg.eigvals(np.linalg.solve(L64, M64)))))
        except np.linalg.LinAlgError:
            radius = math.inf
    smallest = float(np.min(np.linalg.svd(L64, compute_uv=False)))
    raise ValueError(f"the whitening recursion overflowed {w.dtype}: L and M give a filter that grows (spectral "
                     f"radius of L^-1 M {radius:.3g}, smallest singular value of L {smallest:.3g}); the recursion "
                     f"is stable for radius < 1 and an L that is not tiny")


def whiten(x, L, M) -> np.ndarray:
    """The whitening recursion w_0 = L^{-1} x_0, w_i = L^{-1}(x_i - M w_{i-1}) (eq. 9).

    Whitened self-attention s.4, eq. 9. Computed by the core: one GEMM across a chunk of
    sequences per step, OpenMP over chunks. Equals the block-bidiagonal solve
    W = L_full^{-1} X. A singular L raises a ValueError that names its condition number.

    Parameters
    ----------
    x : array_like, shape (..., T, D)
        Sequences (rows are the vectors x_i); leading axes are independent sequences.
    L : array_like, shape (D, D) or (T, D, D)
        Invertible diagonal block (a lower-triangular Cholesky factor uses triangular solves,
        any other L one LU factorization). With shape (T, D, D): one block per step, the
        time-varying factor of :func:`block_cholesky_factors` (exact whitening of the
        block-tridiagonal model from the first position on).
    M : array_like, shape (D, D) or (T, D, D)
        Subdiagonal block, shaped like L (M_0 is unused).

    Returns
    -------
    w : ndarray, shape (..., T, D)
        The whitened sequences, in x's dtype (float32 stays float32).

    Examples
    --------
    >>> x = ag.vector_ma1(0.5 * np.eye(2), B=400, T=6, seed=0)
    >>> L, M, *_ = ag.steady_state_factor(*ag.block_covariances(x))
    >>> w = ag.whiten(x, L, M)
    >>> w.shape, bool(ag.whiteness(w) < 0.6 * ag.whiteness(x))
    ((400, 6, 2), True)
    """
    shape, flat, L, M, lower, varying = _filter(x, L, M)
    return _finite(_core.whiten(flat, L, M, lower, 0, varying), L, M).reshape(shape)


class WhitenGrads(NamedTuple):
    """Cotangents of :func:`whiten`'s inputs: dx (x's shape), dL0 and dM (D, D)."""

    dx: np.ndarray
    dL0: np.ndarray
    dM: np.ndarray


@finite_result
def whiten_backward(x, L0, M, dw, *, w=None, block=None) -> WhitenGrads:
    """Cotangents (dx, dL0, dM) of the steady-state recursion :func:`whiten` for the cotangent dw.

    Forward (eq. 9): w_0 = L0^{-1} x_0, w_i = L0^{-1} z_i, z_i = x_i - M w_{i-1}. The adjoint
    runs backwards in time:

        g_{T-1} = dw_{T-1},  g_i = dw_i - M^T dz_{i+1},  dz_i = L0^{-T} g_i,  dx_i = dz_i,
        dL0 = -sum_i dz_i w_i^T,   dM = -sum_{i >= 1} dz_i w_{i-1}^T,

    summed over all sequences. C++ core: one GEMM and one solve per step across a chunk of
    sequences (OpenMP over chunks), then dL0 and dM as two GEMMs over all rows.

    In row form the adjoint step dz_i = (dw_i - dz_{i+1} M) L0^{-1} is the forward recursion
    with (L0^T, M^T) run on the time-reversed dw. With ``block`` it is computed that way by the
    blocked scan of :func:`whiten_scan` (for few, long sequences), then dL0 and dM by two
    GEMMs; it agrees with the sequential adjoint to rounding while the filter is stable.

    L0 is treated as a full matrix: dL0 is the gradient with respect to all D^2 entries
    (when L0 is lower triangular the forward uses triangular solves, which give the same
    values; a lower-triangular parametrisation takes ``np.tril(dL0)``).

    Parameters
    ----------
    x : array_like, shape (..., T, D)
        The sequences given to the forward.
    L0 : array_like, shape (D, D)
        Invertible factor of the steady-state pair (time-varying (T, D, D) factors are not
        supported here).
    M : array_like, shape (D, D)
        The coupling of the steady-state pair.
    dw : array_like, shape (..., T, D)
        Cotangent of w, in x's shape.
    w : array_like, shape (..., T, D), optional
        The forward output ``whiten(x, L0, M)`` (recomputed when omitted).
    block : int, optional
        None for the sequential adjoint, or the scan's block length (>= 1).

    Returns
    -------
    WhitenGrads
        Named tuple (dx, dL0, dM); float32 when x, L0, M are float32 (see :func:`whiten`),
        else float64.

    Raises
    ------
    ValueError
        Naming the argument for a dw of the wrong shape or dtype, with NaN, or for
        time-varying L0, M.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> x, dw = rng.standard_normal((2, 3, 7, 2))
    >>> L0, M = np.array([[2.0, 0.0], [0.5, 1.5]]), 0.3 * np.eye(2)
    >>> dx, dL0, dM = ag.whiten_backward(x, L0, M, dw)
    >>> dx.shape, dL0.shape, dM.shape
    ((3, 7, 2), (2, 2), (2, 2))
    """
    block = None if block is None else count("block", block)
    shape, flat, L, Mm, lower, varying = _filter(x, L0, M, "L0")
    if varying:
        raise ValueError(f"L0 must have shape (D, D) for whiten_backward (the steady-state recursion), got {L.shape}")
    dw = cotangent("dw", dw, shape, flat.dtype).reshape(flat.shape)
    if w is None:
        w = _core.whiten(flat, L, Mm, lower, 0, False)
    else:
        w = cotangent("w", w, shape, flat.dtype).reshape(flat.shape)
    if block is None:
        dx, dL, dM = _core.whiten_backward(L, Mm, lower, w, dw)
        return WhitenGrads(dx.reshape(shape), dL, dM)
    reversed_dw = np.ascontiguousarray(dw[:, ::-1])
    Lt, Mt = np.ascontiguousarray(L.T), np.ascontiguousarray(Mm.T)
    dx = _core.whiten(reversed_dw, Lt, Mt, False, block, False)[:, ::-1]
    D = flat.shape[-1]
    dL = -(dx.reshape(-1, D).T @ w.reshape(-1, D))
    dM = -(dx[:, 1:].reshape(-1, D).T @ w[:, :-1].reshape(-1, D))
    return WhitenGrads(np.ascontiguousarray(dx).reshape(shape), dL, dM)


def whiten_scan(x, L, M, *, block: int = 64) -> np.ndarray:
    """:func:`whiten` by a blocked parallel scan over the affine maps w_i = A w_{i-1} + b_i.

    Whitened self-attention eq. 9 with A = -L^{-1} M, b_i = L^{-1} x_i. Three phases: each time
    block of length ``block`` run from zero (parallel over blocks), the block carries chained
    with A^block (repeated squaring), each block re-run from its carry (parallel). It does
    about twice the work of the sequential recursion, so it pays only when the sequential
    form cannot use the cores (few sequences, long T). Agrees with whiten to rounding while A
    is stable (spectral radius < 1), as it is for a whitening filter.

    Parameters
    ----------
    x : array_like, shape (..., T, D)
        Sequences.
    L : array_like, shape (D, D)
        Invertible diagonal block.
    M : array_like, shape (D, D)
        Subdiagonal block.
    block : int, default 64
        Length of a time block.

    Returns
    -------
    w : ndarray, shape (..., T, D)
        As :func:`whiten`.

    Examples
    --------
    >>> x = ag.vector_ma1(0.5 * np.eye(2), B=8, T=20, seed=0)
    >>> L, M = np.eye(2), 0.5 * np.eye(2)
    >>> bool(np.allclose(ag.whiten_scan(x, L, M, block=4), ag.whiten(x, L, M)))
    True
    """
    count("block", block)
    shape, flat, L, M, lower, varying = _filter(x, L, M)
    if varying:
        raise ValueError("whiten_scan needs one (D, D) pair (L, M): the scan chains powers of one affine map")
    return _finite(_core.whiten(flat, L, M, lower, int(block), False), L, M).reshape(shape)


# -- covariance models ---------------------------------------------------------------------
@finite_result
@_fill_doc
def block_covariances(x):
    """Stationary lag-0 and lag-1 block covariances of x (B, T, D) (s.4, eq. 5-6).

    Whitened self-attention: Lambda_0 = mean of (x_t - mu)(x_t - mu)^T over sequences and
    positions, and Lambda_1 = mean of (x_t - mu)(x_{t-1} - mu)^T over t >= 1 (the subdiagonal
    block Cov(x_i, x_{i-1})); mu is the mean over sequences and positions.

    %(batch_parameters)s

    Returns
    -------
    Lambda0 : ndarray, shape (D, D)
        Lag-0 block.
    Lambda1 : ndarray, shape (D, D)
        Lag-1 block.

    Examples
    --------
    >>> x = ag.vector_ma1(0.5 * np.eye(2), B=400, T=6, seed=0)
    >>> Lambda0, Lambda1 = ag.block_covariances(x)  # about 1.25 I and 0.5 I
    >>> np.round(np.diag(Lambda1), 1)
    array([0.5, 0.5])
    """
    a = operand("x", x, "(..., B, T, D)", min_ndim=3, dtype=np.float64)
    a = a.reshape((-1,) + a.shape[-2:])
    if a.shape[1] < 2:
        raise ValueError(f"x needs T >= 2 positions for a lag-1 covariance, got shape {a.shape}")
    c = a - a.mean(axis=(0, 1))
    lam0 = np.einsum("btd,bte->de", c, c) / (c.shape[0] * c.shape[1])
    lam1 = np.einsum("btd,bte->de", c[:, 1:], c[:, :-1]) / (c.shape[0] * (c.shape[1] - 1))
    return (lam0 + lam0.T) / 2, lam1


class SteadyState(NamedTuple):
    """Steady-state blocks of the block Cholesky factor and how the iteration went."""

    L: np.ndarray  # (D, D) lower triangular
    M: np.ndarray  # (D, D)
    iterations: int
    change: float  # relative change of L in the last iteration
    converged: bool


def _covariance_block(name, m, D=None):
    """A (D, D) covariance block as float64 (D from the block itself when not given)."""
    expected = "(D, D)" if D is None else f"({D}, {D})"
    a = operand(name, m, expected, dtype=np.float64, contiguous=True)
    if a.shape[0] != a.shape[1] or (D is not None and a.shape[0] != D):
        raise ValueError(f"{name} must have shape {expected}, got {a.shape}")
    return a


def _cholesky_blocks(Lambda0, Lambda1):
    """Checked Lambda_0, Lambda_1 and the generator of the block Cholesky blocks (L_i, M_i)."""
    lam0 = _covariance_block("Lambda0", Lambda0)
    D = lam0.shape[0]
    lam1 = _covariance_block("Lambda1", Lambda1, D)
    if not np.allclose(lam0, lam0.T, rtol=1e-10, atol=1e-12 * np.abs(lam0).max()):
        raise ValueError("Lambda0 must be symmetric")
    try:
        L0 = np.linalg.cholesky(lam0)
    except np.linalg.LinAlgError:
        raise ValueError("Lambda0 is not positive definite") from None

    def steps():
        L, M, i = L0, np.zeros_like(L0), 0
        yield L, M
        while True:
            i += 1
            with np.errstate(over="ignore", invalid="ignore"):
                M = np.linalg.solve(L, lam1.T).T  # M_i = Lambda_1 L_{i-1}^{-T}
                schur = lam0 - M @ M.T
            try:
                # M M^T beyond the float range exceeds every entry of Lambda0: not definite.
                if not np.all(np.isfinite(schur)):
                    raise np.linalg.LinAlgError
                L = np.linalg.cholesky(schur / 2 + schur.T / 2)  # halves first: no overflow near the maximum
            except np.linalg.LinAlgError:
                raise ValueError(
                    f"Lambda0 and Lambda1 give a block-tridiagonal covariance model that is not positive "
                    f"definite: the Schur complement Lambda0 - M M^T lost definiteness at block {i}; the lag-1 "
                    "truncation does not describe this process (its correlation reaches beyond one step too "
                    "strongly)") from None
            yield L, M

    return steps()


def block_cholesky_factors(Lambda0, Lambda1, T: int):
    """The first T blocks (L_i, M_i) of the block Cholesky factor of the covariance model.

    Whitened self-attention eq. 6-7, for the block-tridiagonal block-Toeplitz covariance:
    L_0 = chol(Lambda_0), M_i = Lambda_1 L_{i-1}^{-T}, L_i = chol(Lambda_0 - M_i M_i^T).
    Passed to :func:`whiten` they whiten the model exactly from the first position on.
    ValueError if the model is not positive definite (see :func:`steady_state_factor`).

    Parameters
    ----------
    Lambda0 : array_like, shape (D, D)
        Diagonal block (symmetric positive definite).
    Lambda1 : array_like, shape (D, D)
        Subdiagonal block.
    T : int
        Number of blocks.

    Returns
    -------
    L : ndarray, shape (T, D, D)
        Lower-triangular diagonal blocks.
    M : ndarray, shape (T, D, D)
        Subdiagonal blocks, M_0 = 0.

    Examples
    --------
    >>> L, M = ag.block_cholesky_factors(1.25 * np.eye(2), 0.5 * np.eye(2), T=4)
    >>> L.shape, round(float(L[0, 0, 0]) ** 2, 12)
    ((4, 2, 2), 1.25)
    """
    T = count("T", T)
    D = np.shape(Lambda0)[-1] if np.ndim(Lambda0) else 1
    check_size("T", T * D * D * 2)
    gen = _cholesky_blocks(Lambda0, Lambda1)
    pairs = [next(gen) for _ in range(T)]
    return np.stack([p[0] for p in pairs]), np.stack([p[1] for p in pairs])


def steady_state_factor(Lambda0, Lambda1, *, tol: float = 1e-12, max_iter: int = 10000) -> SteadyState:
    """Steady state (L, M) of the block Cholesky factor of the covariance model.

    Whitened self-attention s.4, eq. 7-9, for the block-tridiagonal block-Toeplitz covariance
    with blocks Lambda_0 (diagonal) and Lambda_1 (subdiagonal). Iterates L_0 = chol(Lambda_0),
    M_i = Lambda_1 L_{i-1}^{-T}, L_i = chol(Lambda_0 - M_i M_i^T) until
    ``|L_i - L_{i-1}|_F <= tol |L_i|_F``. A lag-1-truncated model of a strongly correlated
    process (e.g. a vector AR(1)) need not be positive definite: the Schur complement
    Lambda_0 - M_i M_i^T then loses definiteness and a ValueError says so. Using (L, M) from
    the first position (eq. 9) leaves a transient over the first blocks, where L_i has not
    converged; :func:`block_cholesky_factors` gives the exact time-varying blocks.

    Parameters
    ----------
    Lambda0 : array_like, shape (D, D)
        Diagonal block.
    Lambda1 : array_like, shape (D, D)
        Subdiagonal block.
    tol : float, default 1e-12
        Relative change of L that stops the iteration.
    max_iter : int, default 10000
        Iteration limit.

    Returns
    -------
    SteadyState
        (L, M, iterations, change, converged).

    Examples
    --------
    >>> st = ag.steady_state_factor(1.25 * np.eye(2), 0.5 * np.eye(2))
    >>> st.converged, np.round(np.diag(st.L), 6)  # the MA(1) innovation factor: L = I
    (True, array([1., 1.]))
    """
    tol = scalar("tol", tol, positive=True)
    gen = _cholesky_blocks(Lambda0, Lambda1)
    L, M = next(gen)
    lam1 = np.asarray(Lambda1, dtype=np.float64)
    change = np.inf
    max_iter = count("max_iter", max_iter)
    for it in range(1, max_iter + 1):
        L_new, M = next(gen)
        change = float(np.linalg.norm(L_new - L) / np.linalg.norm(L_new))
        L = L_new
        if change <= tol:
            return SteadyState(L, np.linalg.solve(L, lam1.T).T, it, change, True)
    return SteadyState(L, M, int(max_iter), change, False)


def block_diagonal_factor(Lambda0):
    """The block-diagonal model (Lambda_k = 0 for k > 0): L = chol(Lambda_0), M = 0.

    Whitened self-attention s.4, the simplest covariance model.

    Parameters
    ----------
    Lambda0 : array_like, shape (D, D)
        Diagonal block (symmetric positive definite).

    Returns
    -------
    L : ndarray, shape (D, D)
        chol(Lambda_0), lower triangular.
    M : ndarray, shape (D, D)
        Zeros.

    Examples
    --------
    >>> L, M = ag.block_diagonal_factor(4.0 * np.eye(2))
    >>> L
    array([[2., 0.],
           [0., 2.]])
    """
    lam0 = _covariance_block("Lambda0", Lambda0)
    try:
        return np.linalg.cholesky(lam0), np.zeros_like(lam0)
    except np.linalg.LinAlgError:
        raise ValueError("Lambda0 is not positive definite") from None


@finite_result
@_fill_doc
def full_whitening(x) -> np.ndarray:
    """The exact whitening W = Lambda_X^{-1/2} (X - mu) for small T * D (eq. 3, 10), the reference.

    Whitened self-attention eq. 3. Lambda_X is the sample covariance over the batch of the
    stacked sequences (TD vectors, normalised by B - 1); its symmetric inverse square root is
    applied to every centred sequence, so the output's sample covariance is exactly the
    identity. Needs B > T D.

    %(batch_parameters)s

    Returns
    -------
    ndarray, shape (B, T, D)
        The whitened sequences.

    Examples
    --------
    >>> x = ag.vector_ma1(0.5 * np.eye(2), B=100, T=3, seed=0)
    >>> w = ag.full_whitening(x).reshape(100, -1)
    >>> bool(np.allclose(np.cov(w, rowvar=False), np.eye(6)))
    True
    """
    a = operand("x", x, "(..., B, T, D)", min_ndim=3, dtype=np.float64)
    a = a.reshape((-1,) + a.shape[-2:])
    B, T, D = a.shape
    if B <= T * D:
        raise ValueError(f"x must hold more sequences than T*D = {T * D} for full whitening (a full-rank covariance), "
                         f"got B = {B}")
    X = a.reshape(B, T * D)
    c = _unit_scale(X - X.mean(0))  # W does not depend on the scale of x, and lam stays in range
    lam = c.T @ c / (B - 1)
    vals, vecs = np.linalg.eigh(lam)
    if vals[0] <= vals[-1] * T * D * np.finfo(float).eps:
        raise ValueError("the sample covariance of x is singular")
    inv_sqrt = (vecs / np.sqrt(vals)) @ vecs.T
    return (c @ inv_sqrt).reshape(B, T, D)


# -- whitened self-attention ---------------------------------------------------------------
@renamed_arguments(return_weights="return_routing")
@finite_result
def whitened_attention(x, W_Q, W_K, L, M, *, causal=True, scale=None, return_routing=False):
    """Whitened self-attention (eq. 4): WSA(x)_i = sum_j softmax_j(w_i^T Q^T K w_j scale) w_j.

    Whitened self-attention s.3, eq. 4: x is whitened by :func:`whiten` with (L, M), queries are
    w W_Q and keys w W_K; the whitened vectors themselves are the values (no V matrix: in the
    block-diagonal model L^{-1} plays its role).

    Parameters
    ----------
    x : array_like, shape (..., T, D)
        Sequences.
    W_Q, W_K : array_like, shape (D, d_k)
        Query and key weights.
    L, M : array_like, shape (D, D) or (T, D, D)
        Whitening factors, as in :func:`whiten`.
    causal : bool, default True
        Causal attention (GPT).
    scale : float, optional
        Logit scale, default 1 / sqrt(d_k).
    return_routing : bool, default False
        Also return the routing matrix P, shape (..., T, T) (``return_weights`` is its
        deprecated name).

    Returns
    -------
    y : ndarray, shape (..., T, D)
        The output, or (y, P) with `return_routing`.

    Examples
    --------
    >>> x = ag.vector_ma1(0.5 * np.eye(2), B=4, T=6, seed=0)
    >>> ag.whitened_attention(x, np.eye(2), np.eye(2), np.eye(2), 0.5 * np.eye(2)).shape
    (4, 6, 2)
    """
    w = whiten(x, L, M)
    D = w.shape[-1]
    wq = operand("W_Q", W_Q, f"({D}, d_k)", dtype=None)
    wk = operand("W_K", W_K, f"({D}, d_k)", dtype=None)
    if wq.ndim != 2 or wq.shape[0] != D:
        raise ValueError(f"W_Q must have shape ({D}, d_k), got {wq.shape}")
    if wk.shape != wq.shape:
        raise ValueError(f"W_K must have shape {wq.shape}, got {wk.shape}")
    return softmax_attention(w @ wq.astype(w.dtype), w @ wk.astype(w.dtype), w, causal=causal, scale=scale,
                             return_routing=return_routing, layout="bhnd")


# -- measures ------------------------------------------------------------------------------
def _deviations(a: np.ndarray) -> np.ndarray:
    """a minus its mean over the batch axis 0, with deviations below the rounding of that mean
    (16 eps times the entry's largest magnitude across the batch) set to exactly 0: identical
    sequences have no variation, however NumPy sums them (a broadcast view and a contiguous
    copy round the mean differently)."""
    c = a - a.mean(0)
    c[np.abs(c) <= 16 * np.finfo(a.dtype).eps * np.max(np.abs(a), axis=0)] = 0.0
    return c


def _unit_scale(c: np.ndarray) -> np.ndarray:
    """c divided by its largest |entry| (c itself when all zero)."""
    m = float(np.max(np.abs(c))) if c.size else 0.0
    return c / m if m > 0 else c


def _batch_covariance(x):
    a = operand("x", x, "(..., B, T, D)", min_ndim=3, dtype=np.float64)
    a = a.reshape((-1,) + a.shape[-2:])
    if a.shape[0] < 2:
        raise ValueError(f"x needs at least 2 sequences (the batch axis), got shape {a.shape}")
    return a


@finite_result
@_fill_doc
def whiteness(x) -> float:
    """The paper's whiteness Psi (eq. 10-12) of a batch of sequences.

    Whitened self-attention s.6: with Lambda the sample covariance over the batch of the
    stacked sequences (TD x TD, normalised by B - 1),
    ``Psi = sum_{i != j} |Lambda_ij| / ((TD - 1) sum_i |Lambda_ii|)``, the mean off-diagonal
    magnitude over the mean diagonal magnitude: 0 for white sequences. Sampling noise keeps it
    above 0 for finite B (about sqrt(2 / (pi B)) for white noise).

    %(batch_parameters)s

    Returns
    -------
    float
        Psi >= 0, 0 for white sequences.

    Examples
    --------
    >>> white = np.random.default_rng(0).standard_normal((2000, 3, 2))
    >>> bool(ag.whiteness(white) < 0.03)
    True
    """
    a = _batch_covariance(x)
    B, T, D = a.shape
    X = a.reshape(B, T * D)
    c = _unit_scale(_deviations(X))  # Psi is a ratio: the same for x at any scale
    lam = np.abs(c.T @ c / (B - 1))
    diag = np.trace(lam)
    if T * D == 1 or diag == 0:
        return 0.0
    return float((lam.sum() - diag) / ((T * D - 1) * diag))


@finite_result
@_fill_doc
def stationarity(x) -> float:
    """First-order stationarity rho (eq. 13-14) of a batch of sequences.

    Whitened self-attention s.6: the lag-1 cross-covariances
    Lambda_{t,t+1} = sum_b (x_bt - mu_t)(x_b,t+1 - mu_t+1)^T / (B - 1) and their mean over t,
    ``rho = sum_t |Lambda_{t,t+1} - mean|_F``: 0 for a stationary process (up to sampling
    noise), larger when the lag-1 structure drifts.

    %(batch_parameters)s

    Returns
    -------
    float
        rho >= 0, 0 for a stationary process (up to sampling noise).

    Examples
    --------
    >>> Theta = np.stack([t * np.eye(2) for t in np.linspace(0, 1, 8)])  # drifting MA(1)
    >>> drifting = ag.vector_ma1(Theta, B=2000, T=8, seed=0)
    >>> fixed = ag.vector_ma1(0.5 * np.eye(2), B=2000, T=8, seed=0)
    >>> bool(ag.stationarity(drifting) > 3 * ag.stationarity(fixed))
    True
    """
    a = _batch_covariance(x)
    B, T, D = a.shape
    if T < 2:
        raise ValueError(f"x needs T >= 2 positions, got shape {a.shape}")
    c = _deviations(a)
    lag = np.einsum("btd,bte->tde", c[:, :-1], c[:, 1:]) / (B - 1)
    return float(np.sum(np.linalg.norm(lag - lag.mean(0), axis=(1, 2))))


# -- synthetic processes -------------------------------------------------------------------
def _process(name, m, B, T):
    """The checked arguments of a generator: B, T, its fixed (D, D) or per-step (T, D, D)
    transition matrix (float64) and D."""
    B, T = count("B", B), count("T", T)
    a = operand(name, m, "(D, D) or (T, D, D)", min_ndim=2, dtype=np.float64)
    D = a.shape[-1]
    if a.shape not in ((D, D), (T, D, D)):
        raise ValueError(f"{name} must have shape ({D}, {D}) or ({T}, {D}, {D}), got {a.shape}")
    return B, T, a, D


@finite_result
@_fill_doc
def vector_ma1(Theta, B: int, T: int, *, seed=0) -> np.ndarray:
    """Vector MA(1) sequences x_i = e_i + Theta_i e_{i-1} with e_i ~ N(0, I).

    The covariance model of Whitened self-attention s.4: with a fixed Theta the covariance is
    exactly block-tridiagonal, Lambda_0 = I + Theta Theta^T, Lambda_1 = Theta.

    Parameters
    ----------
    Theta : array_like, shape (D, D) or (T, D, D)
        Fixed, or one matrix per step (a non-stationary process).
    %(process_sizes)s

    %(sequences_returns)s

    Examples
    --------
    >>> ag.vector_ma1(0.5 * np.eye(3), B=4, T=5).shape
    (4, 5, 3)
    """
    B, T, th, D = _process("Theta", Theta, B, T)
    check_size("B, T", B * (T + 1) * D * 3)
    th = np.broadcast_to(th, (T, D, D))
    e = generator(seed).standard_normal((B, T + 1, D))
    return e[:, 1:] + np.einsum("tde,bte->btd", th, e[:, :-1])


@finite_result
@_fill_doc
def vector_ar1(Phi, B: int, T: int, *, seed=0, burn_in: int = 200) -> np.ndarray:
    """Vector AR(1) sequences x_i = Phi_i x_{i-1} + e_i, started in steady state by a burn-in.

    Not block-tridiagonal (its covariance decays geometrically with the lag): a test of the
    truncated covariance model of Whitened self-attention s.4. The time loop runs in the core:
    it is the whitening recursion of :func:`whiten` with L = I, M = -Phi applied to the
    noise (a time-varying Phi uses Phi_0 for the burn-in).

    Parameters
    ----------
    Phi : array_like, shape (D, D) or (T, D, D)
        Transition with spectral radius < 1, fixed or one per step.
    %(process_sizes)s
    burn_in : int, default 200
        Steps discarded before the first returned vector.

    %(sequences_returns)s

    Examples
    --------
    >>> x = ag.vector_ar1(0.5 * np.eye(2), B=4000, T=3)
    >>> x.shape, bool(np.allclose(x[:, 0].var(0), 1 / (1 - 0.5 ** 2), atol=0.1))  # steady from the start
    ((4000, 3, 2), True)
    """
    B, T, ph, D = _process("Phi", Phi, B, T)
    count("burn_in", burn_in, 0)
    check_size("B, T, burn_in", (burn_in + T) * B * D * 3)
    # The draws in the order of a step-by-step simulation: (burn_in + T) steps of (B, D).
    e = generator(seed).standard_normal((burn_in + T, B, D)).transpose(1, 0, 2)
    eye = np.eye(D)
    if ph.ndim == 2:
        x = _core.whiten(np.ascontiguousarray(e), eye, np.ascontiguousarray(-ph), True, 0, False)
        return x[:, burn_in:]
    # Time-varying: the burn-in with Phi_0, then its last state folded into the first draw.
    noise = np.ascontiguousarray(e[:, burn_in:])
    if burn_in:
        state = _core.whiten(np.ascontiguousarray(e[:, :burn_in]), eye, np.ascontiguousarray(-ph[0]), True, 0, False)
        noise[:, 0] += state[:, -1] @ ph[0].T
    return _core.whiten(noise, np.ascontiguousarray(np.broadcast_to(eye, ph.shape)), np.ascontiguousarray(-ph),
                        True, 0, True)
