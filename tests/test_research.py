"""The notes' practice agenda on models: logit lens, induction scores, W_OV / W_QK spectra,
the latent rank of the key cache. Known answers come from a GPT-2 with a planted induction
circuit (:func:`attngeom.models.planted_induction_model`) and from identities (the last
layer's lens is the model's logits; Eckart-Young); every function also runs on random GPT-2,
Llama and Qwen3 checkpoints built as in test_decoders (nothing is downloaded).
"""

import numpy as np
import pytest

import attngeom as ag
from attngeom.models import load_model, planted_induction_model
from checkpoints import assert_same_model

from builders import mixtral

RANDOM_LAYOUTS = ["gpt2", "llama", "qwen3"]


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    return load_model(planted_induction_model(tmp_path_factory.mktemp("planted") / "m"))


@pytest.fixture(scope="module")
def random_models(tmp_path_factory):
    """{layout: (transformers model, folder)} built lazily, once per module."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from builders import build

    cache = {}

    def get(layout):
        if layout not in cache:
            folder = tmp_path_factory.mktemp(layout) / "m"
            cache[layout] = (build(layout, folder), folder)
        return cache[layout]

    return get


def log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


# -- logit lens ---------------------------------------------------------------------------
@pytest.mark.parametrize("layout", RANDOM_LAYOUTS)
def test_last_layer_lens_is_the_logits_and_every_layer_matches_transformers(random_models, layout):
    import torch

    tmodel, folder = random_models(layout)
    ids = np.random.default_rng(3).integers(0, 97, 9)
    m = load_model(folder)
    lens = ag.logit_lens(m, ids, k=4)
    assert lens.top_ids.shape == (3, 9, 4) and lens.target_log_probs.shape == (3, 8)
    logp = log_softmax(m.forward(ids).logits.astype(np.float64))
    # the last layer's lens is the model's output, exact up to rounding
    np.testing.assert_allclose(lens.target_log_probs[-1], logp[np.arange(8), ids[1:]], rtol=0, atol=1e-5)
    np.testing.assert_array_equal(lens.top_ids[-1], np.argsort(-logp, axis=-1, kind="stable")[:, :4])
    np.testing.assert_allclose(lens.top_log_probs[-1], np.sort(logp, -1)[:, ::-1][:, :4], atol=1e-5)
    # every layer against transformers: its hidden states through its own final norm and lm_head
    with torch.no_grad():
        out = tmodel(input_ids=torch.tensor(ids[None]), output_hidden_states=True)
        norm = tmodel.transformer.ln_f if layout == "gpt2" else tmodel.model.norm
        for layer, h in enumerate(out.hidden_states):
            z = (h if layer == len(out.hidden_states) - 1 else norm(h))
            ref = log_softmax(tmodel.lm_head(z)[0].double().numpy())
            np.testing.assert_allclose(lens.target_log_probs[layer], ref[np.arange(8), ids[1:]], atol=1e-4)
            assert np.mean(lens.top_ids[layer, :, 0] == ref.argmax(-1)) == 1.0
    ranks = (logp[:-1] > logp[np.arange(8), ids[1:]][:, None]).sum(-1)
    np.testing.assert_array_equal(lens.target_ranks[-1], ranks)
    p = np.exp(logp)
    np.testing.assert_allclose(lens.entropy[-1], -(p * logp).sum(-1), atol=1e-4)


def test_lens_sees_the_planted_induction_head_only_after_layer_1(planted):
    rng = np.random.default_rng(0)
    s = rng.choice(np.arange(1, 48), 16, replace=False)
    ids = np.concatenate([[0], s, s])
    lens = ag.logit_lens(planted, ids, k=3, dtype=np.float64)
    second = np.arange(17, 32)  # positions of the second copy that predict a repeated token
    assert lens.target_log_probs[2, second].mean() > -0.5  # the model predicts the repeats
    assert (lens.target_ranks[2, second] == 0).all()
    assert lens.target_log_probs[:2, second].max() < -5  # the embedding and layer 0 do not
    s_ = lens.summary()
    assert s_["first_final_layer"] == 2 and s_["top1_L0"] < 0.1
    assert lens.top_tokens is None and lens.tokens is None  # no tokenizer files


def test_lens_with_a_tokenizer_and_its_plot(random_models, tmp_path):
    pytest.importorskip("matplotlib")
    from builders import with_tokenizer

    _, folder = random_models("llama")
    with_tokenizer(folder)
    lens = ag.logit_lens(folder, "the cat sat on the mat", k=2)
    assert lens.tokens == ["the", "cat", "sat", "on", "the", "mat"]
    assert len(lens.top_tokens) == 3 and len(lens.top_tokens[0]) == 6 and len(lens.top_tokens[0][0]) == 2
    assert all(isinstance(t, str) for t in lens.top_tokens[2][5])
    fig = lens.plot()
    labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert labels[0] == "the\u2192cat" and len(labels) == 5


def test_lens_bad_arguments(planted, tmp_path):
    with pytest.raises(ValueError, match="k must be an integer in 1..48"):
        ag.logit_lens(planted, [1, 2], k=0)
    with pytest.raises(ValueError, match="prompt"):
        ag.logit_lens(planted, [])
    with pytest.raises(ValueError, match="prompt: token ids must lie in 0..47"):
        ag.logit_lens(planted, [1, 99])
    with pytest.raises(ValueError, match="prompt: cannot tokenize"):
        ag.logit_lens(planted, "no tokenizer here")
    with pytest.raises(TypeError, match="model must be"):
        ag.logit_lens(None, [1, 2])
    with pytest.raises(ValueError, match="model: cannot load"):
        ag.logit_lens(tmp_path / "missing", [1, 2])
    with pytest.raises(ValueError, match="dtype"):
        ag.logit_lens(planted, [1, 2], dtype=np.int32)
    path = ag.models.packaged_model_path()
    if path is not None:
        with pytest.raises(ValueError, match="model: the logit lens needs a decoder with an unembedding"):
            ag.logit_lens(path, [101, 102])


# -- induction scores ---------------------------------------------------------------------
@pytest.mark.parametrize("n_repeats", [2, 3])
def test_planted_induction_and_previous_token_heads(planted, n_repeats):
    s = ag.induction_scores(planted, seq_len=16, n_repeats=n_repeats, n_sequences=3, bos=0, seed=1)
    assert s.induction.shape == s.previous_token.shape == (2, 4)
    assert s.induction[1, 0] > 0.99 and s.previous_token[0, 0] > 0.99
    others = np.ones((2, 4), bool)
    others[1, 0] = False
    assert s.induction[others].max() < 0.1  # random heads (and the previous-token head) score low
    others = np.ones((2, 4), bool)
    others[0, 0] = False
    assert s.previous_token[others].max() < 0.2
    assert s.previous_token_heads == [(0, 0)]
    # weights alone: head 1.0's keys read what head 0.0 writes (K-composition)
    assert s.k_composition.shape == (2, 4, 2, 4)
    assert np.unravel_index(np.argmax(s.k_composition), s.k_composition.shape) == (0, 0, 1, 0)
    assert s.k_composition_with_previous[1, 0] > 2 * np.delete(s.k_composition_with_previous[1], 0).max()
    assert s.top(2) [0][:2] == (1, 0)
    summary = s.summary()
    assert summary["best_induction_head"] == "1.0" and summary["best_previous_token_head"] == "0.0"
    assert s.token_ids.shape == (3, 1 + 16 * n_repeats) and (s.token_ids[:, 0] == 0).all()


@pytest.mark.parametrize("layout", RANDOM_LAYOUTS)
def test_induction_scores_on_random_checkpoints(random_models, layout):
    _, folder = random_models(layout)
    m = load_model(folder)
    T = 6
    s = ag.induction_scores(m, seq_len=T, n_repeats=2, n_sequences=2, seed=3)
    # the definition, straight from the attention matrices: the stripe at offset T - 1
    P = m.forward(s.token_ids).pattern.astype(np.float64)  # (L, b, H, n, n)
    q = np.arange(T, 2 * T)
    np.testing.assert_allclose(s.induction, P[..., q, q - T + 1].mean(axis=(1, 3)), atol=1e-6)
    t = np.arange(1, 2 * T)
    np.testing.assert_allclose(s.previous_token, P[..., t, t - 1].mean(axis=(1, 3)), atol=1e-6)
    H = m.heads
    np.testing.assert_allclose(s.k_composition, ag.composition_scores(H.W_Q, H.W_K, H.W_V, H.W_O, "K"))
    assert ((0 <= s.induction) & (s.induction <= 1)).all()


def test_induction_scores_defaults_fit_the_model(planted):
    """The default length is 50 where the model allows it, else what its 48 tokens and 60
    positions allow: 30 (two copies), 29 with a bos token."""
    s = ag.induction_scores(planted)
    assert s.token_ids.shape == (4, 60) and s.induction[1, 0] > 0.95  # 0.98 here (0.99 with a bos sink)
    assert ag.induction_scores(planted, bos=0).token_ids.shape == (4, 59)


def test_induction_bad_arguments(planted):
    with pytest.raises(ValueError, match="seq_len"):
        ag.induction_scores(planted, seq_len=1)
    with pytest.raises(ValueError, match="seq_len \\(48\\) must not exceed the 47 tokens"):
        ag.induction_scores(planted, seq_len=48, bos=0)
    with pytest.raises(ValueError, match="n_repeats"):
        ag.induction_scores(planted, seq_len=5, n_repeats=1)
    with pytest.raises(ValueError, match="exceeds the model's 60 positions"):
        ag.induction_scores(planted, seq_len=40, n_repeats=2)
    with pytest.raises(ValueError, match="bos"):
        ag.induction_scores(planted, seq_len=5, bos=48)
    with pytest.raises(TypeError, match="threshold"):
        ag.induction_scores(planted, seq_len=5, threshold="x")
    with pytest.raises(TypeError, match="seed"):
        ag.induction_scores(planted, seq_len=5, seed=1.5)
    with pytest.raises(ValueError, match="by must be"):
        ag.induction_scores(planted, seq_len=5).top(1, by="x")


# -- W_OV / W_QK spectra ----------------------------------------------------------------
@pytest.mark.parametrize("layout", RANDOM_LAYOUTS)
def test_weight_spectra_against_dense_products(random_models, layout):
    _, folder = random_models(layout)
    m = load_model(folder)
    s = ag.weight_spectra(m)
    H = m.heads
    ov = np.linalg.svd(H.W_V @ H.W_O, compute_uv=False)[..., :H.d_head]
    qk = np.linalg.svd(H.W_Q @ np.swapaxes(H.W_K, -1, -2), compute_uv=False)[..., :H.d_head]
    np.testing.assert_allclose(s.ov_singular_values, ov, rtol=1e-10, atol=1e-12 * ov.max())
    np.testing.assert_allclose(s.qk_singular_values, qk, rtol=1e-10, atol=1e-12 * qk.max())
    p = ov ** 2 / (ov ** 2).sum(-1, keepdims=True)
    np.testing.assert_allclose(s.ov_effective_rank, np.exp(-(p * np.log(p)).sum(-1)), rtol=1e-10)
    np.testing.assert_allclose(s.ov_energy, np.cumsum(ov ** 2, -1) / (ov ** 2).sum(-1, keepdims=True), rtol=1e-10)
    k90 = s.directions_for(0.9, which="qk")
    assert ((np.take_along_axis(s.qk_energy, k90[..., None] - 1, -1)[..., 0] >= 0.9 - 1e-12)).all()
    assert set(s.summary()) >= {"ov_effective_rank_mean", "qk_effective_rank_max"}


def test_planted_spectra_are_flat_copiers(planted):
    s = ag.weight_spectra(planted.heads)  # weights only
    # the planted OV circuits are scaled isometries of the 48 token directions: r_eff = 48, E_48 = 1
    np.testing.assert_allclose(s.ov_effective_rank[:, 0], 48.0, rtol=1e-9)
    assert (s.directions_for(1.0)[:, 0] == 48).all()
    assert (s.ov_singular_values[:, 0, 48:] < 1e-10 * s.ov_singular_values[:, 0, :1]).all()
    # previous-token head: W_QK = c^2 sum_{i=1..59} p(i) p(i-1)^T, 59 equal singular values
    np.testing.assert_allclose(s.qk_effective_rank[0, 0], 59.0, rtol=1e-9)
    with pytest.raises(ValueError, match="prompt needs a Model"):
        ag.weight_spectra(planted.heads, prompt=[1, 2])
    with pytest.raises(ValueError, match="level"):
        s.directions_for(1.5)


def test_spectral_diagnostics_figure_with_thinned_tokens(random_models):
    pytest.importorskip("matplotlib")
    from builders import with_tokenizer

    _, folder = random_models("qwen3")
    with_tokenizer(folder)
    text = " ".join(["the cat sat on the mat and the dog ran ."] * 11)[:-2]  # 120 tokens
    s = ag.weight_spectra(folder, prompt=text)
    assert s.routing.shape == (2, 4, 120, 120) and len(s.tokens) == 120
    fig = s.plot(1, 2)
    heat = fig.axes[2]
    labels = [t.get_text() for t in heat.get_xticklabels()]
    assert len(labels) == 60 and labels[:3] == ["the", "sat", "the"]  # every second token
    assert [t.get_text() for t in heat.get_yticklabels()][:2] == ["the", "sat"]
    small = ag.weight_spectra(folder, prompt="the cat sat")
    labels = [t.get_text() for t in small.plot(0, 0).axes[2].get_xticklabels()]
    assert labels == ["the", "cat", "sat"]
    with pytest.raises(ValueError, match="head"):
        s.plot(0, 4)


def test_token_ticks_thin_beyond_the_limit():
    pytest.importorskip("matplotlib")
    fig, ax = ag.plotting.axes_or_new(None)
    assert ag.plotting.token_ticks(ax, list("abcdef")).tolist() == [0, 1, 2, 3, 4, 5]
    where = ag.plotting.token_ticks(ax, [str(i) for i in range(61)], "y")
    assert where.tolist() == list(range(0, 61, 2))
    with pytest.raises(ValueError, match="axis"):
        ag.plotting.token_ticks(ax, ["a"], "z")


# -- latent rank of the key cache (MLA) ----------------------------------------------------
@pytest.mark.parametrize("layout", RANDOM_LAYOUTS)
def test_key_cache_eckart_young_is_exact(random_models, layout):
    _, folder = random_models(layout)
    m = load_model(folder)
    ids = np.random.default_rng(0).integers(0, 97, 12)
    cache = ag.latent_key_cache(m, ids, rank=3)
    f = m.forward(ids, dtype=np.float64)
    group = m.arch.n_heads // m.arch.n_kv_heads
    K = np.concatenate(list(f.k[1, ::group]), axis=-1)  # layer 1: (n, n_kv_heads * d_head)
    np.testing.assert_allclose(cache.keys[1], K, rtol=1e-12, atol=1e-12)
    u, sv, vh = np.linalg.svd(K, full_matrices=False)
    for r in range(sv.size + 1):  # the proposition, for every latent rank
        explicit = np.linalg.norm(K - (u[:, :r] * sv[:r]) @ vh[:r]) ** 2
        assert abs(cache.errors[1, r] - explicit) <= 1e-10 * cache.errors[1, 0]
        assert abs(cache.errors[1, r] - np.sum(sv[r:] ** 2)) <= 1e-12 * cache.errors[1, 0]
    for layer, fac in enumerate(cache.factorizations):
        assert fac.U.shape == (12, 3) and fac.Z.shape == (3, cache.keys.shape[-1])
        assert abs(fac.error - cache.errors[layer, 3]) <= 1e-10 * cache.errors[layer, 0]
    np.testing.assert_allclose(cache.relative_errors[:, 0], 1.0)
    assert (cache.relative_errors[:, -1] == 0).all() and (np.diff(cache.errors, axis=-1) <= 0).all()
    assert (cache.rank_for(0.01) <= cache.rank).all()


def _low_rank_keys(model, layout, rank):
    """Give every layer's key projection rank `rank` and no key bias."""
    import torch

    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for layer in (model.transformer.h if layout == "gpt2" else model.model.layers):
            if layout == "gpt2":
                w, b = layer.attn.c_attn.weight, layer.attn.c_attn.bias  # (d, 3d): columns [q | k | v]
                d = w.shape[0]
                w[:, d:2 * d] = torch.randn(d, rank, generator=g) @ torch.randn(rank, d, generator=g)
                b[d:2 * d] = 0
            else:
                w = layer.self_attn.k_proj.weight  # (out, in)
                w.copy_(torch.randn(w.shape[0], rank, generator=g) @ torch.randn(rank, w.shape[1], generator=g))
                if layer.self_attn.k_proj.bias is not None:
                    layer.self_attn.k_proj.bias.zero_()
    return model


@pytest.mark.parametrize("layout", ["gpt2", "llama"])
def test_planted_latent_rank_and_the_rotation(random_models, layout, tmp_path):
    tmodel, _ = random_models(layout)
    import copy

    _low_rank_keys(copy.deepcopy(tmodel), layout, 3).save_pretrained(tmp_path / "m", safe_serialization=True)
    ids = np.random.default_rng(0).integers(0, 97, 16)
    # the rank-3 products are stored in float32: rank 3 up to float32 rounding
    before = ag.latent_key_cache(tmp_path / "m", ids, rotary=False, rtol=1e-5)
    assert (before.rank == 3).all() and (before.singular_values[:, 2] > 1e-3 * before.singular_values[:, 0]).all()
    assert (before.relative_errors[:, 3] < 1e-11).all() and (before.rank_for(1e-10) == 3).all()
    after = ag.latent_key_cache(tmp_path / "m", ids, rtol=1e-5)
    if layout == "gpt2":  # no rotation: the cache is the same
        np.testing.assert_array_equal(after.keys, before.keys)
    else:  # RoPE mixes positions into the keys: the cache's latent rank grows (notes' challenge)
        assert (after.rank > 3).all()
    assert after.summary()["rotary"] is True


def test_latent_key_cache_bad_arguments_and_plot(planted):
    with pytest.raises(ValueError, match="rank"):
        ag.latent_key_cache(planted, np.arange(1, 5), rank=5)
    with pytest.raises(TypeError, match="rotary"):
        ag.latent_key_cache(planted, np.arange(1, 5), rotary="yes")
    with pytest.raises(ValueError, match="rtol"):
        ag.latent_key_cache(planted, np.arange(1, 5), rtol=-1.0)
    cache = ag.latent_key_cache(planted, np.arange(1, 5))
    with pytest.raises(ValueError, match="relative_error"):
        cache.rank_for(2.0)
    pytest.importorskip("matplotlib")
    assert len(cache.plot().axes[0].lines) == 2


# -- mixture of experts (Mixtral) --------------------------------------------------------
@pytest.mark.parametrize("precision", ["float32", "float64"])
def test_mixtral_forward_matches_transformers(tmp_path, precision):
    torch = pytest.importorskip("torch")
    from builders import batch, float64_everywhere

    model = mixtral(tmp_path / "m", dtype=precision)
    m = load_model(tmp_path / "m")
    assert m.arch.model_type == "mixtral" and m.arch.n_experts == 4 and m.arch.experts_per_token == 2
    ids, mask = batch()
    dt = np.float64 if precision == "float64" else np.float32
    f = m.forward(ids, attention_mask=mask, dtype=dt)
    positions = np.maximum(np.cumsum(mask, 1) - 1, 0)
    import contextlib
    ctx = float64_everywhere() if precision == "float64" else contextlib.nullcontext()
    with torch.no_grad(), ctx:
        out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask.astype(np.int64)),
                    position_ids=torch.tensor(positions), output_router_logits=True)
    tol = 1e-10 if precision == "float64" else 1e-4
    assert np.abs(f.logits - out.logits.numpy())[mask].max() < tol * max(1.0, np.abs(f.logits).max())
    router = np.stack([r.numpy().reshape(3, 7, 4) for r in out.router_logits])
    assert np.abs(f.router_logits - router)[:, mask].max() < tol
    assert f.router_logits.shape == (2, 3, 7, 4)
    single = m.forward(ids[0], dtype=dt)
    assert single.router_logits.shape == (2, 7, 4)


def test_router_statistics_on_a_random_mixtral(tmp_path):
    mixtral(tmp_path / "m")
    ids = np.random.default_rng(0).integers(0, 97, 20)
    s = ag.router_statistics(tmp_path / "m", ids)
    assert s.router_matrix.shape == (2, 20, 4) and s.k == 2 and s.sparsity == 0.5
    assert (np.count_nonzero(s.router_matrix, axis=-1) == 2).all()
    np.testing.assert_allclose(s.router_matrix.sum(-1), 1.0)
    np.testing.assert_array_equal(s.counts.sum(-1), [40, 40])
    np.testing.assert_allclose(s.router_matrix, ag.topk_router(s.router_logits, 2))
    for layer, g in enumerate(s.grams):
        np.testing.assert_allclose(g.gram, s.router_matrix[layer].T @ s.router_matrix[layer], rtol=1e-12)
        np.testing.assert_allclose(s.gram_spectrum[layer], np.linalg.eigvalsh(g.gram)[::-1], atol=1e-12)
    assert ((0.5 <= s.top_k_mass) & (s.top_k_mass <= 1)).all() and (s.entropy <= np.log(4) + 1e-12).all()
    assert set(s.summary()) >= {"imbalance_L0", "off_diagonal_mass_L1", "sparsity"}
    pytest.importorskip("matplotlib")
    assert len(s.plot().axes) >= 2


def test_planted_router_gives_the_balanced_lemma(tmp_path):
    mixtral(tmp_path / "m", top_k=1, planted=True)
    s = ag.router_statistics(tmp_path / "m", np.arange(16))  # token v routes to expert v mod 4
    np.testing.assert_array_equal(s.router_matrix[0].argmax(-1), np.arange(16) % 4)
    np.testing.assert_array_equal(s.counts[0], [4, 4, 4, 4])
    # the notes' lemma: disjoint, equal loads make R^T R = (k T / n_experts) I
    np.testing.assert_allclose(s.grams[0].gram, 4.0 * np.eye(4), atol=1e-12)
    assert s.grams[0].off_diagonal_mass == 0 and s.grams[0].imbalance == 0
    np.testing.assert_allclose(s.gram_spectrum[0], 4.0)
    assert s.top_k_mass[0] > 0.99  # a logit gap of 5 sqrt(32)


def test_router_statistics_needs_experts(planted):
    with pytest.raises(ValueError, match="model: router statistics need a mixture-of-experts model"):
        ag.router_statistics(planted, [1, 2])


def test_mixtral_fused_expert_tensors(tmp_path):
    """transformers >= 5 keeps experts fused in memory (gate_up_proj, down_proj); such
    checkpoints load to the same model."""
    import json

    mixtral(tmp_path / "m")
    from attngeom.models import read_safetensors

    t = read_safetensors(tmp_path / "m" / "model.safetensors")
    fused = {}
    for name, value in t.items():
        if ".block_sparse_moe." not in name:
            fused[name] = value
    for i in range(2):
        s = f"model.layers.{i}.block_sparse_moe."
        fused[f"model.layers.{i}.mlp.gate.weight"] = t[s + "gate.weight"]
        fused[f"model.layers.{i}.mlp.experts.gate_up_proj"] = np.stack(
            [np.concatenate([t[f"{s}experts.{e}.w1.weight"], t[f"{s}experts.{e}.w3.weight"]]) for e in range(4)])
        fused[f"model.layers.{i}.mlp.experts.down_proj"] = np.stack([t[f"{s}experts.{e}.w2.weight"] for e in range(4)])
    assert_same_model(tmp_path / "m", tmp_path / "f", fused)
    assert json.load(open(tmp_path / "f" / "config.json"))["model_type"] == "mixtral"
