"""Stacked per-head attention weights of a checkpoint, in the TransformerLens layout.

``load_heads(path)`` reads a safetensors checkpoint (a file, or a folder with one or more
``*.safetensors`` shards and usually ``config.json``), recognises its layout (BERT, GPT-2,
Llama/Qwen with grouped-query attention; see :mod:`attngeom.models.layouts`) and returns a
:class:`ModelHeads` with

    W_Q, W_K, W_V : (n_layers, n_heads, d_model, d_head)   q = x W_Q[l, h] + b_Q[l, h]
    W_O           : (n_layers, n_heads, d_head, d_model)
    b_Q, b_K, b_V : (n_layers, n_heads, d_head) or None     b_O : (n_layers, d_model) or None

raw: no layer norm is folded in, nothing is centred, so ``x`` must be what the model feeds
its attention (the layer-norm output in pre-LN models such as GPT-2 and Llama, the previous
layer's output in post-LN BERT).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Dict, Optional

import numpy as np

from ..head_diagnostics import HeadDiagnostics, head_diagnostics
from .checkpoint import INDEX, read_index, weight_files
from .layouts import LAYOUTS, detect_layout, split_layer
from .packaged import resolve_checkpoint
from .safetensors import SafetensorsFile

_CONFIG_KEYS = {
    "n_layers": ("num_hidden_layers", "n_layer"),
    "n_heads": ("num_attention_heads", "n_head"),
    "d_model": ("hidden_size", "n_embd", "d_model"),
    "n_kv_heads": ("num_key_value_heads",),
    "d_head": ("head_dim",),
}


class Checkpoint:
    """The safetensors files of one checkpoint and its config.json, read lazily.

    path : a .safetensors file, or a folder of shards (every ``*.safetensors`` in it).
    backend : as in :class:`attngeom.models.SafetensorsFile`.

    ``get(name)`` returns a tensor or None; ``names`` lists every tensor; ``config`` is the
    parsed config.json found next to the weights ({} when there is none).

    Example: ``ck = Checkpoint("model_dir"); ck.get("h.0.attn.c_attn.weight")``
    """

    def __init__(self, path, *, backend: str = "auto"):
        path = resolve_checkpoint(path)
        if os.path.isdir(path):
            files = weight_files(path)  # the index's shards when there is one
            folder = path
        else:
            files, folder = [path], os.path.dirname(os.path.abspath(path))
        self.path = path
        self.folder = folder
        self.files = [SafetensorsFile(f, backend=backend) for f in files]
        self._where: Dict[str, SafetensorsFile] = {}
        for f in self.files:
            for name in f.keys():
                if name in self._where:
                    raise ValueError(f"tensor {name!r} is in both {self._where[name].path!r} and {f.path!r}")
                self._where[name] = f
        index = os.path.join(folder, INDEX)
        if os.path.isdir(path) and os.path.isfile(index):
            for name, shard in read_index(index).items():
                if name not in self._where or os.path.basename(self._where[name].path) != shard:
                    raise ValueError(f"{index!r} puts tensor {name!r} in {shard!r}, which does not hold it")
        self.config = {}
        cfg = os.path.join(folder, "config.json")
        if os.path.isfile(cfg):
            with open(cfg) as fh:
                try:
                    self.config = json.load(fh)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{cfg!r} is not valid JSON: {exc}") from None

    @property
    def names(self) -> list:
        """Every tensor name of the checkpoint."""
        return list(self._where)

    def get(self, name: str) -> Optional[np.ndarray]:
        """The tensor of that name (BF16 widened to float32), or None when it is absent."""
        f = self._where.get(name)
        return None if f is None else f[name]

    def file_of(self, name: str) -> Optional[str]:
        """The path of the safetensors file holding tensor ``name`` (None when it is absent)."""
        f = self._where.get(name)
        return None if f is None else f.path

    def dtype_of(self, name: str) -> Optional[str]:
        """The stored dtype code of tensor ``name`` ("F32", "BF16", ...; None when absent)."""
        f = self._where.get(name)
        return None if f is None else f.dtype(name)

    def config_value(self, key: str) -> Optional[int]:
        """A model dimension from config.json: n_layers, n_heads, d_model, n_kv_heads, d_head."""
        for k in _CONFIG_KEYS[key]:
            if self.config.get(k) is not None:
                return int(self.config[k])
        return None


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

    def kv_head(self, h: int) -> int:
        """The key/value head that query head h reads (h itself without grouped-query attention)."""
        return h // (self.n_heads // self.n_kv_heads)

    def summary(self) -> dict:
        """The model's dimensions and layout as named scalars."""
        return {"layout": self.layout, "causal": self.causal, "n_layers": self.n_layers, "n_heads": self.n_heads,
                "n_kv_heads": self.n_kv_heads, "d_model": self.d_model, "d_head": self.d_head,
                "biases": self.b_Q is not None, "path": self.path}

    def diagnostics(self, x=None, *, bias: bool = True, scale=None, rtol=None) -> HeadDiagnostics:
        """:func:`attngeom.head_diagnostics` of every head, with batch shape (n_layers, n_heads).

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

    def queries_keys(self, x, layer: int, *, bias: bool = True):
        """Queries and keys of every head of one layer: x (n, d_model) or (n_seq, n, d_model)
        -> q, k of shape (..., n_heads, n, d_head), biases included when ``bias``.

        Example: ``q, k = heads.queries_keys(x, 0); ag.softmax_attention(q, k, v)``
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
        return q, k


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
        tensor names found), a missing n_heads and inconsistent shapes.

    Examples
    --------
    >>> heads = ag.load_heads("all-MiniLM-L6-v2")  # needs the models extra
    >>> heads.W_Q.shape
    (6, 12, 384, 32)
    """
    ck = Checkpoint(path, backend=backend)
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
    per_layer = [split_layer(lay, ck.get, prefix, i, n_heads=n_heads, n_kv_heads=n_kv, d_head=d_head) for i in layers]
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

    return ModelHeads(stack("W_Q"), stack("W_K"), stack("W_V"), stack("W_O"), stack("b_Q"), stack("b_K"),
                      stack("b_V"), stack("b_O"), lay.name, LAYOUTS[lay.name].causal, first["n_kv_heads"],
                      path=str(ck.path), config=ck.config)
