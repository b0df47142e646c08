"""Interventions in Model.forward (Ablate, Project, Patch, Hook) and head_ablation_effects.

On random GPT-2, Llama and BERT checkpoints written with NumPy (tests/checkpoints.py):
identities of the projections (bitwise and 1e-10), invariances of the papers (gauge
transforms, what a head cannot read) and the planted induction circuit (known answers). The
same interventions against transformers and TransformerLens hooks are
tests/test_interventions_transformers.py.
"""
import json
import os

import numpy as np
import pytest

import attngeom as ag
from attngeom.models import Ablate, Hook, Patch, Project, head_ablation_effects, load_model
from checkpoints import RANDOM_LAYOUTS, RANDOM_VOCAB as VOCAB, random_checkpoint

N = 9


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """{layout: Model} for every layout tests/checkpoints.py writes (GPT-2, the Llama family
    with its rope types, Mistral, Qwen2, Qwen3, BERT)."""
    return {layout: load_model(random_checkpoint(layout, tmp_path_factory.mktemp(layout))) for layout in RANDOM_LAYOUTS}


def _ids(seed=0, batch=2):
    return np.random.default_rng(seed).integers(0, VOCAB, (batch, N))


def test_projections_identities(models):
    model = models["llama"]
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


def test_removing_directions_one_by_one_sums_to_the_full_removal(models):
    """attn_out is linear in z: the changes from removing each of r orthonormal directions of
    a head's z add up to the change from removing their span (float64, 1e-10)."""
    model = models["llama"]
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


def test_hooks_see_the_forwards_shapes_and_kept_fields_are_intervened(models):
    model = models["llama"]
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
    f = model.forward(ids, keep=("pattern",), interventions=[Ablate("pattern", 0, heads=[0], positions=[3])])
    assert np.all(f.pattern[0, :, 0, 3] == 0) and np.allclose(f.pattern[0, :, 1, 3].sum(-1), 1)


def test_plain_pass_is_unchanged(models):
    model = models["gpt2"]
    ids = _ids(7)
    np.testing.assert_array_equal(model.forward(ids, interventions=[]).logits, model.forward(ids).logits)


def test_bad_interventions_name_the_intervention(models):
    model = models["llama"]
    ids = _ids(8)
    before = model.forward(ids).logits
    source = model.forward(ids[:, :5], keep=("resid_pre",))
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
    assert zero.effects[1, 0] == pytest.approx(loss - zero.baseline, rel=1e-10, abs=0)


def test_mean_and_resample_ablation_use_the_references_real_tokens(models):
    model = models["llama"]
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
    source = model.forward(clean, dtype=np.float64, keep=("resid_pre",))
    for layer, p in [(0, 3), (1, 25)]:
        f = model.forward(corrupt, dtype=np.float64, interventions=[Patch("resid_pre", layer, source, positions=[p])])
        z = f.logits[:-1]
        logp = z - z.max(-1, keepdims=True)
        logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
        loss = -logp[np.arange(39), clean[1:]].mean()  # every pass scored on the clean tokens
        # a fraction of the loss restored, near 0 at some positions: abs at float64 rounding
        want = (loss - r.corrupt) / (r.clean - r.corrupt)
        assert r.restored[layer, p] == pytest.approx(want, rel=1e-9, abs=1e-12)
    whole = model.forward(corrupt, dtype=np.float64, interventions=[Patch("resid_pre", 0, source)]).logits
    np.testing.assert_allclose(whole, model.forward(clean, dtype=np.float64).logits, rtol=1e-12, atol=1e-12)
    per_head = ag.models.activation_patching(model, clean, corrupt, site="z", metric="loss", heads=True, layers=[1])
    assert per_head.restored.shape == (2, 40, 4) and np.isnan(per_head.restored[0]).all()
    assert per_head.plot() is not None and len(per_head.table()) == 160
    with pytest.raises(ValueError, match="clean_ids and corrupt_ids must have one shape"):
        ag.models.activation_patching(model, clean, corrupt[:5])
    # one token changed: patching the clean stream there before the first layer gives the clean
    # logits, so it restores exactly 1 on either metric
    one = clean.copy()
    one[7] = (clean[7] + 1) % 48
    answers = (clean[-1], (clean[-1] + 1) % 48)
    for metric, kw in [("loss", {}), ("logit_diff", dict(answers=answers))]:
        r = ag.models.activation_patching(model, clean, one, metric=metric, layers=[0], dtype=np.float64, **kw)
        assert r.restored[0, 7] == 1.0 and np.all(r.restored[0, :7] == 0.0), metric


@pytest.mark.parametrize("layout", ["gpt2", "llama"])
def test_removing_a_heads_query_null_space_leaves_its_queries(models, layout):
    """Laplace-Radon s.5: the component of what attention reads in ker(W_Q^T) of a head never
    reaches its queries. Removing it from attn_in leaves that head's q unchanged (to rounding,
    float64) while the other heads' queries change."""
    model = models[layout]
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
def test_a_gauge_transform_leaves_the_output_unchanged(models, tmp_path, which):
    """Laplace-Radon s.9.4 / s.13.3 on whole models: (W_Q, W_K) -> (W_Q A, W_K A^{-T}) and
    (W_V, W_O) -> (W_V M, M^{-1} W_O) for every head of a layer leave the logits unchanged to
    rounding (float64), though every weight changed; W_Q -> W_Q A alone (no gauge) does not."""
    folder = models["gpt2"].folder if which == "gpt2" else ag.models.planted_induction_model(tmp_path / "p")
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


def test_a_rotary_heads_gauge_is_the_commutant_of_its_rotations(models):
    """Under rotary embedding q_i k_j^T = x_i W_Q R(i - j) W_K^T x_j^T: A survives as a gauge
    only if it commutes with every rotation (a complex scalar per frequency pair): such an A
    leaves the logits unchanged to rounding (float64), a generic A changes them."""
    model = models["llama"]
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
def test_removing_what_a_head_cannot_read_leaves_its_logits(models, layout):
    """The head's attention logits read x only through x W_Q and x W_K: removing
    ker W_Q^T and ker W_K^T's intersection from attn_in leaves its logits (hence its pattern)
    unchanged to rounding while the other heads' patterns change; removing the complement of
    ker B = ker W_K^T (the columns of W_K) changes them."""
    model = models[layout]
    ids, layer, head = _ids(13), 1, 1
    W_Q, W_K = (np.asarray(w[layer, head], np.float64) for w in (model.heads.W_Q, model.heads.W_K))
    unread, _ = ag.null_space(np.hstack([W_Q, W_K]).T)
    ker_b, _ = ag.null_space(W_K.T)
    assert unread.dim == model.arch.d_model - 2 * model.arch.d_head

    def pattern(ivs):
        return model.forward(ids, dtype=np.float64, keep=("pattern",), layers=[layer], interventions=ivs).pattern[0]

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
