"""A NumPy forward pass of a Hugging Face BERT encoder, for the activations of its heads.

Post-LN BERT (Devlin et al. 2019), as transformers' BertModel in eval mode:

    h_0     = LN(E_word[ids] + E_pos[0..n-1] + E_type[types])
    a_l     = sum_h softmax(q_h k_h^T / sqrt(d_head)) (h_l W_V[h] + b_V[h]) W_O[h] + b_O
    h'_l    = LN(h_l + a_l)
    h_{l+1} = LN(h'_l + GELU(h'_l W_1 + b_1) W_2 + b_2)          GELU with erf

with every attention computed by :func:`attngeom.softmax_attention`. ``hidden_states[l]``
is the input of layer l's attention: the ``x`` of :meth:`ModelHeads.diagnostics`.
Sentence-transformers models (all-MiniLM-L6-v2) add mean pooling and L2 normalisation:
:meth:`BertEncoder.sentence_embedding`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..attention import softmax_attention
from ..circuits import layernorm
from .heads import Checkpoint, ModelHeads, heads_from_checkpoint
from .layouts import detect_layout


def _erf(x: np.ndarray) -> np.ndarray:
    try:
        from scipy.special import erf
    except ImportError:  # exact but slower
        return np.vectorize(math.erf, otypes=[x.dtype])(x)
    return erf(x)


def gelu(x) -> np.ndarray:
    """GELU(x) = x Phi(x) = x (1 + erf(x / sqrt 2)) / 2 (BERT's "gelu"), elementwise.

    Parameters
    ----------
    x : ndarray
        Any shape; the dtype is kept.

    Returns
    -------
    ndarray
        GELU(x), same shape and dtype.

    Examples
    --------
    >>> from attngeom.models import gelu
    >>> gelu(np.array([0.0, 1.0]))
    array([0.    , 0.8413])
    """
    x = np.asarray(x, dtype=np.result_type(x, np.float32))
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


@dataclass
class BertOutput:
    """Everything one forward pass computes for one sequence of n tokens.

    hidden_states : (n_layers + 1, n, d_model); [l] is layer l's input, [-1] the output
    attention : (n_layers, n_heads, n, n) the routing matrices P of every head
    """

    hidden_states: np.ndarray
    attention: np.ndarray

    @property
    def last_hidden_state(self) -> np.ndarray:
        """(n, d_model) the encoder's output."""
        return self.hidden_states[-1]


class BertEncoder:
    """A BERT checkpoint's weights and its forward pass in NumPy (module docstring).

    Build with :meth:`from_checkpoint`. Attributes: ``heads`` (the :class:`ModelHeads`),
    ``eps`` (layer-norm epsilon, config.json's layer_norm_eps or 1e-12).

    Example: ``enc = BertEncoder.from_checkpoint("all-MiniLM-L6-v2"); out = enc.forward(ids)``
    """

    def __init__(self, tensors: dict, heads: ModelHeads, eps: float = 1e-12):
        self.t = tensors
        self.heads = heads
        self.eps = eps

    @classmethod
    def from_checkpoint(cls, path, *, n_heads: Optional[int] = None, dtype=np.float64, backend: str = "auto"):
        """Read a BERT-layout checkpoint (file, folder, packaged-model name or an opened
        :class:`Checkpoint`) in ``dtype``.

        The forward pass is BERT's: absolute position embeddings and the exact GELU. A
        config.json that declares another model type (RoBERTa and XLM-R share BERT's tensor
        names but offset their positions), another activation or relative positions raises
        ValueError rather than giving a silently different network.
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
        _, prefix, layers = detect_layout(ck.names, "bert")
        names = {
            "word": "embeddings.word_embeddings.weight", "pos": "embeddings.position_embeddings.weight",
            "type": "embeddings.token_type_embeddings.weight",
            "ln_g": ("embeddings.LayerNorm.weight", "embeddings.LayerNorm.gamma"),
            "ln_b": ("embeddings.LayerNorm.bias", "embeddings.LayerNorm.beta"),
        }
        for i in layers:
            a = f"encoder.layer.{i}."
            names.update({
                f"{i}.ln1_g": (a + "attention.output.LayerNorm.weight", a + "attention.output.LayerNorm.gamma"),
                f"{i}.ln1_b": (a + "attention.output.LayerNorm.bias", a + "attention.output.LayerNorm.beta"),
                f"{i}.w1": a + "intermediate.dense.weight", f"{i}.b1": a + "intermediate.dense.bias",
                f"{i}.w2": a + "output.dense.weight", f"{i}.b2": a + "output.dense.bias",
                f"{i}.ln2_g": (a + "output.LayerNorm.weight", a + "output.LayerNorm.gamma"),
                f"{i}.ln2_b": (a + "output.LayerNorm.bias", a + "output.LayerNorm.beta"),
            })
        tensors = {}
        for key, options in names.items():
            options = (options,) if isinstance(options, str) else options
            for name in options:
                value = ck.get(prefix + name)
                if value is not None:
                    tensors[key] = value.astype(dtype, copy=False)
                    break
            else:
                raise ValueError(f"bert layout: the forward pass needs tensor {prefix + options[0]!r}, "
                                 f"which the checkpoint lacks")
        d = heads.d_model
        for key in ("word", "pos", "type"):
            if tensors[key].ndim != 2 or tensors[key].shape[1] != d:
                raise ValueError(f"inconsistent shapes: embedding {key!r} should be (rows, {d}), "
                                 f"got {tensors[key].shape}")
        eps = ck.config.get("layer_norm_eps", 1e-12)
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < float("inf"):
            raise ValueError(f"{ck.config_path!r}: field 'layer_norm_eps' must be a positive finite number, "
                             f"got {eps!r}")
        eps = float(eps)
        return cls(tensors, heads, eps)

    @property
    def max_length(self) -> int:
        """The number of position embeddings (longest sequence the model reads)."""
        return self.t["pos"].shape[0]

    def forward(self, input_ids, token_type_ids=None) -> BertOutput:
        """The encoder on one sequence: input_ids (n,) integers -> :class:`BertOutput`.

        token_type_ids : (n,) segment ids, default zeros. Raises ValueError for ids outside
        the vocabulary or n above :attr:`max_length`.
        """
        ids = np.asarray(input_ids)
        if ids.ndim != 1 or ids.size == 0 or ids.dtype.kind not in "iu":
            raise ValueError(f"input_ids must be a non-empty 1-D integer array, got shape {ids.shape}, dtype {ids.dtype}")
        n = ids.size
        vocab = self.t["word"].shape[0]
        if ids.min() < 0 or ids.max() >= vocab:
            raise ValueError(f"input_ids must lie in 0..{vocab - 1}, got {ids.min()}..{ids.max()}")
        if n > self.max_length:
            raise ValueError(f"input_ids has {n} tokens, more than the model's {self.max_length} positions")
        types = np.zeros(n, dtype=np.int64) if token_type_ids is None else np.asarray(token_type_ids)
        if types.shape != (n,):
            raise ValueError(f"token_type_ids must have shape ({n},), got {types.shape}")
        t, H, eps = self.t, self.heads, self.eps
        h = layernorm(t["word"][ids] + t["pos"][:n] + t["type"][types], t["ln_g"], t["ln_b"], eps=eps)
        hidden, attn = [h], []
        for i in range(H.n_layers):
            q, k = H.queries_keys(h, i)
            v = h[None] @ H.W_V[i] + (H.b_V[i][:, None, :] if H.b_V is not None else 0.0)
            z, P = softmax_attention(q, k, v, return_weights=True)  # (n_heads, n, d_head), (n_heads, n, n)
            a = np.einsum("hnd,hdm->nm", z, H.W_O[i]) + (H.b_O[i] if H.b_O is not None else 0.0)
            h1 = layernorm(h + a, t[f"{i}.ln1_g"], t[f"{i}.ln1_b"], eps=eps)
            m = gelu(h1 @ t[f"{i}.w1"].T + t[f"{i}.b1"]) @ t[f"{i}.w2"].T + t[f"{i}.b2"]
            h = layernorm(h1 + m, t[f"{i}.ln2_g"], t[f"{i}.ln2_b"], eps=eps)
            hidden.append(h)
            attn.append(P)
        return BertOutput(np.stack(hidden), np.stack(attn))

    def sentence_embedding(self, input_ids, *, normalize: bool = True) -> np.ndarray:
        """Mean of the output token vectors (sentence-transformers' mean pooling), L2-normalised
        when ``normalize``: input_ids (n,) -> (d_model,)."""
        e = self.forward(input_ids).last_hidden_state.mean(0)
        return e / np.linalg.norm(e) if normalize else e
