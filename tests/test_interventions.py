"""Interventions in Model.forward (Ablate, Project, Patch, Hook) and head_ablation_effects.

Checked against transformers with forward hooks doing the same on the same GPT-2 and Llama
checkpoints (1e-4 in float32), identities of the projections (bitwise and 1e-10), and the
planted induction circuit (known answers).
"""
import numpy as np
import pytest

import attngeom as ag
from attngeom.models import Ablate, Hook, Patch, Project, head_ablation_effects, load_model

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from builders import VOCAB, build  # noqa: E402

N = 9


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """{layout: (Model, transformers model)} for GPT-2 and Llama."""
    out = {}
    for layout in ("gpt2", "llama"):
        folder = tmp_path_factory.mktemp(layout)
        hf = build(layout, folder)
        out[layout] = (load_model(folder), hf)
    return out


def _ids(seed=0, batch=2):
    return np.random.default_rng(seed).integers(0, VOCAB, (batch, N))


def _blocks(hf, layout):
    return hf.transformer.h if layout == "gpt2" else hf.model.layers


def _o_proj(hf, layout, layer):
    block = _blocks(hf, layout)[layer]
    return block.attn.c_proj if layout == "gpt2" else block.self_attn.o_proj


def _attn(hf, layout, layer):
    block = _blocks(hf, layout)[layer]
    return block.attn if layout == "gpt2" else block.self_attn


def _hf_logits(hf, ids, hooks):
    handles = [h() for h in hooks]
    try:
        with torch.no_grad():
            return hf(torch.tensor(ids)).logits.numpy()
    finally:
        for handle in handles:
            handle.remove()


@pytest.mark.parametrize("layout", ["gpt2", "llama"])
def test_zero_ablating_a_heads_z_equals_transformers(pairs, layout):
    model, hf = pairs[layout]
    ids, (layer, head), dh = _ids(), (1, 2), model.arch.d_head

    def pre(module, args):
        x = args[0].clone()
        x[..., head * dh:(head + 1) * dh] = 0
        return (x,) + tuple(args[1:])

    ref = _hf_logits(hf, ids, [lambda: _o_proj(hf, layout, layer).register_forward_pre_hook(pre)])
    f = model.forward(ids, interventions=[Ablate("z", layer, heads=[head])])
    np.testing.assert_allclose(f.logits, ref, rtol=1e-4, atol=1e-4)
    assert np.abs(f.logits - model.forward(ids).logits).max() > 1e-3  # the ablation matters


@pytest.mark.parametrize("layout", ["gpt2", "llama"])
def test_mean_ablating_attn_out_equals_transformers(pairs, layout):
    model, hf = pairs[layout]
    ids, layer = _ids(1), 0
    clean = model.forward(ids, keep=("attn_out", "logits"))
    mean = clean.attn_out[layer].mean(axis=(0, 1))

    def post(module, args, output):
        return (torch.broadcast_to(torch.tensor(mean), output[0].shape).clone(),) + tuple(output[1:])

    ref = _hf_logits(hf, ids, [lambda: _attn(hf, layout, layer).register_forward_hook(post)])
    f = model.forward(ids, interventions=[Ablate("attn_out", layer, mode="mean", reference=clean)])
    np.testing.assert_allclose(f.logits, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("layout", ["gpt2", "llama"])
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
    np.testing.assert_allclose(f.logits, ref, rtol=1e-4, atol=1e-4)
    full = model.forward(corrupt, interventions=[Patch("resid_pre", layer, source)])  # every position
    np.testing.assert_allclose(full.logits, model.forward(clean).logits, rtol=1e-5, atol=1e-5)


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
    eff = head_ablation_effects(model, ids, mode="mean")
    ranked = sorted(eff.table(), key=lambda r: r["rank"])
    assert {(r["layer"], r["head"]) for r in ranked[:2]} == {(1, 0), (0, 0)}
    assert eff.effects[1, 0] > 1.0 and eff.effects[0, 0] > 1.0
    assert np.abs(np.delete(eff.effects.ravel(), [0, model.arch.n_heads])).max() < 0.2 * eff.effects[1, 0]
    # each ablation reuses the clean pass up to its layer: equal to a full ablated pass
    full = model.forward(ids, dtype=np.float64, interventions=[Ablate("z", 1, heads=[0])]).logits
    zero = head_ablation_effects(model, ids, mode="zero", layers=[1])
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
    d = ag.models.direction_effects(model, ids, 1, 0)
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
    qk = ag.models.direction_effects(model, ids, 1, 0, circuit="QK")  # GPT-2: no rotation
    assert qk.kept[-1] == pytest.approx(qk.baseline, abs=1e-8) and qk.kept[0] - qk.baseline > 1.0


def test_activation_patching_equals_the_patched_pass(planted):
    model, ids = planted
    clean, corrupt = ids[0], ids[0].copy()
    corrupt[:20] = np.random.default_rng(1).integers(0, 48, 20)
    r = ag.models.activation_patching(model, clean, corrupt, metric="loss")
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
