"""Mixture-of-experts MLPs (Mixtral, DeepSeek-V2): the sparse MoE block of the decoder.

The notes' "mixture-of-experts feed-forward layers": the MLP G_l is replaced by
sum_e pi_e(x) G_e(x), with a top-k router. Mixtral's sparse MoE block (as transformers
computes it) is, for the normed residual x of one token::

    g       = x W_r^T                                  router logits, W_r (n_experts, d_model)
    R       = topk_router(g, k)                        softmax over all experts, keep the top k,
                                                       renormalise = softmax of the k largest logits
    MLP(x)  = sum_{e in top-k} R_e  down_e(silu(gate_e x) * up_e x)

so R is exactly the notes' "top-k routing matrix" (:func:`attngeom.topk_router`, ties to
the lower expert index). DeepSeek-V2 (DeepSeekMoE) routes differently (:func:`route`): the
top-k of the full softmax p = softmax(g), not renormalised, times routed_scaling_factor,
optionally group-limited (only experts of the topk_group groups with the largest max_e p_e
compete), and adds shared experts that every token passes through with weight 1::

    R_e     = s p_e  for e in top-k (of the kept groups), 0 otherwise
    MLP(x)  = sum_e R_e down_e(silu(gate_e x) * up_e x) + down_s(silu(gate_s x) * up_s x)

Checkpoints store the experts as ``block_sparse_moe.experts.E.{w1,w3,w2}`` (gate, up, down)
with the router ``block_sparse_moe.gate.weight`` (Mixtral), as
``mlp.experts.E.{gate,up,down}_proj`` with ``mlp.gate.weight`` (DeepSeek), or fused as
``mlp.experts.gate_up_proj`` / ``mlp.experts.down_proj`` with ``mlp.gate.weight``; all are
read (:func:`attngeom.models.io.weights.moe_weights`). DeepSeek's shared experts are
``mlp.shared_experts.{gate,up,down}_proj``.

The router logits of every layer are in :attr:`Forward.router_logits`;
:func:`attngeom.router_statistics` (:mod:`attngeom.models.analysis.router`) summarises them.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ...circuits import topk_router
from .products import product


def route(logits, arch) -> np.ndarray:
    """The router matrix R of a mixture-of-experts model from its router logits (module docstring).

    Mixtral: :func:`attngeom.topk_router` (softmax of the k largest logits). DeepSeek-V2:
    the top-k entries of softmax(g) (of the topk_group best groups under the group-limited
    router), not renormalised, times routed_scaling_factor. Ties go to the lower expert
    (group) index.

    Parameters
    ----------
    logits : ndarray, shape (..., n, n_experts)
        Router logits g.
    arch : Architecture
        With n_experts > 0 (experts_per_token, router_normalized, routed_scaling_factor,
        expert_groups).

    Returns
    -------
    ndarray, shape (..., n, n_experts)
        R, k non-zeros a row.

    Examples
    --------
    >>> from attngeom.models import architecture_from_config
    >>> from attngeom.models.nn.moe import route
    >>> a = architecture_from_config({"model_type": "mixtral", "hidden_size": 8, "num_attention_heads": 2,
    ...                               "num_hidden_layers": 1, "vocab_size": 10, "num_local_experts": 4,
    ...                               "num_experts_per_tok": 2})
    >>> route(np.array([[0.0, 2.0, 2.0, -1.0]]), a)
    array([[0. , 0.5, 0.5, 0. ]])
    """
    k = arch.experts_per_token
    if arch.router_normalized and arch.expert_groups is None:
        return arch.routed_scaling_factor * topk_router(logits, k)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    candidates = p
    if arch.expert_groups is not None:
        n_group, keep = arch.expert_groups
        grouped = p.reshape(p.shape[:-1] + (n_group, -1))
        best = np.argsort(-grouped.max(-1), axis=-1, kind="stable")[..., :keep]
        allowed = np.zeros(grouped.shape[:-1], dtype=bool)
        np.put_along_axis(allowed, best, True, -1)
        candidates = np.where(np.repeat(allowed, grouped.shape[-1], axis=-1), p, 0.0)
    idx = np.argsort(-candidates, axis=-1, kind="stable")[..., :k]
    top = np.take_along_axis(candidates, idx, -1)
    if arch.router_normalized:
        top = top / top.sum(-1, keepdims=True)
    R = np.zeros_like(p)
    np.put_along_axis(R, idx, arch.routed_scaling_factor * top, -1)
    return R


def moe_mlp(x: np.ndarray, layer: dict, arch, act: Callable, gate=None):
    """The sparse MoE block on normed residuals x (..., n, d_model) (module docstring).

    Parameters
    ----------
    x : ndarray, shape (..., n, d_model)
        The post-attention normed residual stream.
    layer : dict
        The weights of :func:`attngeom.models.io.weights.moe_weights`, cast to x's dtype.
    arch : Architecture
        The routing rule (:func:`route`).
    act : callable
        The gate's activation function (silu).
    gate : callable, optional
        The pass's site gate: the router logits pass through it before the routing (an
        intervention there changes the experts chosen).

    Returns
    -------
    out : ndarray, shape (..., n, d_model)
        The block's output.
    logits : ndarray, shape (..., n, n_experts)
        The router logits.

    Examples
    --------
    >>> out, logits = moe_mlp(x, weights, arch, silu)  # doctest: +SKIP
    """
    logits = product(x, layer["router"])
    if gate is not None:
        logits = gate("router_logits", logits)
    R = route(logits, arch).astype(x.dtype, copy=False)
    flat_x, flat_r = x.reshape(-1, x.shape[-1]), R.reshape(-1, R.shape[-1])
    out = np.zeros_like(flat_x)
    for e in range(flat_r.shape[1]):
        rows = np.flatnonzero(flat_r[:, e])
        if rows.size == 0:
            continue
        xe = flat_x[rows]
        h = act(product(xe, layer["experts_gate"][e])) * product(xe, layer["experts_up"][e])
        out[rows] += flat_r[rows, e, None] * product(h, layer["experts_down"][e])
    if "shared_gate" in layer:  # DeepSeek's shared experts: every token, weight 1
        out += product(act(product(flat_x, layer["shared_gate"])) * product(flat_x, layer["shared_up"]), layer["shared_down"])
    return out.reshape(x.shape), logits
