"""Lightning (unnormalized, linear-time) self-attention and deep lightning networks.

Henry, Marchetti & Kohn, "Geometry of Lightning Self-Attention", Definitions 1-2: a layer
with attention matrix A = K^T Q (d x d) and value matrix V (d' x d) maps tokens x_1..x_t to

    phi(X)_i = sum_j (x_j^T A x_i) V x_j            (eq. 1;  phi(X) = V X X^T A X, eq. 2)

with no normalisation, so it costs O(t) instead of O(t^2). The paper writes tokens as
columns (X in R^{d x t}); here tokens are rows, x of shape (..., t, d), and the output is
(..., t, d'), i.e. the transpose of the paper's phi(X). Weights keep the paper's shapes.

The softmax-normalised network of s.3.4 (eq. 16), ``kind="softmax"``, weights token j for
token i by S(x_i^T A x_j) = exp(x_i^T A x_j / temperature), normalised over j. Note the
order of x_i, x_j there is the transpose of eq. 1's; both are implemented as written.
``kind="lightning"`` (the default) is eq. 1. The same two words select the network in
:mod:`attngeom.dimension`, whose forward pass is :func:`deep_lightning`.
"""
from __future__ import annotations

import warnings
from typing import Optional, Sequence

import numpy as np

from . import _core
from ._docstrings import fill_doc
from ._operands import (AttentionOperands, check_bound, choice, compute_dtype, finite_result, from_bhnd, max_row_norm, operand,
                        scalar, to_bhnd)
from .attention import AttentionGrads, softmax_attention

_CHUNK = 64

KINDS = ("lightning", "softmax")


def network_kind(kind, normalize: Optional[bool] = None, func: str = "") -> str:
    """The checked network kind, "lightning" (eq. 1) or "softmax" (eq. 16).

    ``normalize`` is the deprecated spelling (True = "softmax", False = "lightning"),
    accepted for one release with a DeprecationWarning."""
    if normalize is not None:
        warnings.warn(f"{func}(): normalize= is deprecated, use kind='softmax' (normalize=True) or "
                      "kind='lightning' (normalize=False)", DeprecationWarning, stacklevel=3)
        kind = "softmax" if normalize else "lightning"
    choice("kind", kind, KINDS)
    return kind


@finite_result(checked=True)  # the core checks each chunk of y as it writes it
@fill_doc
def lightning_attention(q, k, v, *, causal=False, layout=None):
    """Lightning attention y_i = sum_j (q_i . k_j) v_j, in O(n d_k d_v).

    Henry, Marchetti & Kohn, "Geometry of Lightning Self-Attention", eq. (1) in the row
    convention (q_i = Q x_i, k_j = K x_j, v_j = V x_j). Non-causal: Y = Q (K^T V). Causal:
    queries in chunks of 64 rows, each with the prefix state sum k_j^T v_j of the keys it fully
    sees plus one masked diagonal block; no n_q x n_k buffer is ever formed.

    Parameters
    ----------
    %(q_k_v)s
    causal : {False, True, "top_left", "bottom_right"}, default False
        As in :func:`attngeom.softmax_attention` (top-left: key j <= query i; bottom-right:
        j <= i + n_k - n_q).
    layout : {None, "bhnd", "bnhd"}, optional
        The axes of q, k, v and y, as in :func:`attngeom.softmax_attention`.

    Returns
    -------
    y : ndarray, shape (..., n_q, d_v)
        float32 when every input is float32, else float64.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = rng.standard_normal((5, 3)), rng.standard_normal((5, 3)), rng.standard_normal((5, 2))
    >>> bool(np.allclose(ag.lightning_attention(q, k, v, causal=True), np.tril(q @ k.T) @ v))
    True
    """
    layout, (q, k, v) = to_bhnd(layout, "lightning_attention", [("q", q, "v"), ("k", k, "v"), ("v", v, "v")])
    p = AttentionOperands(q, k, v, causal=causal, finite=False)  # the core checks q, k, v in its passes
    y = _core.lightning_attention(p.core_args(), _CHUNK)
    return from_bhnd(layout, p.shaped(y, p.n_q, p.d_v), "v")


@finite_result
@fill_doc
def lightning_attention_backward(q, k, v, dy, *, causal=False, layout=None) -> AttentionGrads:
    """Cotangents (dq, dk, dv) of :func:`lightning_attention` for the output cotangent dy.

    With the visibility pattern C (C_ij = 1 iff query i sees key j) and Y = (Q K^T o C) V:

        dQ = (dY V^T o C) K,   dK = (V dY^T o C^T) Q,   dV = (K Q^T o C^T) dY,

    three lightning products, each computed by the chunked O(n d_k d_v) kernel (the
    transposed pattern is the causal one on time-reversed sequences with the other
    alignment); no n_q x n_k buffer.

    Parameters
    ----------
    q, k, v : array_like, shapes (..., n_q, d_k), (..., n_k, d_k), (..., n_k, d_v)
        As given to :func:`lightning_attention`.
    %(dy)s
    causal : bool or str, default False
        As given to the forward.
    %(backward_layout)s

    %(grads_returns)s

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> q, k, v, dy = rng.standard_normal((4, 5, 2))
    >>> dq, dk, dv = ag.lightning_attention_backward(q, k, v, dy)
    >>> bool(np.allclose(dv, k @ (q.T @ dy)))   # dV = K Q^T dY without a mask
    True
    """
    layout, (q, k, v, dy) = to_bhnd(layout, "lightning_attention_backward",
                                    [("q", q, "v"), ("k", k, "v"), ("v", v, "v"), ("dy", dy, "v")])
    shapes = [np.shape(a) for a in (q, k, v)]
    p = AttentionOperands(q, k, v, causal=causal)
    dy = p.cotangent(dy)
    dq, dk, dv = _core.lightning_attention_backward(p.core_args(), dy, _CHUNK)
    return from_bhnd(layout, AttentionGrads(*p.gradients(dq, dk, dv, shapes)), "vvv")


def _layer_weights(A, V, d, name_a="A", name_v="V"):
    a = operand(name_a, A, f"(d, d) = ({d}, {d})", ndim=2, dtype=None)
    if a.shape != (d, d):
        raise ValueError(f"{name_a} must have shape (d, d) = ({d}, {d}) for tokens of width {d}, got {a.shape}")
    v = operand(name_v, V, f"(d', {d})", dtype=None)
    if v.shape[1] != d:
        raise ValueError(f"{name_v} must have shape (d', d) with d = {d}, got {v.shape}")
    return a, v


def _layer(x, a, v, kind, temperature, causal):
    dt = compute_dtype(x, a, v)
    x, a, v = (m.astype(dt, copy=False) for m in (x, a, v))
    values = x @ v.T
    if kind == "softmax":
        # eq. 16: weights exp(x_i^T A x_j / T): query i is A^T x_i, key j is x_j.
        queries = x @ a
        check_bound(max_row_norm(queries) * max_row_norm(x) / temperature, dt,
                    f"the logits x_i^T A x_j / temperature (temperature = {temperature:.3g})",
                    "temperature is too small for these inputs")
        return softmax_attention(queries, x, values, scale=1.0 / temperature, causal=causal)
    # eq. 1: weights x_j^T A x_i: query i is A x_i, key j is x_j.
    return lightning_attention(x @ a.T, x, values, causal=causal)


@finite_result
def lightning_layer(x, A, V, *, kind="lightning", temperature=1.0, causal=False, normalize=None):
    """One self-attention layer in the paper's weights W = (A, V), tokens as rows.

    Henry, Marchetti & Kohn, eq. (1)-(3) (lightning) and eq. (16) (softmax-normalised).

    Parameters
    ----------
    x : array_like, shape (..., t, d)
        Tokens.
    A : array_like, shape (d, d)
        Attention matrix A = K^T Q (eq. 3), any rank; x_j^T A x_i is the weight of token j
        for token i.
    V : array_like, shape (d', d)
        Value matrix.
    kind : {"lightning", "softmax"}, default "lightning"
        "lightning" gives lightning attention (eq. 1); "softmax" the softmax-normalised layer
        of eq. 16 with S(s) = exp(s / temperature).
    temperature : float, default 1.0
        Softmax temperature.
    causal : bool, default False
        Restrict token i to j <= i.
    normalize : bool, optional
        Deprecated spelling of `kind` (True = "softmax").

    Returns
    -------
    ndarray, shape (..., t, d')
        Row i is phi_W(X)_i.

    Examples
    --------
    >>> x = np.random.default_rng(0).standard_normal((4, 3))
    >>> A, V = np.eye(3), np.ones((2, 3))
    >>> bool(np.allclose(ag.lightning_layer(x, A, V), (x @ x.T) @ x @ V.T))
    True
    """
    kind = network_kind(kind, normalize, "lightning_layer")
    x = operand("x", x, "(..., t, d)", dtype=None)
    a, v = _layer_weights(A, V, x.shape[-1])
    temperature = scalar("temperature", temperature, positive=True)
    return _layer(x, a, v, kind, temperature, causal)


@finite_result
@fill_doc
def deep_lightning(x, As: Sequence, Vs: Sequence, *, kind="lightning", temperature=1.0, causal=False,
                   normalize=None):
    """A deep self-attention network phi_W = phi_{W_l} o ... o phi_{W_1} (Definition 2).

    Henry, Marchetti & Kohn, Definition 2. Layer i has A_i (d_{i-1}, d_{i-1}) and V_i
    (d_i, d_{i-1}). Lightning layers make the network a homogeneous polynomial of degree 3^l
    in x; ``kind="softmax"`` gives the softmax-normalised network of s.3.4 (eq. 16 per layer).
    This is the one forward pass of both kinds of network; the dimension module's
    :func:`attngeom.network_forward` calls it.

    Parameters
    ----------
    x : array_like, shape (..., t, d_0)
        Tokens.
    As : sequence of array_like
        A_1 .. A_l.
    Vs : sequence of array_like
        V_1 .. V_l.
    %(network_kind)s
    causal : bool, default False
        Causal layers.
    normalize : bool, optional
        Deprecated spelling of `kind` (True = "softmax").

    Returns
    -------
    ndarray, shape (..., t, d_l)
        The network output.

    Examples
    --------
    >>> x = np.random.default_rng(0).standard_normal((4, 3))
    >>> As, Vs = [np.eye(3), np.eye(2)], [np.ones((2, 3)), np.ones((1, 2))]
    >>> y = ag.deep_lightning(x, As, Vs)
    >>> y.shape, bool(np.allclose(ag.deep_lightning(2 * x, As, Vs), 2 ** 9 * y))  # degree 3^2
    ((4, 1), True)
    """
    kind = network_kind(kind, normalize, "deep_lightning")
    x = operand("x", x, "(..., t, d)", dtype=None)
    if len(As) != len(Vs) or len(As) == 0:
        raise ValueError(f"As and Vs must be non-empty sequences of equal length, got {len(As)} and {len(Vs)}")
    temperature = scalar("temperature", temperature, positive=True)
    layers = [_layer_weights(a, v, _width(i, Vs, x), f"As[{i}]", f"Vs[{i}]") for i, (a, v) in enumerate(zip(As, Vs))]
    for a, v in layers:
        x = _layer(x, a, v, kind, temperature, causal)
    return x


def _width(i, Vs, x):
    """Input width of layer i: d_0 from x, then the row count of the previous V."""
    return x.shape[-1] if i == 0 else np.shape(Vs[i - 1])[0]
