"""Multi-head latent attention (MLA, DeepSeek-V2): the queries, keys and values.

The notes' "multi-head latent attention" section: keys and values are expanded from a
compressed per-token latent c_KV of width d_c = kv_lora_rank, which is what the cache
stores, together with one rotary key k_R shared by every head (DeepSeek-V2, eqs. 9-19 of
its paper, as transformers computes them). For the normed residual x of one token::

    c_Q        = RMSNorm(x W_DQ)                  q LoRA (q_lora_rank); without it q = x W_Q
    [q_C, q_R] = c_Q W_UQ                         per head: qk_nope_head_dim + qk_rope_head_dim
    [c, k_R]   = x W_DKV                          kv_a_proj_with_mqa: d_c + qk_rope_head_dim
    c_KV       = RMSNorm(c)                       kv_a_layernorm: the latent cache
    [k_C, v]   = c_KV W_UKV                       kv_b_proj, per head: qk_nope_head_dim + v_head_dim
    q_h        = [q_C,h, RoPE(q_R,h)]             queries of head h
    k_h        = [k_C,h, RoPE(k_R)]               the same rotary key for every head
    a          = sum_h softmax(scale q_h k_h^T + mask) v_h W_O[h]

with scale = 1 / sqrt(qk_nope_head_dim + qk_rope_head_dim) and the rotation in the
interleaved (complex-pair) convention on the qk_rope_head_dim rotary columns only
(:class:`Rotary` with ``interleaved=True``). The two latent norms use eps = 1e-6 (the
modules' default in DeepSeek-V2's code and in transformers), not rms_norm_eps.

Because k_C = c_KV W_UK, the content part of the key cache of all heads (n, n_heads *
qk_nope_head_dim) has rank <= d_c, and the whole expanded key cache rank <= d_c +
qk_rope_head_dim, with or without the rotation (the rotary key is one shared
(n, qk_rope_head_dim) block): the decoupled RoPE keeps the cache low-rank, where rotating
the keys of a rank-r W_K raises their rank (:func:`attngeom.latent_key_cache`).
"""
from __future__ import annotations

import numpy as np

from .norm import normalize
from .products import product

LATENT_NORM_EPS = 1e-6  # q_a_layernorm and kv_a_layernorm


def mla_attention_inputs(x: np.ndarray, layer: dict, arch, rotary, positions: np.ndarray, gate=None) -> dict:
    """Queries, keys, values and the latent cache of one MLA layer (module docstring).

    Parameters
    ----------
    x : ndarray, shape (batch, n, d_model)
        The normed residual stream.
    layer : dict
        The weights of :func:`attngeom.models.io.weights.mla_weights`, cast to x's dtype.
    arch : Architecture
        With ``arch.mla`` set.
    rotary : Rotary
        The interleaved rotary embedding of width qk_rope_head_dim.
    positions : ndarray of int, shape (batch, n)
        Token positions.
    gate : callable, optional
        The pass's site gate (:class:`attngeom.models.nn.interventions.Gate`): the latent,
        the rotary key and the unrotated queries and keys pass through it (interventions
        there change what follows).

    Returns
    -------
    dict
        "q", "k" (batch, H, n, d_qk) as the attention reads them (rotary columns last,
        rotated), "v" (batch, H, n, d_v), "q_prerotary", "k_prerotary" (the same before
        the rotation), "latent" c_KV (batch, n, d_c) and "rope_keys" k_R (batch, n, d_rope)
        before the rotation.

    Examples
    --------
    >>> parts = mla_attention_inputs(x, weights, arch, rotary, positions)  # doctest: +SKIP
    >>> parts["latent"].shape  # doctest: +SKIP
    (1, 7, 16)
    """
    m, H = arch.mla, arch.n_heads
    nope, rope, dv, rc = m["qk_nope_head_dim"], m["qk_rope_head_dim"], m["v_head_dim"], m["kv_lora_rank"]
    b, n, _ = x.shape
    if "q" in layer:
        q = product(x, layer["q"])
    else:
        c_q = product(x, layer["q_a"]) if layer["b_q_a"] is None else product(x, layer["q_a"]) + layer["b_q_a"]
        q = product(normalize(c_q, layer["q_a_norm"], None, LATENT_NORM_EPS, "rmsnorm"), layer["q_b"])
    q = q.reshape(b, n, H, nope + rope).transpose(0, 2, 1, 3)
    ckv = product(x, layer["kv_a"]) if layer["b_kv_a"] is None else product(x, layer["kv_a"]) + layer["b_kv_a"]
    latent = normalize(ckv[..., :rc], layer["kv_a_norm"], None, LATENT_NORM_EPS, "rmsnorm")
    k_rope = ckv[..., rc:]
    if gate is not None:
        latent, k_rope = gate("kv_latent", latent), gate("rope_keys", k_rope)
    kv = product(latent, layer["kv_b"]).reshape(b, n, H, nope + dv).transpose(0, 2, 1, 3)
    k_nope, v = kv[..., :nope], kv[..., nope:]
    shared = np.broadcast_to(k_rope[:, None], (b, H, n, rope))
    k_pre = np.concatenate([k_nope, shared], axis=-1)
    pos = positions[:, None]
    if gate is not None:
        q = gate("q_prerotary", q)
        given, k_pre = k_pre, gate("k_prerotary", k_pre)
    q_rot = np.concatenate([q[..., :nope], rotary.rotate(q[..., nope:], pos)], axis=-1)
    if gate is not None and k_pre is not given:  # changed per head: rotate each head's rotary columns
        k_rot = np.concatenate([k_pre[..., :nope], rotary.rotate(k_pre[..., nope:], pos)], axis=-1)
    else:
        k_rot = np.concatenate([k_nope, np.broadcast_to(rotary.rotate(k_rope[:, None], pos), (b, H, n, rope))],
                               axis=-1)
    return {"q": q_rot, "k": k_rot, "v": np.ascontiguousarray(v), "q_prerotary": q, "k_prerotary": k_pre,
            "latent": latent, "rope_keys": k_rope}
