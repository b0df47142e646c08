"""The weights of the forward pass, read from a checkpoint by each family's tensor names.

:func:`read_weights` gives what :class:`attngeom.models.Decoder` runs: global tensors
("embed", "pos", "norm_w", "norm_b", "unembed"; BERT's "type", "embed_norm_w",
"embed_norm_b") and "layers", a list of per-layer dicts, every matrix in (in, out)
orientation (y = x W). Tensors stay as stored, memory-mapped (:meth:`Checkpoint.mapped`), and
each is checked against config.json. This is the one place that spells a family's tensor
names for the forward pass; the attention's come from :data:`LAYOUTS`, which
:func:`attngeom.models.load_heads` reads too. Multi-head latent attention and
mixture-of-experts layers are read by :func:`mla_weights` and :func:`moe_weights` (their
checkpoint names in :mod:`attngeom.models.nn.mla` and :mod:`attngeom.models.nn.moe`).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from .architecture import Architecture
from .checkpoint import Checkpoint
from .layouts import LAYOUTS


def read_weights(ck: Checkpoint, arch: Architecture, prefix: str) -> dict:
    """Read and check every tensor the forward pass needs (module docstring).

    Parameters
    ----------
    ck : Checkpoint
        The opened checkpoint.
    arch : Architecture
        From its config.json.
    prefix : str
        The layout prefix of the layer names ("model.", "transformer.", "").

    Returns
    -------
    dict
        The weights, as the module docstring lists them.

    Raises
    ------
    ValueError
        For a missing tensor, and a tensor whose shape disagrees with config.json (the
        message names the tensor, its file and the config fields).

    Examples
    --------
    >>> w = read_weights(ck, arch, "model.")  # doctest: +SKIP
    """
    a = arch
    root = prefix[: prefix.rstrip(".").rfind(".") + 1] if prefix.rstrip(".").count(".") else ""
    dims = (f"hidden_size={a.d_model}, num_attention_heads={a.n_heads}, num_key_value_heads={a.n_kv_heads}, "
            f"head_dim={a.d_head}, vocab_size={a.vocab_size}")

    def take(name, shape=None, required=True):
        t = ck.mapped(name)
        if t is None:
            if required:
                raise ValueError(f"{a.model_type} checkpoint {ck.path!r} lacks tensor {name!r} (the forward pass "
                                 f"needs tensor {name!r})")
            return None
        if shape is not None and tuple(t.shape) != tuple(shape):
            raise ValueError(f"tensor {name!r} in {ck.file_of(name)!r} has shape {tuple(t.shape)}, but "
                             f"config.json ({dims}) implies {tuple(shape)}")
        return t

    d, H, K, dh, V = a.d_model, a.n_heads, a.n_kv_heads, a.d_head, a.vocab_size
    w = {}
    layers = []
    if a.family == "gpt2":
        p = prefix
        w["embed"] = take(p + "wte.weight", (V, d))
        w["pos"] = take(p + "wpe.weight", (a.max_positions, d))
        w["norm_w"], w["norm_b"] = take(p + "ln_f.weight", (d,)), take(p + "ln_f.bias", (d,))
        for i in range(a.n_layers):
            s = f"{p}h.{i}."
            fc = take(s + "mlp.c_fc.weight")
            ff = fc.shape[1] if fc.ndim == 2 else -1
            want = a.config.get("n_inner") or 4 * d
            if fc.shape != (d, want):
                raise ValueError(f"tensor {s + 'mlp.c_fc.weight'!r} in {ck.file_of(s + 'mlp.c_fc.weight')!r} has "
                                 f"shape {tuple(fc.shape)}, but config.json (n_embd={d}, n_inner="
                                 f"{a.config.get('n_inner')}) implies {(d, want)}")
            t = LAYOUTS["gpt2"].names(p, i)  # the attention's tensor names, from the layout's map
            layers.append({
                "ln1_w": take(s + "ln_1.weight", (d,)), "ln1_b": take(s + "ln_1.bias", (d,)),
                "qkv": take(t["qkv"], (d, 3 * H * dh)), "b_qkv": take(t["bqkv"], (3 * H * dh,), required=False),
                "o": take(t["o"], (H * dh, d)), "b_o": take(t["bo"], (d,), required=False),
                "ln2_w": take(s + "ln_2.weight", (d,)), "ln2_b": take(s + "ln_2.bias", (d,)),
                "up": fc, "b_up": take(s + "mlp.c_fc.bias", (ff,), required=False),
                "down": take(s + "mlp.c_proj.weight", (ff, d)),
                "b_down": take(s + "mlp.c_proj.bias", (d,), required=False),
            })
    elif a.family == "bert":
        p = prefix

        def either(name, shape):  # LayerNorm weight / bias, or the older gamma / beta
            old = name.replace(".weight", ".gamma").replace(".bias", ".beta")
            return take(name, shape) if ck.mapped(old) is None else take(old, shape)

        w["embed"] = take(p + "embeddings.word_embeddings.weight", (V, d))
        w["pos"] = take(p + "embeddings.position_embeddings.weight", (a.max_positions, d))
        w["type"] = take(p + "embeddings.token_type_embeddings.weight")
        if w["type"].ndim != 2 or w["type"].shape[1] != d:
            raise ValueError(f"tensor {p + 'embeddings.token_type_embeddings.weight'!r} has shape "
                             f"{tuple(w['type'].shape)}, but config.json (hidden_size={d}) implies (types, {d})")
        w["embed_norm_w"] = either(p + "embeddings.LayerNorm.weight", (d,))
        w["embed_norm_b"] = either(p + "embeddings.LayerNorm.bias", (d,))
        w["norm_w"] = w["norm_b"] = None  # post-norm: the last layer's norm is the output's
        for i in range(a.n_layers):
            s = f"{p}encoder.layer.{i}."
            t = s + "attention."
            up = take(s + "intermediate.dense.weight")
            ff = up.shape[0] if up.ndim == 2 else -1  # its shape is checked below against d_model
            layers.append({
                **_projections(take, LAYOUTS["bert"].names(p, i), a),
                # post-norm: ln1 normalises h + attention, ln2 h' + MLP
                "ln1_w": either(t + "output.LayerNorm.weight", (d,)), "ln1_b": either(t + "output.LayerNorm.bias", (d,)),
                "up": take(s + "intermediate.dense.weight", (ff, d)).T, "b_up": take(s + "intermediate.dense.bias", (ff,)),
                "down": take(s + "output.dense.weight", (d, ff)).T, "b_down": take(s + "output.dense.bias", (d,)),
                "ln2_w": either(s + "output.LayerNorm.weight", (d,)), "ln2_b": either(s + "output.LayerNorm.bias", (d,)),
            })
    else:
        p = prefix
        ours = a.model_type == "attngeom-gpt"  # LayerNorm biases, a 4x GELU MLP (fc_in, fc_out)
        if ours and a.config.get("variant", "standard") != "standard":
            raise ValueError(f"{ck.path!r}: an attngeom-gpt checkpoint of the {a.config['variant']!r} arm: the "
                             f"NumPy forward pass runs softmax attention (the 'standard' arm); rebuild this one "
                             f"with attngeom.torch.gpt.load_checkpoint")
        w["embed"] = take(p + "embed_tokens.weight", (V, d))
        if ours and a.max_positions is not None:  # learned positions
            w["pos"] = take(p + "embed_positions.weight", (a.max_positions, d))
        w["norm_w"] = take(p + "norm.weight", (d,))
        w["norm_b"] = take(p + "norm.bias", (d,)) if ours else None
        want_ff = a.config.get("intermediate_size")
        for i in range(a.n_layers):
            s = f"{p}layers.{i}."
            if i in a.moe_layers:
                mlp = moe_weights(take, s, a)
            elif ours and not a.config.get("mlp", True):  # attention-only
                mlp = {}
            elif ours:
                up = take(s + "mlp.fc_in.weight", (4 * d, d))
                mlp = {"up": up.T, "b_up": take(s + "mlp.fc_in.bias", (4 * d,)),
                       "down": take(s + "mlp.fc_out.weight", (d, 4 * d)).T, "b_down": take(s + "mlp.fc_out.bias", (d,))}
            else:
                gate = take(s + "mlp.gate_proj.weight")
                ff = gate.shape[0]
                if gate.shape != ((want_ff or ff), d):
                    raise ValueError(f"tensor {s + 'mlp.gate_proj.weight'!r} in "
                                     f"{ck.file_of(s + 'mlp.gate_proj.weight')!r} has shape {tuple(gate.shape)}, but "
                                     f"config.json (intermediate_size={want_ff}, hidden_size={d}) implies "
                                     f"{(want_ff or ff, d)}")
                mlp = {
                    "gate": gate.T, "up": take(s + "mlp.up_proj.weight", (ff, d)).T,
                    "down": take(s + "mlp.down_proj.weight", (d, ff)).T,
                    "b_gate": take(s + "mlp.gate_proj.bias", (ff,), required=False),
                    "b_up": take(s + "mlp.up_proj.bias", (ff,), required=False),
                    "b_down": take(s + "mlp.down_proj.bias", (d,), required=False),
                }
            t = s + "self_attn."
            if a.mla:  # multi-head latent attention (:mod:`.mla`)
                attn = mla_weights(take, s, a)
            else:
                attn = _projections(take, LAYOUTS["llama"].names(p, i), a)
            layer = {
                "ln1_w": take(s + "input_layernorm.weight", (d,)),
                "ln1_b": take(s + "input_layernorm.bias", (d,)) if ours else None, **attn,
                "ln2_w": take(s + "post_attention_layernorm.weight", (d,)) if mlp else None,
                "ln2_b": take(s + "post_attention_layernorm.bias", (d,)) if ours and mlp else None, **mlp,
            }
            if a.qk_norm:
                layer["q_norm"] = take(t + "q_norm.weight", (dh,))
                layer["k_norm"] = take(t + "k_norm.weight", (dh,))
            layers.append(layer)
    head = None if a.family == "bert" else take(root + "lm_head.weight", (V, d), required=False)
    w["unembed"] = (None if a.family == "bert" else  # an encoder: no language-model head
                    w["embed"] if a.tie_word_embeddings or head is None and a.family == "gpt2" else head)
    w["layers"] = layers
    return w


def _projections(take, names, a: Architecture) -> dict:
    """The attention's q, k, v, o weights in (in, out) orientation and their biases (None where
    not stored), from torch Linear weights (out, in) and biases named by a layout's map
    (roles q, k, v, o and bq, bk, bv, bo)."""
    d, H, K, dh = a.d_model, a.n_heads, a.n_kv_heads, a.d_head
    rows = {"q": H * dh, "k": K * dh, "v": K * dh, "o": d}
    cols = {"q": d, "k": d, "v": d, "o": H * dh}
    out = {}
    for role in "qkvo":
        out[role] = take(names[role], (rows[role], cols[role])).T
        out["b_" + role] = take(names["b" + role], (rows[role],), required=False)
    return out


def mla_weights(take: Callable, prefix: str, arch) -> dict:
    """One layer's MLA weights in (in, out) orientation (y = x W).

    Parameters
    ----------
    take : callable
        ``take(name, shape=None, required=True)`` -> tensor or None (the decoder's reader,
        which checks shapes against config.json).
    prefix : str
        The layer's name prefix ("model.layers.3.").
    arch : Architecture
        With ``arch.mla`` set.

    Returns
    -------
    dict
        "q" (d_model, H * d_qk) without q LoRA, else "q_a" (d_model, q_lora_rank), "q_a_norm"
        (q_lora_rank,), "q_b" (q_lora_rank, H * d_qk); "kv_a" (d_model, d_c + d_rope),
        "kv_a_norm" (d_c,), "kv_b" (d_c, H * (d_nope + d_v)), "o" (H * d_v, d_model); biases
        "b_q_a", "b_kv_a", "b_o" or None (attention_bias).

    Examples
    --------
    >>> w = mla_weights(take, "model.layers.0.", arch)  # doctest: +SKIP
    """
    m, d, H = arch.mla, arch.d_model, arch.n_heads
    nope, rope, dv, rc, rq = (m["qk_nope_head_dim"], m["qk_rope_head_dim"], m["v_head_dim"], m["kv_lora_rank"],
                              m["q_lora_rank"])
    qk = nope + rope
    t = prefix + "self_attn."
    w = {}
    if rq is None:
        w["q"] = take(t + "q_proj.weight", (H * qk, d)).T
    else:
        w["q_a"] = take(t + "q_a_proj.weight", (rq, d)).T
        w["b_q_a"] = take(t + "q_a_proj.bias", (rq,), required=False)
        w["q_a_norm"] = take(t + "q_a_layernorm.weight", (rq,))
        w["q_b"] = take(t + "q_b_proj.weight", (H * qk, rq)).T
    w["kv_a"] = take(t + "kv_a_proj_with_mqa.weight", (rc + rope, d)).T
    w["b_kv_a"] = take(t + "kv_a_proj_with_mqa.bias", (rc + rope,), required=False)
    w["kv_a_norm"] = take(t + "kv_a_layernorm.weight", (rc,))
    w["kv_b"] = take(t + "kv_b_proj.weight", (H * (nope + dv), rc)).T
    w["o"] = take(t + "o_proj.weight", (d, H * dv)).T
    w["b_o"] = take(t + "o_proj.bias", (d,), required=False)
    return w


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
        d_ff), "experts_down" (n_experts, d_ff, d_model); with shared experts also
        "shared_gate", "shared_up" (d_model, d_shared) and "shared_down" (d_shared, d_model).

    Examples
    --------
    >>> w = moe_weights(take, "model.layers.0.", arch)  # doctest: +SKIP
    """
    d, E = arch.d_model, arch.n_experts
    ff = arch.config.get("moe_intermediate_size", arch.config.get("intermediate_size"))
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
        if take(prefix + "mlp.gate.weight", required=False) is not None:  # DeepSeek: one tensor per expert
            s, names = prefix + "mlp.", ("gate_proj", "up_proj", "down_proj")
        else:  # Mixtral
            s, names = prefix + "block_sparse_moe.", ("w1", "w3", "w2")
        router = take(s + "gate.weight", (E, d))
        w1 = [np.asarray(take(f"{s}experts.{e}.{names[0]}.weight", (ff, d) if ff else None)) for e in range(E)]
        f = w1[0].shape[0]
        gate = np.stack([w.T for w in w1])
        up = np.stack([np.asarray(take(f"{s}experts.{e}.{names[1]}.weight", (f, d))).T for e in range(E)])
        down = np.stack([np.asarray(take(f"{s}experts.{e}.{names[2]}.weight", (d, f))).T for e in range(E)])
    out = {"router": np.asarray(router).T, "experts_gate": gate, "experts_up": up, "experts_down": down}
    if arch.shared_experts:
        s, fs = prefix + "mlp.shared_experts.", arch.shared_experts * gate.shape[2]
        out["shared_gate"] = take(s + "gate_proj.weight", (fs, d)).T
        out["shared_up"] = take(s + "up_proj.weight", (fs, d)).T
        out["shared_down"] = take(s + "down_proj.weight", (d, fs)).T
    return out
