"""Checkpoints of GPT-2, Llama (with Llama 3 and YaRN rope scaling), Mistral, Qwen2, Qwen3 and
BERT through ``ag.load_model``, on random checkpoints written with NumPy (tests/checkpoints.py;
nothing is downloaded and no torch is needed): layouts, the Hugging Face cache, tokenizers,
refused checkpoints and inputs, half-precision and memory-mapped weights, the heads' queries,
keys and bilinear forms, and the heads report. The forward pass against transformers is
tests/test_decoders_transformers.py; against the architecture written out in NumPy,
tests/test_long_context.py.
"""
import json
import os

import numpy as np
import pytest

import attngeom as ag
from attngeom.models import load_model
from checkpoints import RANDOM_LAYOUTS, RANDOM_VOCAB as VOCAB, random_checkpoint, random_tensors, with_tokenizer
from reference import decoder_logits


def test_unpadded_defaults_and_layouts(tmp_path):
    """1-D input has no batch axis; q, k, v reproduce each layer's attention with the kernel."""
    random_checkpoint("qwen3", tmp_path / "q")
    m = load_model(tmp_path / "q")
    ids = np.arange(1, 9)
    f = m.forward(ids, dtype=np.float64)
    assert f.logits.shape == (8, VOCAB) and f.q.shape == (2, 4, 8, 16) and f.resid_pre.shape == (2, 8, 32)
    assert f.ln_final.shape == (8, 32)
    assert f.positions.tolist() == list(range(8)) and f.attention_mask.all()
    for layer in range(2):
        _, P = ag.softmax_attention(f.q[layer], f.k[layer], f.v[layer], causal=True, scale=f.scale[layer],
                                    return_routing=True)
        np.testing.assert_allclose(P, f.pattern[layer], atol=1e-13)
        # keys and values come in groups: heads 0, 1 read kv head 0
        np.testing.assert_array_equal(f.k[layer, 0], f.k[layer, 1])
        assert not np.allclose(f.k[layer, 1], f.k[layer, 2])
    # the rotation is the only difference between q and q_prerotary; position 0 is unrotated
    np.testing.assert_allclose(f.q[:, :, 0], f.q_prerotary[:, :, 0], atol=1e-15)
    np.testing.assert_allclose(np.linalg.norm(f.q, axis=-1), np.linalg.norm(f.q_prerotary, axis=-1), rtol=1e-12)
    assert not np.allclose(f.q[:, :, 1:], f.q_prerotary[:, :, 1:])


def test_hugging_face_cache(tmp_path, monkeypatch):
    random_checkpoint("gpt2", tmp_path / "src")
    hub = tmp_path / "home" / "hub"
    repo = hub / "models--tiny-org--tiny-gpt2"
    snap = repo / "snapshots" / "0123abcd"
    os.makedirs(snap)
    os.makedirs(repo / "blobs")
    os.makedirs(repo / "refs")
    (repo / "refs" / "main").write_text("0123abcd")
    for name in os.listdir(tmp_path / "src"):  # the cache stores blobs and links them from the snapshot
        os.replace(tmp_path / "src" / name, repo / "blobs" / name)
        os.symlink(os.path.join("..", "..", "blobs", name), snap / name)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    m = load_model("tiny-org/tiny-gpt2")
    assert m.arch.model_type == "gpt2" and os.path.samefile(m.folder, snap)
    assert m.forward(np.array([1, 2, 3])).logits.shape == (3, VOCAB)
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    assert load_model("tiny-org/tiny-gpt2@main").arch.n_layers == 2
    with pytest.raises(ValueError, match="not in the Hugging Face cache.*models--tiny-org--other.*hf download "
                                         "tiny-org/other"):
        load_model("tiny-org/other")
    with pytest.raises(ValueError, match="0123zzzz"):
        load_model("tiny-org/tiny-gpt2@0123zzzz")


def test_tokenizer(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    random_checkpoint("llama", tmp_path / "m")
    words = ["<unk>", "the", "cat", "sat", "on", "mat", "."]
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "m" / "tokenizer.json"))
    m = load_model(tmp_path / "m")
    ids, tokens = m.tokenize("the cat sat on the mat.")
    assert ids == [1, 2, 3, 4, 1, 5, 6] and tokens[:3] == ["the", "cat", "sat"]
    assert m.tokenize("the cat sat on the mat.", max_length=3)[0] == [1, 2, 3]
    np.testing.assert_array_equal(m.forward(ids).logits, m.forward(np.array(ids)).logits)
    os.remove(tmp_path / "m" / "tokenizer.json")
    with pytest.raises(ValueError, match="no tokenizer.json"):
        load_model(tmp_path / "m").tokenize("the cat")


def _edit_config(folder, **changes):
    path = os.path.join(folder, "config.json")
    cfg = json.load(open(path))
    cfg.update(changes)
    json.dump(cfg, open(path, "w"))


def test_bad_checkpoints(tmp_path):
    random_checkpoint("llama", tmp_path / "m")
    _edit_config(tmp_path / "m", model_type="gemma")
    with pytest.raises(ValueError, match="model_type 'gemma'.*supported model types: bert, gpt2, llama, mistral, "
                                         "qwen2, qwen3"):
        load_model(tmp_path / "m")
    _edit_config(tmp_path / "m", model_type="llama", num_key_value_heads=4)
    with pytest.raises(ValueError, match="k_proj.weight' in .*model.safetensors' has shape \\(16, 32\\), but "
                                         "config.json .*num_key_value_heads=4.* implies \\(32, 32\\)"):
        load_model(tmp_path / "m")
    _edit_config(tmp_path / "m", num_key_value_heads=2, intermediate_size=50)
    with pytest.raises(ValueError, match="gate_proj.weight.*intermediate_size=50"):
        load_model(tmp_path / "m")
    _edit_config(tmp_path / "m", intermediate_size=48, num_hidden_layers=3)
    with pytest.raises(ValueError, match="num_hidden_layers is 3, but the checkpoint has 2 layers"):
        load_model(tmp_path / "m")
    _edit_config(tmp_path / "m", num_hidden_layers=2, rope_parameters={"rope_type": "dynamic", "rope_theta": 1e4,
                                                                       "factor": 2.0})
    with pytest.raises(ValueError, match="rope_type 'dynamic' is not supported .*default, linear, llama3, yarn"):
        load_model(tmp_path / "m")
    _edit_config(tmp_path / "m", rope_parameters={"rope_type": "yarn", "rope_theta": 1e4})
    with pytest.raises(ValueError, match="rope_type 'yarn' needs a number 'factor'"):
        load_model(tmp_path / "m")
    _edit_config(tmp_path / "m", rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0,
                                                  "mscale": "big"})
    with pytest.raises(ValueError, match="rope_parameters 'mscale' must be a non-negative number"):
        load_model(tmp_path / "m")
    os.remove(tmp_path / "m" / "config.json")
    with pytest.raises(ValueError, match="config.json is needed"):
        load_model(tmp_path / "m")


def test_bad_token_ids_and_masks(tmp_path):
    random_checkpoint("gpt2", tmp_path / "g")
    m = load_model(tmp_path / "g")
    with pytest.raises(ValueError, match="token_ids must lie in 0..96 \\(config.json vocab_size 97\\), got 0..97"):
        m.forward(np.array([0, 97]))
    with pytest.raises(ValueError, match="token_ids must lie in 0..96"):
        m.forward(np.array([-1, 3]))
    with pytest.raises(ValueError, match="integer array"):
        m.forward(np.array([0.0, 1.0]))
    with pytest.raises(ValueError, match="integer array"):
        m.forward(np.zeros((1, 1, 2), int))
    with pytest.raises(ValueError, match="17 tokens in a sequence, more than the 16 positions .*n_positions"):
        m.forward(np.zeros(17, int))
    # padding does not count against the table
    assert m.forward(np.zeros((1, 18), int), attention_mask=np.r_[np.zeros(2), np.ones(16)][None]).logits.shape \
        == (1, 18, VOCAB)
    with pytest.raises(ValueError, match="attention_mask must have token_ids' shape"):
        m.forward(np.zeros((2, 4), int), attention_mask=np.ones(4))
    with pytest.raises(ValueError, match="0/1"):
        m.forward(np.zeros(4, int), attention_mask=np.array([1, 2, 1, 1]))
    with pytest.raises(ValueError, match="sequence 1 has no real token"):
        m.forward(np.zeros((2, 4), int), attention_mask=np.array([[1, 1, 1, 1], [0, 0, 0, 0]]))
    with pytest.raises(ValueError, match="dtype must be float32, float64 or .bfloat16."):
        m.forward(np.zeros(4, int), dtype=np.float16)


@pytest.mark.parametrize("stored", ["F16", "BF16"])
def test_half_precision_weights(tmp_path, stored):
    """float16 / bfloat16 checkpoints: the forward on the rounded weights, computed in float64, equals the
    float64 forward on the same weights written in float32 (the widening is exact)."""
    random_checkpoint("qwen2", tmp_path / "m")
    path = tmp_path / "m" / "model.safetensors"
    tensors = ag.models.read_safetensors(path)
    ag.models.write_safetensors(path, tensors, dtype=stored)
    half = load_model(tmp_path / "m").forward(np.arange(6), dtype=np.float64)
    widened = ag.models.read_safetensors(path)
    assert all(t.dtype == (np.float16 if stored == "F16" else np.float32) for t in widened.values())
    ag.models.write_safetensors(path, {k: v.astype(np.float32) for k, v in widened.items()})
    full = load_model(tmp_path / "m").forward(np.arange(6), dtype=np.float64)
    np.testing.assert_array_equal(half.logits, full.logits)


def _mapped_file(a):
    """The memory map under an array (following .base), or None when it owns its data."""
    while a is not None:
        if isinstance(a, np.memmap):
            return a.filename
        a = a.base
    return None


@pytest.mark.parametrize("stored", ["F32", "BF16"])
def test_weights_are_memory_mapped(tmp_path, stored):
    """The decoder's weights are read-only views of the file (nothing copied at load); bfloat16
    stays 2-byte bits, widened when a layer runs; rewriting the file leaves a loaded model intact."""
    random_checkpoint("qwen3", tmp_path / "m")
    path = tmp_path / "m" / "model.safetensors"
    ag.models.write_safetensors(path, ag.models.read_safetensors(path), dtype=stored)
    m = load_model(tmp_path / "m")
    layer = m.decoder.w["layers"][0]
    for key in ("q", "k", "v", "o", "gate", "up", "down", "ln1_w", "q_norm"):
        w = layer[key]
        if stored == "BF16":
            assert isinstance(w, ag.models.BFloat16Array) and w.bits.dtype == np.uint16
            w = w.bits
        assert os.path.samefile(_mapped_file(w), path), key
        assert not w.flags.writeable
    before = m.forward(np.arange(5)).logits
    if stored == "F32":
        ids = np.arange(5)
        want = decoder_logits(random_tensors("qwen3"), RANDOM_LAYOUTS["qwen3"], ids, rows=ids)
        np.testing.assert_allclose(before, want, rtol=0, atol=1e-5 * np.abs(want).max())
    ag.models.write_safetensors(path, {"unrelated": np.ones(3, np.float32)})  # the old file stays mapped
    np.testing.assert_array_equal(m.forward(np.arange(5)).logits, before)


# -- RoPE-correct geometry ---------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["llama3", "llama_yarn", "qwen2", "qwen3", "gpt2"])
def test_heads_use_the_models_queries_and_keys(tmp_path, layout):
    """queries_keys + softmax_attention reproduce the model's own attention (the issue's report:
    un-rotated queries and keys gave patterns off by 0.2-0.5 on a random Llama)."""
    random_checkpoint(layout, tmp_path / "m")
    m = load_model(tmp_path / "m")
    f = m.forward(np.arange(3, 12), dtype=np.float64)
    H = m.heads
    assert (H.rotary is not None) == (layout != "gpt2") and (H.q_norm is not None) == (layout == "qwen3")
    for layer in range(2):
        x = f.attn_in[layer]
        q, k = H.queries_keys(x, layer)
        np.testing.assert_allclose(q, f.q[layer], atol=1e-12)
        np.testing.assert_allclose(k, f.k[layer], atol=1e-12)
        q0, k0 = H.queries_keys(x, layer, rotary=False)
        np.testing.assert_allclose(q0, f.q_prerotary[layer], atol=1e-12)
        _, P = ag.softmax_attention(q, k, None, causal=True, return_routing=True)
        np.testing.assert_allclose(P, f.pattern[layer], atol=1e-12)
        if layout != "gpt2":
            _, P0 = ag.softmax_attention(q0, k0, None, causal=True, return_routing=True)
            assert np.abs(P0 - f.pattern[layer]).max() > 1e-3  # the rotation matters
    # the data diagnostics see the same routing matrices
    d = H.diagnostics(f.attn_in)
    s = np.linalg.svd(f.pattern, compute_uv=False)  # (L, H, n)
    np.testing.assert_allclose(d.routing_singular_values[:, :, 0], s, atol=1e-10)
    np.testing.assert_allclose(d.radius_mean, np.linalg.norm(f.q, axis=-1).mean(-1) / np.sqrt(H.d_head), rtol=1e-12)


@pytest.mark.parametrize("layout", ["llama", "qwen3"])
def test_bilinear_at_an_offset(tmp_path, layout):
    random_checkpoint(layout, tmp_path / "m")
    m = load_model(tmp_path / "m")
    f = m.forward(np.arange(10, 19), dtype=np.float64)
    H, layer, head = m.heads, 1, 3
    x = f.attn_in[layer]
    logits = f.q[layer, head] @ f.k[layer, head].T  # q_i . k_j
    if layout == "qwen3":  # normalised per token: B carries the gains, the rms factors stay outside
        g, n = H.W_Q[layer, head], H.W_K[layer, head]
        rq = np.sqrt(np.mean((x @ g) ** 2, -1) + H.norm_eps)
        rk = np.sqrt(np.mean((x @ n) ** 2, -1) + H.norm_eps)
        logits = logits * rq[:, None] * rk[None, :]
    for i, j in [(4, 4), (6, 2), (8, 0), (2, 7)]:
        B = H.bilinear(layer, head, offset=i - j)
        assert abs(x[i] @ B @ x[j] - logits[i, j]) < 1e-10 * max(1, abs(logits[i, j]))
    np.testing.assert_allclose(H.bilinear(layer, head), H.W_Q[layer, head] @ np.diag(
        H.q_norm[layer] * H.k_norm[layer] if layout == "qwen3" else np.ones(H.d_head)) @ H.W_K[layer, head].T,
        atol=1e-12)
    # per-frequency pairs add up to B(delta), each with its own rank <= 2 spectrum
    pairs = H.bilinear_pairs(layer, head, offset=5)
    blocks = np.einsum("pma,pab,pnb->pmn", pairs.W_Q, H.rotary.matrix(5)[np.c_[np.arange(H.d_head // 2),
                                                                              np.arange(H.d_head // 2) + H.d_head // 2][:, :, None],
                                                                       np.c_[np.arange(H.d_head // 2),
                                                                             np.arange(H.d_head // 2) + H.d_head // 2][:, None, :]],
                       pairs.W_K)
    np.testing.assert_allclose(blocks.sum(0), H.bilinear(layer, head, offset=5), atol=1e-12)
    np.testing.assert_allclose(pairs.singular_values, np.linalg.svd(blocks, compute_uv=False)[:, :2], atol=1e-12)
    np.testing.assert_allclose(pairs.frequencies, H.rotary.inv_freq)


def test_bilinear_of_models_without_rotation(tmp_path):
    random_checkpoint("gpt2", tmp_path / "g")
    H = load_model(tmp_path / "g").heads
    np.testing.assert_array_equal(H.bilinear(0, 1, offset=3), H.W_Q[0, 1] @ H.W_K[0, 1].T)
    with pytest.raises(ValueError, match="needs a rotary model"):
        H.bilinear_pairs(0, 1)
    with pytest.raises(ValueError, match="2 layers x 4 heads"):
        H.bilinear(2, 0)


def _cli_heads(tmp_path, layout, text):
    """`attngeom heads` on a random checkpoint of that layout with ``text`` in a file, into tmp_path / "r"."""
    pytest.importorskip("matplotlib")
    random_checkpoint(layout, tmp_path / "m")
    with_tokenizer(tmp_path / "m")
    (tmp_path / "text.txt").write_text(text)
    from attngeom import cli
    assert cli.main(["heads", str(tmp_path / "m"), "--text", str(tmp_path / "text.txt"), "--heads", "1.2",
                     "--out", str(tmp_path / "r")]) == 0


@pytest.mark.parametrize("layout", ["llama", "qwen3"])
def test_cli_heads_on_decoders(tmp_path, layout, capsys):
    _cli_heads(tmp_path, layout, "the cat sat on the mat and the dog ran .")
    assert f"{layout} model, 2 layers x 4 heads (kv heads 2)" in capsys.readouterr().out  # its model_type
    assert {"heads.json", "attention_L1_H2.png"} <= set(os.listdir(tmp_path / "r"))
    report = json.load(open(tmp_path / "r" / "heads.json"))
    s = report["summary"]
    assert s["rotary"] is True and s["qk_norm"] == (layout == "qwen3") and "offset 0" in s["bilinear_note"]
    assert s["n_tokens"] == 11 and len(report["heads"]) == 8
    # the routing ranks in the report are those of the model's own attention
    from attngeom.models import text_activations
    x, tokens = text_activations(tmp_path / "m", "the cat sat on the mat and the dog ran .")
    f = load_model(tmp_path / "m").forward(np.array([1, 2, 3, 4, 1, 5, 6, 1, 7, 8, 9]), dtype=np.float64)
    np.testing.assert_allclose(x[:, 0], f.attn_in, atol=1e-12)
    ranks = np.linalg.svd(f.pattern, compute_uv=False)
    row = next(r for r in report["heads"] if (r["layer"], r["head"]) == (1, 2))
    assert abs(row["routing_effective_rank_mean"] - ag.effective_rank(ranks[1, 2], kind="entropy", spectrum=True)) \
        < 1e-6


def test_unknown_rotation_warns(tmp_path):
    random_checkpoint("llama", tmp_path / "m")
    _edit_config(tmp_path / "m", model_type=None)
    with pytest.warns(UserWarning, match="rotary embedding is unknown"):
        H = ag.load_heads(tmp_path / "m")
    assert H.rotary is None and H.summary()["rotary"] is False


def test_head_diagnostics_with_given_queries_and_keys():
    rng = np.random.default_rng(0)
    wq, wk = rng.standard_normal((2, 3, 8, 4))  # 3 heads
    x = rng.standard_normal((2, 5, 8))  # 2 sequences of 5 tokens
    q, k = x[None] @ wq[:, None], x[None] @ wk[:, None]  # (3, 2, 5, 4)
    a = ag.head_diagnostics(wq, wk, x=x, causal=True)
    b = ag.head_diagnostics(wq, wk, q=q, k=k, causal=True)
    np.testing.assert_allclose(a.routing_singular_values, b.routing_singular_values, atol=1e-12)
    np.testing.assert_allclose(a.radius_mean, b.radius_mean, rtol=1e-12)
    assert [t.rank for t in a.tilt] == [t.rank for t in b.tilt]
    with pytest.raises(ValueError, match="q and k must be given together"):
        ag.head_diagnostics(wq, wk, q=q)
    with pytest.raises(ValueError, match="give x or \\(q, k\\), not both"):
        ag.head_diagnostics(wq, wk, x=x, q=q, k=k)
    with pytest.raises(ValueError, match="q and k must have one shape"):
        ag.head_diagnostics(wq, wk, q=q, k=k[..., :3])


@pytest.mark.parametrize("layout", ["gpt2", "llama", "qwen3"])
def test_heads_report_on_decoders(tmp_path, layout, capsys):
    """The full report (two texts from one paragraph file) on random GPT-2, Llama and Qwen3 checkpoints."""
    _cli_heads(tmp_path, layout, "the cat sat on the mat .\n\nthe dog ran and the cat sat .\n")
    assert "2 texts (15 tokens, 7-8 per text" in capsys.readouterr().out
    assert {"heads.json", "attention.npz", "cross_layer.png", "layer_head_grids.png", "attention_L1_H2.png",
            "laplace_radon_L1_H2.png", "summary.md", "report.html"} <= set(os.listdir(tmp_path / "r"))
    data = json.load(open(tmp_path / "r" / "heads.json"))
    assert data["tokens"][1][:3] == ["the", "dog", "ran"] and len(data["heads"]) == 8
    with np.load(tmp_path / "r" / "attention.npz") as z:
        P = z["attention_1"]
    # the saved attention is the model's own (causal) attention
    f = load_model(tmp_path / "m").forward(np.array([1, 7, 8, 6, 1, 2, 3, 9]), dtype=np.float64)
    np.testing.assert_allclose(P, f.pattern, atol=1e-5)
    row = next(r for r in data["heads"] if (r["layer"], r["head"]) == (1, 2))
    assert 0 < row["attention_entropy"] < np.log(8) and row["attention_entropy_spread"] >= 0