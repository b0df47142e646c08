"""Multi-head latent attention (DeepSeek-V2): the forward pass against transformers on tiny
random checkpoints built offline with save_pretrained (as in test_decoders), the latent rank
of the cached c_KV and the Eckart-Young errors of the key cache rebuilt from it (the notes'
MLA proposition), on random weights and on a planted low-rank latent, DeepSeek's routing,
and the configurations that are refused.

float32: logits, hidden states and attentions to <= 1e-4; float64 to <= 1e-10 (the reference
run with every float32 upcast inside transformers redirected to float64).
"""
import contextlib
import json
import os

import numpy as np
import pytest

import attngeom as ag
from attngeom.models import load_heads, load_model
from attngeom.models.nn.rotary import Rotary

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from builders import (HEADS, KV_LORA, NOPE, ROPE, V_DIM, VOCAB, batch, deepseek, deepseek_config,  # noqa: E402
                      float64_everywhere, max_errors, reference, transformers_hidden)


VARIANTS = {
    "q_lora": {},
    # DeepSeek-V2's released configs use YaRN with mscale = mscale_all_dim = 0.707 (attention factor 1,
    # logit scale mscale^2); here unequal, so both factors matter
    "yarn": dict(rope_parameters={"rope_type": "yarn", "rope_theta": 500.0, "factor": 8.0, "beta_fast": 4.0,
                                  "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 0.5,
                                  "original_max_position_embeddings": 16}, max_position_embeddings=128),
    "no_q_lora_grouped": dict(q_lora_rank=None, topk_method="group_limited_greedy", n_group=2, topk_group=1,
                              first_k_dense_replace=0, n_shared_experts=2, attention_bias=True),
}


@pytest.mark.parametrize("precision", ["float32", "float64"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_forward_matches_transformers(tmp_path, variant, precision):
    model = deepseek(tmp_path / "m", precision, **VARIANTS[variant])
    m = load_model(tmp_path / "m")
    a = m.arch
    assert a.model_type == "deepseek_v2" and a.mla["kv_lora_rank"] == KV_LORA and a.d_head == NOPE + ROPE
    assert a.moe_layers == ((0, 1) if variant == "no_q_lora_grouped" else (1,)) and not a.router_normalized
    dt = np.float64 if precision == "float64" else np.float32
    tol = 1e-10 if precision == "float64" else 1e-4
    ids, mask = batch()
    positions = np.maximum(np.cumsum(mask, 1) - 1, 0)
    f = m.forward(ids, attention_mask=mask, dtype=dt)
    assert f.q.shape == (2, 3, HEADS, 7, NOPE + ROPE) and f.v.shape == (2, 3, HEADS, 7, V_DIM)
    assert f.kv_latent.shape == (2, 3, 7, KV_LORA) and f.rope_keys.shape == (2, 3, 7, ROPE)
    assert f.resid_pre.dtype == f.ln_final.dtype == dt
    if variant == "yarn":  # mscale(s, m) = 0.1 m ln s + 1: logit scale mscale(8, 0.5)^2, rotary factor the ratio
        assert f.scale[0] == pytest.approx((NOPE + ROPE) ** -0.5 * (0.05 * np.log(8) + 1) ** 2, rel=1e-12, abs=0)
        assert m.decoder.rotary.attention_factor == pytest.approx((0.1 * np.log(8) + 1) / (0.05 * np.log(8) + 1))
        default = m.decoder.rotary.inv_freq / 500.0 ** -(np.arange(ROPE // 2) * 2 / ROPE)
        assert default[0] == 1 and default[-1] == pytest.approx(1 / 8)  # fast pair kept, slow pair interpolated
    errs = max_errors(f, reference(model, ids, mask, positions, precision == "float64"), mask)
    print(variant, precision, {k: f"{v:.2e}" for k, v in errs.items()})
    assert max(errs.values()) <= tol, errs
    # router logits of the MoE layers, and the experts each token is sent to
    ctx = float64_everywhere() if precision == "float64" else contextlib.nullcontext()
    chosen = []
    hooks = [layer.mlp.gate.register_forward_hook(lambda mod, inp, out: chosen.append(out))
             for layer in model.model.layers if hasattr(layer.mlp, "gate")]
    with torch.no_grad(), ctx:
        out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask.astype(np.int64)),
                    position_ids=torch.tensor(positions), output_router_logits=True)
    for h in hooks:
        h.remove()
    router = np.stack([r.numpy().reshape(3, 7, 4) for r in out.router_logits])
    assert f.router_logits.shape == (len(a.moe_layers), 3, 7, 4)
    assert np.abs(f.router_logits - router)[:, mask].max() <= tol
    from attngeom.models.nn.moe import route
    for layer, (_, weights, indices) in enumerate(chosen):
        R = route(f.router_logits[layer].reshape(-1, 4), a)
        expected = np.zeros_like(R)
        np.put_along_axis(expected, indices.numpy(), weights.numpy(), -1)
        keep = mask.reshape(-1)
        assert np.abs(R - expected)[keep].max() <= tol
    # one unpadded sequence alone gives its rows of the batch
    one = m.forward(ids[1, 2:], dtype=dt)
    assert one.kv_latent.shape == (2, 5, KV_LORA) and one.router_logits.shape[1:] == (5, 4)
    np.testing.assert_allclose(transformers_hidden(one), transformers_hidden(f)[:, 1, 2:], atol=10 * tol, rtol=0)


def test_queries_keys_and_latent_reproduce_the_layer(tmp_path):
    """q, k, v reproduce each layer's attention through the kernel; k's content columns are
    c_KV W_UK, its rotary columns one key shared by every head, rotated in neighbour pairs."""
    deepseek(tmp_path / "m")
    m = load_model(tmp_path / "m")
    ids = np.arange(1, 10)
    f = m.forward(ids, dtype=np.float64)
    for layer in range(2):
        _, P = ag.softmax_attention(f.q[layer], f.k[layer], f.v[layer], causal=True, scale=f.scale[layer],
                                    return_routing=True)
        np.testing.assert_allclose(P, f.pattern[layer], atol=1e-13)
        kv_b = np.asarray(m.decoder.w["layers"][layer]["kv_b"], np.float64).reshape(KV_LORA, HEADS, NOPE + V_DIM)
        content = np.einsum("nc,chd->hnd", f.kv_latent[layer], kv_b[:, :, :NOPE])
        np.testing.assert_allclose(f.k[layer, :, :, :NOPE], content, atol=1e-12)
        np.testing.assert_allclose(f.v[layer], np.einsum("nc,chd->hnd", f.kv_latent[layer], kv_b[:, :, NOPE:]),
                                   atol=1e-12)
        for h in range(HEADS):
            np.testing.assert_array_equal(f.k_prerotary[layer, h, :, NOPE:], f.rope_keys[layer])
        rotary = Rotary(m.decoder.rotary.inv_freq, interleaved=True)
        np.testing.assert_allclose(f.k[layer, 0, :, NOPE:], rotary.rotate(f.rope_keys[layer], np.arange(9)),
                                   atol=1e-13)
    assert f.scale[0] == pytest.approx((NOPE + ROPE) ** -0.5)
    np.testing.assert_array_equal(f.q[:, :, 0], f.q_prerotary[:, :, 0])  # position 0 is not rotated
    assert not np.allclose(f.q[:, :, 1:, NOPE:], f.q_prerotary[:, :, 1:, NOPE:])
    np.testing.assert_array_equal(f.q[..., :NOPE], f.q_prerotary[..., :NOPE])  # content columns never rotate


def test_interleaved_rotary_is_the_complex_product():
    rng = np.random.default_rng(0)
    theta = np.array([1.0, 0.3, 0.01])
    x = rng.standard_normal((5, 6))
    pos = np.arange(5)
    r = Rotary(theta, interleaved=True)
    z = (x[:, 0::2] + 1j * x[:, 1::2]) * np.exp(1j * pos[:, None] * theta)
    expected = np.stack([z.real, z.imag], axis=-1).reshape(5, 6)
    np.testing.assert_allclose(r.rotate(x, pos), expected, atol=1e-15)
    for m in range(5):
        np.testing.assert_allclose(x[m] @ r.matrix(m), expected[m], atol=1e-15)
    R = r.matrix(3)
    np.testing.assert_allclose(R @ R.T, np.eye(6), atol=1e-15)
    np.testing.assert_allclose(r.matrix(5) @ r.matrix(2).T, R, atol=1e-14)
    # the same rotation as rotate_half after de-interleaving the pairs
    order = np.concatenate([np.arange(0, 6, 2), np.arange(1, 6, 2)])
    np.testing.assert_allclose(Rotary(theta).rotate(x[:, order], pos), expected[:, order], atol=1e-15)


# -- latent rank of the cache ---------------------------------------------------------------
N_TOKENS = 16  # > KV_LORA + ROPE, so the rank bounds are attained on random weights


def _check_latent_errors(cache):
    """The three facts about latent_errors (module docstring of attngeom.models.latent)."""
    L = cache.keys.shape[0]
    k = cache.errors.shape[1] - 1
    for layer in range(L):
        total = cache.errors[layer, 0]
        s = cache.kv_latent_singular_values[layer]
        kv_b = cache.kv_b[layer]
        W_UK = kv_b.reshape(KV_LORA, HEADS, NOPE + V_DIM)[:, :, :NOPE].reshape(KV_LORA, -1)
        norm2 = np.linalg.norm(W_UK, 2) ** 2
        c = cache.kv_latent[layer]
        u, _, vh = np.linalg.svd(c, full_matrices=False)
        keys = cache.keys[layer].reshape(N_TOKENS, HEADS, NOPE + ROPE)
        for r in range(s.size + 1):
            # explicit: rebuild the content keys from the rank-r latent
            rebuilt = keys.copy()
            c_r = (u[:, :r] * s[:r]) @ vh[:r]
            rebuilt[:, :, :NOPE] = (c_r @ W_UK).reshape(N_TOKENS, HEADS, NOPE)
            explicit = np.sum((keys - rebuilt) ** 2)
            assert abs(cache.latent_errors[layer, r] - explicit) <= 1e-10 * total
            tail = np.sum(s[r:] ** 2)
            assert cache.latent_errors[layer, r] <= norm2 * tail * (1 + 1e-10) + 1e-12 * total
            assert cache.latent_errors[layer, r] >= cache.errors[layer, min(r + ROPE, k)] - 1e-10 * total
        rank = cache.kv_latent_rank[layer]
        assert (cache.latent_errors[layer, rank:] <= 1e-20 * total + 1e-10 * cache.latent_errors[layer, 0]).all()


def _with_kv_b(cache, model):
    cache.kv_b = [np.asarray(model.decoder.w["layers"][i]["kv_b"], np.float64) for i in range(model.n_layers)]
    return cache


@pytest.mark.parametrize("rotary", [True, False])
def test_latent_rank_of_a_random_deepseek(tmp_path, rotary):
    deepseek(tmp_path / "m")
    m = load_model(tmp_path / "m")
    ids = np.random.default_rng(0).integers(0, VOCAB, N_TOKENS)
    cache = _with_kv_b(ag.latent_key_cache(m, ids, rotary=rotary, rank=3), m)
    f = m.forward(ids, dtype=np.float64)
    np.testing.assert_array_equal(cache.kv_latent, f.kv_latent)
    assert cache.keys.shape == (2, N_TOKENS, HEADS * (NOPE + ROPE))
    assert cache.kv_latent_singular_values.shape == (2, KV_LORA)
    # the cached latent has full rank d_c; the expanded cache rank d_c + d_rope, rotated or not
    assert (cache.kv_latent_rank == KV_LORA).all()
    assert (cache.rank == KV_LORA + ROPE).all()
    assert (cache.singular_values[:, KV_LORA + ROPE - 1] > 1e-6 * cache.singular_values[:, 0]).all()
    assert (cache.relative_errors[:, KV_LORA + ROPE] < 1e-20).all()
    assert (0 < cache.kv_latent_effective_rank).all() and (cache.kv_latent_effective_rank <= KV_LORA).all()
    _check_latent_errors(cache)
    assert cache.factorizations[0].U.shape == (N_TOKENS, 3)
    summary = cache.summary()
    assert summary["kv_latent_rank_L1"] == KV_LORA and summary["rank_L0"] == KV_LORA + ROPE


def test_planted_low_rank_latent(tmp_path):
    """A rank-2 latent projection W_DKV: c_KV has rank 2 (its RMSNorm scales rows and columns),
    the key cache rank 2 + d_rope, and rebuilding it from the rank-2 latent loses nothing."""
    model = deepseek(None)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for layer in model.model.layers:
            w = layer.self_attn.kv_a_proj_with_mqa.weight  # (d_c + d_rope, d_model)
            w[:KV_LORA] = torch.randn(KV_LORA, 2, generator=g) @ torch.randn(2, w.shape[1], generator=g)
    model.save_pretrained(tmp_path / "m", safe_serialization=True)
    m = load_model(tmp_path / "m")
    ids = np.random.default_rng(1).integers(0, VOCAB, N_TOKENS)
    for rotary in (True, False):
        # the rank-2 products are stored in float32: rank 2 up to float32 rounding
        cache = _with_kv_b(ag.latent_key_cache(m, ids, rotary=rotary, rtol=1e-5), m)
        assert (cache.kv_latent_rank == 2).all() and (cache.rank == 2 + ROPE).all()
        s = cache.kv_latent_singular_values
        assert (s[:, 1] > 1e-3 * s[:, 0]).all() and (s[:, 2] < 1e-5 * s[:, 0]).all()
        assert (cache.latent_errors[:, 2] < 1e-9 * cache.latent_errors[:, 0]).all()
        assert (cache.relative_errors[:, 2 + ROPE] < 1e-9).all() and (cache.rank_for(1e-8) == 2 + ROPE).all()
        _check_latent_errors(cache)


def test_latent_fields_are_none_without_mla(tmp_path):
    from builders import build

    build("llama", tmp_path / "l")
    cache = ag.latent_key_cache(tmp_path / "l", np.arange(1, 9))
    assert cache.kv_latent is None and cache.latent_errors is None and cache.kv_latent_rank is None
    assert not any(key.startswith("kv_latent") for key in cache.summary())


# -- routing -------------------------------------------------------------------------------
def test_router_statistics_of_deepseek(tmp_path):
    deepseek(tmp_path / "m")
    m = load_model(tmp_path / "m")
    ids = np.random.default_rng(2).integers(0, VOCAB, 20)
    s = ag.router_statistics(m, ids)
    assert s.layers == [1] and s.router_matrix.shape == (1, 20, 4) and s.k == 2 and s.sparsity == 0.5
    assert (np.count_nonzero(s.router_matrix, axis=-1) == 2).all()
    # not renormalised: each row holds the top-2 softmax mass times routed_scaling_factor
    np.testing.assert_allclose(s.router_matrix.sum(-1), 1.5 * np.sort(_softmax(s.router_logits), -1)[..., -2:].sum(-1),
                               rtol=1e-12)
    np.testing.assert_allclose(s.top_k_mass, (s.router_matrix.sum(-1) / 1.5).mean(-1), rtol=1e-12)
    assert set(s.summary()) >= {"imbalance_L1", "entropy_L1"} and "imbalance_L0" not in s.summary()
    pytest.importorskip("matplotlib")
    assert len(s.plot().axes) >= 2


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_group_limited_routing_keeps_the_best_groups():
    from attngeom.models import architecture_from_config
    from attngeom.models.nn.moe import route

    cfg = json.loads(deepseek_config(topk_method="group_limited_greedy", n_group=2, topk_group=1).to_json_string())
    a = architecture_from_config(cfg)
    assert a.expert_groups == (2, 1)
    # group {0, 1} holds the single largest probability, so experts 2 and 3 cannot be chosen
    g = np.array([[3.0, -5.0, 2.9, 2.8]])
    R = route(g, a)
    p = _softmax(g)[0]
    np.testing.assert_allclose(R[0], 1.5 * np.array([p[0], p[1], 0, 0]), rtol=1e-15)
    greedy = architecture_from_config({**cfg, "topk_method": "greedy"})
    np.testing.assert_allclose(route(g, greedy)[0], 1.5 * np.array([p[0], 0, p[2], 0]), rtol=1e-15)


# -- refused -------------------------------------------------------------------------------
def _edit(folder, **changes):
    path = os.path.join(folder, "config.json")
    cfg = json.load(open(path))
    cfg.update(changes)
    json.dump(cfg, open(path, "w"))
    return cfg


def test_refused_configurations(tmp_path):
    deepseek(tmp_path / "m")
    original = json.load(open(tmp_path / "m" / "config.json"))
    cases = [
        (dict(rope_parameters={"rope_type": "longrope", "rope_theta": 500.0, "factor": 40.0}),
         "rope_type 'longrope' is not supported"),
        (dict(norm_topk_prob=True), "norm_topk_prob"),
        (dict(topk_method="noaux_tc"), "topk_method 'noaux_tc' is not supported"),
        (dict(topk_method="group_limited_greedy", n_group=3, topk_group=1), "n_group = 3 must divide"),
        (dict(num_key_value_heads=2), "num_key_value_heads = 2 must equal num_attention_heads = 4"),
        (dict(qk_rope_head_dim=3), "qk_rope_head_dim must be even"),
        (dict(kv_lora_rank=5), "kv_a_proj_with_mqa.weight' in .* has shape \\(10, 32\\), but config.json"),
    ]
    for changes, message in cases:
        json.dump(original, open(tmp_path / "m" / "config.json", "w"))
        _edit(tmp_path / "m", **changes)
        with pytest.raises(ValueError, match=message):
            load_model(tmp_path / "m")
    json.dump(original, open(tmp_path / "m" / "config.json", "w"))
    # per-head weights: MLA keys pass through a norm, so there are none to extract
    with pytest.raises(ValueError, match="layout: multi-head latent attention"):
        load_heads(tmp_path / "m")
    with pytest.raises(ValueError, match="model: a deepseek_v2 model has multi-head latent attention"):
        load_model(tmp_path / "m").heads
    with pytest.raises(ValueError, match="model: a deepseek_v2 model has multi-head latent attention"):
        ag.weight_spectra(tmp_path / "m")
    with pytest.raises(ValueError, match="token_ids must be .* ragged"):
        load_model(tmp_path / "m").forward([[1], [2, 3]])


def test_induction_scores_from_the_patterns(tmp_path):
    """The repeated-tokens scores come from the model's own attention; the weights-only
    K-composition has no per-head W_K to use and is None."""
    deepseek(tmp_path / "m")
    m = load_model(tmp_path / "m")
    s = ag.induction_scores(m, seq_len=10, n_sequences=2, seed=0)
    P = m.forward(s.token_ids, dtype=np.float32).pattern.astype(np.float64)
    t = np.arange(1, 20)
    np.testing.assert_allclose(s.previous_token, P[..., t, t - 1].mean(axis=(1, 3)), rtol=1e-12)
    i = np.arange(10)
    np.testing.assert_allclose(s.induction, P[..., 10 + i, i + 1].mean(axis=(1, 3)), rtol=1e-12)
    assert s.k_composition is None and s.k_composition_with_previous is None
    assert s.summary()["best_induction_head"] == "{}.{}".format(*s.top(1)[0][:2])
    with pytest.raises(ValueError, match="by: 'k_composition_with_previous' is not available"):
        s.top(by="k_composition_with_previous")


def test_lens_runs_on_deepseek(tmp_path):
    model = deepseek(tmp_path / "m")
    m = load_model(tmp_path / "m")
    ids = np.random.default_rng(4).integers(0, VOCAB, 9)
    lens = ag.logit_lens(m, ids, k=3)
    with torch.no_grad():
        out = model(input_ids=torch.tensor(ids[None]), output_hidden_states=True)
    logp = torch.log_softmax(out.logits[0].double(), -1).numpy()
    np.testing.assert_allclose(lens.target_log_probs[-1], logp[np.arange(8), ids[1:]], atol=1e-5)


def test_fused_expert_tensors(tmp_path):
    """Experts stored fused (mlp.experts.gate_up_proj, down_proj: transformers' in-memory
    format) load to the same model as one tensor per expert."""
    from attngeom.models import read_safetensors
    from checkpoints import assert_same_model

    deepseek(tmp_path / "m")
    t = read_safetensors(tmp_path / "m" / "model.safetensors")
    fused = {k: v for k, v in t.items() if ".mlp.experts." not in k}
    s = "model.layers.1.mlp.experts."
    fused[s + "gate_up_proj"] = np.stack([np.concatenate([t[f"{s}{e}.gate_proj.weight"], t[f"{s}{e}.up_proj.weight"]])
                                          for e in range(4)])
    fused[s + "down_proj"] = np.stack([t[f"{s}{e}.down_proj.weight"] for e in range(4)])
    assert_same_model(tmp_path / "m", tmp_path / "f", fused)


def test_from_transformers(tmp_path):
    """The adapter builds the same Model from the transformers model in memory (experts fused there)."""
    model = deepseek(tmp_path / "m")
    ids = np.arange(1, 9)
    a = ag.models.from_transformers(model).forward(ids, dtype=np.float64)
    b = load_model(tmp_path / "m").forward(ids, dtype=np.float64)
    np.testing.assert_array_equal(a.logits, b.logits)
    np.testing.assert_array_equal(a.kv_latent, b.kv_latent)


def test_bfloat16_sites_hold_bfloat16_values_and_an_intervention_is_read_as_given(tmp_path):
    """In the bfloat16 mode multi-head latent attention rounds q, k and v before their sites
    (as the other layouts do): the sites hold bfloat16 values, and a value an intervention
    gives reaches the kernel as given (the heads' outputs z are its float32 attention)."""
    from attngeom.models import Hook
    from attngeom.models.nn.products import bfloat16_values

    deepseek(tmp_path / "m")
    m = load_model(tmp_path / "m")
    ids = np.arange(1, 10)
    f = m.forward(ids, dtype="bfloat16", keep=("q", "k", "v"))
    for site in ("q", "k", "v"):
        x = getattr(f, site)
        assert x.dtype == np.float32
        np.testing.assert_array_equal(bfloat16_values(x), x)
    tilt = np.float32(1 + 2.0 ** -12)  # moves q off bfloat16 values
    g = m.forward(ids, dtype="bfloat16", keep=("q", "k", "v", "z"), interventions=[Hook("q", 0, lambda q: q * tilt)])
    assert not np.array_equal(bfloat16_values(g.q[0]), g.q[0])
    want = ag.softmax_attention(g.q[0], g.k[0], g.v[0], causal=True, scale=(NOPE + ROPE) ** -0.5)
    np.testing.assert_array_equal(g.z[0], want)


def test_router_logits_interventions_read_the_layer_they_name(tmp_path):
    """Router logits are kept at the layers with experts only (DeepSeek-V2's first layers are
    dense), so a reference's stack is indexed by those layers: patching a run with its own
    router logits gives its logits bitwise, and a mean ablation writes that layer's mean."""
    from attngeom.models import Ablate, Hook, Patch

    deepseek(tmp_path / "m", num_hidden_layers=3)
    m = load_model(tmp_path / "m")
    assert m.arch.moe_layers == (1, 2)
    ids = np.random.default_rng(0).integers(0, VOCAB, (2, 9))
    clean = m.forward(ids, keep=("logits", "router_logits"))
    assert clean.router_logits.shape[0] == 2 and clean["router_logits", 1].shape == (2, 9, 4)
    for layer in (1, 2):
        patched = m.forward(ids, keep=("logits",), interventions=[Patch("router_logits", layer, clean)])
        np.testing.assert_array_equal(patched.logits, clean.logits)
        seen = {}
        m.forward(ids, keep=("logits",), interventions=[
            Ablate("router_logits", layer, mode="mean", reference=clean),
            Hook("router_logits", layer, lambda a: seen.setdefault("a", a.copy()) * 0 + a)])
        np.testing.assert_allclose(seen["a"], np.broadcast_to(clean["router_logits", layer].mean(axis=(0, 1)), (2, 9, 4)),
                                   rtol=1e-6, atol=0)
