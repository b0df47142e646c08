"""A GPT-2 checkpoint with a hand-built induction circuit: known answers for the research tools.

:func:`planted_induction_model` writes a two-layer GPT-2 (config.json and model.safetensors,
loadable by :func:`load_model` and by ``transformers``) whose weights implement the
induction mechanism of Olsson et al. (the notes' "induction circuits"):

* the residual stream is split into three orthogonal slots, each spanned by orthonormal
  vectors orthogonal to the all-ones vector (so LayerNorm only rescales): the current
  token ``t(v)``, the position ``p(i)`` (learned ``wpe``), and the previous token ``r(v)``;
  every embedding is ``t(v) + p(i)`` and the residual norm stays constant, so each
  LayerNorm is a fixed scalar;
* layer 0, head 0 is a previous-token head: W_Q maps p(i) to the head coordinate i,
  W_K maps p(j) to the coordinate j + 1, so the logit of key j is large only for
  j = i - 1; its OV circuit writes r(v) for the attended token v (W_OV maps t(v) to r(v));
* layer 1, head 0 is an induction head: W_Q reads t(v), W_K reads r(v) (K-composition
  with head 0.0), so a query attends to the token right after an earlier occurrence of its
  own token; its OV circuit copies that token (t(v) to 2.5 t(v)), and the tied unembedding
  then predicts it;
* every other head has random weights (small output weights, so they do not disturb the
  circuit) and the MLPs are zero.

On repeated random tokens head 1.0 has an induction score above 0.99 and head 0.0 a
previous-token score above 0.99, while the random heads stay near uniform.
"""
from __future__ import annotations

import json
import os

import numpy as np

from ..._operands import count, generator


def planted_induction_model(folder, *, vocab_size: int = 48, n_heads: int = 4, d_head: int = 64,
                            n_positions: int = 60, logit: float = 24.0, seed=0) -> str:
    """Write a two-layer GPT-2 checkpoint with a planted induction circuit (module docstring).

    Heads 0.0 (previous token) and 1.0 (induction) are planted; heads h >= 1 of both
    layers are random. d_model = n_heads * d_head must exceed 2 * vocab_size + n_positions
    (the three residual slots), and d_head must exceed vocab_size and n_positions.

    Parameters
    ----------
    folder : str or path-like
        Created if needed; config.json and model.safetensors are written into it.
    vocab_size : int, default 48
        Vocabulary size.
    n_heads : int, default 4
        Heads per layer (>= 1).
    d_head : int, default 64
        Head width.
    n_positions : int, default 60
        Length of the position table.
    logit : float, default 24.0
        The attention logit of the planted heads' matching key (the others get about 0).
    seed : int, default 0
        Seed of the slot bases and the random heads.

    Returns
    -------
    str
        The folder.

    Raises
    ------
    ValueError
        For dimensions too small to hold the three slots.

    Examples
    --------
    >>> from attngeom.models import planted_induction_model
    >>> model = ag.load_model(planted_induction_model("planted"))
    >>> model.arch.n_layers, model.arch.n_heads, model.arch.d_model
    (2, 4, 256)
    """
    V = count("vocab_size", vocab_size, 2)
    H = count("n_heads", n_heads, 1, 64)
    dh = count("d_head", d_head, 2, 4096)
    n_pos = count("n_positions", n_positions, 2)
    d = H * dh
    if 2 * V + n_pos >= d or dh <= max(V, n_pos):
        raise ValueError(f"vocab_size ({V}), n_positions ({n_pos}), n_heads ({H}) and d_head ({dh}) must satisfy "
                         f"2 vocab_size + n_positions < n_heads d_head and d_head > max(vocab_size, n_positions)")
    if not isinstance(logit, (int, float)) or isinstance(logit, bool) or not 0 < logit < 1e4:
        raise ValueError(f"logit must be a number in (0, 1e4), got {logit!r}")
    rng = generator(seed)
    # orthonormal vectors orthogonal to the all-ones vector: LayerNorm's centring leaves them alone
    centred = rng.standard_normal((d, 2 * V + n_pos))
    centred -= centred.mean(axis=0)
    basis = np.linalg.qr(centred)[0]
    tok, pos, prev = basis[:, :V], basis[:, V:V + n_pos], basis[:, V + n_pos:]

    def ln_scale(squared_norm):  # LayerNorm of a centred vector of that squared norm: x * sqrt(d / |x|^2)
        return np.sqrt(d / squared_norm)

    scale = 1.0 / np.sqrt(dh)
    layers = []
    for layer in range(2):
        gamma = ln_scale(2.0 if layer == 0 else 3.0)  # |t + p|^2 = 2, then + |r|^2 = 3
        c = np.sqrt(logit / scale) / gamma  # q.k scale = (c gamma)^2 scale = logit
        W_Q, W_K, W_V = (rng.standard_normal((H, d, dh)) * 0.06 for _ in range(3))
        W_O = rng.standard_normal((H, dh, d)) * 1e-3
        W_Q[0], W_K[0], W_V[0], W_O[0] = 0.0, 0.0, 0.0, 0.0
        if layer == 0:  # previous-token head: query of position i meets the key of position i - 1
            last = n_pos
            W_Q[0][:, :last] = c * pos[:, :last]
            W_K[0][:, 1:last + 1] = c * pos[:, :last]
            W_V[0][:, :V] = tok / np.sqrt(gamma)
            W_O[0][:V] = prev.T / np.sqrt(gamma)  # writes r(v) with unit norm
        else:  # induction head: current token against the previous-token slot, copies the token
            W_Q[0][:, :V] = c * tok
            W_K[0][:, :V] = c * prev
            W_V[0][:, :V] = tok / np.sqrt(gamma)
            W_O[0][:V] = 2.5 * tok.T / np.sqrt(gamma)
        qkv = np.concatenate([w.transpose(1, 0, 2).reshape(d, H * dh) for w in (W_Q, W_K, W_V)], axis=1)
        layers.append((qkv, W_O.reshape(H * dh, d)))
    tensors = {"transformer.wte.weight": tok.T.copy(), "transformer.wpe.weight": pos.T.copy(),
               "transformer.ln_f.weight": np.ones(d), "transformer.ln_f.bias": np.zeros(d)}
    for i, (qkv, o) in enumerate(layers):
        p = f"transformer.h.{i}."
        tensors.update({
            p + "ln_1.weight": np.ones(d), p + "ln_1.bias": np.zeros(d),
            p + "attn.c_attn.weight": qkv, p + "attn.c_attn.bias": np.zeros(3 * d),
            p + "attn.c_proj.weight": o, p + "attn.c_proj.bias": np.zeros(d),
            p + "ln_2.weight": np.ones(d), p + "ln_2.bias": np.zeros(d),
            p + "mlp.c_fc.weight": np.zeros((d, 4 * d)), p + "mlp.c_fc.bias": np.zeros(4 * d),
            p + "mlp.c_proj.weight": np.zeros((4 * d, d)), p + "mlp.c_proj.bias": np.zeros(d),
        })
    from ..io.safetensors import write_safetensors

    folder = os.fspath(folder)
    os.makedirs(folder, exist_ok=True)
    write_safetensors(os.path.join(folder, "model.safetensors"), tensors, dtype="F32",
                      metadata={"format": "pt"})
    config = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": V, "n_embd": d,
              "n_layer": 2, "n_head": H, "n_positions": n_pos, "n_inner": None, "activation_function": "gelu_new",
              "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True, "bos_token_id": 0, "eos_token_id": 0}
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    return folder
