"""BERT encoders through the one transformer (:class:`Decoder`), one sequence at a time.

Post-LN BERT (Devlin et al. 2019), as transformers' BertModel in eval mode, is the Decoder's
post-norm, bidirectional case:

    h_0     = LN(E_word[ids] + E_pos[0..n-1] + E_type[types])
    a_l     = sum_h softmax(q_h k_h^T / sqrt(d_head)) (h_l W_V[h] + b_V[h]) W_O[h] + b_O
    h'_l    = LN(h_l + a_l)
    h_{l+1} = LN(h'_l + GELU(h'_l W_1 + b_1) W_2 + b_2)          GELU with erf

:class:`BertEncoder` is a thin wrapper over it: it also reads checkpoints without
config.json (the dimensions from the tensors and ``n_heads``), takes token types, and returns
one sequence's :class:`BertOutput`. ``hidden_states[l]`` is the input of layer l's attention:
the ``x`` of :meth:`ModelHeads.diagnostics`. Sentence-transformers models (all-MiniLM-L6-v2)
add mean pooling and L2 normalisation: :meth:`BertEncoder.sentence_embedding`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..._deprecation import renamed_field
from ..._operands import check_token_ids
from ..io.architecture import architecture_from_config
from ..io.checkpoint import Checkpoint
from ..io.layouts import detect_layout
from .decoder import Decoder
from .forward import ForwardPlan
from .heads import ModelHeads, heads_from_checkpoint


@dataclass
class BertOutput:
    """Everything one forward pass computes for one sequence of n tokens.

    hidden_states : (n_layers + 1, n, d_model); [l] is layer l's input, [-1] the output
    routing : (n_layers, n_heads, n, n) the routing matrices P of every head
    """

    hidden_states: np.ndarray
    routing: np.ndarray
    attention = renamed_field("routing")

    @property
    def last_hidden_state(self) -> np.ndarray:
        """(n, d_model) the encoder's output."""
        return self.hidden_states[-1]


class BertEncoder:
    """A BERT checkpoint's encoder: the one transformer (:class:`Decoder`) on one sequence.

    Build with :meth:`from_checkpoint`. Attributes: ``heads`` (the :class:`ModelHeads`),
    ``eps`` (layer-norm epsilon, config.json's layer_norm_eps or 1e-12), ``decoder`` (the
    transformer that runs the pass) and ``dtype`` (its computation dtype).

    Example: ``enc = BertEncoder.from_checkpoint("all-MiniLM-L6-v2"); out = enc.forward(ids)``
    """

    def __init__(self, decoder: Decoder, heads: ModelHeads, dtype=np.float64):
        self.decoder = decoder
        self.heads = heads
        self.eps = decoder.arch.norm_eps
        self.dtype = np.dtype(dtype)

    @classmethod
    def from_checkpoint(cls, path, *, n_heads: Optional[int] = None, dtype=np.float64, backend: str = "auto"):
        """Read a BERT-layout checkpoint (file, folder, packaged-model name or an opened
        :class:`Checkpoint`) to run in ``dtype``.

        The forward pass is BERT's: absolute position embeddings and the exact GELU. A
        config.json that declares another model type (RoBERTa and XLM-R share BERT's tensor
        names but offset their positions), another activation or relative positions raises
        ValueError rather than giving a silently different network. Without config.json the
        dimensions come from the tensors and ``n_heads``.
        """
        ck = path if isinstance(path, Checkpoint) else Checkpoint(path, backend=backend)
        cfg = ck.config
        problems = []
        if cfg.get("model_type", "bert") != "bert":
            problems.append(f"model_type {cfg['model_type']!r}")
        if cfg.get("hidden_act", "gelu") != "gelu":
            problems.append(f"hidden_act {cfg['hidden_act']!r}")
        if cfg.get("position_embedding_type", "absolute") != "absolute":
            problems.append(f"position_embedding_type {cfg['position_embedding_type']!r}")
        if problems:
            raise ValueError(f"the NumPy forward pass implements BERT (model_type 'bert', hidden_act 'gelu', absolute "
                             f"positions); config.json declares {', '.join(problems)}: save activations as .npy instead")
        heads = heads_from_checkpoint(ck, n_heads=n_heads, layout="bert", dtype=dtype)
        eps = cfg.get("layer_norm_eps", 1e-12)
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < float("inf"):
            raise ValueError(f"{ck.config_path!r}: field 'layer_norm_eps' must be a positive finite number, "
                             f"got {eps!r}")
        _, prefix, _ = detect_layout(ck.names, "bert")

        def rows(name):  # an embedding table's rows (1 where it is missing: the Decoder names it)
            t = ck.mapped(prefix + f"embeddings.{name}_embeddings.weight")
            return t.shape[0] if t is not None and t.ndim == 2 and t.shape[0] else 1

        arch = architecture_from_config({
            **cfg, "model_type": "bert", "num_hidden_layers": heads.n_layers, "num_attention_heads": heads.n_heads,
            "hidden_size": heads.d_model, "head_dim": heads.d_head, "vocab_size": rows("word"),
            "max_position_embeddings": rows("position"), "layer_norm_eps": float(eps)}, where=ck.config_path)
        return cls(Decoder.from_checkpoint(ck, arch, prefix), heads, dtype)

    @property
    def max_length(self) -> int:
        """The number of position embeddings (longest sequence the model reads)."""
        return self.decoder.arch.max_positions

    def forward(self, input_ids, token_type_ids=None) -> BertOutput:
        """The encoder on one sequence: input_ids (n,) integers -> :class:`BertOutput`.

        token_type_ids : (n,) segment ids, default zeros. Raises ValueError for ids outside
        the vocabulary or n above :attr:`max_length`.
        """
        ids = np.asarray(input_ids)
        if ids.ndim != 1 or ids.size == 0 or ids.dtype.kind not in "iu":
            raise ValueError(f"input_ids must be a non-empty 1-D integer array, got shape {ids.shape}, dtype {ids.dtype}")
        n = ids.size
        check_token_ids("input_ids", ids, self.decoder.arch.vocab_size)
        if n > self.max_length:
            raise ValueError(f"input_ids has {n} tokens, more than the model's {self.max_length} positions")
        types = None if token_type_ids is None else np.asarray(token_type_ids)
        if types is not None and types.shape != (n,):
            raise ValueError(f"token_type_ids must have shape ({n},), got {types.shape}")
        plan = ForwardPlan(frozenset({"resid_pre", "ln_final", "pattern"}), tuple(range(self.decoder.arch.n_layers)))
        f = self.decoder.forward(ids[None].astype(np.int64), np.ones((1, n), bool), np.arange(n)[None], self.dtype,
                                 plan, types=None if types is None else types[None])
        return BertOutput(np.concatenate([f.resid_pre, f.ln_final[None]])[:, 0], f.pattern[:, 0])

    def sentence_embedding(self, input_ids, *, normalize: bool = True) -> np.ndarray:
        """Mean of the output token vectors (sentence-transformers' mean pooling), L2-normalised
        when ``normalize``: input_ids (n,) -> (d_model,)."""
        e = self.forward(input_ids).last_hidden_state.mean(0)
        return e / np.linalg.norm(e) if normalize else e
