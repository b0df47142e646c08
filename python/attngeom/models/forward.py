"""The result of a model's forward pass: :class:`Forward`.

Every per-layer quantity is stacked over layers on the first axis, so ``f.q[l]`` is layer l's
queries. Shapes are for one sequence of n tokens; a batch of sequences (2-D token ids) adds a
batch axis after the layer axis (``f.q[l]`` is then (batch, n_heads, n, d_head), ``f.logits``
(batch, n, vocab)).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np


@dataclass
class Forward:
    """Everything one forward pass computes, in the library's layout (tokens are rows).

    Attributes
    ----------
    logits : ndarray, shape ([batch,] n, vocab) or None
        The next-token logits (None for a checkpoint without an unembedding, e.g. BERT).
    hidden_states : ndarray, shape (n_layers + 1, [batch,] n, d_model)
        As transformers' ``output_hidden_states``: [0] the embeddings, [l] the residual
        stream after layer l; for pre-norm decoders [-1] has the final norm applied.
    attentions : ndarray, shape (n_layers, [batch,] n_heads, n, n)
        The routing matrices P of every head.
    attention_inputs : ndarray, shape (n_layers, [batch,] n, d_model)
        What each layer's attention reads: the normed residual stream of pre-norm models,
        the previous layer's output in post-norm BERT (the ``x`` of ModelHeads' diagnostics).
    q, k, v : ndarray, shape (n_layers, [batch,] n_heads, n, d_head)
        Queries, keys and values as the attention uses them: after q_norm / k_norm and the
        rotary embedding, biases included, keys and values repeated for every query head
        of a grouped-query model, so ``softmax_attention(q[l], k[l], v[l], causal=True,
        mask=...)`` reproduces layer l (with ``scale``). Under multi-head latent attention
        (DeepSeek-V2) q and k have width qk_nope_head_dim + qk_rope_head_dim, the rotary
        columns last, and v has width v_head_dim.
    q_prerotary, k_prerotary : ndarray, shape (n_layers, [batch,] n_heads, n, d_head)
        The same before the rotary embedding (equal to q, k for models without one).
    scale : ndarray, shape (n_layers,)
        The logit scale of every layer (1 / sqrt(d_head) except GPT-2 options).
    positions : ndarray of int, shape ([batch,] n)
        The position of every token (cumulative count of unpadded tokens minus one).
    attention_mask : ndarray of bool, shape ([batch,] n)
        True for real tokens, False for padding. Rows and columns of padded tokens are
        not meaningful (a padded query row of P may be all zeros).
    router_logits : ndarray, shape (n_moe_layers, [batch,] n, n_experts) or None
        The router (gate) logits of mixture-of-experts models (:mod:`.moe`), for the layers
        ``arch.moe_layers`` (all layers of Mixtral; DeepSeek-V2's first layers are dense);
        None otherwise.
    kv_latent : ndarray, shape (n_layers, [batch,] n, kv_lora_rank) or None
        Multi-head latent attention (:mod:`.mla`): the latent c_KV every layer caches, after
        its kv_a_layernorm; None for other models.
    rope_keys : ndarray, shape (n_layers, [batch,] n, qk_rope_head_dim) or None
        MLA's decoupled rotary key k_R (before the rotation), shared by every head.

    Examples
    --------
    >>> from attngeom.models import Forward
    >>> f = Forward(None, np.zeros((3, 4, 8)), np.zeros((2, 2, 4, 4)), np.zeros((2, 4, 8)),
    ...             *[np.zeros((2, 2, 4, 4))] * 5, np.ones(2) / 2, np.arange(4), np.ones(4, bool))
    >>> f.n_layers, f.n_tokens
    (2, 4)
    """

    logits: Optional[np.ndarray]
    hidden_states: np.ndarray
    attentions: np.ndarray
    attention_inputs: np.ndarray
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    q_prerotary: np.ndarray
    k_prerotary: np.ndarray
    scale: np.ndarray
    positions: np.ndarray
    attention_mask: np.ndarray
    router_logits: Optional[np.ndarray] = None
    kv_latent: Optional[np.ndarray] = None
    rope_keys: Optional[np.ndarray] = None

    @property
    def n_layers(self) -> int:
        """The number of layers."""
        return self.attentions.shape[0]

    @property
    def n_tokens(self) -> int:
        """n, the (padded) sequence length."""
        return self.positions.shape[-1]

    @property
    def last_hidden_state(self) -> np.ndarray:
        """([batch,] n, d_model) the model's output, ``hidden_states[-1]``."""
        return self.hidden_states[-1]
