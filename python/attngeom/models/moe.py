"""Mixture-of-experts MLPs (Mixtral): the sparse MoE block of the decoder and its weights.

The notes' "mixture-of-experts feed-forward layers": the MLP G_l is replaced by
sum_e pi_e(x) G_e(x), with top-k routing. Mixtral's sparse MoE block (as transformers
computes it) is, for the normed residual x of one token::

    g       = x W_r^T                                  router logits, W_r (n_experts, d_model)
    R       = topk_routing(g, k)                       softmax over all experts, keep the top k,
                                                       renormalise = softmax of the k largest logits
    MLP(x)  = sum_{e in top-k} R_e  down_e(silu(gate_e x) * up_e x)

so R is exactly the notes' "top-k routing matrix" (:func:`attngeom.topk_routing`, ties to
the lower expert index). Checkpoints store the experts as
``block_sparse_moe.experts.E.{w1,w3,w2}`` (gate, up, down) with the router
``block_sparse_moe.gate.weight``, or fused as ``mlp.experts.gate_up_proj`` /
``mlp.experts.down_proj`` with ``mlp.gate.weight``; both are read.

The router logits of every layer are in :attr:`Forward.router_logits`;
:func:`attngeom.router_statistics` (:mod:`attngeom.models.routing`) summarises them.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..circuits import topk_routing


def moe_weights(take: Callable, prefix: str, arch) -> dict:
    """The router and stacked expert weights of one layer, in (in, out) orientation.

    Parameters
    ----------
    take : callable
        ``take(name, shape=None, required=True)`` -> tensor or None (the decoder's reader).
    prefix : str
        The layer's name prefix ("model.layers.3.").
    arch : Architecture
        With n_experts > 0.

    Returns
    -------
    dict
        "router" (d_model, n_experts), "experts_gate" and "experts_up" (n_experts, d_model,
        d_ff), "experts_down" (n_experts, d_ff, d_model).

    Examples
    --------
    >>> w = moe_weights(take, "model.layers.0.", arch)  # doctest: +SKIP
    """
    d, E = arch.d_model, arch.n_experts
    ff = arch.config.get("intermediate_size")
    fused = take(prefix + "mlp.experts.gate_up_proj", required=False)
    if fused is not None:
        router = take(prefix + "mlp.gate.weight", (E, d))
        fused = np.asarray(fused)
        if fused.ndim != 3 or fused.shape[0] != E or fused.shape[2] != d or fused.shape[1] % 2:
            raise ValueError(f"tensor {prefix + 'mlp.experts.gate_up_proj'!r} has shape {tuple(fused.shape)}, but "
                             f"config.json (num_local_experts={E}, hidden_size={d}) implies ({E}, 2 * d_ff, {d})")
        half = fused.shape[1] // 2
        gate, up = np.swapaxes(fused[:, :half], 1, 2), np.swapaxes(fused[:, half:], 1, 2)
        down = np.swapaxes(np.asarray(take(prefix + "mlp.experts.down_proj", (E, d, half))), 1, 2)
    else:
        s = prefix + "block_sparse_moe."
        router = take(s + "gate.weight", (E, d))
        w1 = [np.asarray(take(f"{s}experts.{e}.w1.weight", (ff, d) if ff else None)) for e in range(E)]
        f = w1[0].shape[0]
        gate = np.stack([w.T for w in w1])
        up = np.stack([np.asarray(take(f"{s}experts.{e}.w3.weight", (f, d))).T for e in range(E)])
        down = np.stack([np.asarray(take(f"{s}experts.{e}.w2.weight", (d, f))).T for e in range(E)])
    return {"router": np.asarray(router).T, "experts_gate": gate, "experts_up": up, "experts_down": down}


def moe_mlp(x: np.ndarray, layer: dict, k: int, act: Callable):
    """The sparse MoE block on normed residuals x (..., n, d_model) (module docstring).

    Parameters
    ----------
    x : ndarray, shape (..., n, d_model)
        The post-attention normed residual stream.
    layer : dict
        The weights of :func:`moe_weights`, cast to x's dtype.
    k : int
        Experts per token.
    act : callable
        The gate nonlinearity (silu).

    Returns
    -------
    out : ndarray, shape (..., n, d_model)
        The block's output.
    logits : ndarray, shape (..., n, n_experts)
        The router logits.

    Examples
    --------
    >>> out, logits = moe_mlp(x, weights, 2, silu)  # doctest: +SKIP
    """
    logits = x @ layer["router"]
    R = topk_routing(logits, k).astype(x.dtype, copy=False)
    flat_x, flat_r = x.reshape(-1, x.shape[-1]), R.reshape(-1, R.shape[-1])
    out = np.zeros_like(flat_x)
    for e in range(flat_r.shape[1]):
        rows = np.flatnonzero(flat_r[:, e])
        if rows.size == 0:
            continue
        xe = flat_x[rows]
        h = act(xe @ layer["experts_gate"][e]) * (xe @ layer["experts_up"][e])
        out[rows] += flat_r[rows, e, None] * (h @ layer["experts_down"][e])
    return out.reshape(x.shape), logits
