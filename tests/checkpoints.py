"""Synthetic checkpoints written with NumPy (nothing is downloaded): raw tensors of a random
model in each layout's own storage convention, the layer's attention computed the model's way
from them, a BERT checkpoint with its vocabulary, hand-made safetensors files, and the check
that rewritten tensors load to the same model.

Test modules import from here, never from one another.
"""
import json
import math
import os
import shutil
import struct

import numpy as np

from attngeom.models import load_model, write_safetensors

try:
    import safetensors.numpy as st_numpy
except ImportError:  # the package is optional
    st_numpy = None
BACKENDS = ["python"] + (["package"] if st_numpy is not None else [])
DTYPES = ["F32", "F16", "BF16"]


def raw_model(layout, rng, n_layers=2, n_heads=4, d_model=16, d_head=4, n_kv=None, prefix="", bias=True):
    """Raw tensors of a random model in the checkpoint's own storage convention."""
    n_kv = n_kv or n_heads
    t = {}
    r = lambda *s: rng.standard_normal(s).astype(np.float32) * 0.5  # noqa: E731
    for i in range(n_layers):
        if layout == "bert":
            a = f"{prefix}encoder.layer.{i}.attention."
            for role in ("query", "key", "value"):
                t[a + f"self.{role}.weight"] = r(n_heads * d_head, d_model)
                if bias:
                    t[a + f"self.{role}.bias"] = r(n_heads * d_head)
            t[a + "output.dense.weight"] = r(d_model, n_heads * d_head)
            if bias:
                t[a + "output.dense.bias"] = r(d_model)
        elif layout == "gpt2":
            a = f"{prefix}h.{i}.attn."
            t[a + "c_attn.weight"] = r(d_model, 3 * n_heads * d_head)
            t[a + "c_proj.weight"] = r(n_heads * d_head, d_model)
            if bias:
                t[a + "c_attn.bias"] = r(3 * n_heads * d_head)
                t[a + "c_proj.bias"] = r(d_model)
            t[f"{prefix}h.{i}.ln_1.weight"] = r(d_model)
        else:
            a = f"{prefix}layers.{i}.self_attn."
            t[a + "q_proj.weight"] = r(n_heads * d_head, d_model)
            t[a + "k_proj.weight"] = r(n_kv * d_head, d_model)
            t[a + "v_proj.weight"] = r(n_kv * d_head, d_model)
            t[a + "o_proj.weight"] = r(d_model, n_heads * d_head)
            if bias:
                for role, rows in (("q", n_heads), ("k", n_kv), ("v", n_kv)):
                    t[a + f"{role}_proj.bias"] = r(rows * d_head)
    return t


def model_attention(layout, t, layer, x, n_heads, n_kv=None, prefix=""):
    """The layer's attention output computed the model's way from the stored tensors."""
    n_kv = n_kv or n_heads

    def lin(w, b=None):  # torch.nn.Linear, (out, in)
        return x @ w.T + (0 if b is None else b)

    if layout == "bert":
        a = f"{prefix}encoder.layer.{layer}.attention."
        q, k, v = (lin(t[a + f"self.{r}.weight"], t.get(a + f"self.{r}.bias")) for r in ("query", "key", "value"))
        wo, bo = t[a + "output.dense.weight"].T, t.get(a + "output.dense.bias")
        causal = False
    elif layout == "gpt2":
        a = f"{prefix}h.{layer}.attn."
        qkv = x @ t[a + "c_attn.weight"] + t.get(a + "c_attn.bias", 0)
        q, k, v = np.split(qkv, 3, axis=-1)
        wo, bo = t[a + "c_proj.weight"], t.get(a + "c_proj.bias")
        causal = True
    else:
        a = f"{prefix}layers.{layer}.self_attn."
        q, k, v = (lin(t[a + f"{r}_proj.weight"], t.get(a + f"{r}_proj.bias")) for r in ("q", "k", "v"))
        wo, bo = t[a + "o_proj.weight"].T, None
        causal = True
    n, d_head = x.shape[0], q.shape[-1] // n_heads
    group = n_heads // n_kv
    outs = []
    for h in range(n_heads):
        qh = q[:, h * d_head:(h + 1) * d_head]
        g = h // group
        kh, vh = k[:, g * d_head:(g + 1) * d_head], v[:, g * d_head:(g + 1) * d_head]
        s = qh @ kh.T / math.sqrt(d_head)
        if causal:
            s = np.where(np.tril(np.ones((n, n), bool)), s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        outs.append((p / p.sum(-1, keepdims=True)) @ vh)
    return np.concatenate(outs, -1) @ wo + (0 if bo is None else bo)


def write_model(folder, tensors, config=None, dtype=None):
    os.makedirs(folder, exist_ok=True)
    write_safetensors(os.path.join(folder, "model.safetensors"), tensors, dtype=dtype)
    if config is not None:
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(config, f)
    return str(folder)


CONFIGS = {
    "bert": lambda L, H, d, kv: {"num_hidden_layers": L, "num_attention_heads": H, "hidden_size": d},
    "gpt2": lambda L, H, d, kv: {"n_layer": L, "n_head": H, "n_embd": d},
    "llama": lambda L, H, d, kv: {"num_hidden_layers": L, "num_attention_heads": H, "hidden_size": d,
                                  "num_key_value_heads": kv},
}


def raw_file(path, header, data=b"", length=None):
    blob = json.dumps(header).encode() if isinstance(header, dict) else header
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob) if length is None else length) + blob + data)
    return path


VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "the", "cat", "sat", "on", "mat", ".", ",", "un", "##believ",
         "##able", "cafe", "!", "a", "##s"]


def bert_checkpoint(folder, rng, L=2, H=2, d=8, ff=12, vocab=VOCAB, max_pos=16):
    t = {f"bert.{k}": v for k, v in raw_model("bert", rng, L, H, d, d // H).items()}
    r = lambda *s: rng.standard_normal(s).astype(np.float32) * 0.5  # noqa: E731
    t.update({"bert.embeddings.word_embeddings.weight": r(len(vocab), d),
              "bert.embeddings.position_embeddings.weight": r(max_pos, d),
              "bert.embeddings.token_type_embeddings.weight": r(2, d),
              "bert.embeddings.LayerNorm.weight": 1 + r(d), "bert.embeddings.LayerNorm.bias": r(d)})
    for i in range(L):
        a = f"bert.encoder.layer.{i}."
        t.update({a + "attention.output.LayerNorm.weight": 1 + r(d), a + "attention.output.LayerNorm.bias": r(d),
                  a + "intermediate.dense.weight": r(ff, d), a + "intermediate.dense.bias": r(ff),
                  a + "output.dense.weight": r(d, ff), a + "output.dense.bias": r(d),
                  a + "output.LayerNorm.weight": 1 + r(d), a + "output.LayerNorm.bias": r(d)})
    write_model(folder, t, {"num_hidden_layers": L, "num_attention_heads": H, "hidden_size": d,
                            "layer_norm_eps": 1e-12})
    with open(os.path.join(folder, "vocab.txt"), "w") as f:
        f.write("\n".join(vocab) + "\n")
    return t


def assert_same_model(folder, other, tensors):
    """Write ``tensors`` with folder's config.json into ``other``: its forward pass (logits and
    router logits) equals folder's bit for bit."""
    os.makedirs(other)
    write_safetensors(os.path.join(other, "model.safetensors"), tensors)
    shutil.copy(os.path.join(folder, "config.json"), os.path.join(other, "config.json"))
    ids = np.arange(1, 9)
    a, b = load_model(folder).forward(ids), load_model(other).forward(ids)
    np.testing.assert_array_equal(a.logits, b.logits)
    np.testing.assert_array_equal(a.router_logits, b.router_logits)
