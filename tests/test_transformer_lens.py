"""attngeom against TransformerLens 4 (TransformerBridge), on the same random GPT-2 and
grouped-query Llama (4 query heads, 2 key/value heads) checkpoints, built by transformers.

Pinned parity a TransformerLens user expects: every site of a forward pass equals the
run_with_cache hook value of the same name and interventions equal run_with_hooks (1e-4,
float32); composition scores equal all_composition_scores (float32 on their side); the SVD
of a factored OV circuit equals FactoredMatrix's (float64 on both sides, 1e-12).
"""
import numpy as np
import pytest

import attngeom as ag
from attngeom.models import Ablate, Patch
from attngeom.models.nn.sites import model_sites, parse_site

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tl = pytest.importorskip("transformer_lens")
tokenizers = pytest.importorskip("tokenizers")
from transformer_lens.model_bridge import TransformerBridge  # noqa: E402

from builders import model_pairs  # noqa: E402
from checkpoints import RANDOM_VOCAB as VOCAB  # noqa: E402

N = 9
LAYOUTS = ("gpt2", "llama")


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """{layout: (Model, transformers model)} of GPT-2 and the grouped-query Llama."""
    return model_pairs(tmp_path_factory, LAYOUTS)


def _ids(seed=0, batch=2):
    return np.random.default_rng(seed).integers(0, VOCAB, (batch, N))


@pytest.fixture(scope="module")
def bridges(pairs):
    """{layout: TransformerLens TransformerBridge} over the same transformers models."""

    def words():  # one per bridge: booting sets the tokenizer's special tokens from the model's config
        vocab = tokenizers.Tokenizer(tokenizers.models.WordLevel({"a": 0, "<unk>": 1}, unk_token="<unk>"))
        return transformers.PreTrainedTokenizerFast(tokenizer_object=vocab)

    return {layout: TransformerBridge.boot_transformers(pairs[layout][0].folder, hf_model=pairs[layout][1],
                                                          tokenizer=words(), device="cpu")
            for layout in LAYOUTS}


def _theirs(cache, name, site, n_heads):
    """TransformerLens' cached value of the hook `name` in the Forward's layout: heads before
    positions, keys and values repeated per query head under grouped-query attention. Models
    without a rotary embedding have no hook_rot_q / hook_rot_k: there q and k are hook_q, hook_k."""
    key = name if name in cache else name.replace("hook_rot_", "hook_")
    value = cache[key].detach().numpy()
    if site in ("q", "k", "v", "z", "q_prerotary", "k_prerotary"):
        value = value.transpose(0, 2, 1, 3)  # (b, n, H, d) -> (b, H, n, d)
        if value.shape[1] != n_heads:  # grouped-query: one per key/value head
            value = np.repeat(value, n_heads // value.shape[1], axis=1)
    return value


@pytest.mark.parametrize("layout", ["gpt2", "llama"])
def test_sites_and_interventions_equal_transformer_lens(pairs, bridges, layout):
    """Every site of a cache of the whole pass (keep="all") holds TransformerLens' run_with_cache
    value under the same hook name, and zero-ablating a head's z, mean-ablating attn_out and
    patching resid_pre with TransformerBridge hooks give our logits (1e-4, float32)."""
    model, _ = pairs[layout]
    bridge = bridges[layout]
    ids = _ids(5)
    t = torch.tensor(ids)
    with torch.no_grad():
        tl_logits, cache = bridge.run_with_cache(t)
    f = model.forward(ids, keep="all")
    np.testing.assert_allclose(f.logits, tl_logits.numpy(), rtol=1e-4, atol=1e-4)
    compared = set()
    for name, ours in f.items():
        site, _ = parse_site(name)
        theirs = _theirs(cache, name, site, model.arch.n_heads)
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4, err_msg=name)
        compared.add(site)
    assert compared == set(model_sites(model.arch))  # every site this model has
    assert len(compared) == (18 if layout == "gpt2" else 17)  # GPT-2's position table; no experts, no latent

    f = model.forward(ids, keep=("logits", "resid_pre", "attn_out"))
    layer, head = 1, 2

    def zero(z, hook):
        z[:, :, head] = 0
        return z

    mean = torch.tensor(f.attn_out[0].mean(axis=(0, 1)))

    def average(out, hook):
        return torch.broadcast_to(mean, out.shape).clone()

    source = model.forward(_ids(6), keep=("resid_pre", "logits"))
    positions = [2, 5]

    def patch(x, hook):
        x[:, positions] = torch.tensor(source["resid_pre", layer][:, positions])
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


def _weights(bridge):
    """The bridge's stacked W_Q, W_K, W_V, W_O as float64 arrays, key/value heads repeated per
    query head (TransformerLens layout)."""
    expand = bridge._expand_kv_heads
    return [np.asarray(w.detach().numpy(), np.float64)
            for w in (bridge.W_Q, expand(bridge.W_K), expand(bridge.W_V), bridge.W_O)]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("mode", ["Q", "K", "V"])
def test_composition_scores_equal_transformer_lens(pairs, bridges, layout, mode):
    """ag.composition_scores of our heads equals TransformerBridge.all_composition_scores (float32
    on its side: measured 1e-7 on scores of about 0.2, checked at 1e-5 of the largest), and the
    heads attngeom reads from the checkpoint are the bridge's weights."""
    model, _ = pairs[layout]
    theirs = bridges[layout].all_composition_scores(mode).scores.detach().numpy()
    W = _weights(bridges[layout])
    for ours, w in zip((model.heads.W_Q, model.heads.W_K, model.heads.W_V, model.heads.W_O), W):
        np.testing.assert_allclose(ours, w, rtol=0, atol=1e-6 * np.abs(w).max())
    ours = ag.composition_scores(model.heads.W_Q, model.heads.W_K, model.heads.W_V, model.heads.W_O, mode)
    assert ours.shape == theirs.shape == (2, 4, 2, 4) and theirs.max() > 0.05
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-5 * theirs.max())


@pytest.mark.parametrize("layout", LAYOUTS)
def test_factored_svd_equals_factored_matrix(pairs, bridges, layout):
    """The SVD of a head's OV circuit W_V W_O (d_model x d_model, rank d_head) from its factors:
    ag.factored_svd against TransformerLens' FactoredMatrix.svd() in float64. Singular values
    agree to 1e-12 of the largest; singular vectors up to sign (the values are distinct), so
    U S Vh agree and |U_ours^T U_theirs| is the identity to rounding over the spectral gap."""
    _, W_K, W_V, W_O = _weights(bridges[layout])
    for layer, head in ((0, 1), (1, 3)):
        A, B = W_V[layer, head], W_O[layer, head]
        ours = ag.factored_svd(A, B)
        fm = tl.FactoredMatrix(torch.tensor(A), torch.tensor(B))
        U, S, V = (t.numpy() for t in fm.svd())  # TransformerLens returns V (rdim, mdim), not Vh
        scale = S.max()
        np.testing.assert_allclose(ours.S, S, rtol=0, atol=1e-12 * scale)
        gap = np.min(-np.diff(S)) / scale  # distinct values: vectors unique up to sign
        assert gap > 1e-3
        # a singular vector's rounding error is about machine precision over the relative gap
        # (measured 1e-14 at gaps of 0.01-0.04)
        np.testing.assert_allclose(np.abs(ours.U.T @ U), np.eye(len(S)), rtol=0, atol=1e-13 / gap)
        np.testing.assert_allclose(np.abs(ours.Vh @ V), np.eye(len(S)), rtol=0, atol=1e-13 / gap)
        np.testing.assert_allclose((ours.U * ours.S) @ ours.Vh, A @ B, rtol=0, atol=1e-12 * np.abs(A @ B).max())


@pytest.mark.parametrize("layout", LAYOUTS)
def test_logit_attribution_equals_transformer_lens(pairs, bridges, layout):
    """Each head's direct logit attribution equals TransformerLens' stack_head_results through
    apply_ln_to_stack, read by the final norm's weight times the unembedding's answer direction
    (float32 on both sides: measured 6e-7 of parts of order 1; checked at 1e-4)."""
    model, hf = pairs[layout]
    bridge = bridges[layout]
    ids = _ids(7, batch=1)
    right, wrong = 5, 7
    with torch.no_grad():
        _, cache = bridge.run_with_cache(torch.tensor(ids))
        stack = cache.stack_head_results(layer=-1, pos_slice=-1)
        scaled = cache.apply_ln_to_stack(stack, layer=-1, pos_slice=-1)
    norm = (hf.transformer.ln_f if layout == "gpt2" else hf.model.norm).weight.detach()
    W_U = bridge.W_U.detach()
    theirs = (scaled[:, 0] @ ((W_U[:, right] - W_U[:, wrong]) * norm)).numpy().reshape(model.n_layers, -1)
    ours = ag.models.logit_attribution(model, ids[0], right, wrong, dtype=np.float32)
    assert np.abs(theirs).max() > 0.1
    np.testing.assert_allclose(ours.heads, theirs, rtol=0, atol=1e-4 * np.abs(theirs).max())


def _tl_path_patching(bridge, clean, corrupt, sender, receivers, answers, rotary):
    """Path patching written with TransformerLens hooks: the sender's z from the corrupted run,
    every other head's z frozen clean, the receivers' inputs recorded; then clean runs with
    those inputs patched (each receiver alone, then all)."""
    names = {"q": "hook_rot_q" if rotary else "hook_q", "k": "hook_rot_k" if rotary else "hook_k", "v": "hook_v"}
    with torch.no_grad():
        clean_logits, clean_cache = bridge.run_with_cache(clean)
        corrupt_logits, corrupt_cache = bridge.run_with_cache(corrupt)
    sl, sh = sender

    def freeze(layer):  # (the bridge passes its own name of an aliased hook: the closure keeps ours)
        name = f"blocks.{layer}.attn.hook_z"

        def fn(z, hook):
            out = clean_cache[name].clone()
            if layer == sl:
                out[:, :, sh] = corrupt_cache[name][:, :, sh]
            return out
        return fn

    recorded = {}

    def record(name):
        def fn(x, hook):
            recorded[name] = x.clone()
            return x
        return fn

    hooks = [(f"blocks.{layer}.attn.hook_z", freeze(layer)) for layer in range(sl, bridge.cfg.n_layers)]
    hooks += [(f"blocks.{layer}.attn.{names[kind]}", record(f"blocks.{layer}.attn.{names[kind]}"))
              for layer, _, kind in receivers]
    with torch.no_grad():
        bridge.run_with_hooks(clean, fwd_hooks=hooks)

    def diff(logits):
        last = logits[:, -1].double().numpy()
        return float(np.mean(last[:, answers[0]] - last[:, answers[1]]))

    def patched(chosen):
        def patch(name, head):
            def fn(x, hook):
                x = x.clone()
                x[:, :, head] = recorded[name][:, :, head]
                return x
            return fn

        hooks = [(f"blocks.{layer}.attn.{names[kind]}", patch(f"blocks.{layer}.attn.{names[kind]}", head))
                 for layer, head, kind in chosen]
        with torch.no_grad():
            return diff(bridge.run_with_hooks(clean, fwd_hooks=hooks))

    return diff(clean_logits), diff(corrupt_logits), [patched([r]) for r in receivers], patched(receivers)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_path_patching_equals_transformer_lens_hooks(pairs, bridges, layout):
    """path_patching equals the same algorithm written with TransformerLens hooks (1e-4, float32):
    queries, keys and values on GPT-2; queries on the grouped-query Llama (its key and value
    heads are shared by two query heads, so a single query head's key has no hook there)."""
    model, _ = pairs[layout]
    clean, corrupt = _ids(8), _ids(9)
    receivers = [(1, 0, "q"), (1, 2, "k"), (1, 3, "v")] if layout == "gpt2" else [(1, 0, "q"), (1, 3, "q")]
    answers = (5, 7)
    ours = ag.models.path_patching(model, clean, corrupt, sender=(0, 1), receivers=receivers, answers=answers)
    c, x, each, joint = _tl_path_patching(bridges[layout], torch.tensor(clean), torch.tensor(corrupt), (0, 1),
                                          receivers, answers, rotary=layout == "llama")
    tol = 1e-4
    np.testing.assert_allclose([ours.clean, ours.corrupt], [c, x], rtol=0, atol=tol)
    np.testing.assert_allclose(ours.patched, each, rtol=0, atol=tol)
    np.testing.assert_allclose(ours.joint, joint, rtol=0, atol=tol)
    np.testing.assert_allclose(ours.effect, np.subtract(each, c), rtol=0, atol=2 * tol)
    # the paths matter: a path's effect stands ten tolerances clear of zero, so patching the
    # wrong site (or none) would fail the comparisons above
    assert np.abs(ours.effect).max() > 10 * tol


def test_qwen3_sites_equal_transformer_lens_the_normed_queries_and_keys_as_hook_q_normed(tmp_path_factory):
    """Qwen3 (q_norm / k_norm): every site equals TransformerLens' value of the same name but
    q_prerotary and k_prerotary, which hold the vectors after the norms: its hook_q_normed and
    hook_k_normed (its hook_q and hook_k are the projections before them; the sites table says
    so)."""
    (model, hf), = model_pairs(tmp_path_factory, ["qwen3"]).values()
    vocab = tokenizers.Tokenizer(tokenizers.models.WordLevel({"a": 0, "<unk>": 1}, unk_token="<unk>"))
    bridge = TransformerBridge.boot_transformers(model.folder, hf_model=hf, device="cpu",
                                                 tokenizer=transformers.PreTrainedTokenizerFast(tokenizer_object=vocab))
    ids = _ids(5)
    with torch.no_grad():
        tl_logits, cache = bridge.run_with_cache(torch.tensor(ids))
    f = model.forward(ids, keep="all")
    np.testing.assert_allclose(f.logits, tl_logits.numpy(), rtol=1e-4, atol=1e-4)
    normed = {"q_prerotary": "hook_q_normed", "k_prerotary": "hook_k_normed"}
    compared = set()
    for name, ours in f.items():
        site, _ = parse_site(name)
        if site in normed:  # (b, heads, n, d): TransformerLens keeps the norm's layout; one per key head
            theirs = cache[name.replace(name.rsplit(".", 1)[-1], normed[site])].detach().numpy()
            theirs = np.repeat(theirs, model.arch.n_heads // theirs.shape[1], axis=1)
        else:
            theirs = _theirs(cache, name, site, model.arch.n_heads)
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4, err_msg=name)
        if site in normed:  # TransformerLens' hook_q / hook_k: before the norm, another value
            before = _theirs(cache, name, site, model.arch.n_heads)
            assert np.abs(ours - before).max() > 1e-2, name
        compared.add(site)
    assert compared == set(model_sites(model.arch))
