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
from typing import NamedTuple

import numpy as np

from . import _core
from ._deprecation import renamed_arguments
from ._docstrings import fill_doc
from ._operands import (AttentionOperands, choice, finite_result, from_bhnd, logit_scale, operand,
                        reduce_to_shape, scalar, to_bhnd)
from .attention_stats import core_stats, with_stats
from .kernels import kernel_params
from .laplace_radon import ridge_attention, tilts_and_radii


@renamed_arguments(return_weights="return_routing")
def softmax_attention(q, k, v, *, mask=None, causal=False, scale=None, return_routing=False,
                      return_log_partition=False, return_stats=False, layout=None, products="float",
                      merge_heads=False):
    """Softmax scaled dot-product attention, y = softmax(scale q k^T + mask) v.

    Lawrence, Laplace-Radon eq. (2)-(3). Flash-style C++ kernel: online softmax over key
    blocks, OpenMP over batch x query blocks, no n_q x n_k buffer unless the weights are
    asked for; stable for logits of any magnitude.

    Parameters
    ----------
    q : array_like, shape (..., n_q, d_k)
        Queries, one per row.
    k : array_like, shape (..., n_k, d_k)
        Keys, one per row.
    v : array_like, shape (..., n_k, d_v)
        Values, one per key. Leading axes of q, k, v (and mask) broadcast. float32 and
        float64 are kept; float16 is computed in float32, integers in float64, mixed input
        in float64.
    mask : array_like, optional
        Broadcastable to (..., n_q, n_k). Boolean: True = attend. Float: added to the
        scaled logits (-inf hides a key; NaN and +inf are rejected).
    causal : {False, True, "top_left", "bottom_right"}, default False
        True / "top_left": key j visible to query i iff j <= i (PyTorch ``is_causal``).
        "bottom_right": iff j <= i + n_k - n_q (FlashAttention >= 2.1, queries appended to
        a cache). Combined with mask by logical and.
    scale : float, optional
        Logit scale, default 1 / sqrt(d_k).
    return_routing : bool, default False
        Also return the routing matrix P, shape (..., n_q, n_k) (``return_weights`` is its
        deprecated name).
    return_log_partition : bool, default False
        Also return log Z = logsumexp_j(scale q_i.k_j + mask_ij), shape (..., n_q).
    return_stats : bool, default False
        Also return an :class:`attngeom.AttentionStats` (entropy, largest weight and its key,
        weight on key 0, mean query-key distance and log Z of each query's weight row, each
        (..., heads, n_q) in every layout), computed in the same streaming pass as y with no
        (n_q, n_k) buffer: the equations are in :mod:`attngeom.attention_stats`.
    layout : {None, "bhnd", "bnhd"}, optional
        The axes of per-head activations. "bhnd" (the default, None): q (..., heads, n_q,
        d_k), tokens are the rows of each head, as everywhere in the library. "bnhd": q
        (..., n_q, heads, d_k), k and v (..., n_k, heads, d), as TransformerLens ``hook_q``
        and Hugging Face (batch, pos, head, d_head) activations; y and log Z come back as
        (..., n_q, heads, d_v) and (..., n_q, heads), P and the mask stay (..., heads, n_q,
        n_k). Without a layout argument, 4-D q, k, v that look like (batch, pos, head,
        d_head) give a :class:`attngeom.LayoutWarning` (the rule is in ``docs/api.rst``,
        "Activation layouts").
    products : {"float", "bfloat16"}, default "float"
        "bfloat16" (float32 operands; ``ml_dtypes.bfloat16`` ones are float32 here): q, k and
        v are rounded to bfloat16 (nearest, ties to even) and their products summed in
        float32, while the scores, the softmax, log Z and the statistics stay float32, as in
        the bfloat16 mode of :meth:`attngeom.Model.forward`. Where the CPU has AMX tiles
        (AMX-BF16) or bfloat16 dot products (AVX512_BF16; ``show_config()["bf16_products"]``)
        they compute both block products, S = scale (q . k) and P V with each weight rounded to bfloat16 (as PyTorch's
        bfloat16 flash attention rounds them), so y may differ from the exact attention of the
        rounded q, k, v by up to 2^-8 sum_j p_ij abs(v_j) per entry. Elsewhere the float32 kernel
        runs on the rounded values.
    merge_heads : bool, default False
        Return y as (batch, n_q, heads * d_v): each query's heads side by side, the layout
        an output projection reads, written there by the kernel (no copy). The heads are the
        batch axes after the first in the "bhnd" order (q (batch, heads, n_q, d_k); for
        grouped queries (batch, kv_heads, group, n_q, d_k), kv_heads x group of them), so q,
        k and v broadcast to at least two batch axes. The values are y's, only placed
        differently; P, log Z and the statistics keep their shapes.

    Returns
    -------
    y : ndarray, shape (..., n_q, d_v)
        The attention output, in the computation dtype (see `v`); (batch, n_q, heads * d_v)
        with `merge_heads`. With `return_routing`,
        `return_log_partition` or `return_stats` a tuple (y, [P], [log Z], [stats]) in that
        order. A query with no visible key gives y = 0, P = 0 and log Z = -inf (its statistics:
        entropy, max_weight, sink_weight, mean_distance 0 and argmax -1).

    Raises
    ------
    ValueError
        Naming the argument: q or k holds NaN or inf, or v does in a row some query sees
        (a value no query can see never enters); the weighted sum of v passes the float
        range (entries of v near the float limit); the logits may pass it (with
        ``products="bfloat16"``, also q or k within half a bfloat16 step of the float maximum,
        or q . k before the scale beyond it, on every CPU alike); or a shape, mask or scale
        is invalid.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = rng.standard_normal((5, 4)), rng.standard_normal((7, 4)), rng.standard_normal((7, 3))
    >>> y, P = ag.softmax_attention(q, k, v, causal=True, return_routing=True)
    >>> y.shape, P.shape
    ((5, 3), (5, 7))
    >>> bool(np.allclose(P.sum(-1), 1)), bool(np.all(np.triu(P, 1) == 0))
    (True, True)
    """
    layout, (q, k, v) = to_bhnd(layout, "softmax_attention", [("q", q, "v"), ("k", k, "v"), ("v", v, "v")])
    pr = AttentionOperands(q, k, v, mask=mask, causal=causal, finite=False)  # the core checks q, k, v
    scale = logit_scale(scale, pr.d_k)
    bf16 = choice("products", products, ("float", "bfloat16")) == "bfloat16"
    if bf16 and pr.dtype != np.float32:
        raise ValueError(f"products='bfloat16' computes in float32: q, k and v must be float32 (or bfloat16), "
                         f"got a {pr.dtype} computation")
    y_heads = 1
    if merge_heads:
        if len(pr.batch_shape) < 2:
            raise ValueError(f"merge_heads: q, k and v must broadcast to (batch, heads, ..., n, d) in the bhnd order, "
                             f"got the batch shape {pr.batch_shape}")
        y_heads = math.prod(pr.batch_shape[1:])
    y, w, lz, st = _core.softmax_attention(pr.core_args(), scale, bool(return_routing),
                                           bool(return_log_partition), want_stats=bool(return_stats), bf16=bf16,
                                           y_heads=y_heads)
    out = pr.attention_outputs(y, w, lz, return_routing, return_log_partition, y_merged=bool(merge_heads))
    if return_stats:
        out = (out, core_stats(lambda a: pr.shaped(a, pr.n_q), lz, st))
    return with_stats(layout, out, return_routing, return_log_partition, return_stats, y_merged=bool(merge_heads))


class AttentionGrads(NamedTuple):
    """Cotangents of an attention call's inputs, each with its input's shape (broadcast axes summed)."""

    dq: np.ndarray
    dk: np.ndarray
    dv: np.ndarray


def attention_backward(q, k, v, dy, *, mask=None, causal=False, scale=None, y=None, log_partition=None,
                       key_bias_grad=False):
    """Shared path of softmax_attention_backward and projection_attention_backward.

    With key_bias_grad, also returns the cotangent of an additive bias b_j constant along the
    query axis (sum_i dl_ij), shape (..., n_k) over the broadcast batch.
    """
    pr = AttentionOperands(q, k, v, mask=mask, causal=causal)
    shapes = [np.shape(a) for a in (q, k, v)]
    scale = logit_scale(scale, pr.d_k)
    args = pr.core_args()
    dy, y, log_z = pr.saved(dy, y, log_partition, lambda: _core.softmax_attention(args, scale, False, True))
    dq, dk, dv, _, dbias = _core.softmax_attention_backward(args, scale, y, log_z, dy, bool(key_bias_grad))
    grads = AttentionGrads(*pr.gradients(dq, dk, dv, shapes))
    return (grads, pr.shaped(dbias, pr.n_k)) if key_bias_grad else grads


@finite_result
def softmax_attention_backward(q, k, v, dy, *, mask=None, causal=False, scale=None, y=None,
                               log_partition=None, layout=None) -> AttentionGrads:
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
    q, k, v : array_like, shapes (..., n_q, d_k), (..., n_k, d_k), (..., n_k, d_v)
        Exactly as given to :func:`softmax_attention`.
    dy : array_like, shape (..., n_q, d_v)
        Cotangent of the output, in the forward output's (broadcast) shape; cast to the
        forward's dtype.
    mask, causal, scale
        Exactly as given to :func:`softmax_attention`.
    y, log_partition : array_like, optional
        The forward's outputs ``softmax_attention(..., return_log_partition=True)``, shapes
        (..., n_q, d_v) and (..., n_q); recomputed when either is missing.
    layout : {None, "bhnd", "bnhd"}, optional
        As given to the forward (see :func:`softmax_attention`): with "bnhd", q, k, v, dy, y
        are (..., n, heads, d), log_partition (..., n_q, heads), and dq, dk, dv come back so.

    Returns
    -------
    AttentionGrads
        Named tuple (dq, dk, dv) with the shapes of q, k, v: cotangents over broadcast
        leading axes are summed, as NumPy / PyTorch broadcasting implies. dtype: the
        forward's (float32 when q, k, v are all float32, else float64).

    Raises
    ------
    ValueError
        Naming the argument for a dy (or y, log_partition) of the wrong shape or dtype,
        or containing NaN.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> q, k, v, dy = rng.standard_normal((4, 2, 5, 3))
    >>> dq, dk, dv = ag.softmax_attention_backward(q, k, v, dy, causal=True)
    >>> dq.shape, bool(np.allclose(dv.sum(-2), dy.sum(-2)))   # each row of P sums to 1
    ((2, 5, 3), True)
    """
    layout, (q, k, v, dy, y, log_partition) = to_bhnd(layout, "softmax_attention_backward", [
        ("q", q, "v"), ("k", k, "v"), ("v", v, "v"), ("dy", dy, "v"), ("y", y, "v"),
        ("log_partition", log_partition, "s")])
    grads = attention_backward(q, k, v, dy, mask=mask, causal=causal, scale=scale, y=y, log_partition=log_partition)
    return from_bhnd(layout, grads, "vvv")


@renamed_arguments(return_weights="return_routing")
def kernel_attention(q, k, v, *, kernel="exp", causal=False, mask=None, scale=None, return_routing=False,
                     return_log_partition=False, return_stats=False, layout=None, **params):
    """Kernel-swapped attention: weights psi(tau_i, s_ij) on the projected coordinate.

    Each query is split into its tilt u_i = q_i / ``|q_i|`` and radius tau_i = scale ``|q_i|``
    (Laplace-Radon eq. 9), each key is seen only through s_ij = u_i . k_j (eq. 15), and
    the weights p_ij = psi(tau_i, s_ij) / sum_j psi(tau_i, s_ij) replace softmax
    (eq. 40-44). ``kernel="exp"`` gives exp(tau s) = exp(scale q.k): softmax attention.
    See :mod:`attngeom.kernels` for the kernels and their parameters.

    Parameters
    ----------
    q, k, v : array_like, shapes (..., n_q, d_k), (..., n_k, d_k), (..., n_k, d_v)
        Queries, keys and values as in :func:`softmax_attention` (same dtype rule).
    kernel : {"exp", "gaussian", "cauchy", "stable"}, default "exp"
        The kernel psi(tau, s) of :mod:`attngeom.kernels`.
    causal, mask : optional
        As in :func:`softmax_attention`; an additive mask multiplies psi by exp(mask).
    scale : float, optional
        Radius scale, default 1 / sqrt(d_k).
    return_routing, return_log_partition : bool, default False
        As in :func:`softmax_attention` (``return_weights`` is deprecated); log Z is
        log sum_j psi(tau_i, s_ij) (plus the additive mask).
    return_stats : bool, default False
        As in :func:`softmax_attention`: the statistics of the kernel's weight rows.
    layout : {None, "bhnd", "bnhd"}, optional
        The axes of q, k, v, y and log Z, as in :func:`softmax_attention`.
    **params
        Kernel parameters: sigma (gaussian), gamma (cauchy), alpha in [0.1, 2] and c (stable).

    Returns
    -------
    y : ndarray, shape (..., n_q, d_v)
        The output, or (y, [P], [log Z], [stats]) as in :func:`softmax_attention`. A zero query has
        no direction: u = 0, tau = 0, so every key has s = 0 and the weights are uniform
        over the visible keys.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = rng.standard_normal((5, 4)), rng.standard_normal((7, 4)), rng.standard_normal((7, 3))
    >>> bool(np.allclose(ag.kernel_attention(q, k, v), ag.softmax_attention(q, k, v)))  # "exp" is softmax
    True
    >>> ag.kernel_attention(q, k, v, kernel="gaussian", sigma=0.5).shape
    (5, 3)
    """
    name, p = kernel_params(kernel, params)
    layout, (q, k, v) = to_bhnd(layout, "kernel_attention", [("q", q, "v"), ("k", k, "v"), ("v", v, "v")])
    q = operand("q", q, "(..., n_q, d_k)")
    u, tau = tilts_and_radii(q, logit_scale(scale, q.shape[-1]))
    out = ridge_attention(u, tau, k, v, kernel=name, params=p, mask=mask, causal=causal, qname="q",
                          return_routing=return_routing, return_log_partition=return_log_partition,
                          return_stats=return_stats)
    return with_stats(layout, out, return_routing, return_log_partition, return_stats)


@finite_result
@fill_doc
def kernel_attention_backward(q, k, v, dy, *, kernel="exp", causal=False, mask=None, scale=None, y=None,
                              log_partition=None, layout=None, **params) -> AttentionGrads:
    """Cotangents (dq, dk, dv) of :func:`kernel_attention` for the output cotangent dy.

    With u_i = q_i / ``|q_i|``, tau_i = scale ``|q_i|`` (Laplace-Radon eq. 9), s_ij = u_i.k_j and
    l_ij = log psi(tau_i, s_ij) + mask_ij (eq. 40-44):

        dl_ij = P_ij (dy_i.v_j - dy_i.y_i),   dk_j = sum_i dl_ij dl/ds u_i,
        du_i = sum_j dl_ij dl/ds k_j,   dtau_i = sum_j dl_ij dl/dtau,
        dq_i = (du_i - u_i (u_i.du_i)) / ``|q_i|`` + scale dtau_i u_i.

    dl/ds = -dl/dtau is -(s - tau) / sigma^2 (gaussian), -2 z / (gamma (1 + z^2)) with
    z = (s - tau) / gamma (cauchy), -(log f)'(tau - s) (stable: the derivative of the same
    Chebyshev table / tail series that gives the value). ``kernel="exp"`` is softmax attention
    with logits scale q.k and goes through :func:`softmax_attention_backward`. Flash-style C++
    kernel as in softmax_attention_backward.

    A zero query has no direction (u = 0): the weights are not differentiable in q there and
    its dq is 0 (except for "exp", which is smooth at 0).

    Parameters
    ----------
    q, k, v : array_like, shapes (..., n_q, d_k), (..., n_k, d_k), (..., n_k, d_v)
        As given to :func:`kernel_attention`.
    %(dy)s
    kernel, causal, mask, scale
        As given to :func:`kernel_attention`.
    y, log_partition : array_like, optional
        The forward's outputs (recomputed when either is missing).
    layout : {None, "bhnd", "bnhd"}, optional
        As given to the forward (see :func:`softmax_attention`): with "bnhd", q, k, v, dy, y
        are (..., n, heads, d), log_partition (..., n_q, heads), and dq, dk, dv come back so.
    **params
        The kernel's parameters (sigma, gamma, alpha, c), as given to the forward.

    %(grads_returns)s

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> q, k, v, dy = rng.standard_normal((4, 6, 3))
    >>> g = ag.kernel_attention_backward(q, k, v, dy, kernel="cauchy", gamma=0.5)
    >>> [a.shape for a in g]
    [(6, 3), (6, 3), (6, 3)]
    """
    name, p = kernel_params(kernel, params)
    layout, (q, k, v, dy, y, log_partition) = to_bhnd(layout, "kernel_attention_backward", [
        ("q", q, "v"), ("k", k, "v"), ("v", v, "v"), ("dy", dy, "v"), ("y", y, "v"),
        ("log_partition", log_partition, "s")])
    if name == "exp":
        grads = softmax_attention_backward(q, k, v, dy, mask=mask, causal=causal, scale=scale, y=y,
                                           log_partition=log_partition, layout="bhnd")
        return from_bhnd(layout, grads, "vvv")
    qa = operand("q", q, "(..., n_q, d_k)")
    scale = logit_scale(scale, qa.shape[-1])
    u, tau = tilts_and_radii(qa, scale)
    pr = AttentionOperands(u, k, v, qname="q", tau=tau, mask=mask, causal=causal)
    args = pr.core_args()
    dy, y, log_z = pr.saved(dy, y, log_partition, lambda: _core.ridge_attention(args, name, p, False, True))
    du, dk, dv, dtau, _ = _core.ridge_attention_backward(args, name, p, y, log_z, dy)
    du, dk, dv = pr.gradients(du, dk, dv, [u.shape, np.shape(k), np.shape(v)])
    dtau = reduce_to_shape(pr.shaped(dtau, pr.n_q), tau.shape)
    u = u.astype(pr.dtype, copy=False)
    norm = tilts_and_radii(qa.astype(pr.dtype, copy=False), 1.0)[1][..., None]  # |q|, overflow-safe
    radial = np.sum(u * du, axis=-1, keepdims=True)
    dq = np.divide(du - u * radial, norm, out=np.zeros_like(du), where=norm > 0)
    dq += pr.dtype.type(scale) * dtau[..., None] * u
    return from_bhnd(layout, AttentionGrads(dq, dk, dv), "vvv")
