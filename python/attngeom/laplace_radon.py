"""The Laplace-Radon picture of one attention head (Lawrence, Laplace-Radon s.4, s.9, s.10).

A query q splits into a tilt u = q / ``|q|`` on the sphere and a Laplace radius
tau = scale ``|q|`` (eq. 9). Keys enter only through their Radon projection s = u.k (eq. 6,
15); the softmax partition Z and the value-weighted numerator N are Laplace transforms of
that projection (eq. 11-13, 34):

    Z(u, tau) = sum_i psi(tau, u.k_i),   N(u, tau) = sum_i psi(tau, u.k_i) v_i,

with psi(tau, s) = exp(tau s) for softmax, and y = N / Z is exactly the attention output
(Theorem 1, eq. 14). Other kernels psi give generalized Radon integral transforms (eq. 44).

Shapes: u (..., n_q, d_k), tau (..., n_q), k (..., n_k, d_k), v (..., n_k, d_v); leading
axes broadcast. tilt_radius, radon_project, laplace_radon_attention, projected_cumulants and
log_partition_gradient also take (batch, pos, head, d_head) activations with ``layout="bnhd"``
(see :func:`attngeom.softmax_attention`).
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple, Optional

import numpy as np

from . import _core
from ._deprecation import renamed_arguments
from ._docstrings import fill_doc
from ._operands import (AttentionOperands, Operand, check_bound, check_finite, check_shared_width, compute_dtype, count,
                        finite_result, from_bhnd, logit_scale, max_row_norm, operand, scalar, to_bhnd)
from .attention_stats import core_stats, with_stats
from .errors import ResultOverflow
from .kernels import kernel_params


class Transform(NamedTuple):
    """Z (..., n_q) and N (..., n_q, d_v) (N is None when no values were given)."""

    Z: np.ndarray
    N: Optional[np.ndarray]


class LogTransform(NamedTuple):
    """log Z (..., n_q) and y = N / Z (..., n_q, d_v) (None when no values were given)."""

    log_Z: np.ndarray
    y: Optional[np.ndarray]


def tilt_radius(q, *, scale=None, layout=None):
    """Tilt u = q / ``|q|`` and radius tau = scale ``|q|`` of each query (Laplace-Radon eq. 9, 15-16).

    Lawrence, Laplace-Radon s.4.1: the logit scale q.k / sqrt(d_k) = tau (u.k) splits into a
    direction on the sphere (which hyperplanes the query looks along) and a Laplace variable.
    A zero query gets u = 0 and tau = 0.

    Parameters
    ----------
    q : array_like, shape (..., n, d_k)
        Queries, one per row. float32 stays float32 (float16 is computed in float32); other
        input is computed in float64.
    scale : float, optional
        Default 1 / sqrt(d_k), the softmax scaling, so that tau u.k = q.k / sqrt(d_k).
    layout : {None, "bhnd", "bnhd"}, optional
        The axes of per-head activations, as in :func:`softmax_attention`: with "bnhd",
        q and u are (..., n, heads, d_k), tau (..., n, heads).

    Returns
    -------
    u : ndarray, shape (..., n, d_k)
        Unit tilts (rows of norm 1, or 0 for a zero query).
    tau : ndarray, shape (..., n)
        Radii scale ``|q|``: non-negative for scale >= 0 (the default); a negative scale
        gives negative radii, so that tau u.k = scale q.k holds either way.

    Examples
    --------
    >>> q = np.array([[3.0, 4.0], [0.0, 2.0]])
    >>> u, tau = ag.tilt_radius(q, scale=1.0)
    >>> u
    array([[0.6, 0.8],
           [0. , 1. ]])
    >>> tau
    array([5., 2.])
    """
    layout, (q,) = to_bhnd(layout, "tilt_radius", [("q", q, "v")])
    q = operand("q", q, "(..., n, d_k)", min_ndim=1)
    return from_bhnd(layout, tilts_and_radii(q, logit_scale(scale, q.shape[-1])), "vs")


def tilts_and_radii(q: np.ndarray, scale: float) -> tuple:
    """(u, tau) of :func:`tilt_radius` for checked queries q (..., n, d_k) of the computation
    dtype and a checked scale, without the checks."""
    u, tau = _core.tilt_radius(np.ascontiguousarray(q.reshape(-1, q.shape[-1])), float(scale))
    return u.reshape(q.shape), tau.reshape(q.shape[:-1])


@finite_result
def radon_project(u, k, *, layout=None):
    """Projected coordinates s[..., j, i] = u_j . k_i (Laplace-Radon eq. 6, 15).

    The discrete Radon transform of the key measure along each tilt: the multiset
    {s[..., j, :]} is the projection of the key cloud onto the line spanned by u_j.

    Parameters
    ----------
    u : array_like, shape (..., n_q, d_k)
        Tilts (unit vectors for the paper's picture; any vectors are accepted).
    k : array_like, shape (..., n_k, d_k)
        Keys, one per row. Leading axes of u and k broadcast.
    layout : {None, "bhnd", "bnhd"}, optional
        The axes of per-head activations, as in :func:`softmax_attention`: with "bnhd",
        u and k are (..., n, heads, d_k); s keeps (..., heads, n_q, n_k).

    Returns
    -------
    s : ndarray, shape (..., n_q, n_k)
        Projected coordinates, in the computation dtype.

    Examples
    --------
    >>> u = np.array([[1.0, 0.0]])
    >>> k = np.array([[2.0, 5.0], [-1.0, 3.0]])
    >>> ag.radon_project(u, k)
    array([[ 2., -1.]])
    """
    _, (u, k) = to_bhnd(layout, "radon_project", [("u", u, "v"), ("k", k, "v")])
    u = operand("u", u, "(..., n_q, d_k)", dtype=None)
    k = operand("k", k, "(..., n_k, d_k)", dtype=None)
    check_shared_width("u", u, "k", k)
    dt = compute_dtype(u, k)
    try:
        return np.matmul(u.astype(dt, copy=False), np.swapaxes(k.astype(dt, copy=False), -1, -2))
    except ValueError:
        raise ValueError(f"batch dimensions do not broadcast: u {u.shape[:-2]}, k {k.shape[:-2]}") from None


@renamed_arguments(return_weights="return_routing")
def ridge_attention(u, tau, k, v, *, kernel, params, mask=None, causal=False, qname="u", return_routing=False,
                    return_log_partition=False, return_stats=False):
    """The core call behind :func:`laplace_radon_attention` and kernel_attention: weights
    psi(tau_i, u_i.k_j) normalised per row, with the kernel already checked
    (``kernel_params``); `qname` names the query argument in error messages. NaN and inf in
    u, tau, k, v are found by the core (as "u", "tau", "k", "v"; callers that derive u and tau
    from q check q first). With `return_stats`, returns (out, AttentionStats), `out` as
    without it."""
    pr = AttentionOperands(u, k, v, qname=qname, tau=tau, mask=mask, causal=causal, finite=False)
    y, w, lz, st = _core.ridge_attention(pr.core_args(), kernel, params, bool(return_routing),
                                         bool(return_log_partition), bool(return_stats))
    out = pr.attention_outputs(y, w, lz, return_routing, return_log_partition)
    return (out, core_stats(lambda a: pr.shaped(a, pr.n_q), lz, st)) if return_stats else out


def laplace_radon_transform(u, tau, k, v=None, *, kernel="exp", log_domain=False, **params):
    """The transforms Z(u, tau) and N(u, tau) (Laplace-Radon eq. 11-13, 34, 44).

    Z(u_j, tau_j) = sum_i psi(tau_j, u_j.k_i) and N(u_j, tau_j) = sum_i psi(tau_j, u_j.k_i) v_i:
    the Laplace transforms of the Radon projection of the key measure (Lawrence, s.4.3).

    Parameters
    ----------
    u : array_like, shape (..., n_q, d_k)
        Tilts (any vectors are accepted; the paper's are unit or zero).
    tau : array_like, shape (..., n_q), real or complex
        Radii. Complex tau is supported for the exponential kernel: at tau = i w, Z is the
        (unnormalised) characteristic function of the projected key measure, bounded by
        n_k and well conditioned, which is what the inverse Laplace pipeline samples.
    k : array_like, shape (..., n_k, d_k)
        Keys.
    v : array_like, shape (..., n_k, d_v), optional
        Values; without them N is None.
    kernel : {"exp", "gaussian", "cauchy", "stable"}, default "exp"
        The kernel psi of :mod:`attngeom.kernels`.
    log_domain : bool, default False
        Return ``LogTransform(log_Z, y)`` with y = N / Z instead of ``Transform(Z, N)``.
        Real tau of any size then never overflows (``Transform`` raises ResultOverflow, a
        ValueError, where Z or N passes the float range). For complex tau
        log_Z is the principal complex logarithm (shift + log of the shifted sum), and y is
        ill-defined near zeros of Z.
    **params
        Kernel parameters (sigma, gamma, alpha, c); see :mod:`attngeom.kernels`.

    Returns
    -------
    Transform or LogTransform
        Transform(Z, N) or LogTransform(log_Z, y); Z, log_Z of shape (..., n_q); N, y of
        shape (..., n_q, d_v) or None without v. The real dtype follows the inputs (float32 /
        float64); complex tau gives complex64 / complex128.

    Examples
    --------
    >>> k = np.array([[1.0, 0.0], [-1.0, 0.0]])
    >>> u = np.array([[1.0, 0.0]])
    >>> Z, N = ag.laplace_radon_transform(u, np.array([0.5]), k)
    >>> bool(np.isclose(Z[0], np.exp(0.5) + np.exp(-0.5)))
    True
    >>> Z, N = ag.laplace_radon_transform(u, np.array([1j]), k)  # characteristic function 2 cos(1)
    >>> bool(np.isclose(Z[0], 2 * np.cos(1.0)))
    True
    """
    if tau is None:
        raise TypeError("tau must be an array of radii, got None")
    name, p = kernel_params(kernel, params)
    tau_arr = np.asarray(tau)
    if np.iscomplexobj(tau_arr):
        if name != "exp":
            raise ValueError(f"complex tau is supported for kernel='exp' only, got kernel={name!r}")
        return _transform_complex(u, tau_arr, k, v, log_domain)
    y, log_z = ridge_attention(u, tau, k, v, kernel=name, params=p, return_log_partition=True)
    y = y if v is not None else None
    if log_domain:
        return LogTransform(log_z, y)
    with np.errstate(over="ignore"):
        Z = np.exp(log_z)
        return _within_range(Transform(Z, None if y is None else y * Z[..., None]))


def _within_range(t: Transform) -> Transform:
    """Z and N as computed, or ResultOverflow where they pass the float range (the inputs are
    finite): the log domain holds them."""
    if np.all(np.isfinite(t.Z)) and (t.N is None or np.all(np.isfinite(t.N))):
        return t
    raise ResultOverflow("laplace_radon_transform: Z or N is beyond the float range at these radii; "
                         "log_domain=True returns log Z and y = N / Z")


def _transform_complex(u, tau, k, v, log_domain):
    check_finite("tau", tau)
    pr = AttentionOperands(u, k, v, qname="u", tau=tau.real)  # shapes, checks and broadcasting
    # The projections s = u.k and the exponents tau s must be representable.
    s_max = max_row_norm(pr.q.array) * max_row_norm(pr.k.array)
    check_bound(s_max, pr.dtype, "the projections u.k", "rescale u or k")
    check_bound(float(np.max(np.abs(tau), initial=0.0)) * s_max, pr.dtype, "the exponents tau u.k",
                "rescale tau, u or k")
    ctype = np.complex64 if pr.dtype == np.float32 else np.complex128
    tau_b = np.broadcast_to(tau, tau.shape[:-1] + (pr.n_q,)) if tau.shape[-1] == 1 else tau
    tau_flat = np.ascontiguousarray(tau_b.reshape((-1,) + tau_b.shape[-1:]), dtype=ctype)
    shift, zs, ns = _core.laplace_transform_complex(pr.core_args(), tau_flat)
    shift, zs, ns = pr.shaped(shift, pr.n_q), pr.shaped(zs, pr.n_q), pr.shaped(ns, pr.n_q, pr.d_v)
    if log_domain:
        with np.errstate(divide="ignore", invalid="ignore"):
            return LogTransform(shift + np.log(zs), None if v is None else ns / zs[..., None])
    with np.errstate(over="ignore", invalid="ignore"):
        scale = np.exp(shift)
        return _within_range(Transform(scale * zs, None if v is None else ns * scale[..., None]))


@renamed_arguments(return_weights="return_routing")
def laplace_radon_attention(u, tau, k, v, *, kernel="exp", mask=None, causal=False, return_routing=False,
                            return_log_partition=False, return_stats=False, layout=None, **params):
    """Attention from tilts and radii: y = N(u, tau) / Z(u, tau) (Laplace-Radon eq. 14, 42).

    With the exponential kernel and (u, tau) = tilt_radius(q) this is softmax attention
    exactly (Theorem 1); the computation goes through the projected coordinates s = u.k,
    a separate code path from :func:`softmax_attention`, so the identity is a real check.

    Parameters
    ----------
    u : array_like, shape (..., n_q, d_k)
        Tilts, e.g. from :func:`tilt_radius`.
    tau : array_like, shape (..., n_q)
        Real radii.
    k : array_like, shape (..., n_k, d_k)
        Keys.
    v : array_like, shape (..., n_k, d_v)
        Values.
    kernel : {"exp", "gaussian", "cauchy", "stable"}, default "exp"
        The kernel psi of :mod:`attngeom.kernels`.
    mask, causal : optional
        As in :func:`softmax_attention`.
    return_routing, return_log_partition : bool, default False
        As in :func:`softmax_attention` (``return_weights`` is deprecated).
    return_stats : bool, default False
        Also return the :class:`attngeom.AttentionStats` of the weight rows, as in
        :func:`softmax_attention`.
    layout : {None, "bhnd", "bnhd"}, optional
        The axes of per-head activations, as in :func:`softmax_attention`: with "bnhd",
        u, k, v, y are (..., n, heads, d) and tau, log Z (..., n_q, heads).
    **params
        Kernel parameters (sigma, gamma, alpha, c).

    Returns
    -------
    y : ndarray, shape (..., n_q, d_v)
        The output, or (y, [P], [log Z]) as in :func:`softmax_attention`.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = rng.standard_normal((5, 4)), rng.standard_normal((7, 4)), rng.standard_normal((7, 3))
    >>> u, tau = ag.tilt_radius(q)
    >>> y = ag.laplace_radon_attention(u, tau, k, v, causal=True)
    >>> bool(np.allclose(y, ag.softmax_attention(q, k, v, causal=True), atol=1e-12))
    True
    """
    if tau is None:
        raise TypeError("tau must be an array of radii, got None")
    name, p = kernel_params(kernel, params)
    if np.iscomplexobj(np.asarray(tau)):
        raise TypeError("tau must be real for attention (complex tau: use laplace_radon_transform)")
    layout, (u, k, v, tau) = to_bhnd(layout, "laplace_radon_attention",
                                     [("u", u, "v"), ("k", k, "v"), ("v", v, "v"), ("tau", tau, "s")])
    out = ridge_attention(u, tau, k, v, kernel=name, params=p, mask=mask, causal=causal,
                          return_routing=return_routing, return_log_partition=return_log_partition,
                          return_stats=return_stats)
    return with_stats(layout, out, return_routing, return_log_partition, return_stats)


@finite_result
def projected_cumulants(u, tau, k, order=2, *, kernel="exp", layout=None, **params):
    """Cumulants of the projected coordinate S = u.k under the Gibbs weights (eq. 45, 51).

    The weights are p_i proportional to psi(tau, u.k_i). For the exponential kernel the
    cumulants are the tau-derivatives of the cumulant-generating function log Z(u, tau):
    kappa_1 = d/dtau log Z = E[S], kappa_2 = d^2/dtau^2 log Z = Var(S), and so on
    (Laplace-Radon eq. 51). Computed exactly from the weights, not by finite differences;
    central moments are accumulated after subtracting the mean (no cancellation).

    Parameters
    ----------
    u : array_like, shape (..., n_q, d_k)
        Tilts.
    tau : array_like, shape (..., n_q)
        Real radii.
    k : array_like, shape (..., n_k, d_k)
        Keys.
    order : int in 1..4, default 2
        Number of cumulants: kappa_1 = mean, kappa_2 = variance, kappa_3 = third central
        moment, kappa_4 = mu_4 - 3 mu_2^2.
    kernel : {"exp", "gaussian", "cauchy", "stable"}, default "exp"
        The kernel psi.
    layout : {None, "bhnd", "bnhd"}, optional
        The axes of per-head activations, as in :func:`softmax_attention`: with "bnhd",
        u, k are (..., n, heads, d_k), tau (..., n_q, heads) and the result (..., n_q,
        heads, order).
    **params
        Kernel parameters.

    Returns
    -------
    ndarray, shape (..., n_q, order)
        kappa_1 .. kappa_order for each query.

    Examples
    --------
    >>> k = np.array([[1.0, 0.0], [-1.0, 0.0]])
    >>> kappa = ag.projected_cumulants(np.array([[1.0, 0.0]]), np.array([0.0]), k)
    >>> kappa  # S = +-1 with equal weight at tau = 0: mean 0, variance 1
    array([[0., 1.]])
    """
    if tau is None:
        raise TypeError("tau must be an array of radii, got None")
    name, p = kernel_params(kernel, params)
    count("order", order, 1, 4)
    layout, (u, k, tau) = to_bhnd(layout, "projected_cumulants", [("u", u, "v"), ("k", k, "v"), ("tau", tau, "s")])
    pr = AttentionOperands(u, k, None, qname="u", tau=tau)
    out = _core.projected_cumulants(pr.core_args(), name, p, int(order))
    return from_bhnd(layout, pr.shaped(out, pr.n_q, int(order)), "v")


@fill_doc
def log_partition_gradient(q, k, *, scale=None, hessian=False, layout=None):
    """Gradient (and Hessian) of log Z(q) = log sum_i exp(scale q.k_i) in q (eq. 48-49).

    grad_q log Z = scale E_p[k] and Hess_q log Z = scale^2 Cov_p(k), with p the softmax
    weights of q over the keys (softmax as an exponential family, Laplace-Radon s.10.3).

    Parameters
    ----------
    %(q_k)s
    scale : float, optional
        Logit scale, default 1 / sqrt(d_k).
    hessian : bool, default False
        Also return the Hessian, shape (..., n_q, d_k, d_k) (O(n_k d_k^2) per query).
    layout : {None, "bhnd", "bnhd"}, optional
        The axes of per-head activations, as in :func:`softmax_attention`: with "bnhd",
        q, k and the gradient are (..., n, heads, d_k), the Hessian (..., n_q, heads,
        d_k, d_k).

    Returns
    -------
    grad : ndarray, shape (..., n_q, d_k)
        The gradient, or the tuple (grad, hess) when `hessian` is true.

    Examples
    --------
    >>> k = np.array([[1.0, 0.0], [-1.0, 0.0]])
    >>> ag.log_partition_gradient(np.zeros((1, 2)), k, scale=1.0)  # the mean key
    array([[0., 0.]])
    """
    layout, (q, k) = to_bhnd(layout, "log_partition_gradient", [("q", q, "v"), ("k", k, "v")])
    q = operand("q", q, "(..., n_q, d_k)", dtype=None, nonempty=False, finite=False)
    scale = logit_scale(scale, q.shape[-1])
    check_bound(abs(scale), compute_dtype(q), "scale", "pass float64 q and k, or a smaller scale")
    tau = np.full(q.shape[:-1], scale, dtype=compute_dtype(q))
    pr = AttentionOperands(q, k, None, qname="q", tau=tau)
    # The logits, the gradient scale E_p[k] and the Hessian scale^2 Cov_p(k) must be representable.
    key_max = max_row_norm(pr.k.array)
    check_bound(abs(scale) * max_row_norm(pr.q.array) * key_max, pr.dtype, "the logits scale q.k",
                "rescale q, k or scale")
    grad_max = abs(scale) * key_max
    check_bound(grad_max, pr.dtype, "scale |k| (the gradient's scale)", "rescale k or scale")
    query_max, limit = max_row_norm(pr.q.array), float(np.finfo(pr.dtype).max)
    if not query_max * key_max <= limit:
        # q.k alone passes the range though scale q.k does not: the kernel forms tau (q.k), so
        # q is scaled by 2^-e and tau by 2^e (exact), e the smallest power that brings |q| |k|
        # to half the range; then tau 2^e <= 2 scale |q| |k| / limit <= 2.
        e = int(math.ceil(math.log2(query_max) + math.log2(key_max) - math.log2(limit))) + 1
        check_bound(math.ldexp(abs(scale), e), pr.dtype, "scale |q|", "rescale q or scale")
        pr.q = Operand(np.ldexp(pr.q.array, -e).astype(pr.dtype), pr.q.index)
        pr.tau = Operand(np.ldexp(pr.tau.array, e).astype(pr.dtype), pr.tau.index)
    if hessian:
        check_bound(grad_max * grad_max, pr.dtype, "scale^2 |k|^2 (the Hessian's scale)", "rescale k or scale")
    if scale == 0:  # the gradient scale E[k] and the Hessian scale^2 Cov(k) are exactly 0, whatever k holds
        grad = np.zeros(pr.batch_shape + (pr.n_q, pr.d_k), pr.dtype)
        if not hessian:
            return from_bhnd(layout, grad, "v")
        return from_bhnd(layout, (grad, np.zeros(grad.shape + (pr.d_k,), pr.dtype)), "vm")
    mean, cov = _core.gibbs_key_moments(pr.core_args(), "exp", {}, bool(hessian))
    grad = pr.shaped(mean, pr.n_q, pr.d_k) * pr.dtype.type(scale)
    if not hessian:
        return from_bhnd(layout, grad, "v")
    # scale^2 Cov as two products: scale * scale alone may overflow where the Hessian does not.
    hess = pr.shaped(cov, pr.n_q, pr.d_k, pr.d_k) * pr.dtype.type(scale) * pr.dtype.type(scale)
    return from_bhnd(layout, (grad, hess), "vm")


def head_probe(k, v) -> Callable:
    """A probe of a head's unnormalised transforms, for :func:`attngeom.recover_keys`.

    Laplace-Radon eq. 34: every tilt at every radius of the grid, through
    :func:`laplace_radon_transform`.

    Parameters
    ----------
    k : array_like, shape (n_k, d_k)
        The head's keys.
    v : array_like, shape (n_k, d_v)
        The head's values.

    Returns
    -------
    callable
        ``probe(u, tau) -> (Z, N)`` with u of shape (m, d_k) and tau of shape (T,) (real or
        complex), giving Z of shape (m, T) and N of shape (m, T, d_v).

    Examples
    --------
    >>> k, v = np.eye(2), np.ones((2, 1))
    >>> Z, N = ag.head_probe(k, v)(np.eye(2), np.array([0.0, 1.0]))
    >>> Z.shape, N.shape
    ((2, 2), (2, 2, 1))
    """
    k = operand("k", k, "(..., n_k, d_k)", dtype=np.float64)
    v = operand("v", v, "(..., n_k, d_v)", dtype=np.float64)

    def probe(u, tau):
        u = np.asarray(u, dtype=np.float64)
        tau = np.asarray(tau)
        m, T = u.shape[0], tau.size
        uu = np.broadcast_to(u[:, None, :], (m, T, u.shape[1]))
        tt = np.broadcast_to(tau[None, :], (m, T))
        return laplace_radon_transform(uu, tt, k, v)

    return probe
