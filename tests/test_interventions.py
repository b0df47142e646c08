"""Interventions in Model.forward (Ablate, Project, Patch, Hook) and head_ablation_effects.

Checked against transformers with forward hooks doing the same on the same GPT-2, Llama and
BERT checkpoints (1e-4 in float32; BERT's last hidden state, it has no logits), identities of the projections (bitwise and 1e-10), and the
planted induction circuit (known answers).
"""
import json
import os

import numpy as np
import pytest

import attngeom as ag
from attngeom.models import Ablate, Hook, Patch, Project, head_ablation_effects, load_model
from attngeom.models.nn.interventions import SITE_FIELDS

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from builders import LAYOUTS, VOCAB, build  # noqa: E402

N = 9


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """{layout: (Model, transformers model)} for every layout of the builders (GPT-2, the Llama
    family with its rope types, Mistral, Qwen2, Qwen3, BERT)."""
    out = {}
    for layout in LAYOUTS:
        folder = tmp_path_factory.mktemp(layout)
        hf = build(layout, folder)
        out[layout] = (load_model(folder), hf)
    return out


def _ids(seed=0, batch=2):
    return np.random.default_rng(seed).integers(0, VOCAB, (batch, N))


def _blocks(hf, layout):
    return {"gpt2": lambda: hf.transformer.h, "bert": lambda: hf.encoder.layer}.get(layout, lambda: hf.model.layers)()


def _o_proj(hf, layout, layer):
    block = _blocks(hf, layout)[layer]
    return {"gpt2": lambda: block.attn.c_proj, "bert": lambda: block.attention.output.dense}.get(
        layout, lambda: block.self_attn.o_proj)()


def _attn(hf, layout, layer):
    """The module whose output (first element) is the attention block's output after W_O."""
    block = _blocks(hf, layout)[layer]
    return {"gpt2": lambda: block.attn, "bert": lambda: block.attention.output.dense}.get(
        layout, lambda: block.self_attn)()


def _hf_logits(hf, ids, hooks):
    """The logits (BERT: the last hidden state) of transformers' forward with the hooks."""
    handles = [h() for h in hooks]
    try:
        with torch.no_grad():
            out = hf(torch.tensor(ids))
            return (out.last_hidden_state if out.get("logits") is None else out.logits).numpy()
    finally:
        for handle in handles:
            handle.remove()


def _out(f):
    """A Forward's logits, or for BERT its last hidden state."""
    return f.hidden_states[-1] if f.logits is None else f.logits


@pytest.mark.parametrize("layout", LAYOUTS)
def test_zero_ablating_a_heads_z_equals_transformers(pairs, layout):
    model, hf = pairs[layout]
    ids, (layer, head), dh = _ids(), (1, 2), model.arch.d_head

    def pre(module, args):
        x = args[0].clone()
        x[..., head * dh:(head + 1) * dh] = 0
        return (x,) + tuple(args[1:])

    ref = _hf_logits(hf, ids, [lambda: _o_proj(hf, layout, layer).register_forward_pre_hook(pre)])
    f = model.forward(ids, interventions=[Ablate("z", layer, heads=[head])])
    np.testing.assert_allclose(_out(f), ref, rtol=1e-4, atol=1e-4)
    assert np.abs(_out(f) - _out(model.forward(ids))).max() > 1e-3  # the ablation matters


@pytest.mark.parametrize("layout", ["gpt2", "llama", "bert"])
def test_mean_ablating_attn_out_equals_transformers(pairs, layout):
    model, hf = pairs[layout]
    ids, layer = _ids(1), 0
    clean = model.forward(ids, keep=("attn_out", "logits", "hidden_states"))
    mean = clean.attn_out[layer].mean(axis=(0, 1))

    def post(module, args, output):
        if isinstance(output, torch.Tensor):  # BERT's W_O, a Linear
            return torch.broadcast_to(torch.tensor(mean), output.shape).clone()
        return (torch.broadcast_to(torch.tensor(mean), output[0].shape).clone(),) + tuple(output[1:])

    ref = _hf_logits(hf, ids, [lambda: _attn(hf, layout, layer).register_forward_hook(post)])
    f = model.forward(ids, interventions=[Ablate("attn_out", layer, mode="mean", reference=clean)])
    np.testing.assert_allclose(_out(f), ref, rtol=1e-4, atol=1e-4)
    assert np.abs(_out(f) - _out(clean)).max() > 1e-3


@pytest.mark.parametrize("layout", ["gpt2", "llama", "bert"])
def test_patching_resid_pre_equals_transformers(pairs, layout):
    model, hf = pairs[layout]
    clean, corrupt = _ids(2), _ids(3)
    layer, positions = 1, [2, 5]
    source = model.forward(clean, keep=("hidden_states",))
    patched = source.hidden_states[layer]

    def pre(module, args, kwargs):
        key = "hidden_states" if "hidden_states" in kwargs else None
        x = (kwargs[key] if key else args[0]).clone()
        x[:, positions] = torch.tensor(patched[:, positions])
        if key:
            kwargs = dict(kwargs, hidden_states=x)
            return args, kwargs
        return (x,) + tuple(args[1:]), kwargs

    ref = _hf_logits(hf, corrupt, [lambda: _blocks(hf, layout)[layer].register_forward_pre_hook(pre, with_kwargs=True)])
    f = model.forward(corrupt, interventions=[Patch("resid_pre", layer, source, positions=positions)])
    np.testing.assert_allclose(_out(f), ref, rtol=1e-4, atol=1e-4)
    full = model.forward(corrupt, interventions=[Patch("resid_pre", layer, source)])  # every position
    np.testing.assert_allclose(_out(full), _out(model.forward(clean)), rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def bridges(pairs):
    """{layout: TransformerLens TransformerBridge} over the same transformers models (GPT-2,
    Llama); skipped where transformer-lens (4.x, with TransformerBridge) is not installed."""
    tl = pytest.importorskip("transformer_lens.model_bridge")
    tokenizers = pytest.importorskip("tokenizers")
    import transformers

    def words():  # one per bridge: booting sets the tokenizer's special tokens from the model's config
        vocab = tokenizers.Tokenizer(tokenizers.models.WordLevel({"a": 0, "<unk>": 1}, unk_token="<unk>"))
        return transformers.PreTrainedTokenizerFast(tokenizer_object=vocab)

    return {layout: tl.TransformerBridge.boot_transformers(pairs[layout][0].folder, hf_model=pairs[layout][1],
                                                          tokenizer=words(), device="cpu")
            for layout in ("gpt2", "llama")}


def _tl_site(cache, layout, site, layer, n_heads):
    """A TransformerLens cache's value at one of our sites, in the Forward's layout (heads
    before positions; q and k after the rotation, which TransformerLens names rot_q, rot_k)."""
    names = {"resid_pre": "hook_resid_pre", "attn_in": "ln1.hook_out", "attn_out": "hook_attn_out",
             "mlp_out": "hook_mlp_out", "resid_post": "hook_resid_post", "pattern": "attn.hook_pattern",
             "z": "attn.hook_z", "v": "attn.hook_v",
             "q": "attn.hook_rot_q" if layout == "llama" else "attn.hook_q",
             "k": "attn.hook_rot_k" if layout == "llama" else "attn.hook_k"}
    value = cache[f"blocks.{layer}.{names[site]}"].detach().numpy()
    if site in ("q", "k", "v", "z"):
        value = value.transpose(0, 2, 1, 3)  # (b, n, H, d) -> (b, H, n, d)
    if site in ("k", "v") and value.shape[1] != n_heads:  # grouped-query: one per key/value head
        value = np.repeat(value, n_heads // value.shape[1], axis=1)
    return value


@pytest.mark.parametrize("layout", ["gpt2", "llama"])
def test_sites_and_interventions_equal_transformer_lens(pairs, bridges, layout):
    """Every site holds TransformerLens' hook value of the same name, and zero-ablating a head's
    z, mean-ablating attn_out and patching resid_pre with TransformerBridge hooks give our
    logits (1e-4, float32)."""
    model, _ = pairs[layout]
    bridge = bridges[layout]
    ids = _ids(5)
    t = torch.tensor(ids)
    with torch.no_grad():
        tl_logits, cache = bridge.run_with_cache(t)
    f = model.forward(ids, keep=("logits", "hidden_states", "attention_inputs", "q", "k", "v", "attentions", "z",
                                 "attn_out", "mlp_out", "resid_post"))
    np.testing.assert_allclose(f.logits, tl_logits.numpy(), rtol=1e-4, atol=1e-4)
    for site, field in SITE_FIELDS.items():
        for layer in range(model.n_layers):
            ours = getattr(f, field)[layer]
            theirs = _tl_site(cache, layout, site, layer, model.arch.n_heads)
            np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4, err_msg=f"{site} layer {layer}")

    layer, head = 1, 2

    def zero(z, hook):
        z[:, :, head] = 0
        return z

    mean = torch.tensor(f.attn_out[0].mean(axis=(0, 1)))

    def average(out, hook):
        return torch.broadcast_to(mean, out.shape).clone()

    source = model.forward(_ids(6), keep=("hidden_states", "logits"))
    positions = [2, 5]

    def patch(x, hook):
        x[:, positions] = torch.tensor(source.hidden_states[layer][:, positions])
        return x

    cases = [([(f"blocks.{layer}.attn.hook_z", zero)], [Ablate("z", layer, heads=[head])]),
             ([("blocks.0.hook_attn_out", average)], [Ablate("attn_out", 0, mode="mean", reference=f)]),
             ([(f"blocks.{layer}.hook_resid_pre", patch)], [Patch("resid_pre", layer, source, positions=positions)])]
    for hooks, interventions in cases:
        with torch.no_grad():
            theirs = bridge.run_with_hooks(t, fwd_hooks=hooks).numpy()
        ours = model.forward(ids, interventions=interventions, keep=("logits",)).logits
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4, err_msg=str(interventions[0]))
        assert np.abs(ours - f.logits).max() > 1e-3  # each intervention matters


def test_projections_identities(pairs):
    model, _ = pairs["llama"]
    ids = _ids(4)
    plain = model.forward(ids, dtype=np.float64, keep=("logits",))
    d, dh = model.arch.d_model, model.arch.d_head
    everything, nothing = ag.Subspace.span(np.eye(d)), ag.Subspace.span(np.zeros((1, d)))
    assert everything.dim == d and nothing.dim == 0

    def run(*ivs):
        return model.forward(ids, dtype=np.float64, keep=("logits",), interventions=list(ivs)).logits

    np.testing.assert_array_equal(run(Project("resid_pre", 1, everything, remove=False)), plain.logits)
    np.testing.assert_array_equal(run(Project("resid_pre", 1, nothing)), plain.logits)
    np.testing.assert_array_equal(run(Project("attn_out", 0, nothing, remove=False)),
                                  run(Ablate("attn_out", 0, mode="zero")))
    np.testing.assert_array_equal(run(Project("attn_out", 0, everything)), run(Ablate("attn_out", 0)))
    np.testing.assert_array_equal(run(Project("q", 1, ag.Subspace.span(np.eye(dh)), heads=[1])),
                                  run(Ablate("q", 1, heads=[1])))


def test_removing_directions_one_by_one_sums_to_the_full_removal(pairs):
    """attn_out is linear in z: the changes from removing each of r orthonormal directions of
    a head's z add up to the change from removing their span (float64, 1e-10)."""
    model, _ = pairs["llama"]
    ids, layer, head = _ids(5), 1, 3
    rng = np.random.default_rng(0)
    basis = np.linalg.qr(rng.standard_normal((model.arch.d_head, 3)))[0]

    def attn_out(sub):
        ivs = [] if sub is None else [Project("z", layer, sub, heads=[head])]
        return model.forward(ids, dtype=np.float64, keep=("attn_out",), layers=[layer],
                             interventions=ivs).attn_out[0]

    clean = attn_out(None)
    parts = sum(attn_out(ag.Subspace.span(basis[:, [i]].T)) - clean for i in range(3))
    whole = attn_out(ag.Subspace.span(basis.T)) - clean
    assert np.abs(whole).max() > 1e-3
    np.testing.assert_allclose(parts, whole, rtol=0, atol=1e-10 * np.abs(whole).max())


def test_hooks_see_the_forwards_shapes_and_kept_fields_are_intervened(pairs):
    model, _ = pairs["llama"]
    ids = _ids(6)
    seen = []

    def double(x):
        seen.append(x.shape)
        return 2 * x

    f = model.forward(ids[0], keep=("v", "z"), interventions=[Hook("v", 0, double)])
    g = model.forward(ids[0], keep=("v", "z"))
    assert seen == [(4, N, 8)]  # one sequence: no batch axis, as Forward holds it
    np.testing.assert_array_equal(f.v[0], 2 * g.v[0])
    np.testing.assert_allclose(f.z[0], 2 * g.z[0], rtol=1e-6)  # z = P v is linear in v
    f = model.forward(ids, keep=("attentions",), interventions=[Ablate("pattern", 0, heads=[0], positions=[3])])
    assert np.all(f.attentions[0, :, 0, 3] == 0) and np.allclose(f.attentions[0, :, 1, 3].sum(-1), 1)


def test_plain_pass_is_unchanged(pairs):
    model, _ = pairs["gpt2"]
    ids = _ids(7)
    np.testing.assert_array_equal(model.forward(ids, interventions=[]).logits, model.forward(ids).logits)


def test_bad_interventions_name_the_intervention(pairs):
    model, _ = pairs["llama"]
    ids = _ids(8)
    before = model.forward(ids).logits
    source = model.forward(ids[:, :5], keep=("hidden_states",))
    cases = [
        (Ablate("hook_z", 0), ValueError, r"interventions\[0\] \(Ablate\): site: unknown site 'hook_z'"),
        (Ablate("z", 2), ValueError, r"layer must be an integer in 0..1, got 2"),
        (Ablate("z", 0, heads=[4]), ValueError, r"heads 4 is out of range for 4 heads"),
        (Ablate("resid_pre", 0, heads=[0]), ValueError, r"heads: the site 'resid_pre' is not per head"),
        (Ablate("z", 0, positions=[N]), ValueError, rf"positions {N} is out of range"),
        (Ablate("z", 0, mode="half"), ValueError, r"mode must be one of zero, mean, resample"),
        (Ablate("z", 0, mode="mean"), TypeError, r"reference must be a Forward"),
        (Project("q", 0, ag.Subspace.span(np.eye(32)[:2])), ValueError, r"subspace lives in R\^32, the site's "
                                                                         r"vectors in R\^8"),
        (Project("q", 0, np.eye(8)), TypeError, r"subspace must be an attngeom.Subspace"),
        (Patch("resid_pre", 1, source), ValueError,
         r"source holds \(2, 5, 32\) at the site, this pass \(2, 9, 32\) \(batch 2, 9 tokens\)"),
        (Patch("z", 1, source), ValueError, r"source did not keep 'z' at layer 1"),
        (Hook("q", 0, lambda x: x[..., :4]), ValueError, r"interventions\[0\] \(Hook at 'q', layer 0\): fn returned "
                                                          r"shape"),
        (Hook("q", 0, lambda x: x * np.nan), ValueError, r"fn returned non-finite"),
        ("zero", TypeError, r"interventions\[0\] must be an Ablate, Project, Patch or Hook"),
    ]
    for iv, error, message in cases:
        with pytest.raises(error, match=message):
            model.forward(ids, interventions=[iv])
    np.testing.assert_array_equal(model.forward(ids).logits, before)  # nothing left in a changed state


def test_head_ablation_effects_find_the_planted_circuit(tmp_path):
    """On repeated random tokens the planted induction head (1.0) and previous-token head (0.0)
    matter most: ablating either raises the loss far more than any random head."""
    folder = ag.models.planted_induction_model(tmp_path / "planted")
    model = load_model(folder)
    rng = np.random.default_rng(0)
    half = rng.integers(0, 48, (4, 20))
    ids = np.concatenate([half, half], axis=1)
    eff = head_ablation_effects(model, ids, mode="mean")  # float32, as Model.forward
    np.testing.assert_allclose(eff.effects, head_ablation_effects(model, ids, dtype=np.float64).effects, rtol=1e-4,
                               atol=1e-5)
    ranked = sorted(eff.table(), key=lambda r: r["rank"])
    assert {(r["layer"], r["head"]) for r in ranked[:2]} == {(1, 0), (0, 0)}
    assert eff.effects[1, 0] > 1.0 and eff.effects[0, 0] > 1.0
    assert np.abs(np.delete(eff.effects.ravel(), [0, model.arch.n_heads])).max() < 0.2 * eff.effects[1, 0]
    # each ablation reuses the clean pass up to its layer: equal to a full ablated pass
    full = model.forward(ids, dtype=np.float64, interventions=[Ablate("z", 1, heads=[0])]).logits
    zero = head_ablation_effects(model, ids, mode="zero", layers=[1], dtype=np.float64)
    assert np.isnan(zero.effects[0]).all()
    z = np.asarray(full[:, :-1], np.float64)
    logp = z - z.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    loss = -np.take_along_axis(logp, ids[:, 1:, None], -1).mean()
    assert zero.effects[1, 0] == pytest.approx(loss - zero.baseline, rel=1e-10)


def test_mean_and_resample_ablation_use_the_references_real_tokens(pairs):
    model, _ = pairs["llama"]
    ids = _ids(9)
    mask = np.ones(ids.shape, bool)
    mask[1, :3] = False  # left padding in the reference
    ref = model.forward(ids, attention_mask=mask, keep=("z", "v"))
    f = model.forward(ids, keep=("v",), interventions=[Ablate("v", 1, heads=[2], mode="mean", reference=ref)])
    want = ref.v[1].transpose(0, 2, 1, 3)[mask][:, 2].mean(axis=0)  # (d_head,) over the real tokens
    np.testing.assert_allclose(f.v[1][:, 2], np.broadcast_to(want, f.v[1][:, 2].shape), rtol=1e-6)
    r = model.forward(ids, keep=("z",), interventions=[Ablate("z", 0, mode="resample", reference=ref, seed=3)])
    pick = np.random.default_rng(3).integers(0, 2, size=2)
    np.testing.assert_array_equal(r.z[0], ref.z[0][pick])
    with pytest.raises(ValueError, match="reference has 5 tokens, this pass 9: resampling keep positions"):
        model.forward(ids, interventions=[Ablate("z", 0, mode="resample",
                                                 reference=model.forward(ids[:, :5], keep=("z",)))])


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    folder = ag.models.planted_induction_model(tmp_path_factory.mktemp("planted") / "m")
    half = np.random.default_rng(0).integers(0, 48, (4, 20))
    return load_model(folder), np.concatenate([half, half], axis=1)


def test_direction_effects_find_the_planted_rank(planted):
    """The planted induction head copies tokens through a rank-48 OV circuit (the token slot):
    48 directions, the curve of the top k kept reaches the clean loss at k = 48 (1e-8), and
    keeping none of them costs as much as ablating the head."""
    model, ids = planted
    d = ag.models.direction_effects(model, ids, 1, 0, dtype=np.float64)
    W = np.asarray(model.heads.W_V[1, 0], np.float64) @ np.asarray(model.heads.W_O[1, 0], np.float64)
    assert d.singular_values.size == np.linalg.matrix_rank(W) == 48
    assert d.kept[48] == pytest.approx(d.baseline, abs=1e-8)
    assert d.kept[0] - d.baseline > 1.0 and np.isfinite(d.removed).all()
    zero = model.forward(ids, dtype=np.float64, interventions=[Ablate("z", 1, heads=[0])]).logits
    none_kept = model.forward(ids, dtype=np.float64, interventions=[Hook("z", 1, lambda z: np.concatenate(
        [z[:, :1] * 0, z[:, 1:]], axis=1))]).logits
    np.testing.assert_allclose(zero, none_kept, rtol=1e-12, atol=1e-12)
    assert len(d.table()) == 48 and d.plot() is not None
    with pytest.raises(ValueError, match="head must be an integer in 0..3, got 4"):
        ag.models.direction_effects(model, ids, 1, 4)
    qk = ag.models.direction_effects(model, ids, 1, 0, circuit="QK", dtype=np.float64)  # GPT-2: no rotation
    assert qk.kept[-1] == pytest.approx(qk.baseline, abs=1e-8) and qk.kept[0] - qk.baseline > 1.0


def test_activation_patching_equals_the_patched_pass(planted):
    model, ids = planted
    clean, corrupt = ids[0], ids[0].copy()
    corrupt[:20] = np.random.default_rng(1).integers(0, 48, 20)
    r = ag.models.activation_patching(model, clean, corrupt, metric="loss", dtype=np.float64)
    assert r.restored.shape == (2, 40) and r.corrupt > r.clean
    source = model.forward(clean, dtype=np.float64, keep=("hidden_states",))
    for layer, p in [(0, 3), (1, 25)]:
        f = model.forward(corrupt, dtype=np.float64, interventions=[Patch("resid_pre", layer, source, positions=[p])])
        z = f.logits[:-1]
        logp = z - z.max(-1, keepdims=True)
        logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
        loss = -logp[np.arange(39), corrupt[1:]].mean()
        assert r.restored[layer, p] == pytest.approx((loss - r.corrupt) / (r.clean - r.corrupt), rel=1e-9)
    whole = model.forward(corrupt, dtype=np.float64, interventions=[Patch("resid_pre", 0, source)]).logits
    np.testing.assert_allclose(whole, model.forward(clean, dtype=np.float64).logits, rtol=1e-12, atol=1e-12)
    per_head = ag.models.activation_patching(model, clean, corrupt, site="z", metric="loss", heads=True, layers=[1])
    assert per_head.restored.shape == (2, 40, 4) and np.isnan(per_head.restored[0]).all()
    assert per_head.plot() is not None and len(per_head.table()) == 160
    with pytest.raises(ValueError, match="clean_ids and corrupt_ids must have one shape"):
        ag.models.activation_patching(model, clean, corrupt[:5])


@pytest.mark.parametrize("layout", ["gpt2", "llama"])
def test_removing_a_heads_query_null_space_leaves_its_queries(pairs, layout):
    """Laplace-Radon s.5: the component of what attention reads in ker(W_Q^T) of a head never
    reaches its queries. Removing it from attn_in leaves that head's q unchanged (to rounding,
    float64) while the other heads' queries change."""
    model, _ = pairs[layout]
    ids, layer, head = _ids(10), 1, 2
    W_Q = np.asarray(model.heads.W_Q[layer, head], np.float64)  # (d_model, d_head)
    null, _ = ag.null_space(W_Q.T)
    assert null.dim == model.arch.d_model - model.arch.d_head
    plain = model.forward(ids, dtype=np.float64, keep=("q",), layers=[layer])
    f = model.forward(ids, dtype=np.float64, keep=("q",), layers=[layer],
                      interventions=[Project("attn_in", layer, null)])
    np.testing.assert_allclose(f.q[0][:, head], plain.q[0][:, head], rtol=0, atol=1e-12 * np.abs(plain.q).max())
    others = [h for h in range(model.arch.n_heads) if h != head]
    assert np.abs(f.q[0][:, others] - plain.q[0][:, others]).max() > 1e-3


def _gauged(folder, layer, transforms, keys=True):
    """A Model of the checkpoint in folder whose heads of one layer are gauge transformed in its
    weights: transforms {query head: (A, M)} maps W_Q -> W_Q A, b_Q -> b_Q A, W_K -> W_K A^{-T},
    b_K -> b_K A^{-T} (A per key/value head: the heads of a group share it) and W_V -> W_V M,
    b_V -> b_V M, W_O[h] -> M^{-1} W_O[h] (M None: no value gauge). keys=False leaves W_K and b_K
    as they are (then it is no gauge)."""
    m = load_model(folder)
    a = m.arch
    H, K, dh = a.n_heads, a.n_kv_heads, a.d_head
    w = {k: None if v is None else np.array(v, np.float64) for k, v in m.decoder.w["layers"][layer].items()}
    if a.family == "gpt2":  # the fused (d, 3 H dh) c_attn and its bias
        for i, role in enumerate("qkv"):
            w[role] = w["qkv"][:, i * H * dh:(i + 1) * H * dh]
            w["b_" + role] = None if w["b_qkv"] is None else w["b_qkv"][i * H * dh:(i + 1) * H * dh]
    done = set()  # key/value heads transformed (the heads of a group share them, and A and M)
    for h, (A, M) in transforms.items():
        g = h // (H // K)  # its key/value head
        q, kv = slice(h * dh, (h + 1) * dh), slice(g * dh, (g + 1) * dh)
        w["q"][:, q] = w["q"][:, q] @ A
        if w["b_q"] is not None:
            w["b_q"][q] = w["b_q"][q] @ A
        if M is not None:
            w["o"][q] = np.linalg.solve(M, w["o"][q])
        if g in done:
            continue
        done.add(g)
        for role, T in (("k", np.linalg.inv(A).T if keys else None), ("v", M)):
            if T is not None:
                w[role][:, kv] = w[role][:, kv] @ T
                if w["b_" + role] is not None:
                    w["b_" + role][kv] = w["b_" + role][kv] @ T
    if a.family == "gpt2":
        w["qkv"] = np.concatenate([w["q"], w["k"], w["v"]], axis=1)
        if w["b_qkv"] is not None:
            w["b_qkv"] = np.concatenate([w["b_q"], w["b_k"], w["b_v"]])
        for role in ("q", "k", "v", "b_q", "b_k", "b_v"):
            del w[role]
    m.decoder.w["layers"][layer] = w
    return m


def _conditioned(rng, n, low=0.5, high=2.0):
    """A random n x n matrix with singular values in [low, high]."""
    u, _ = np.linalg.qr(rng.standard_normal((n, n)))
    v, _ = np.linalg.qr(rng.standard_normal((n, n)))
    return u @ np.diag(rng.uniform(low, high, n)) @ v.T


def _commuting(rng, dh):
    """A random invertible d_head x d_head matrix commuting with every rotate-half rotation:
    on each frequency's pair (i, i + d_head / 2), a I + b J (a complex scalar)."""
    half, A = dh // 2, np.zeros((dh, dh))
    for i in range(half):
        r, t = rng.uniform(0.5, 2.0), rng.uniform(0, 2 * np.pi)
        a, b = r * np.cos(t), r * np.sin(t)
        A[i, i] = A[i + half, i + half] = a
        A[i, i + half], A[i + half, i] = b, -b
    return A


@pytest.mark.parametrize("which", ["gpt2", "planted"])
def test_a_gauge_transform_leaves_the_output_unchanged(pairs, tmp_path, which):
    """Laplace-Radon s.9.4 / s.13.3 on whole models: (W_Q, W_K) -> (W_Q A, W_K A^{-T}) and
    (W_V, W_O) -> (W_V M, M^{-1} W_O) for every head of a layer leave the logits unchanged to
    rounding (float64), though every weight changed; W_Q -> W_Q A alone (no gauge) does not."""
    folder = pairs["gpt2"][0].folder if which == "gpt2" else ag.models.planted_induction_model(tmp_path / "p")
    rng = np.random.default_rng(7)
    plain = load_model(folder)
    ids = np.random.default_rng(8).integers(0, min(plain.arch.vocab_size, 48), (2, N))
    clean = plain.forward(ids, dtype=np.float64, keep=("logits",)).logits
    dh, layer = plain.arch.d_head, plain.n_layers - 1
    gauges = {h: (_conditioned(rng, dh), _conditioned(rng, dh)) for h in range(plain.arch.n_heads)}
    gauged = _gauged(folder, layer, gauges).forward(ids, dtype=np.float64, keep=("logits",)).logits
    np.testing.assert_allclose(gauged, clean, rtol=0, atol=1e-11 * np.abs(clean).max())
    # W_Q -> W_Q A alone is no gauge: the logits change
    changed = _gauged(folder, layer, {0: (gauges[0][0], None)}, keys=False).forward(ids, dtype=np.float64,
                                                                                 keep=("logits",)).logits
    assert np.abs(changed - clean).max() > 1e-6 * np.abs(clean).max()


def test_a_rotary_heads_gauge_is_the_commutant_of_its_rotations(pairs):
    """Under rotary embedding q_i k_j^T = x_i W_Q R(i - j) W_K^T x_j^T: A survives as a gauge
    only if it commutes with every rotation (a complex scalar per frequency pair): such an A
    leaves the logits unchanged to rounding (float64), a generic A changes them."""
    model, _ = pairs["llama"]
    rng = np.random.default_rng(11)
    ids = _ids(12)
    clean = model.forward(ids, dtype=np.float64, keep=("logits",)).logits
    a, layer = model.arch, 1
    group = a.n_heads // a.n_kv_heads
    for make, invariant in ((_commuting, True), (_conditioned, False)):
        per_kv = [make(rng, a.d_head) for _ in range(a.n_kv_heads)]
        m = _gauged(model.folder, layer, {h: (per_kv[h // group], None) for h in range(a.n_heads)})
        out = m.forward(ids, dtype=np.float64, keep=("logits",)).logits
        err = np.abs(out - clean).max() / np.abs(clean).max()
        assert (err < 1e-12) if invariant else (err > 1e-4), (make.__name__, err)


@pytest.mark.parametrize("layout", ["gpt2", "llama"])
def test_removing_what_a_head_cannot_read_leaves_its_logits(pairs, layout):
    """The head's attention logits read x only through x W_Q and x W_K: removing
    ker W_Q^T and ker W_K^T's intersection from attn_in leaves its logits (hence its pattern)
    unchanged to rounding while the other heads' patterns change; removing the complement of
    ker B = ker W_K^T (the columns of W_K) changes them."""
    model, _ = pairs[layout]
    ids, layer, head = _ids(13), 1, 1
    W_Q, W_K = (np.asarray(w[layer, head], np.float64) for w in (model.heads.W_Q, model.heads.W_K))
    unread, _ = ag.null_space(np.hstack([W_Q, W_K]).T)
    ker_b, _ = ag.null_space(W_K.T)
    assert unread.dim == model.arch.d_model - 2 * model.arch.d_head

    def pattern(ivs):
        return model.forward(ids, dtype=np.float64, keep=("attentions",), layers=[layer], interventions=ivs).attentions[0]

    plain = pattern([])
    kept = pattern([Project("attn_in", layer, unread)])
    np.testing.assert_allclose(kept[:, head], plain[:, head], rtol=0, atol=1e-12)
    others = [h for h in range(model.arch.n_heads) if h != head]
    assert np.abs(kept[:, others] - plain[:, others]).max() > 1e-3
    lost = pattern([Project("attn_in", layer, ker_b.complement())])
    assert np.abs(lost[:, head] - plain[:, head]).max() > 1e-3


def test_heads_report_with_effects(tmp_path, capsys):
    """attngeom heads --effects on the planted induction model: the planted heads rank first,
    the invariance checks hold (gauge and unread component at rounding, the keys' span not),
    and the figures, JSON, summary.md and report.html carry the causal section."""
    tokenizers = pytest.importorskip("tokenizers")
    pytest.importorskip("matplotlib")
    from attngeom import cli

    folder = ag.models.planted_induction_model(tmp_path / "p")
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({f"t{i}": i for i in range(48)}, unk_token="t0"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "p" / "tokenizer.json"))
    half = " ".join(f"t{i}" for i in np.random.default_rng(0).integers(0, 48, 20))
    (tmp_path / "text.txt").write_text(f"{half} {half}")
    out = tmp_path / "r"
    assert cli.main(["heads", folder, "--text", str(tmp_path / "text.txt"), "--effects", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "causal effects (40 tokens" in printed
    files = set(os.listdir(out))
    assert {"ablation_effects.png", "spectrum_vs_effect.png", "directions_L1_H0.png", "directions_L0_H0.png"} <= files
    effects = json.load(open(out / "heads.json"))["effects"]
    ranked = sorted(effects["heads"]["heads"], key=lambda r: r["rank"])
    assert {(r["layer"], r["head"]) for r in ranked[:2]} == {(1, 0), (0, 0)}
    assert [d["layer"] for d in effects["directions"]][:2] in ([1, 0], [0, 1])
    checks = {(r["layer"], r["head"], r["check"]): r for r in effects["invariances"]}
    for layer, head in ((1, 0), (0, 0)):
        assert checks[layer, head, "gauge"]["measured"] < 1e-12
        assert checks[layer, head, "unread removed"]["measured"] < 1e-12
        assert checks[layer, head, "ker B complement removed"]["measured"] > 1e-2
    assert "## Causal effects" in (out / "summary.md").read_text()
    assert "Invariances (Laplace-Radon" in (out / "report.html").read_text()
    # refused before any computation: no text, or a model without an lm_head
    assert cli.main(["heads", folder, "--effects", "--out", str(tmp_path / "r2")]) == 2
    assert "--effects measures the model's loss on a text" in capsys.readouterr().err
    assert not (tmp_path / "r2").exists()
