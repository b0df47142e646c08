"""Stacked per-head attention weights of a checkpoint, in the TransformerLens layout.

``load_heads(path)`` reads a safetensors checkpoint (a file, or a folder with one or more
``*.safetensors`` shards and usually ``config.json``), recognises its layout (BERT, GPT-2,
Llama/Qwen with grouped-query attention; see :mod:`attngeom.models.io.layouts`) and returns a
:class:`ModelHeads` with

    W_Q, W_K, W_V : (n_layers, n_heads, d_model, d_head)   q = x W_Q[l, h] + b_Q[l, h]
    W_O           : (n_layers, n_heads, d_head, d_model)
    b_Q, b_K, b_V : (n_layers, n_heads, d_head) or None     b_O : (n_layers, d_model) or None

raw: no layer norm is folded in, nothing is centred, so ``x`` must be what the model feeds
its attention (the layer-norm output in pre-LN models such as GPT-2 and Llama, the previous
layer's output in post-LN BERT).

Rotary models (Llama, Mistral, Qwen2, Qwen3 with config.json) also carry their
:class:`Rotary` embedding and Qwen3's q_norm / k_norm gains, so that
:meth:`ModelHeads.queries_keys` and the data part of :meth:`ModelHeads.diagnostics` (radii,
tilts, routing matrices) use the queries and keys the model itself uses. Which quantities
depend on the relative offset i - j of query and key:

* offset-free: the parameter nulls of W_Q and W_K (ker W_Q^T, ker W_K^T: the rotation acts
  inside the head space), the W_OV spectrum, the radii (norms of q: the rotation is orthogonal);
* offset-dependent: the bilinear form, B(delta) = W_Q R(delta) W_K^T
  (:meth:`ModelHeads.bilinear`), its spectrum and effective rank (the reported "bilinear"
  columns are B(0) = W_Q W_K^T), and the token-space tilt normals.

With Qwen3's q_norm / k_norm the logits are not bilinear in x: q = g_q * RMS(x W_Q) and
k = g_k * RMS(x W_K) are normalised per token, so x_i B(delta) x_j^T with B(delta) =
W_Q diag(g_q) R(delta) diag(g_k) W_K^T is the logit times rms(x_i W_Q) rms(x_j W_K): B gives
the directions, not the magnitudes; summaries flag it (``qk_norm``).
"""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ...head_diagnostics import HeadDiagnostics, head_diagnostics
from ..io.architecture import SUPPORTED_ARCHITECTURES, architecture_from_config
from ..io.checkpoint import Checkpoint
from ..io.layouts import LAYOUTS, detect_layout, split_layer
from ..io.packaged import model_name
from .rotary import Rotary, rope_frequencies, rotary_pairs, yarn_factors


@dataclass
class ModelHeads:
    """All attention heads of a model, stacked in the TransformerLens layout (module docstring).

    Attributes
    ----------
    W_Q, W_K, W_V : (n_layers, n_heads, d_model, d_head); W_O : (n_layers, n_heads, d_head, d_model)
    b_Q, b_K, b_V : (n_layers, n_heads, d_head) or None; b_O : (n_layers, d_model) or None
    layout : "bert", "gpt2" or "llama"; causal : whether the model's attention is causal
    n_kv_heads : key/value heads per layer (grouped-query models; n_heads otherwise). W_K,
        W_V hold one copy per query head: query head h reads kv head h // (n_heads // n_kv_heads)
    path : where the weights came from; config : the parsed config.json ({} if none)
    rotary : the :class:`Rotary` embedding of rotary models (None otherwise, and for a
        Llama-layout checkpoint without config.json, whose rotation is unknown)
    q_norm, k_norm : (n_layers, d_head) Qwen3's query / key RMSNorm gains, or None;
        norm_eps their epsilon
    """

    W_Q: np.ndarray
    W_K: np.ndarray
    W_V: np.ndarray
    W_O: np.ndarray
    b_Q: Optional[np.ndarray]
    b_K: Optional[np.ndarray]
    b_V: Optional[np.ndarray]
    b_O: Optional[np.ndarray]
    layout: str
    causal: bool
    n_kv_heads: int
    path: str = ""
    config: dict = field(default_factory=dict, repr=False)
    rotary: Optional[Rotary] = None
    q_norm: Optional[np.ndarray] = None
    k_norm: Optional[np.ndarray] = None
    norm_eps: float = 1e-6

    @property
    def n_layers(self) -> int:
        return self.W_Q.shape[0]

    @property
    def n_heads(self) -> int:
        return self.W_Q.shape[1]

    @property
    def d_model(self) -> int:
        return self.W_Q.shape[2]

    @property
    def d_head(self) -> int:
        return self.W_Q.shape[3]

    def __repr__(self) -> str:
        """A few lines: the model, then each weight's shape, dtype, mean and range."""
        from ..._summary import array_summary

        kinds = [k for k, on in (("rotary", self.rotary is not None), ("q/k norm", self.q_norm is not None),
                                 ("causal", self.causal)) if on]
        lines = [f"ModelHeads({self.config.get('model_type') or self.layout} ({self.layout} layout) from "
                 f"{self.path!r}: {self.n_layers} layers x {self.n_heads} heads (kv heads {self.n_kv_heads}), "
                 f"d_model {self.d_model}, d_head {self.d_head}" + (f"; {', '.join(kinds)}" if kinds else "")]
        lines += [f"  {name}: {array_summary(getattr(self, name))}" for name in ("W_Q", "W_K", "W_V", "W_O")]
        biases = [name for name in ("b_Q", "b_K", "b_V", "b_O") if getattr(self, name) is not None]
        lines += [f"  {name}: {array_summary(getattr(self, name))}" for name in biases]
        if not biases:
            lines.append("  no biases")
        return "\n".join(lines) + ")"

    def kv_head(self, h: int) -> int:
        """The key/value head that query head h reads (h itself without grouped-query attention)."""
        return h // (self.n_heads // self.n_kv_heads)

    def summary(self) -> dict:
        """The model's type (config.json's model_type, else the layout), dimensions and layout as
        named scalars."""
        out = {"model_type": self.config.get("model_type") or self.layout, "layout": self.layout,
               "causal": self.causal, "n_layers": self.n_layers, "n_heads": self.n_heads,
               "n_kv_heads": self.n_kv_heads, "d_model": self.d_model, "d_head": self.d_head,
               "biases": self.b_Q is not None, "path": self.path,
               "name": model_name(self.path) if self.path else "model", "rotary": self.rotary is not None,
               "qk_norm": self.q_norm is not None}
        if self.rotary is not None:
            out["bilinear_note"] = ("rotary model: the bilinear columns are B(0) = W_Q W_K^T, exact at offset 0 "
                                    "only; the logit at offset i - j is x_i W_Q R(i - j) W_K^T x_j^T")
        if self.q_norm is not None:
            out["bilinear_note"] = out.get("bilinear_note", "") + ("; q_norm / k_norm: logits are not bilinear in "
                                                                   "x, B gives directions, not magnitudes")
        return out

    def diagnostics(self, x=None, *, bias: bool = True, scale=None, rtol=None) -> HeadDiagnostics:
        """:func:`attngeom.head_diagnostics` of every head, with batch shape (n_layers, n_heads).

        For rotary and q/k-norm models the data diagnostics use :meth:`queries_keys` (the
        rotated, normalised queries and keys the model uses, tokens at positions 0..n-1);
        the weights-only fields are those of B(0) = W_Q W_K^T (module docstring).

        Parameters
        ----------
        x : array_like, optional
            Activations, the input of each layer's attention: (n_layers, n, d_model) (one
            sequence) or (n_layers, n_seq, n, d_model).
        bias : bool, default True
            With x and query/key biases, queries and keys are the model's own,
            q = x W_Q + b_Q and k = x W_K + b_K, computed in homogeneous coordinates
            (x, 1) with W = [W; b]; token-space tilt quantities (token_null_dim,
            token_effective_dim) then refer to R^(d_model + 1). The weights-only fields
            are always those of the raw W_Q, W_K, W_V, W_O.
        scale : float, optional
            Logit scale, default 1 / sqrt(d_head).
        rtol : float, optional
            Rank threshold, as in :func:`attngeom.null_space`.

        Returns
        -------
        HeadDiagnostics
            With batch shape (n_layers, n_heads).

        Examples
        --------
        >>> d = ag.load_heads("all-MiniLM-L6-v2").diagnostics()  # needs the models extra
        >>> d.batch_shape
        (6, 12)
        """
        out = head_diagnostics(self.W_Q, self.W_K, self.W_V, self.W_O, rtol=rtol)
        if x is None:
            return out
        xs = np.asarray(x)
        if xs.ndim not in (3, 4) or xs.shape[0] != self.n_layers or xs.shape[-1] != self.d_model:
            raise ValueError(f"x must have shape ({self.n_layers}, n, {self.d_model}) or "
                             f"({self.n_layers}, n_seq, n, {self.d_model}), got {xs.shape}")
        if xs.ndim == 3:
            xs = xs[:, None]
        if self.rotary is not None or self.q_norm is not None:
            q, k = zip(*(self.queries_keys(xs[layer], layer, bias=bias) for layer in range(self.n_layers)))
            q, k = (np.swapaxes(np.stack(a), 1, 2) for a in (q, k))  # (n_layers, n_heads, n_seq, n, d_head)
            data = head_diagnostics(self.W_Q, self.W_K, q=q, k=k, scale=scale, causal=self.causal, rtol=rtol)
            for name in ("radius_mean", "radius_std", "tilt", "routing_singular_values", "routing_rank",
                         "routing_effective_rank"):
                setattr(out, name, getattr(data, name))
            return out
        wq, wk = self.W_Q, self.W_K
        if bias and (self.b_Q is not None or self.b_K is not None):
            zeros = np.zeros(self.W_Q.shape[:2] + (1, self.d_head), self.W_Q.dtype)
            wq = np.concatenate([wq, zeros if self.b_Q is None else self.b_Q[:, :, None]], axis=2)
            wk = np.concatenate([wk, zeros if self.b_K is None else self.b_K[:, :, None]], axis=2)
            xs = np.concatenate([xs, np.ones(xs.shape[:-1] + (1,), xs.dtype)], axis=-1)
        data = head_diagnostics(wq, wk, x=xs[:, None], scale=scale, causal=self.causal, rtol=rtol)
        for name in ("radius_mean", "radius_std", "tilt", "routing_singular_values", "routing_rank",
                     "routing_effective_rank"):
            setattr(out, name, getattr(data, name))
        return out

    def queries_keys(self, x, layer: int, *, bias: bool = True, rotary: bool = True, positions=None):
        """Queries and keys of every head of one layer, as the model uses them.

        x (n, d_model) or (n_seq, n, d_model) -> q, k of shape (..., n_heads, n, d_head):
        x W + b (biases when ``bias``), then Qwen3's q_norm / k_norm, then the rotary
        embedding at ``positions`` (default 0..n-1) unless ``rotary=False`` (the un-rotated
        queries and keys).

        Example: ``q, k = heads.queries_keys(x, 0); ag.softmax_attention(q, k, v, causal=True)``
        """
        xs = np.asarray(x)
        if xs.ndim < 2 or xs.shape[-1] != self.d_model:
            raise ValueError(f"x must have shape (..., n, {self.d_model}), got {xs.shape}")
        if not 0 <= layer < self.n_layers:
            raise ValueError(f"layer must be in 0..{self.n_layers - 1}, got {layer}")
        xh = xs[..., None, :, :]
        q = xh @ self.W_Q[layer]
        k = xh @ self.W_K[layer]
        if bias and self.b_Q is not None:
            q = q + self.b_Q[layer][:, None, :]
        if bias and self.b_K is not None:
            k = k + self.b_K[layer][:, None, :]
        if self.q_norm is not None:
            q = q / np.sqrt(np.mean(q * q, axis=-1, keepdims=True) + self.norm_eps) * self.q_norm[layer]
            k = k / np.sqrt(np.mean(k * k, axis=-1, keepdims=True) + self.norm_eps) * self.k_norm[layer]
        if rotary and self.rotary is not None:
            n = xs.shape[-2]
            pos = np.arange(n) if positions is None else np.asarray(positions)
            if pos.shape[-1] != n:
                raise ValueError(f"positions must have shape (..., {n}), got {pos.shape}")
            q = self.rotary.rotate(q, pos[..., None, :])
            k = self.rotary.rotate(k, pos[..., None, :])
        return q, k

    def bilinear(self, layer: int, head: int, *, offset: float = 0) -> np.ndarray:
        """The bilinear form of one head at a relative offset: B(delta) = W_Q R(delta) W_K^T.

        The logit of query token i and key token j (biases aside) is
        scale * x_i B(i - j) x_j^T (Laplace-Radon eq. 2 with the rotation of RoPE); for models
        without a rotary embedding B does not depend on the offset. With Qwen3's q_norm /
        k_norm the gains are included, B = W_Q diag(g_q) R(delta) diag(g_k) W_K^T, and the
        logit is x_i B x_j^T / (rms(x_i W_Q) rms(x_j W_K)) (module docstring).

        Parameters
        ----------
        layer, head : int
            The head.
        offset : float, default 0
            delta = i - j, query position minus key position.

        Returns
        -------
        ndarray, shape (d_model, d_model)
            B(delta).

        Examples
        --------
        >>> B = heads.bilinear(0, 3, offset=5)  # doctest: +SKIP
        """
        wq, wk = self._head(layer, head)
        if self.rotary is None:
            return wq @ wk.T
        return wq @ self.rotary.matrix(offset) @ wk.T

    def bilinear_pairs(self, layer: int, head: int, *, offset: float = 0):
        """B(delta) split by RoPE's frequency pairs: B(delta) = sum_p B_p(delta).

        See :func:`attngeom.models.rotary_pairs`; needs a rotary model.

        Parameters
        ----------
        layer, head : int
            The head.
        offset : float, default 0
            delta = i - j.

        Returns
        -------
        RotaryPairs
            Per pair p: its frequency, the (d_model, 2) factors of B_p and the singular values
            of B_p(delta).

        Examples
        --------
        >>> pairs = heads.bilinear_pairs(0, 3, offset=5)  # doctest: +SKIP
        """
        if self.rotary is None:
            raise ValueError(f"bilinear_pairs needs a rotary model; this {self.layout} checkpoint has none")
        wq, wk = self._head(layer, head)
        return rotary_pairs(wq, wk, self.rotary.inv_freq, offset=offset)

    def _head(self, layer, head):
        if not (0 <= layer < self.n_layers and 0 <= head < self.n_heads):
            raise ValueError(f"(layer, head) must be in {self.n_layers} layers x {self.n_heads} heads, "
                             f"got ({layer}, {head})")
        wq, wk = self.W_Q[layer, head], self.W_K[layer, head]
        if self.q_norm is not None:
            wq, wk = wq * self.q_norm[layer], wk * self.k_norm[layer]
        return wq, wk


def load_heads(path, *, n_heads: Optional[int] = None, n_kv_heads: Optional[int] = None, layout: Optional[str] = None,
               dtype=np.float64, backend: str = "auto") -> ModelHeads:
    """Read a checkpoint's attention weights as a :class:`ModelHeads` (TransformerLens layout).

    Per-head weights for the diagnostics of Laplace-Radon s.12 and the notes' circuits. No
    PyTorch needed.

    Parameters
    ----------
    path : str or path-like
        A .safetensors file, a folder holding the weights (shards allowed) and usually
        config.json, or the name of a packaged model ("all-MiniLM-L6-v2").
    n_heads : int, optional
        Required when there is no config.json (it cannot be read off the shapes); must agree
        with config.json when both are given.
    n_kv_heads : int, optional
        Key/value heads of grouped-query models without config.json (default: inferred from
        the key weight's rows and d_head).
    layout : {"bert", "gpt2", "llama"}, optional
        Default: detected from the tensor names.
    dtype : numpy dtype, default float64
        dtype of the returned weights (float16/bfloat16/float32 checkpoints are widened).
    backend : {"auto", "package", "python"}, default "auto"
        The safetensors reader used.

    Returns
    -------
    ModelHeads
        W_Q, W_K, W_V (n_layers, n_heads, d_model, d_head), W_O (n_layers, n_heads, d_head,
        d_model), biases and the configuration.

    Raises
    ------
    ValueError
        For a file that is not safetensors, a truncated file, an unknown layout (listing the
        tensor names found), a missing n_heads, inconsistent shapes, a config.json that is
        not a JSON object or whose dimensions are not positive integers, and an attention
        weight that is empty or holds NaN or infinity (each naming the file and the field
        or tensor).

    Examples
    --------
    >>> heads = ag.load_heads("all-MiniLM-L6-v2")  # needs the models extra
    >>> heads.W_Q.shape
    (6, 12, 384, 32)
    """
    return heads_from_checkpoint(Checkpoint(path, backend=backend), n_heads=n_heads, n_kv_heads=n_kv_heads,
                                 layout=layout, dtype=dtype)


def heads_from_checkpoint(ck: Checkpoint, *, n_heads: Optional[int] = None, n_kv_heads: Optional[int] = None,
                          layout: Optional[str] = None, dtype=np.float64) -> ModelHeads:
    """:func:`load_heads` of an opened :class:`Checkpoint` (a folder's, or one held in memory).

    Parameters
    ----------
    ck : Checkpoint
        The checkpoint.
    n_heads, n_kv_heads, layout, dtype
        As in :func:`load_heads`.

    Returns
    -------
    ModelHeads
        As :func:`load_heads`.

    Examples
    --------
    >>> heads = heads_from_checkpoint(Checkpoint("model_dir"))  # doctest: +SKIP
    """
    lay, prefix, layers = detect_layout(ck.names, layout)
    cfg_heads = ck.config_value("n_heads")
    if n_heads is not None:
        if isinstance(n_heads, bool) or not isinstance(n_heads, (int, np.integer)) or n_heads < 1:
            raise ValueError(f"n_heads must be a positive integer, got {n_heads!r}")
        if cfg_heads is not None and cfg_heads != n_heads:
            raise ValueError(f"n_heads = {n_heads} disagrees with config.json's {cfg_heads}")
    n_heads = n_heads if n_heads is not None else cfg_heads
    if n_heads is None:
        raise ValueError(f"n_heads is required: there is no config.json next to {ck.path!r} and the number of "
                         f"heads cannot be read off the weights' shapes")
    cfg_layers = ck.config_value("n_layers")
    if cfg_layers is not None and cfg_layers != len(layers):
        raise ValueError(f"inconsistent shapes: config.json has {cfg_layers} layers, the checkpoint {len(layers)}")
    n_kv = n_kv_heads if n_kv_heads is not None else ck.config_value("n_kv_heads")
    d_head = ck.config_value("d_head")
    per_layer = [split_layer(lay, ck.get_weight, prefix, i, n_heads=n_heads, n_kv_heads=n_kv, d_head=d_head)
                 for i in layers]
    first = per_layer[0]
    for i, w in enumerate(per_layer):
        for key in ("W_Q", "W_K", "W_V", "W_O"):
            if w[key].shape != first[key].shape:
                raise ValueError(f"inconsistent shapes: layer {i}'s {key} has shape {w[key].shape}, "
                                 f"layer 0's {first[key].shape}")
        for key in ("b_Q", "b_K", "b_V", "b_O"):
            if (w[key] is None) != (first[key] is None):
                raise ValueError(f"inconsistent checkpoint: layer {i} {'lacks' if w[key] is None else 'has'} {key}, "
                                 f"layer 0 {'has' if w[key] is None else 'lacks'} it")
    cfg_d = ck.config_value("d_model")
    if cfg_d is not None and cfg_d != first["W_Q"].shape[1]:
        raise ValueError(f"inconsistent shapes: config.json has d_model {cfg_d}, the weights "
                         f"{first['W_Q'].shape[1]}")

    def stack(key):
        if first[key] is None:
            return None
        return np.stack([w[key] for w in per_layer]).astype(dtype, copy=False)

    rotary, q_norm, k_norm, eps = None, None, None, 1e-6
    # a whitened attngeom-gpt arm stores its heads d_model wide (zero-padded): its rotation is per d_head block
    padded = ck.config.get("model_type") == "attngeom-gpt" and ck.config.get("variant") == "whitened"
    if lay.name == "llama" and SUPPORTED_ARCHITECTURES.get(ck.config.get("model_type")) == "llama" and not padded:
        arch = architecture_from_config(ck.config, where=os.path.join(ck.folder, "config.json"))
        rotary = None if arch.rope is None else Rotary(rope_frequencies(arch.rope, first["W_Q"].shape[2]),
                                                       attention_factor=yarn_factors(arch.rope)[0])
        eps = arch.norm_eps
        names = [f"{prefix}layers.{i}.self_attn.{which}_norm.weight" for which in ("q", "k") for i in layers]
        if arch.qk_norm:
            norms = [ck.get(name) for name in names]
            missing = [name for name, t in zip(names, norms) if t is None]
            if missing:
                raise ValueError(f"{arch.model_type} checkpoint {ck.path!r} lacks tensor {missing[0]!r}")
            for name, t in zip(names, norms):
                if t.shape != (first["W_Q"].shape[2],):
                    raise ValueError(f"inconsistent shapes: tensor {name!r} should have shape "
                                     f"({first['W_Q'].shape[2]},), got {t.shape}")
            q_norm = np.stack(norms[: len(layers)]).astype(dtype)
            k_norm = np.stack(norms[len(layers):]).astype(dtype)
    elif padded:
        warnings.warn(f"{ck.path!r}: the whitened arm of attngeom run training stores its heads d_model wide "
                      f"(zero-padded) and rotates each d_head block: queries_keys and diagnostics use un-rotated "
                      f"queries and keys", stacklevel=3)
    elif lay.name == "llama":
        warnings.warn(f"{ck.path!r}: a llama-layout checkpoint without a config.json model_type of "
                      f"{', '.join(k for k, v in SUPPORTED_ARCHITECTURES.items() if v == 'llama')}: its rotary "
                      f"embedding is unknown, so queries_keys and diagnostics use un-rotated queries and keys, "
                      f"which are not the ones the model uses", stacklevel=3)
    return ModelHeads(stack("W_Q"), stack("W_K"), stack("W_V"), stack("W_O"), stack("b_Q"), stack("b_K"),
                      stack("b_V"), stack("b_O"), lay.name, LAYOUTS[lay.name].causal, first["n_kv_heads"],
                      path=str(ck.path), config=ck.config, rotary=rotary, q_norm=q_norm, k_norm=k_norm,
                      norm_eps=eps)
