"""Forward passes of GPT-2, Llama (with Llama 3 and YaRN rope scaling), Mistral, Qwen2, Qwen3 and BERT
through ``ag.load_model``, compared with ``transformers`` on tiny random-init checkpoints built
from config classes and saved with save_pretrained (nothing is downloaded).

float32: logits, hidden states and attentions to <= 1e-4. float64: the reference model is
converted with ``model.double()`` and run with every float32 upcast inside transformers
(RMSNorm, softmax, rotary angles) redirected to float64, so both sides compute in float64 and
must agree to <= 1e-10.
"""
import os

import numpy as np
import pytest

import attngeom as ag
from attngeom.models import load_model

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from builders import LAYOUTS, VOCAB, N, batch, build, configs, max_errors, reference, transformers_hidden  # noqa: E402


@pytest.mark.parametrize("precision", ["float32", "float64"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_forward_matches_transformers(tmp_path, layout, precision):
    model = build(layout, tmp_path / layout, precision)
    m = load_model(tmp_path / layout)
    dt = np.float64 if precision == "float64" else np.float32
    tol = 1e-10 if precision == "float64" else 1e-4
    ids, mask = batch()
    positions = np.maximum(np.cumsum(mask, 1) - 1, 0)
    f = m.forward(ids, attention_mask=mask, dtype=dt)
    assert f.resid_pre.dtype == f.ln_final.dtype == dt and f.pattern.shape == (2, 3, 4, N, N)
    errs = max_errors(f, reference(model, ids, mask, positions, precision == "float64"), mask)
    print(layout, precision, {k: f"{v:.2e}" for k, v in errs.items()})
    assert max(errs.values()) <= tol, errs
    assert (f.logits is None) == (layout == "bert")
    # unpadded: one sequence alone gives the rows of the batch
    one = m.forward(ids[1, 2:], dtype=dt)
    assert one.q.shape[:2] == (2, 4)
    if layout == "bert":
        assert one.logits is None
    else:
        assert one.logits.shape == (N - 2, VOCAB)
    np.testing.assert_allclose(transformers_hidden(one), transformers_hidden(f)[:, 1, 2:], atol=10 * tol, rtol=0)
    ref1 = reference(model, ids[1:2, 2:], np.ones((1, N - 2), bool), np.arange(N - 2)[None], precision == "float64")
    assert max(max_errors(m.forward(ids[1:2, 2:], dtype=dt), ref1, np.ones((1, N - 2), bool)).values()) <= tol


def test_sharded_index_and_stray_shards(tmp_path):
    model = build("llama", tmp_path / "full")
    model.save_pretrained(tmp_path / "sh", safe_serialization=True, max_shard_size="40KB")
    shards = sorted(p for p in os.listdir(tmp_path / "sh") if p.endswith(".safetensors"))
    assert len(shards) >= 2 and os.path.isfile(tmp_path / "sh" / "model.safetensors.index.json")
    ids = np.array([3, 1, 4, 1, 5])
    expect = load_model(tmp_path / "full").forward(ids).logits
    np.testing.assert_array_equal(load_model(tmp_path / "sh").forward(ids).logits, expect)
    # a stray file (an old single-file copy) next to the shards is not mixed in
    ag.models.write_safetensors(tmp_path / "sh" / "model.safetensors",
                                {"model.norm.weight": np.zeros(32, np.float32)})
    np.testing.assert_array_equal(load_model(tmp_path / "sh").forward(ids).logits, expect)
    os.remove(tmp_path / "sh" / shards[-1])
    with pytest.raises(ValueError, match=f"lists shards that are missing: {shards[-1]}"):
        load_model(tmp_path / "sh")


def test_fp8_weights_are_refused(tmp_path):
    st = pytest.importorskip("safetensors.torch")
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("this torch has no float8")
    build("qwen2", tmp_path / "m")
    path = str(tmp_path / "m" / "model.safetensors")
    tensors = st.load_file(path)
    tensors["model.layers.1.self_attn.q_proj.weight"] = tensors["model.layers.1.self_attn.q_proj.weight"].to(
        torch.float8_e4m3fn)
    st.save_file(tensors, path, metadata={"format": "pt"})
    with pytest.raises(ValueError, match="'model.layers.1.self_attn.q_proj.weight' in .*model.safetensors' has "
                                         "dtype F8_E4M3, which is not supported"):
        load_model(tmp_path / "m")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_numpy_written_checkpoints_are_what_transformers_writes(tmp_path, layout):
    """The checkpoints tests/checkpoints.py writes with NumPy (the tests that need no
    transformers reference run on them) hold the tensors transformers' save_pretrained writes
    for the same config, transformers loads them with nothing missing or unexpected, and
    computes our forward pass (float32, 1e-4)."""
    from checkpoints import RANDOM_LAYOUTS, random_checkpoint, random_tensor_shapes

    import safetensors.numpy

    build(layout, tmp_path / "theirs")
    theirs = safetensors.numpy.load_file(str(tmp_path / "theirs" / "model.safetensors"))
    assert {k: tuple(v.shape) for k, v in theirs.items()} == random_tensor_shapes(RANDOM_LAYOUTS[layout])
    folder = random_checkpoint(layout, tmp_path / "ours")
    assert load_model(folder).arch == load_model(tmp_path / "theirs").arch
    cls = configs()[layout]()[1]
    hf, info = cls.from_pretrained(folder, output_loading_info=True, attn_implementation="eager")
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    ids, mask = batch()
    positions = np.maximum(np.cumsum(mask, 1) - 1, 0)
    errs = max_errors(load_model(folder).forward(ids, attention_mask=mask), reference(hf.eval(), ids, mask, positions,
                                                                                      False), mask)
    assert max(errs.values()) <= 1e-4, errs
