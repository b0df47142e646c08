"""Attention kernels: softmax scaled dot-product attention and kernel-swapped attention.

Shapes follow the row convention: queries ``q`` (..., n_q, d_k), keys ``k`` (..., n_k, d_k),
values ``v`` (..., n_k, d_v); leading axes broadcast like NumPy. Outputs have the
computation dtype: float32 when every operand is float32, float64 otherwise (integers
become float64).

Causal alignment. When n_q != n_k two conventions exist. ``causal=True`` (or
``"top_left"``) is PyTorch's ``is_causal``: query i sees keys j <= i. ``causal="bottom_right"``
is FlashAttention's (>= 2.1): the last query sees the last key, query i sees
j <= i + n_k - n_q, which is what a block of new queries appended to a key cache needs.
A query that sees no key (a fully masked row) returns zeros and log Z = -inf.
"""
from __future__ import annotations

import math
from typing import NamedTuple, Optional

import numpy as np

from . import _core
from ._arrays import (
    batch_operands,
    broadcast_batch,
    check_finite,
    check_min_ndim,
    check_nonempty,
    compute_dtype,
    cotangent,
    real_array,
    reduce_to_shape,
    scalar,
)
from .kernels import kernel_params

_CAUSAL = {None: 0, False: 0, True: 1, "top_left": 1, "bottom_right": 2}


def _causal_code(causal) -> int:
    try:
        return _CAUSAL[causal]
    except (KeyError, TypeError):
        raise ValueError(f"causal must be False, True, 'top_left' or 'bottom_right', got {causal!r}") from None


class _Problem:
    """Checked and broadcast operands of one attention call (queries given as q or as u, tau)."""

    def __init__(self, q, k, v, *, qname="q", tau=None, mask=None, causal=False):
        q = real_array(qname, q)
        k = real_array("k", k)
        check_min_ndim(qname, q, 2, "(..., n_q, d_k)")
        check_min_ndim("k", k, 2, "(..., n_k, d_k)")
        # v=None: no values, only the partition (a zero-width value block).
        checks = [(qname, q, "(..., n_q, d_k)"), ("k", k, "(..., n_k, d_k)")]
        if v is None:
            v = np.empty(k.shape[:-1] + (0,), k.dtype)
        else:
            v = real_array("v", v)
            check_min_ndim("v", v, 2, "(..., n_k, d_v)")
            checks.append(("v", v, "(..., n_k, d_v)"))
        for name, a, exp in checks:
            check_nonempty(name, a, exp)
        n_q, d_k = q.shape[-2:]
        n_k = k.shape[-2]
        if k.shape[-1] != d_k:
            raise ValueError(f"k must have shape (..., n_k, d_k) with d_k = {d_k} (from {qname}), got {k.shape}")
        if v.shape[-2] != n_k:
            raise ValueError(f"v must have shape (..., n_k, d_v) with n_k = {n_k} (from k), got {v.shape}")
        named = [(qname, q, 2), ("k", k, 2), ("v", v, 2)]
        arrays = [q, k, v]
        if tau is not None:
            tau = real_array("tau", tau)
            if tau.ndim < 1 or tau.shape[-1] not in (n_q, 1):
                raise ValueError(f"tau must have shape (..., n_q) with n_q = {n_q} (from {qname}), got {tau.shape}")
            check_nonempty("tau", tau, "(..., n_q)")
            if tau.shape[-1] == 1 and n_q != 1:
                tau = np.broadcast_to(tau, tau.shape[:-1] + (n_q,))
            named.append(("tau", tau, 1))
            arrays.append(tau)
        self.dtype = compute_dtype(*arrays)
        for name, a, _ in named:
            check_finite(name, a)
        self.mask_kind = None
        if mask is not None:
            mask = real_array("mask", mask, allow_bool=True)
            check_nonempty("mask", mask, "broadcastable to (..., n_q, n_k)")
            if mask.ndim < 2:
                mask = mask.reshape((1,) * (2 - mask.ndim) + mask.shape)
            if mask.shape[-2] not in (1, n_q) or mask.shape[-1] not in (1, n_k):
                raise ValueError(
                    f"mask must be broadcastable to (..., n_q, n_k) = (..., {n_q}, {n_k}), got {mask.shape}")
            if mask.dtype.kind == "b":
                self.mask_kind = "keep"
            else:
                if np.any(np.isnan(mask)) or np.any(mask == np.inf):
                    raise ValueError("mask (additive) must not contain NaN or +inf; use -inf to hide a key")
                self.mask_kind = "bias"
            named.append(("mask", mask, 2))
        self.batch_shape = broadcast_batch(named)
        dtypes = [self.dtype] * len(named)
        if self.mask_kind == "keep":
            dtypes[-1] = np.uint8
        ops = batch_operands(self.batch_shape, [a for _, a, _ in named], [c for _, _, c in named], dtypes)
        self.q, self.k, self.v = ops[:3]
        self.tau = ops[3] if tau is not None else None
        self.mask = ops[-1] if mask is not None else None
        self.batch = int(np.prod(self.batch_shape, dtype=np.int64))
        self.n_q, self.n_k, self.d_k, self.d_v = n_q, n_k, d_k, v.shape[-1]
        self.causal = _causal_code(causal)

    def mask_args(self):
        if self.mask is None:
            return None, None, None
        if self.mask_kind == "keep":
            return self.mask.array, None, self.mask.index
        return None, self.mask.array, self.mask.index

    def shaped(self, a: Optional[np.ndarray], *core):
        return None if a is None else a.reshape(self.batch_shape + core)

    def cotangent(self, dy):
        """The output cotangent dy (..., n_q, d_v), checked, over the flat batch."""
        out = self.batch_shape + (self.n_q, self.d_v)
        return cotangent("dy", dy, out, self.dtype).reshape(self.batch, self.n_q, self.d_v)

    def saved(self, dy, y, log_partition, forward):
        """Checked (dy, y, log Z) over the flat batch; y and log Z from `forward()` unless both given."""
        out = self.batch_shape + (self.n_q, self.d_v)
        dy = self.cotangent(dy)
        if y is None or log_partition is None:
            y, _, log_z = forward()
        else:
            y = cotangent("y", y, out, self.dtype).reshape(self.batch, self.n_q, self.d_v)
            log_z = cotangent("log_partition", log_partition, self.batch_shape + (self.n_q,), self.dtype,
                              allow_neg_inf=True).reshape(self.batch, self.n_q)
        return dy, y, log_z


def _pack(y, weights, log_partition, return_weights, return_log_partition):
    out = (y,)
    if return_weights:
        out += (weights,)
    if return_log_partition:
        out += (log_partition,)
    return out[0] if len(out) == 1 else out


def softmax_attention(q, k, v, *, mask=None, causal=False, scale=None, return_weights=False,
                      return_log_partition=False):
    """Softmax scaled dot-product attention, y = softmax(scale q k^T + mask) v.

    Lawrence, Laplace-Radon eq. (2)-(3). Flash-style C++ kernel: online softmax over key
    blocks, OpenMP over batch x query blocks, no n_q x n_k buffer unless the weights are
    asked for; stable for logits of any magnitude.

    Parameters
    ----------
    q : array_like, shape (..., n_q, d_k)
    k : array_like, shape (..., n_k, d_k)
    v : array_like, shape (..., n_k, d_v)
        Leading axes of q, k, v (and mask) broadcast.
    mask : array_like, optional
        Broadcastable to (..., n_q, n_k). Boolean: True = attend. Float: added to the
        scaled logits (-inf hides a key; NaN and +inf are rejected).
    causal : {False, True, "top_left", "bottom_right"}
        True / "top_left": key j visible to query i iff j <= i (PyTorch ``is_causal``).
        "bottom_right": iff j <= i + n_k - n_q (FlashAttention >= 2.1, queries appended to
        a cache). Combined with mask by logical and.
    scale : float, optional
        Logit scale, default 1 / sqrt(d_k).
    return_weights : bool
        Also return the routing matrix P, shape (..., n_q, n_k).
    return_log_partition : bool
        Also return log Z = logsumexp_j(scale q_i.k_j + mask_ij), shape (..., n_q).

    Returns
    -------
    y : ndarray (..., n_q, d_v), or a tuple (y, [P], [log Z]) in that order.
    A query with no visible key gives y = 0, P = 0 and log Z = -inf.

    Example: ``y = ag.softmax_attention(q, k, v, causal=True)``
    """
    pr = _Problem(q, k, v, mask=mask, causal=causal)
    scale = 1.0 / math.sqrt(pr.d_k) if scale is None else scalar("scale", scale)
    keep, bias, mi = pr.mask_args()
    y, w, lz = _core.softmax_attention(pr.batch, pr.q.array, pr.q.index, pr.k.array, pr.k.index, pr.v.array,
                                       pr.v.index, keep, bias, mi, pr.causal, scale, bool(return_weights),
                                       bool(return_log_partition))
    return _pack(pr.shaped(y, pr.n_q, pr.d_v), pr.shaped(w, pr.n_q, pr.n_k), pr.shaped(lz, pr.n_q),
                 return_weights, return_log_partition)


class AttentionGrads(NamedTuple):
    """Cotangents of an attention call's inputs, each with its input's shape (broadcast axes summed)."""

    dq: np.ndarray
    dk: np.ndarray
    dv: np.ndarray


def _shapes(**arrays):
    return {name: np.shape(a) for name, a in arrays.items()}


def attention_backward(q, k, v, dy, *, mask=None, causal=False, scale=None, y=None, log_partition=None,
                       key_bias_grad=False):
    """Shared path of softmax_attention_backward and projection_attention_backward.

    With key_bias_grad, also returns the cotangent of an additive bias b_j constant along the
    query axis (sum_i dl_ij), shape (..., n_k) over the broadcast batch.
    """
    pr = _Problem(q, k, v, mask=mask, causal=causal)
    shapes = _shapes(q=q, k=k, v=v)
    scale = 1.0 / math.sqrt(pr.d_k) if scale is None else scalar("scale", scale)
    keep, bias, mi = pr.mask_args()

    def forward():
        return _core.softmax_attention(pr.batch, pr.q.array, pr.q.index, pr.k.array, pr.k.index, pr.v.array,
                                       pr.v.index, keep, bias, mi, pr.causal, scale, False, True)

    dy, y, log_z = pr.saved(dy, y, log_partition, forward)
    dq, dk, dv, _, dbias = _core.softmax_attention_backward(
        pr.batch, pr.q.array, pr.q.index, pr.k.array, pr.k.index, pr.v.array, pr.v.index, keep, bias, mi, pr.causal,
        scale, y, log_z, dy, bool(key_bias_grad))
    grads = AttentionGrads(reduce_to_shape(pr.shaped(dq, pr.n_q, pr.d_k), shapes["q"]),
                           reduce_to_shape(pr.shaped(dk, pr.n_k, pr.d_k), shapes["k"]),
                           reduce_to_shape(pr.shaped(dv, pr.n_k, pr.d_v), shapes["v"]))
    return (grads, pr.shaped(dbias, pr.n_k)) if key_bias_grad else grads


def softmax_attention_backward(q, k, v, dy, *, mask=None, causal=False, scale=None, y=None,
                               log_partition=None) -> AttentionGrads:
    """Cotangents (dq, dk, dv) of :func:`softmax_attention` for the output cotangent dy.

    With l_ij = scale q_i.k_j + mask_ij, P = softmax_j(l), y = P v (Laplace-Radon eq. 2-3):

        dv_j = sum_i P_ij dy_i,  dl_ij = P_ij (dy_i.v_j - D_i),  D_i = dy_i.y_i,
        dq_i = scale sum_j dl_ij k_j,  dk_j = scale sum_i dl_ij q_i.

    Flash-style C++ kernel (FlashAttention-2 backward): P is recomputed block by block from
    the saved log Z, no n_q x n_k buffer; OpenMP over batch x key blocks, with the dq
    contributions of each key block summed in a fixed order, so the result does not depend
    on the thread count. The mask gets no gradient; a query with no visible key (a fully
    masked row) contributes nothing.

    Parameters
    ----------
    q, k, v, mask, causal, scale : exactly as given to :func:`softmax_attention`.
    dy : array_like, shape (..., n_q, d_v), the forward output's (broadcast) shape.
    y, log_partition : optional, the forward's outputs ``softmax_attention(...,
        return_log_partition=True)``, shapes (..., n_q, d_v) and (..., n_q); recomputed when
        either is missing.

    Returns
    -------
    AttentionGrads(dq, dk, dv) with the shapes of q, k, v: cotangents over broadcast leading
    axes are summed, as NumPy / PyTorch broadcasting implies. dtype: the forward's (float32
    when q, k, v are all float32, else float64); dy is cast to it. ValueError naming the
    argument for a dy (or y, log_partition) of the wrong shape or dtype, or containing NaN.

    Example: ``dq, dk, dv = ag.softmax_attention_backward(q, k, v, dy, causal=True)``
    """
    return attention_backward(q, k, v, dy, mask=mask, causal=causal, scale=scale, y=y, log_partition=log_partition)


def ridge_attention(u, tau, k, v, *, kernel, params, mask=None, causal=False, qname="u", return_weights=False,
                    return_log_partition=False):
    """Shared path of kernel_attention and laplace_radon_attention (parameters checked there)."""
    pr = _Problem(u, k, v, qname=qname, tau=tau, mask=mask, causal=causal)
    keep, bias, mi = pr.mask_args()
    y, w, lz = _core.ridge_attention(pr.batch, pr.q.array, pr.q.index, pr.tau.array, pr.tau.index, pr.k.array,
                                     pr.k.index, pr.v.array, pr.v.index, keep, bias, mi, pr.causal, kernel, params,
                                     bool(return_weights), bool(return_log_partition))
    return _pack(pr.shaped(y, pr.n_q, pr.d_v), pr.shaped(w, pr.n_q, pr.n_k), pr.shaped(lz, pr.n_q),
                 return_weights, return_log_partition)


def kernel_attention(q, k, v, *, kernel="exp", causal=False, mask=None, scale=None, return_weights=False,
                     return_log_partition=False, **params):
    """Kernel-swapped attention: weights psi(tau_i, s_ij) on the projected coordinate.

    Each query is split into its tilt u_i = q_i / |q_i| and radius tau_i = scale |q_i|
    (Laplace-Radon eq. 9), each key is seen only through s_ij = u_i . k_j (eq. 15), and
    the weights p_ij = psi(tau_i, s_ij) / sum_j psi(tau_i, s_ij) replace softmax
    (eq. 40-44). ``kernel="exp"`` gives exp(tau s) = exp(scale q.k): softmax attention.
    See :mod:`attngeom.kernels` for the kernels and their parameters.

    Parameters
    ----------
    q, k, v : array_like, shapes (..., n_q, d_k), (..., n_k, d_k), (..., n_k, d_v)
    kernel : {"exp", "gaussian", "cauchy", "stable"}
    causal, mask : as in :func:`softmax_attention`; an additive mask multiplies psi by
        exp(mask).
    scale : float, optional
        Radius scale, default 1 / sqrt(d_k).
    **params : sigma (gaussian), gamma (cauchy), alpha in (0, 2] and c (stable).
    return_weights, return_log_partition : as in :func:`softmax_attention`; log Z is
        log sum_j psi(tau_i, s_ij) (plus the additive mask).

    Returns
    -------
    y : ndarray (..., n_q, d_v), or (y, [P], [log Z]).
    A zero query has no direction: u = 0, tau = 0, so every key has s = 0 and the
    weights are uniform over the visible keys.

    Example: ``y = ag.kernel_attention(q, k, v, kernel="gaussian", sigma=0.5)``
    """
    name, p = kernel_params(kernel, params)
    from .laplace_radon import tilt_radius

    q = real_array("q", q)
    check_min_ndim("q", q, 2, "(..., n_q, d_k)")
    check_finite("q", q)
    u, tau = tilt_radius(q, scale=scale)
    return ridge_attention(u, tau, k, v, kernel=name, params=p, mask=mask, causal=causal, qname="q",
                           return_weights=return_weights, return_log_partition=return_log_partition)


def kernel_attention_backward(q, k, v, dy, *, kernel="exp", causal=False, mask=None, scale=None, y=None,
                              log_partition=None, **params) -> AttentionGrads:
    """Cotangents (dq, dk, dv) of :func:`kernel_attention` for the output cotangent dy.

    With u_i = q_i / |q_i|, tau_i = scale |q_i| (Laplace-Radon eq. 9), s_ij = u_i.k_j and
    l_ij = log psi(tau_i, s_ij) + mask_ij (eq. 40-44):

        dl_ij = P_ij (dy_i.v_j - dy_i.y_i),   dk_j = sum_i dl_ij dl/ds u_i,
        du_i = sum_j dl_ij dl/ds k_j,   dtau_i = sum_j dl_ij dl/dtau,
        dq_i = (du_i - u_i (u_i.du_i)) / |q_i| + scale dtau_i u_i.

    dl/ds = -dl/dtau is -(s - tau) / sigma^2 (gaussian), -2 z / (gamma (1 + z^2)) with
    z = (s - tau) / gamma (cauchy), -(log f)'(tau - s) (stable: the derivative of the same
    Chebyshev table / tail series that gives the value). ``kernel="exp"`` is softmax attention
    with logits scale q.k and goes through :func:`softmax_attention_backward`. Flash-style C++
    kernel as in softmax_attention_backward.

    A zero query has no direction (u = 0): the weights are not differentiable in q there and
    its dq is 0 (except for "exp", which is smooth at 0).

    Parameters
    ----------
    q, k, v, kernel, causal, mask, scale, **params : as given to :func:`kernel_attention`.
    dy : (..., n_q, d_v); y, log_partition : optional forward outputs (recomputed if missing).

    Returns AttentionGrads(dq, dk, dv) with the shapes of q, k, v (broadcast axes summed),
    dtype as the forward's; ValueError naming the argument for a bad dy, y or log_partition.

    Example: ``dq, dk, dv = ag.kernel_attention_backward(q, k, v, dy, kernel="cauchy", gamma=0.5)``
    """
    name, p = kernel_params(kernel, params)
    if name == "exp":
        return softmax_attention_backward(q, k, v, dy, mask=mask, causal=causal, scale=scale, y=y,
                                          log_partition=log_partition)
    from .laplace_radon import tilt_radius

    qa = real_array("q", q)
    check_min_ndim("q", qa, 2, "(..., n_q, d_k)")
    check_finite("q", qa)
    scale = 1.0 / math.sqrt(qa.shape[-1]) if scale is None else scalar("scale", scale)
    u, tau = tilt_radius(qa, scale=scale)
    shapes = _shapes(k=k, v=v)
    pr = _Problem(u, k, v, qname="q", tau=tau, mask=mask, causal=causal)
    keep, bias, mi = pr.mask_args()

    def forward():
        return _core.ridge_attention(pr.batch, pr.q.array, pr.q.index, pr.tau.array, pr.tau.index, pr.k.array,
                                     pr.k.index, pr.v.array, pr.v.index, keep, bias, mi, pr.causal, name, p, False,
                                     True)

    dy, y, log_z = pr.saved(dy, y, log_partition, forward)
    du, dk, dv, dtau, _ = _core.ridge_attention_backward(
        pr.batch, pr.q.array, pr.q.index, pr.tau.array, pr.tau.index, pr.k.array, pr.k.index, pr.v.array,
        pr.v.index, keep, bias, mi, pr.causal, name, p, y, log_z, dy)
    du = reduce_to_shape(pr.shaped(du, pr.n_q, pr.d_k), u.shape)
    dtau = reduce_to_shape(pr.shaped(dtau, pr.n_q), tau.shape)
    u = u.astype(pr.dtype, copy=False)
    norm = np.linalg.norm(qa.astype(pr.dtype, copy=False), axis=-1, keepdims=True)
    radial = np.sum(u * du, axis=-1, keepdims=True)
    dq = np.divide(du - u * radial, norm, out=np.zeros_like(du), where=norm > 0)
    dq += pr.dtype.type(scale) * dtau[..., None] * u
    return AttentionGrads(dq, reduce_to_shape(pr.shaped(dk, pr.n_k, pr.d_k), shapes["k"]),
                          reduce_to_shape(pr.shaped(dv, pr.n_k, pr.d_v), shapes["v"]))
