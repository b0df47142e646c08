"""The safetensors format: bfloat16 bits, round trips through every reader backend and the
safetensors package, and hostile files (a ValueError naming the file and the field, never
another error), with the JSON files that sit beside a checkpoint."""
import json
import os
import struct

import numpy as np
import pytest

import attngeom as ag
from attngeom.models import (BertEncoder, SafetensorsFile, bfloat16_to_float32, float32_to_bfloat16, read_safetensors,
                              text_activations, tokenize, write_safetensors)
from checkpoints import BACKENDS, DTYPES, bert_checkpoint, raw_file, raw_model, st_numpy, write_model


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
        opened(raw_file(tmp_path / "h.safetensors", {"a": {}}, length=1000))
    with pytest.raises(ValueError, match="not JSON"):
        opened(raw_file(tmp_path / "j.safetensors", b"{not json"))
    with pytest.raises(ValueError, match="not a JSON object"):
        opened(raw_file(tmp_path / "l.safetensors", b"[1, 2]"))
    good = {"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}
    with pytest.raises(ValueError, match="truncated: tensor 'w'"):
        opened(raw_file(tmp_path / "t.safetensors", good, b"\0" * 10))
    bad = {"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 12]}}
    with pytest.raises(ValueError, match="needs 16 bytes"):
        opened(raw_file(tmp_path / "o.safetensors", bad, b"\0" * 16))
    with pytest.raises(ValueError, match="needs a dtype string"):
        opened(raw_file(tmp_path / "k.safetensors", {"w": {"shape": [1]}}, b"\0" * 4))
    with pytest.raises(ValueError, match="integer shape"):
        opened(raw_file(tmp_path / "s.safetensors", {"w": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}},
                         b"\0" * 4))
    # tensors must tile the data: trailing bytes, gaps and overlaps are rejected
    with pytest.raises(ValueError, match="trailing bytes"):
        opened(raw_file(tmp_path / "tr.safetensors", good, b"\0" * 32))
    two = {"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
           "b": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}
    with pytest.raises(ValueError, match="must be contiguous"):
        opened(raw_file(tmp_path / "ov.safetensors", two, b"\0" * 8))
    with pytest.raises(ValueError, match="__metadata__"):
        opened(raw_file(tmp_path / "md.safetensors", {"__metadata__": {"a": 1}, **good}, b"\0" * 16))
    f8 = {"w": {"dtype": "F8_E4M3", "shape": [4], "data_offsets": [0, 4]}}
    f = opened(raw_file(tmp_path / "f8.safetensors", f8, b"\0" * 4))
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
    _opened_both(raw_file(tmp_path / "a.safetensors", deep), "nested too deeply")
    _opened_both(raw_file(tmp_path / "b.safetensors", b'{"w": {"dtype": "F32", "shape": ' + deep + b"}}"),
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
    _opened_both(raw_file(tmp_path / "s.safetensors", header, b"\0" * 4 if offsets[1] == 4 else b""), message)


def test_header_duplicate_names(tmp_path):
    entry = '{"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}'
    blob = f'{{"w": {entry}, "w": {entry}}}'.encode()
    _opened_both(raw_file(tmp_path / "d.safetensors", blob, b"\0" * 4), "names 'w' twice")
    blob = b'{"w": {"dtype": "F32", "dtype": "F16", "shape": [1], "data_offsets": [0, 4]}}'
    _opened_both(raw_file(tmp_path / "f.safetensors", blob, b"\0" * 4), "names 'dtype' twice")


def test_header_cap(tmp_path, monkeypatch):
    from attngeom.models.io import safetensors as st

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
