"""Tensor-name maps of checkpoint layouts, and their conversion to stacked per-head weights.

Every layout is converted to the TransformerLens layout used by the rest of the library
(tokens are rows, q = x W_Q + b_Q):

    W_Q, W_K, W_V : (n_heads, d_model, d_head)     b_Q, b_K, b_V : (n_heads, d_head)
    W_O           : (n_heads, d_head, d_model)     b_O           : (d_model,)

so that a layer's attention output is sum_h softmax(...) (x W_V[h] + b_V[h]) W_O[h] + b_O.

Layouts (``prefix`` is whatever precedes the names below, e.g. ``bert.``, ``transformer.``):

* ``bert``  (Hugging Face BertModel): ``encoder.layer.N.attention.self.{query,key,value}.
  {weight,bias}`` and ``encoder.layer.N.attention.output.dense.{weight,bias}``, stored
  (out, in) as torch.nn.Linear (y = x W^T + b). Bidirectional.
* ``gpt2``  (Hugging Face GPT-2): ``h.N.attn.c_attn.{weight,bias}``, one fused Conv1D
  stored (in, 3 * out) with y = x W + b, columns [q ``| k |`` v]; ``h.N.attn.c_proj``. Causal.
* ``llama`` (Llama, Qwen, Mistral and other grouped-query models): ``layers.N.self_attn.
  {q,k,v,o}_proj.{weight,bias}`` stored (out, in); k and v have n_kv_heads heads and query
  head h reads key/value head h // (n_heads / n_kv_heads). Causal. The rotary position
  embedding is not a weight: B = W_Q W_K^T here is the position-free part of the bilinear
  form (at relative offset m it is W_Q R_m W_K^T). Hugging Face's per-head row permutation
  for rotate_half acts identically on q and k and leaves B unchanged.
* ``mla`` (DeepSeek-V2 multi-head latent attention): ``layers.N.self_attn.kv_a_proj_with_mqa.
  weight`` and the other tensors of :mod:`attngeom.models.nn.mla`. Recognised so that the
  forward pass finds its layers; it has no per-head weights in this layout, because every
  key passes through the latent's RMSNorm (kv_a_layernorm), which is not linear in x:
  :func:`split_layer` refuses it with a ValueError, and the forward pass's q and k
  (:class:`attngeom.models.Forward`) are the per-head quantities of such a model.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np


@dataclass(frozen=True)
class Layout:
    """A checkpoint layout: its name, whether attention is causal, and its tensor names.

    ``pattern`` matches the query weight of one layer (groups: prefix, layer index);
    ``names(prefix, layer)`` gives that layer's tensor names by role
    (q, k, v, o weights; bq, bk, bv, bo biases; q/k/v may share one fused name).
    """

    name: str
    causal: bool
    pattern: "re.Pattern"
    names: Callable[[str, int], Dict[str, str]]
    fused: bool = False


def _bert_names(p, i):
    a = f"{p}encoder.layer.{i}.attention."
    return {"q": a + "self.query.weight", "k": a + "self.key.weight", "v": a + "self.value.weight",
            "o": a + "output.dense.weight", "bq": a + "self.query.bias", "bk": a + "self.key.bias",
            "bv": a + "self.value.bias", "bo": a + "output.dense.bias"}


def _gpt2_names(p, i):
    a = f"{p}h.{i}.attn."
    return {"qkv": a + "c_attn.weight", "bqkv": a + "c_attn.bias", "o": a + "c_proj.weight", "bo": a + "c_proj.bias"}


def _llama_names(p, i):
    a = f"{p}layers.{i}.self_attn."
    return {"q": a + "q_proj.weight", "k": a + "k_proj.weight", "v": a + "v_proj.weight", "o": a + "o_proj.weight",
            "bq": a + "q_proj.bias", "bk": a + "k_proj.bias", "bv": a + "v_proj.bias", "bo": a + "o_proj.bias"}


def _mla_names(p, i):
    a = f"{p}layers.{i}.self_attn."
    return {"kv_a": a + "kv_a_proj_with_mqa.weight", "kv_b": a + "kv_b_proj.weight", "o": a + "o_proj.weight"}


LAYOUTS: Dict[str, Layout] = {
    "bert": Layout("bert", False, re.compile(r"^(.*?)encoder\.layer\.(\d+)\.attention\.self\.query\.weight$"),
                   _bert_names),
    "gpt2": Layout("gpt2", True, re.compile(r"^(.*?)h\.(\d+)\.attn\.c_attn\.weight$"), _gpt2_names, fused=True),
    # before llama: an MLA model without q LoRA also has q_proj
    "mla": Layout("mla", True, re.compile(r"^(.*?)layers\.(\d+)\.self_attn\.kv_a_proj_with_mqa\.weight$"),
                  _mla_names),
    "llama": Layout("llama", True, re.compile(r"^(.*?)layers\.(\d+)\.self_attn\.q_proj\.weight$"), _llama_names),
}


def _name_list(names, limit=12) -> str:
    names = sorted(names)
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def detect_layout(names, layout: Optional[str] = None) -> Tuple[Layout, str, List[int]]:
    """Which layout a set of tensor names is in: (layout, prefix, sorted layer indices).

    Raises ValueError listing the names found when no layout (or more than one prefix)
    matches, and when the layer indices are not 0..n_layers-1.

    Parameters
    ----------
    names : iterable of str
        The checkpoint's tensor names.
    layout : {"bert", "gpt2", "mla", "llama"}, optional
        Force one of LAYOUTS; default: the one whose query-weight pattern matches (MLA's
        pattern is its kv_a_proj_with_mqa weight).

    Returns
    -------
    layout : Layout
        The matching layout.
    prefix : str
        The prefix before the layer names (e.g. "model." or "").
    layers : list of int
        The layer indices found, sorted.

    Examples
    --------
    >>> from attngeom.models.io.layouts import detect_layout
    >>> names = [f"h.{i}.attn.c_attn.weight" for i in range(2)] + [f"h.{i}.attn.c_proj.weight" for i in range(2)]
    >>> layout, prefix, layers = detect_layout(names)
    >>> layout.name, prefix, layers
    ('gpt2', '', [0, 1])
    """
    names = list(names)
    if layout is not None and layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {tuple(LAYOUTS)}, got {layout!r}")
    candidates = [LAYOUTS[layout]] if layout else list(LAYOUTS.values())
    for lay in candidates:
        hits = [m for m in map(lay.pattern.match, names) if m]
        if not hits:
            continue
        prefixes = sorted({m.group(1) for m in hits})
        if len(prefixes) > 1:
            raise ValueError(f"{lay.name} layout with several name prefixes {prefixes}; one model per checkpoint")
        layers = sorted({int(m.group(2)) for m in hits})
        if layers != list(range(len(layers))):
            raise ValueError(f"{lay.name} layout: layer indices {layers} are not 0..{len(layers) - 1}")
        return lay, prefixes[0], layers
    wanted = f"the {layout} layout" if layout else f"a known layout ({', '.join(LAYOUTS)})"
    raise ValueError(f"unknown layout: no tensor names of {wanted}; found {_name_list(names) or 'no tensors'}")


def _expect(name, a, shape):
    if tuple(a.shape) != tuple(shape):
        raise ValueError(f"inconsistent shapes: tensor {name!r} should have shape {tuple(shape)}, got {tuple(a.shape)}")


def split_layer(layout: Layout, get: Callable[[str], Optional[np.ndarray]], prefix: str, layer: int, *,
                n_heads: int, n_kv_heads: Optional[int] = None, d_head: Optional[int] = None) -> dict:
    """One layer's attention weights in the TransformerLens layout (see the module docstring).

    W_K, W_V, b_K, b_V of grouped-query models are expanded to one copy per query head.

    Parameters
    ----------
    layout : Layout
        The checkpoint's layout (see :func:`detect_layout`).
    get : callable
        ``get(name)`` returns a tensor, or None when the checkpoint lacks it (missing biases
        are None in the result; a missing weight is a ValueError).
    prefix : str
        The layout prefix.
    layer : int
        Layer index.
    n_heads : int
        Query heads.
    n_kv_heads : int, optional
        Key/value heads (llama only; default n_heads).
    d_head : int, optional
        Head width (default d_attn / n_heads).

    Returns
    -------
    dict
        "W_Q", "W_K", "W_V" (n_heads, d_model, d_head), "W_O" (n_heads, d_head, d_model),
        "b_Q", "b_K", "b_V" (n_heads, d_head) or None, "b_O" (d_model,) or None, and
        "n_kv_heads".

    Examples
    --------
    >>> from attngeom.models.io.layouts import LAYOUTS, split_layer
    >>> t = {"h.0.attn.c_attn.weight": np.zeros((8, 24)), "h.0.attn.c_proj.weight": np.zeros((8, 8))}
    >>> w = split_layer(LAYOUTS["gpt2"], t.get, "", 0, n_heads=2)
    >>> w["W_Q"].shape, w["W_O"].shape, w["b_Q"]
    ((2, 8, 4), (2, 4, 8), None)
    """
    if layout.name == "mla":
        raise ValueError("layout: multi-head latent attention (DeepSeek-V2) has no per-head W_Q, W_K, W_V: its keys "
                         "pass through the latent's RMSNorm (kv_a_layernorm); use the forward pass "
                         "(attngeom.load_model(...).forward) for its queries, keys and values")
    names = layout.names(prefix, layer)

    def need(role):
        a = get(names[role])
        if a is None:
            raise ValueError(f"{layout.name} layout: layer {layer} has no tensor {names[role]!r}")
        if a.ndim != (1 if role.startswith("b") else 2):
            raise ValueError(f"inconsistent shapes: tensor {names[role]!r} should be "
                             f"{'1-D' if role.startswith('b') else '2-D'}, got shape {tuple(a.shape)}")
        return a

    def optional(role):
        return None if get(names[role]) is None else need(role)

    if layout.fused:  # GPT-2 Conv1D: (in, 3 * out), y = x W + b
        qkv = need("qkv")
        d_model, three = qkv.shape
        if three % 3 or (three // 3) % n_heads:
            raise ValueError(f"inconsistent shapes: tensor {names['qkv']!r} of shape {qkv.shape} must be "
                             f"(d_model, 3 * n_heads * d_head) with n_heads = {n_heads}")
        d_attn = three // 3
        q, k, v = qkv[:, :d_attn], qkv[:, d_attn:2 * d_attn], qkv[:, 2 * d_attn:]
        o = need("o")  # (in = d_attn, out = d_model)
        _expect(names["o"], o, (d_attn, d_model))
        bqkv = optional("bqkv")
        if bqkv is not None:
            _expect(names["bqkv"], bqkv, (three,))
        bq, bk, bv = (None, None, None) if bqkv is None else (bqkv[:d_attn], bqkv[d_attn:2 * d_attn], bqkv[2 * d_attn:])
        n_kv = n_heads
        dh = d_attn // n_heads
    else:  # torch.nn.Linear: (out, in), y = x W^T + b
        q = need("q")
        d_q, d_model = q.shape
        dh = d_q // n_heads if d_head is None else d_head
        if n_heads * dh != d_q:
            raise ValueError(f"inconsistent shapes: tensor {names['q']!r} has {d_q} rows, not n_heads * d_head = "
                             f"{n_heads} * {dh}")
        k_rows = need("k").shape[0]
        n_kv = n_kv_heads if n_kv_heads is not None else (k_rows // dh if layout.name == "llama" else n_heads)
        if n_kv < 1 or n_heads % n_kv:
            raise ValueError(f"n_kv_heads = {n_kv} must divide n_heads = {n_heads}")
        for role, rows in (("k", n_kv * dh), ("v", n_kv * dh)):
            _expect(names[role], need(role), (rows, d_model))
        _expect(names["o"], need("o"), (d_model, d_q))
        q, k, v = q.T, need("k").T, need("v").T
        o = need("o").T  # (d_attn, d_model)
        bq, bk, bv = optional("bq"), optional("bk"), optional("bv")
        for role, b, size in (("bq", bq, d_q), ("bk", bk, n_kv * dh), ("bv", bv, n_kv * dh)):
            if b is not None:
                _expect(names[role], b, (size,))
    bo = optional("bo")
    if bo is not None:
        _expect(names["bo"], bo, (d_model,))

    def heads_in(w, n):  # (d_model, n * dh) -> (n, d_model, dh)
        return np.ascontiguousarray(w.reshape(d_model, n, dh).transpose(1, 0, 2))

    group = np.arange(n_heads) // (n_heads // n_kv)  # query head h reads kv head h // group size
    out = {
        "W_Q": heads_in(q, n_heads),
        "W_K": heads_in(k, n_kv)[group],
        "W_V": heads_in(v, n_kv)[group],
        "W_O": np.ascontiguousarray(o.reshape(n_heads, dh, d_model)),
        "b_Q": None if bq is None else bq.reshape(n_heads, dh),
        "b_K": None if bk is None else bk.reshape(n_kv, dh)[group],
        "b_V": None if bv is None else bv.reshape(n_kv, dh)[group],
        "b_O": bo,
        "n_kv_heads": n_kv,
    }
    return out
