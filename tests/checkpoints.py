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


# Random checkpoints of every layout the model tests use, written with NumPy: config.json as
# transformers 5 writes it (the fields the forward pass reads) and model.safetensors under the
# tensor names transformers' save_pretrained gives. tests/test_decoders.py checks that
# transformers loads each of them with no missing or unexpected tensor and computes our
# forward pass (so tests that need no transformers reference run without torch).
_SMALL = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
              head_dim=8, hidden_act="silu", rms_norm_eps=1e-6)
RANDOM_LAYOUTS = {
    "gpt2": dict(model_type="gpt2", architectures=["GPT2LMHeadModel"], vocab_size=97, n_embd=32, n_layer=2,
                 n_head=4, n_positions=16, n_inner=None, activation_function="gelu_new", layer_norm_epsilon=1e-5,
                 tie_word_embeddings=True, bos_token_id=0, eos_token_id=0),
    "llama": dict(model_type="llama", architectures=["LlamaForCausalLM"], **_SMALL, num_key_value_heads=2,
                  max_position_embeddings=64, tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
                  rope_parameters={"rope_theta": 500.0, "rope_type": "default"}),
    "llama3": dict(model_type="llama", architectures=["LlamaForCausalLM"], **_SMALL, num_key_value_heads=1,
                   max_position_embeddings=64, tie_word_embeddings=True, attention_bias=False, mlp_bias=False,
                   rope_parameters={"rope_theta": 10000.0, "rope_type": "llama3", "factor": 8.0,
                                    "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                    "original_max_position_embeddings": 16}),
    "llama_yarn": dict(model_type="llama", architectures=["LlamaForCausalLM"], **_SMALL, num_key_value_heads=2,
                       max_position_embeddings=64, tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
                       rope_parameters={"rope_theta": 10000.0, "rope_type": "yarn", "factor": 4.0,
                                        "beta_fast": 8.0, "original_max_position_embeddings": 16}),
    "mistral": dict(model_type="mistral", architectures=["MistralForCausalLM"], **_SMALL, num_key_value_heads=2,
                    max_position_embeddings=131072, sliding_window=4, tie_word_embeddings=False,
                    rope_parameters={"rope_theta": 10000.0, "rope_type": "default"}),
    "qwen2": dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"], **{k: v for k, v in _SMALL.items() if k != "head_dim"},
                  num_key_value_heads=2, max_position_embeddings=32768, tie_word_embeddings=True,
                  use_sliding_window=False, sliding_window=None, max_window_layers=28,
                  layer_types=["full_attention", "full_attention"],
                  rope_parameters={"rope_theta": 10000.0, "rope_type": "default"}),
    "qwen3": dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"], **{**_SMALL, "head_dim": 16},
                  num_key_value_heads=2, max_position_embeddings=32768, tie_word_embeddings=False,
                  attention_bias=False, use_sliding_window=False, sliding_window=None, max_window_layers=28,
                  layer_types=["full_attention", "full_attention"],
                  rope_parameters={"rope_theta": 10000.0, "rope_type": "default"}),
    "bert": dict(model_type="bert", architectures=["BertModel"], vocab_size=97, hidden_size=32, num_hidden_layers=2,
                 num_attention_heads=4, intermediate_size=48, max_position_embeddings=16, type_vocab_size=2,
                 hidden_act="gelu", layer_norm_eps=1e-12, pad_token_id=0, position_embedding_type="absolute"),
}
RANDOM_VOCAB = 97


def random_tensor_shapes(config):
    """{tensor name: shape} of the checkpoint transformers' save_pretrained writes for config
    (one of RANDOM_LAYOUTS' configs), in its storage orientation (torch Linear: (out, in);
    GPT-2's Conv1D: (in, out))."""
    c = config
    if c["model_type"] == "gpt2":
        d, L, V, ff = c["n_embd"], c["n_layer"], c["vocab_size"], c["n_inner"] or 4 * c["n_embd"]
        t = {"transformer.wte.weight": (V, d), "transformer.wpe.weight": (c["n_positions"], d),
             "transformer.ln_f.weight": (d,), "transformer.ln_f.bias": (d,)}
        for i in range(L):
            s = f"transformer.h.{i}."
            t.update({s + "ln_1.weight": (d,), s + "ln_1.bias": (d,), s + "ln_2.weight": (d,), s + "ln_2.bias": (d,),
                      s + "attn.c_attn.weight": (d, 3 * d), s + "attn.c_attn.bias": (3 * d,),
                      s + "attn.c_proj.weight": (d, d), s + "attn.c_proj.bias": (d,),
                      s + "mlp.c_fc.weight": (d, ff), s + "mlp.c_fc.bias": (ff,),
                      s + "mlp.c_proj.weight": (ff, d), s + "mlp.c_proj.bias": (d,)})
        return t
    d, L, V, ff = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"], c["intermediate_size"]
    if c["model_type"] == "bert":
        t = {"embeddings.word_embeddings.weight": (V, d),
             "embeddings.position_embeddings.weight": (c["max_position_embeddings"], d),
             "embeddings.token_type_embeddings.weight": (c["type_vocab_size"], d),
             "embeddings.LayerNorm.weight": (d,), "embeddings.LayerNorm.bias": (d,),
             "pooler.dense.weight": (d, d), "pooler.dense.bias": (d,)}
        for i in range(L):
            s = f"encoder.layer.{i}."
            for role in ("query", "key", "value"):
                t.update({s + f"attention.self.{role}.weight": (d, d), s + f"attention.self.{role}.bias": (d,)})
            t.update({s + "attention.output.dense.weight": (d, d), s + "attention.output.dense.bias": (d,),
                      s + "attention.output.LayerNorm.weight": (d,), s + "attention.output.LayerNorm.bias": (d,),
                      s + "intermediate.dense.weight": (ff, d), s + "intermediate.dense.bias": (ff,),
                      s + "output.dense.weight": (d, ff), s + "output.dense.bias": (d,),
                      s + "output.LayerNorm.weight": (d,), s + "output.LayerNorm.bias": (d,)})
        return t
    H, K = c["num_attention_heads"], c["num_key_value_heads"]
    dh = c.get("head_dim") or d // H
    t = {"model.embed_tokens.weight": (V, d), "model.norm.weight": (d,)}
    if not c["tie_word_embeddings"]:
        t["lm_head.weight"] = (V, d)
    for i in range(L):
        s = f"model.layers.{i}."
        a = s + "self_attn."
        t.update({s + "input_layernorm.weight": (d,), s + "post_attention_layernorm.weight": (d,),
                  s + "mlp.gate_proj.weight": (ff, d), s + "mlp.up_proj.weight": (ff, d),
                  s + "mlp.down_proj.weight": (d, ff),
                  a + "q_proj.weight": (H * dh, d), a + "k_proj.weight": (K * dh, d), a + "v_proj.weight": (K * dh, d),
                  a + "o_proj.weight": (d, H * dh)})
        if c["model_type"] == "qwen2":
            t.update({a + "q_proj.bias": (H * dh,), a + "k_proj.bias": (K * dh,), a + "v_proj.bias": (K * dh,)})
        if c["model_type"] == "qwen3":
            t.update({a + "q_norm.weight": (dh,), a + "k_norm.weight": (dh,)})
    return t


def random_tensors(layout, seed=0):
    """{name: float32 array} of a random model of that layout (RANDOM_LAYOUTS). Weights of
    order one, as tests/builders.py gives the transformers models (transformers' own init, std
    0.02, makes every attention near uniform): norm scales 1 + 0.2 N(0, 1), other vectors
    0.2 N(0, 1), matrices 0.3 N(0, 1)."""
    rng = np.random.default_rng(seed)
    tensors = {}
    for name, shape in random_tensor_shapes(RANDOM_LAYOUTS[layout]).items():
        norm = ("norm" in name or "ln_" in name or "LayerNorm" in name) and name.endswith("weight")
        scale = 0.2 if len(shape) == 1 else 0.3
        tensors[name] = ((1.0 if norm else 0.0) + scale * rng.standard_normal(shape)).astype(np.float32)
    return tensors


def random_checkpoint(layout, folder, seed=0):
    """Write random_tensors(layout, seed) and the layout's config.json into folder with NumPy;
    return the folder as a string."""
    return write_model(folder, random_tensors(layout, seed), RANDOM_LAYOUTS[layout])


def random_batch():
    """The model tests' padded batch: ids (3, 7) of RANDOM_VOCAB and its mask, row 1 with two
    tokens of left padding, row 2 with three of right padding."""
    rng = np.random.default_rng(1)
    ids = rng.integers(0, RANDOM_VOCAB, size=(3, 7))
    mask = np.ones((3, 7), dtype=bool)
    mask[1, :2] = False  # left padding
    mask[2, -3:] = False  # right padding
    return ids, mask


def with_tokenizer(folder):
    """A word-level tokenizer.json over a ten-word vocabulary, written into folder."""
    import pytest

    tokenizers = pytest.importorskip("tokenizers")
    words = ["<unk>"] + "the cat sat on mat and dog ran . a".split()
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.save(str(folder / "tokenizer.json"))
